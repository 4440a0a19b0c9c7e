"""The small-world ring under short sessions: a crashed near neighbour holds no window slot.

Measured with ``flockring bench churn --overlay smallworld --session-min 5`` (docs/smallworld.md,
"Short sessions"): most incorrect deliveries were made by a node whose near neighbours on one
side had both crashed and were not yet declared dead. Counted as members of the window, the
suspected nodes kept the live node beyond them out: the repair walk found it, its list reached
us, and we refused it (it did not "fit"). When the probes ended the dead nodes' keys were
delivered here. Now suspected connections hold no slot, so the live node next in line is linked
as soon as it is heard of, and every lookup is checked against the brute-force closest live
node (``Network.closest_live``).
"""

from __future__ import annotations

import random

from sim_oracles import lookups, sw_width, wrong_windows

from overlay import NodeHandle, NodeId
from overlay.smallworld import SmallWorldCore
from overlay.smallworld.connections import ConnectionTable
from sim_adapter.network import Network, SimNode


def _core(x: SimNode) -> SmallWorldCore:
    assert isinstance(x.core, SmallWorldCore)
    return x.core


def _ring(n: int, seed: int) -> tuple[Network, list[SimNode]]:
    net = Network(seed=seed)
    nodes = net.spawn(n, overlay="smallworld", build="oracle")
    net.run(45.0)  # a few exchange rounds: RTT samples, timers desynchronised
    return net, sorted(nodes, key=lambda x: int(x.id))


def _crash_two_right_neighbours(seed: int) -> None:
    net, ring = _ring(40, seed)
    n = len(ring)
    # a node whose third right neighbour is not already one of its connections
    i = next(
        j for j in range(n) if ring[(j + 3) % n].core.handle not in _core(ring[j]).known_nodes()
    )
    a, b, c, d = (ring[(i + j) % n] for j in range(4))
    ca = _core(a)
    bh, ch, dh = b.core.handle, c.core.handle, d.core.handle
    net.crash([b, c])
    # d's probes ended first: it drops both and walks for its new left neighbour, which is a.
    # a holds both suspected (lost acks, probes under way), in its window still.
    ca.prox.suspect(bh)
    ca.prox.suspect(ch)
    _core(d).prox.declare_dead(bh)
    _core(d).prox.declare_dead(ch)
    net.run(1.5)
    assert not ca.prox.is_dead(bh) and not ca.prox.is_dead(ch)
    assert bh in ca.known_nodes() and ch in ca.known_nodes()
    # d reached a (its walk, then its Link): a keeps it, the live node beyond its suspected
    # neighbours (before, a found d did not fit and trimmed it again)
    assert dh in ca.known_nodes()
    # keys that belong to d now: a sends them there instead of waiting on b and c and, when
    # their probes end, delivering them itself
    span = (int(d.id) - int(a.id)) % 2**160
    keys = [NodeId((int(a.id) + span * f // 100) % 2**160) for f in (55, 70, 85, 99)]
    res = net.lookup_many([(a, k) for k in keys])
    for r, k in zip(res, keys, strict=True):
        assert r.result == net.closest_live(k), (k, r.result)
    net.run(60.0)
    live = [x for x in ring if x.alive]
    assert wrong_windows(live, sw_width, lambda x: _core(x).near_connections()) == 0
    ok, _ = lookups(net, live, 300, seed=seed)
    assert ok == 1.0


def test_two_crashed_right_neighbours_do_not_keep_the_live_one_beyond_out() -> None:
    _crash_two_right_neighbours(seed=1)


def test_two_crashed_right_neighbours_other_seed() -> None:
    _crash_two_right_neighbours(seed=5)


def _h(x: int) -> NodeHandle:
    return NodeHandle(NodeId(x), x)


def test_table_counts_only_live_connections_against_a_brute_force_window() -> None:
    """``fits_near``/``surplus`` with a suspected set agree with the window recomputed from the
    live connections alone, by brute force over random tables."""
    rng = random.Random(7)
    ring = 2**160
    for _ in range(300):
        me = rng.randrange(ring)
        t = ConnectionTable(me, 2)
        hs = [_h(rng.randrange(ring)) for _ in range(rng.randrange(3, 12))]
        for h in hs:
            t.add(h)
        bad = {h for h in hs if rng.random() < 0.3}
        live = sorted((h for h in t.all if h not in bad), key=lambda h: (h.id - me) % ring)
        win = set(live[:2] + live[-2:]) if len(live) > 4 else set(live)
        pos = set(t.near_nodes())
        assert set(t.surplus(bad)) == {h for h in t.all if h not in win | pos}
        x = rng.randrange(ring)
        cw = (x - me) % ring
        if len(live) < 4:
            want = cw != 0
        else:
            want = cw < (live[1].id - me) % ring or cw > (live[-2].id - me) % ring
        assert t.fits_near(x, bad) == want
