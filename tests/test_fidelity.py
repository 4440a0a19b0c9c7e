"""The simulator's fidelity mode: what a live node's receive loop does, in virtual time.

``Network(fidelity=True)`` encodes and decodes every message through ``overlay.wire`` (so the
wire's type checks are the trust boundary, as live), hands receivers the observed, interned
sender handle, drops self-addressed messages and does not count a node whose join failed as live.
Each behaviour has a test that fails without the mode; then both overlays are built by joins,
churned and checked against the oracle with the mode on, and the hostile-input attacks of
``test_hostile_*.py`` are replayed from non-members through the wire.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
from sim_oracles import lookups, sw_width, wrong_windows

from overlay import NodeHandle, NodeId
from overlay.messages import Message
from overlay.multicast import MULTICAST_APP, McQuery, Multicast
from overlay.pastry.messages import Heartbeat, LeafFailed
from overlay.proximity import Ping, Pong
from overlay.smallworld.messages import JOIN, ConnectReply
from overlay.wire import intern_handle
from sim_adapter import Network, SimNode


def _spy(node: SimNode) -> list[tuple[NodeHandle, Message]]:
    """Record what ``node``'s core receives (and let it through)."""
    got: list[tuple[NodeHandle, Message]] = []
    orig = node.core.receive

    def receive(src: NodeHandle, msg: Message) -> None:
        got.append((src, msg))
        orig(src, msg)

    node.core.receive = receive  # type: ignore[method-assign]
    return got


# ------------------------------------------------------------------ each behaviour
@pytest.mark.parametrize("fidelity", [False, True])
def test_messages_are_decoded_copies_from_an_interned_observed_handle(fidelity: bool) -> None:
    net = Network(seed=1, fidelity=fidelity)
    a, b = net.spawn(2, overlay="pastry", build="oracle")
    got = _spy(b)
    ping = Ping(12345, 0.5)
    a.core.runtime.send(b.handle, ping)
    net.run(1.0)
    src, msg = next((s, m) for s, m in got if isinstance(m, Ping))
    assert msg == ping and src == a.handle
    if fidelity:
        assert msg is not ping  # what the wire gave back
        assert src is intern_handle(a.id.to_bytes_be(), a.index)
        assert net.fidelity is not None and net.fidelity.stats["decoded"] >= 1
    else:
        assert msg is ping and src is a.handle


@pytest.mark.parametrize("fidelity", [False, True])
def test_the_wire_rejects_what_its_type_checks_refuse(fidelity: bool) -> None:
    """A message built in-process with a wrong field type (never validated there) reaches the
    core without fidelity; through the wire it is dropped and counted, as on a live node."""
    net = Network(seed=2, fidelity=fidelity)
    nodes = net.spawn(10, overlay="pastry", build="oracle")
    bad = LeafFailed("not a handle", 0.0)  # type: ignore[arg-type]
    stranger = NodeHandle(NodeId.random(random.Random(1)), "stranger")
    got = _spy(nodes[0])
    net.inject(stranger, nodes[0], bad)
    net.run(1.0)
    reached = [m for _, m in got if isinstance(m, LeafFailed)]
    if fidelity:
        assert not reached
        assert net.fidelity is not None and net.fidelity.stats["bad_message"] == 1
    else:
        assert reached == [bad]


@pytest.mark.parametrize("fidelity", [False, True])
def test_self_addressed_messages_are_dropped(fidelity: bool) -> None:
    net = Network(seed=3, fidelity=fidelity)
    (a,) = net.spawn(1, overlay="pastry", build="oracle")
    got = _spy(a)
    a.core.runtime.send(a.handle, Ping(7, 0.0))
    net.run(1.0)
    pings = [m for _, m in got if isinstance(m, (Ping, Pong))]
    if fidelity:
        assert not pings
        assert net.fidelity is not None and net.fidelity.stats["self_dropped"] == 1
    else:
        assert pings  # delivered to itself (and answered), which a live node never sees


@pytest.mark.parametrize("fidelity", [False, True])
def test_a_node_whose_join_failed_is_not_live(fidelity: bool) -> None:
    """A Pastry joiner cut off from everyone fails to join; with fidelity the oracle does not
    expect it to own keys (without, lookups for its keys 'fail' against the oracle)."""
    net = Network(seed=4, fidelity=fidelity)
    nodes = net.spawn(30, overlay="pastry", build="oracle")
    net.run(5.0)
    net.partition([nodes])  # a new node (index 30) is in no group: alone
    (late,) = net.spawn(1, overlay="pastry", join_timeout_s=120.0)
    net.heal()
    assert not late.core.ready
    key = late.id  # the key the failed node would own if it counted
    r = net.lookup(nodes[0], key)
    if fidelity:
        assert not late.alive and net.closest_live(int(key)) != late.id
        assert r.result == net.closest_live(int(key))
    else:
        assert late.alive and net.closest_live(int(key)) == late.id
        assert r.result != late.id  # the oracle expected a node that never joined


# ------------------------------------------------------------------ both overlays, with churn
@pytest.mark.parametrize("overlay", ["pastry", "smallworld"])
def test_joins_churn_and_lookups_in_fidelity_mode(overlay: str) -> None:
    net = Network(seed=11, fidelity=True)
    nodes = net.spawn(60, overlay=overlay, join_interval_s=1.0)
    assert all(x.core.ready for x in nodes)
    rng = random.Random(11)
    for _ in range(3):  # crash 10 %, restart as many crashed ones, repair
        live = [x for x in net.nodes if x.alive]
        net.crash(rng.sample(live, 6))
        net.run(60.0)
        for x in rng.sample([x for x in net.nodes if not x.alive], 3):
            net.restart(x)
        net.run(60.0)
    live = [x for x in net.nodes if x.alive]
    ok, _ = lookups(net, live, 300, seed=12)
    assert ok == 1.0
    fid = net.fidelity
    assert fid is not None
    assert fid.stats["decoded"] > 10_000
    assert fid.stats["encode_errors"] == fid.stats["bad_message"] == fid.stats["malformed"] == 0
    half: int | Callable[[SimNode], int] = 8 if overlay == "pastry" else sw_width
    window = (
        (lambda x: x.core.leaf.nodes())
        if overlay == "pastry"
        else (lambda x: x.core.near_connections())
    )
    assert wrong_windows(live, half, window) == 0


# ------------------------------------------------------------------ attacks, through the wire
def _victim_keys(net: Network, victim: SimNode, n: int) -> list[NodeId]:
    rng = random.Random(5)
    keys: list[NodeId] = []
    while len(keys) < n:
        k = NodeId((int(victim.id) + rng.randrange(-(1 << 140), 1 << 140)) % (1 << 160))
        if net.closest_live(int(k)) == victim.id:
            keys.append(k)
    return keys


def test_forged_failure_reports_from_a_non_member_through_the_wire() -> None:
    net = Network(seed=6, fidelity=True)
    nodes = net.spawn(60, overlay="pastry", build="oracle")
    net.run(5.0)
    victim = nodes[7]
    keys = _victim_keys(net, victim, 20)
    stranger = NodeHandle(NodeId.random(random.Random(9)), "198.51.100.7")  # no such node
    holders = [x for x in nodes if victim.handle in x.core.leaf.members]  # type: ignore[attr-defined]
    for _ in range(120):  # one forged report a second to every node holding the victim
        for x in holders:
            net.inject(stranger, x, LeafFailed(victim.handle, 0.0))
            net.inject(stranger, x, Heartbeat((), ((victim.handle, 0.0),)))
        net.run(1.0)
    assert not any(x.core.prox.is_dead(victim.handle) for x in nodes)
    res = net.lookup_many([(nodes[i % 60], k) for i, k in enumerate(keys)])
    assert all(r.result == victim.id for r in res)
    assert sum(x.core.stats["failure_reports_rate_limited"] for x in holders) > 100


def test_forged_connect_replies_through_the_wire_change_nothing() -> None:
    net = Network(seed=7, fidelity=True)
    nodes = net.spawn(40, overlay="smallworld", build="oracle")
    net.run(20.0)
    victim = nodes[3]
    before = set(victim.core.near_connections())  # type: ignore[attr-defined]
    rng = random.Random(3)
    fakes = tuple(NodeHandle(NodeId.random(rng), f"fake-{i}") for i in range(6))
    liar = NodeHandle(NodeId.random(rng), "liar")
    for _ in range(10):
        net.inject(liar, victim, ConnectReply(fakes[0], JOIN, rng.getrandbits(31), fakes))
        net.inject(liar, victim, ConnectReply(liar, JOIN, rng.getrandbits(31), fakes))
    net.run(5.0)
    assert set(victim.core.near_connections()) == before  # type: ignore[attr-defined]
    assert not set(victim.core.known_nodes()) & set(fakes)
    ok, _ = lookups(net, nodes, 100, seed=4)
    assert ok == 1.0


def test_nan_budgets_cross_the_wire_and_are_clamped() -> None:
    net = Network(seed=8, fidelity=True)
    nodes = net.spawn(30, overlay="pastry", build="oracle")
    net.run(5.0)
    x, parent = nodes[5], nodes[20]
    q = McQuery(7, "count", None, 1, x.id, x.id, math.nan, math.inf, 30, 8, None, 99, 0)
    net.inject(parent.handle, x, q)
    net.run(3 * 3600.0 + 60.0)
    assert x.core.stats["multicast_clamped"] == 2
    app = x.core.apps[MULTICAST_APP]
    assert isinstance(app, Multicast) and not app._sessions
