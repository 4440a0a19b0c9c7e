"""The small-world ring's control traffic under short sessions (docs/smallworld.md, "Short
sessions"): what a join, a lost shortcut and a change of the near window cost.

Each test pins one cut of information-free traffic and checks the ring stays right:
a joiner takes over the shortcuts of the node next to it instead of routing requests, a dead
shortcut is replaced by a neighbour its reply named, a new shortcut is not pinged at once, and a
change of the near window is pushed only to the members whose own window it touches. One more
pins what answers the slower failure detection those cuts cost: a message stuck on a suspected
neighbour, with no live node closer to its key, asks past the gap instead of waiting to be
delivered in the root's place.
"""

from __future__ import annotations

from typing import Any

from sim_oracles import lookups, wrong_windows

from overlay.handle import NodeHandle
from overlay.ids import RING, NodeId, ring_distance
from overlay.smallworld import SmallWorldConfig, SmallWorldCore
from overlay.smallworld.estimate import desired_shortcuts
from overlay.smallworld.exchange import changed_for
from overlay.smallworld.maintenance import check_shortcuts
from sim_adapter.network import Network, SimNode


def _core(x: SimNode) -> SmallWorldCore:
    assert isinstance(x.core, SmallWorldCore)
    return x.core


#: replacement by a neighbour and the joiner's take-over, off by default (config.py)
_OFFERS = SmallWorldConfig(reuse_shortcuts=True, inherit_shortcuts=True)


def _ring(
    seed: int, n: int = 400, build: str = "oracle", config: SmallWorldConfig | None = None
) -> tuple[Network, list[SimNode]]:
    net = Network(seed=seed)
    nodes = net.spawn(n, overlay="smallworld", build=build, config=config)
    net.run(30.0)
    return net, nodes


def test_a_joiner_takes_over_its_neighbours_shortcuts_instead_of_routing_requests() -> None:
    # built by joins: the nodes' shortcuts were made by routed requests whose replies named
    # the shortcuts' neighbours (an oracle build sends no replies, so it knows none)
    net, nodes = _ring(seed=11, n=300, build="joins", config=_OFFERS)
    joiners = [net.arrive(config=_OFFERS) for _ in range(20)]
    net.run(20.0)
    taken = requests = 0
    for j in joiners:
        c = _core(j)
        assert c.ready
        taken += c.stats["shortcuts_taken_over"]
        requests += c.stats["connect_requests"]
        # the quota is held all the same (give or take the slack of the estimate)
        assert len(c.shortcuts()) >= desired_shortcuts(c.n_hat, c.config) - 1
    want = sum(desired_shortcuts(_core(j).n_hat, _core(j).config) for j in joiners)
    assert taken >= want // 3
    # one JOIN each, and a routed request only for the shortcuts not taken over
    assert requests - len(joiners) <= want - taken + len(joiners)
    ok, _ = lookups(net, [*nodes, *joiners], 1000, seed=11)
    assert ok == 1.0


def test_the_joiner_does_not_take_over_shortcuts_when_told_not_to() -> None:
    net = Network(seed=11)
    cfg = SmallWorldConfig(inherit_shortcuts=False)
    net.spawn(300, overlay="smallworld", config=cfg)
    net.run(30.0)
    j = net.arrive(config=cfg)
    net.run(20.0)
    c = _core(j)
    assert c.ready and c.stats["shortcuts_taken_over"] == 0
    assert len(c.shortcuts()) >= desired_shortcuts(c.n_hat, cfg) - 1


def _routed_shortcut(net: Network, nodes: list[SimNode]) -> tuple[SmallWorldCore, NodeHandle]:
    """A node with an own shortcut made by a routed request (so its reply named neighbours)."""
    for x in nodes:
        c = _core(x)
        alts = c.shortcut_alts or {}
        for s in c.shortcuts():
            if s in alts and all(a not in c.table for a in alts[s]):  # far from our window
                return c, s
    raise AssertionError("no routed shortcut yet")


def test_a_dead_shortcut_is_replaced_by_a_neighbour_its_reply_named() -> None:
    net, _ = _ring(seed=12, config=_OFFERS)
    # a fresh node's shortcuts beyond the taken-over ones are made by routed requests
    joiners = [net.arrive(config=_OFFERS) for _ in range(20)]
    net.run(20.0)
    c, s = _routed_shortcut(net, joiners)
    assert c.shortcut_alts is not None
    alts = c.shortcut_alts[s]
    net.crash(net.node_by_id(s.id))
    requests = c.stats["connect_requests"]
    c.prox.declare_dead(s)  # as the keep-alive probe would, 120 s on
    net.run(5.0)
    assert s not in c.table
    assert c.stats["shortcuts_taken_over"] >= 1
    assert set(c.shortcuts()) & set(alts)
    assert c.stats["connect_requests"] == requests  # no routed request for it


def _spy_on_probes(c: SmallWorldCore, probed: list[tuple[NodeHandle, NodeHandle]]) -> None:
    """Record (prober, probed) for every probe ``c`` starts."""
    orig = c.prox.probe

    def spy(h: NodeHandle, *a: Any, **k: Any) -> None:
        probed.append((c.handle, h))
        orig(h, *a, **k)

    c.prox.probe = spy  # type: ignore[method-assign]


def test_a_new_shortcut_is_not_pinged_at_once() -> None:
    net, nodes = _ring(seed=13)
    net.run(200.0)  # old enough that a shortcut never heard from looks silent for long
    probed: list[tuple[NodeHandle, NodeHandle]] = []
    for x in nodes:
        _spy_on_probes(_core(x), probed)
    old_out: dict[NodeHandle, set[NodeHandle]] = {}
    for x in nodes[:40]:
        c = _core(x)
        old_out[x.handle] = set(c.table.out)
        victim = c.shortcuts()[0]
        c.table.discard_out(victim)  # a shortcut to replace, its peer left alone
        c.table.remove(victim)
        c.prox.forget(victim)
        c.shortcut_alts = None  # make the replacement a routed request
        check_shortcuts(c)
    net.run(30.0)
    new = [
        (x.handle, s) for x in nodes[:40] for s in _core(x).table.out if s not in old_out[x.handle]
    ]
    assert len(new) >= 20
    pairs = {frozenset(p) for p in probed}
    assert sum(frozenset(p) in pairs for p in new) <= len(new) // 10


def _h(i: int) -> NodeHandle:
    return NodeHandle(NodeId(i % RING), i)


def test_a_window_change_at_one_end_is_news_only_to_members_near_it() -> None:
    step = RING // 100
    me = 50 * step
    l2, l1, r1, r2, r3 = (_h(x * step) for x in (48, 49, 51, 52, 53))
    before = (r1, r2, l2, l1)
    after = (r1, r3, l2, l1)  # r2 failed, r3 took its place
    assert changed_for(me, r1, before, after, 2)  # r1's right side is r2 → r3
    assert not changed_for(me, l2, before, after, 2)  # l2's right side is l1, us
    assert not changed_for(me, l1, before, after, 2)  # l1's right side is us, r1
    x = _h(50 * step + step // 2)  # a joiner between us and r1
    after = (x, r1, l2, l1)
    assert changed_for(me, l1, before, after, 2)  # l1's right side becomes us, x
    assert changed_for(me, r1, before, after, 2)
    assert not changed_for(me, l2, before, after, 2)


def test_pushes_skip_members_the_change_does_not_concern_and_the_ring_converges() -> None:
    net = Network(seed=14)
    nodes = net.spawn(300, overlay="smallworld", join_interval_s=0.05)
    net.run(5.0)
    skipped = sum(_core(x).stats["near_push_skipped"] for x in nodes)
    assert skipped > 0
    ok, _ = lookups(net, nodes, 1000, seed=14)
    assert ok == 1.0


def test_trimming_a_displaced_near_connection_sends_no_unlink() -> None:
    # A joiner pushes the second neighbour on each side out of its neighbours' windows; they
    # drop each other without telling (the far end either still needs the link or has dropped
    # it itself), and the windows are still exactly right.
    net = Network(seed=15)
    cfg = SmallWorldConfig(inherit_shortcuts=False, reuse_shortcuts=False)
    nodes = net.spawn(300, overlay="smallworld", build="oracle", config=cfg)
    net.run(30.0)
    unlinks0 = net.msg_by_type["Unlink"]
    trimmed0 = sum(_core(x).stats["links_trimmed"] for x in nodes)
    joiners = [net.arrive(config=cfg) for _ in range(10)]
    net.run(10.0)
    every = [*nodes, *joiners]
    trimmed = sum(_core(x).stats["links_trimmed"] for x in every) - trimmed0
    shortcut_trims = sum(_core(x).stats["shortcuts_trimmed"] for x in every)
    assert trimmed >= 20  # about two displaced links per neighbour of each joiner
    assert net.msg_by_type["Unlink"] - unlinks0 <= shortcut_trims
    assert wrong_windows(every, 2, lambda x: _core(x).near_connections()) == 0


def test_a_message_stuck_on_a_suspected_neighbour_asks_for_the_nodes_beyond_it() -> None:
    # Both right neighbours of a node crash at once, undetected: a lookup from it for a key of
    # the live node beyond them finds only those two closer than itself. Before their probes
    # end it asks the nearest live node on that side for the nodes it misses and sends the
    # lookup through the one it learns, rather than delivering it in the root's place once
    # both are declared dead.
    net, nodes = _ring(seed=16, n=200)
    live = sorted(nodes, key=lambda x: int(x.id))
    n = len(live)
    for i, x in enumerate(live):
        r1, r2, r3 = live[(i + 1) % n], live[(i + 2) % n], live[(i + 3) % n]
        key = r3.id
        mine = ring_distance(x.id, key)
        others = [h for h in _core(x).table.all if h not in (r1.handle, r2.handle)]
        if all(ring_distance(h.id, key) > mine for h in others):
            break  # it knows no live node closer to r3 than itself
    else:
        raise AssertionError("no node whose only way to its third neighbour is the first two")
    c = _core(x)
    net.crash([r1, r2])
    assert net.closest_live(int(key)) == r3.id
    res = net.lookup(x, key, timeout_s=30.0)
    assert res.result == r3.id
    assert c.stats["gap_queries"] >= 1
    assert c.stats["reroutes_past_suspected"] >= 1
    assert r3.handle in c.table
