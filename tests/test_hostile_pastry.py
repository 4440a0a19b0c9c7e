"""Hostile input to Pastry: failure reports are hints, never verdicts (MSPastry §3.2).

A stream of forged ``LeafFailed`` reports, or heartbeats that list a live neighbour as failed,
must not evict it anywhere: each receiver probes the named node itself (rate-limited) and keeps
it while it answers. A real crash is still detected, through the receivers' own probes.
"""

from __future__ import annotations

import random

from sim_oracles import lookups

from overlay import NodeId
from overlay.ids import ring_distance
from overlay.pastry.messages import Heartbeat, LeafFailed
from sim_adapter import Network
from sim_adapter.simnode import SimNode


def _keys_owned_by(net: Network, victim: SimNode, rng: random.Random, n: int) -> list[NodeId]:
    keys: list[NodeId] = []
    while len(keys) < n:
        k = NodeId((int(victim.id) + rng.randrange(-(1 << 140), 1 << 140)) % (1 << 160))
        if net.closest_live(k) == victim.id:
            keys.append(k)
    return keys


def _setup(seed: int) -> tuple[Network, list[SimNode], SimNode, SimNode, SimNode]:
    net = Network(seed=seed, fidelity=True)  # the wire and observed handles, as live
    nodes = net.spawn(80, overlay="pastry", build="oracle")
    net.run(5.0)
    victim = nodes[7]
    target = min(
        (x for x in nodes if x is not victim),
        key=lambda x: ring_distance(int(x.id), int(victim.id)),
    )  # an immediate neighbour: its leaf set holds the victim
    attacker = max(nodes, key=lambda x: ring_distance(int(x.id), int(victim.id)))  # non-member
    assert victim.handle in target.core.leaf.members  # type: ignore[attr-defined]
    assert attacker.handle not in target.core.leaf.members  # type: ignore[attr-defined]
    return net, nodes, victim, target, attacker


def test_forged_failure_reports_evict_nobody() -> None:
    net, nodes, victim, target, attacker = _setup(seed=5)
    rng = random.Random(1)
    keys = _keys_owned_by(net, victim, rng, 20)
    for _ in range(120):  # one forged report a second, for two minutes, to every leaf member
        for m in target.core.leaf.nodes():  # type: ignore[attr-defined]
            peer = net.node_by_id(int(m.id))
            if peer is not victim:
                peer.core.receive(attacker.handle, LeafFailed(victim.handle, 0.0))
        target.core.receive(attacker.handle, Heartbeat((), ((victim.handle, 0.0),)))
        net.run(1.0)
    for x in nodes:
        assert not x.core.prox.is_dead(victim.handle), x
    assert victim.handle in target.core.leaf.members  # type: ignore[attr-defined]
    res = net.lookup_many([(rng.choice(nodes), k) for k in keys])
    assert all(r.result == victim.id for r in res)
    assert target.core.stats["failure_reports_rate_limited"] > 100
    assert target.core.stats["failure_report_probes"] <= 120 // 10 + 1


def test_a_real_crash_is_still_detected_and_repaired() -> None:
    net, nodes, victim, _, _ = _setup(seed=6)
    net.crash(victim)
    net.run(90.0)
    live = [x for x in nodes if x.alive]
    for x in live:
        assert victim.handle not in x.core.leaf.members  # type: ignore[attr-defined]
    ok, _ = lookups(net, live, 200, seed=2)
    assert ok == 1.0


def test_a_join_completes_when_the_reply_names_a_node_we_hold_dead() -> None:
    """The joiner's reply lists a member our probes already found dead (the responder has not
    noticed yet). Asking it times out; the timed-out ask must remove it, or the consistent join
    waits for it until the dead verdict expires (300 s)."""
    net = Network(seed=8, fidelity=True)
    nodes = net.spawn(60, overlay="pastry", build="oracle")
    net.run(5.0)
    dead = nodes[9]
    net.crash(dead)
    joiner = net._new_node("pastry", None, NodeId((int(dead.id) + 1) % (1 << 160)))
    joiner.core.prox.declare_dead(dead.handle)  # a verdict of ours from earlier
    t0 = net.now
    net._join_one(joiner, 300.0)
    assert joiner.core.ready
    took = joiner.core.joiner.ready_at - t0  # type: ignore[attr-defined]
    # the route to our id first meets the dead node's neighbours, which still forward to it and
    # reroute (tens of seconds here); what must not happen is waiting out the 300 s verdict
    assert took < 60.0, took
    assert dead.handle not in joiner.core.leaf.members  # type: ignore[attr-defined]
