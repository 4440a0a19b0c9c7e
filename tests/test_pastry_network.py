"""Pastry on the simulated Network, checked against the brute-force oracle.

Sizes are small (hundreds of nodes) so the file runs in well under a minute; the 10^4 / 10^5
figures are benchmarks (``flockring bench pastry``), not tests.
"""

from __future__ import annotations

import math
import random

from sim_oracles import lookups, wrong_windows

from overlay import NodeId
from overlay.ids import RING
from overlay.pastry import PastryConfig
from sim_adapter.latency import TransitStub
from sim_adapter.network import Network, SimNode


def _wrong_leaf_sets(nodes: list[SimNode], half: int = 8) -> int:
    """How many live nodes' leaf sets differ from the L/2 live nodes each side (oracle)."""
    return wrong_windows(nodes, half, lambda x: x.core.leaf.nodes())  # type: ignore[attr-defined]


def _dead_leaf_entries(net: Network) -> int:
    n = 0
    for x in net.nodes:
        if x.alive:
            for h in x.core.leaf.nodes():  # type: ignore[attr-defined]
                n += not net.nodes[int(h.address)].alive
    return n


def test_500_nodes_by_joins_route_every_lookup_to_the_closest_node() -> None:
    net = Network(seed=21)
    nodes = net.spawn(500, overlay="pastry")
    assert all(x.core.ready for x in nodes)
    assert _wrong_leaf_sets(nodes) == 0
    ok, hops = lookups(net, nodes, 2000, seed=1)
    assert ok == 1.0
    assert hops <= math.log(500, 16) + 0.5


def test_20_percent_crash_is_repaired_within_60_virtual_seconds() -> None:
    net = Network(seed=22)
    nodes = net.spawn(400, overlay="pastry")
    net.run(60)
    net.crash(random.Random(3).sample(nodes, 80))
    net.run(60)
    assert _dead_leaf_entries(net) == 0
    ok, _ = lookups(net, nodes, 2000, seed=2)
    assert ok == 1.0
    net.run(120)
    assert _wrong_leaf_sets(nodes) == 0


def test_5_percent_loss_still_delivers_99_percent_correctly() -> None:
    net = Network(seed=23, loss=0.05)
    nodes = net.spawn(300, overlay="pastry")
    net.run(60)
    ok, _ = lookups(net, nodes, 2000, seed=3)
    assert ok >= 0.99


def test_partition_into_two_halves_heals_after_links_return() -> None:
    net = Network(seed=24)
    nodes = net.spawn(200, overlay="pastry")
    ordered = sorted(nodes, key=lambda x: x.id)
    left, right = ordered[:100], ordered[100:]
    net.partition([left, right])
    net.run(300)
    # each half has become a ring of its own
    assert _wrong_leaf_sets(left) == 0 and _wrong_leaf_sets(right) == 0
    k = NodeId((int(right[50].id) + 1) % RING)
    assert net.lookup(left[10], k).result != net.closest_live(k)
    net.heal()
    net.run(600)  # two partition-handler periods (300 s each)
    assert _wrong_leaf_sets(nodes) == 0
    ok, _ = lookups(net, nodes, 1000, seed=4)
    assert ok == 1.0


def test_maintenance_stays_under_half_a_message_per_second_per_node() -> None:
    net = Network(seed=25)
    nodes = net.spawn(200, overlay="pastry")
    net.run(300)
    before = net.message_count
    net.run(1800)
    rate = (net.message_count - before) / 1800 / len(nodes)
    assert rate < 0.5


def test_oracle_build_routes_correctly_and_keeps_its_state_under_maintenance() -> None:
    net = Network(seed=26)
    nodes = net.spawn(1500, overlay="pastry", build="oracle")
    assert net.message_count == 0
    ok, hops = lookups(net, nodes, 2000, seed=5)
    assert ok == 1.0 and hops <= math.log(1500, 16) + 0.5
    net.run(120)
    assert _wrong_leaf_sets(nodes) == 0


def _row0_rtt(net: Network) -> float:
    lat = net.latency
    vals = [
        lat.rtt_s(x.index, int(h.address))
        for x in net.nodes
        for h in x.core.routing_row(0)  # type: ignore[attr-defined]
    ]
    return sum(vals) / len(vals)


def test_nearby_node_discovery_gives_closer_routing_tables_and_stays_consistent() -> None:
    # Same ids, same placement: joins through the random seed vs joins through the nearest
    # node found by the discovery walk (FreePastry getNearest). PNS quality = row-0 RTTs.
    def build(cfg: PastryConfig) -> Network:
        net = Network(seed=27, latency=TransitStub(seed=27))
        nodes = net.spawn(250, overlay="pastry", config=cfg)
        assert all(x.core.ready for x in nodes)
        assert _wrong_leaf_sets(nodes) == 0
        return net

    plain = build(PastryConfig(join_locate_rounds=0))
    near = build(PastryConfig())
    assert _row0_rtt(near) < 0.8 * _row0_rtt(plain)
    assert sum(x.core.stats["join_locate_requests"] for x in near.nodes) >= 249
    ok, _ = lookups(near, near.nodes, 1000, seed=6)
    assert ok == 1.0
