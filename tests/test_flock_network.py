"""Willing lists on simulated rings against brute-force oracles (Butt et al. 2006 §3.2).

Static rings built with ``build="oracle"`` on transit-stub latency. After one announcement round
every willing list must equal what a brute-force walk over every routing table (Pastry: rows)
or connection table (small world: hop counts) says, and each sublist must be sorted by the
latency model's RTT within the stated tolerance (more free machines first inside a bucket).
TTL 1 runs on 1,000 nodes; TTL 2 on 300 here, and Pastry's also on 1,000 under the ``slow``
marker (~35 s: a third row of prefixes fills at that size). The small-world ring's TTL-2 lists
are hop counts, which do not change with the ring's size: its 1,000-node round (~40 s) was
dropped from the suite to keep CI's run well inside its budget.
"""

from __future__ import annotations

import itertools

import pytest
from flock_support import pastry_oracle, smallworld_oracle, willing_map

from discovery.announce import FlockConfig
from sim_adapter import Network, latency
from sim_adapter.plugins.flock import FixedPool, FlockSim
from sim_adapter.simnode import SimNode

SETTLE_S = 3.0  # forwarding + probes: transit-stub RTTs stay well under 1 s


def _run(n: int, overlay: str, ttl: int, seed: int = 1) -> tuple[FlockSim, list[SimNode]]:
    net = Network(seed=seed, latency=latency.TransitStub(seed=seed))
    nodes = net.spawn(n, overlay=overlay, build="oracle")
    rng = net.rng
    # free machines 1..3: many equal counts, so the free-machine tie-break is exercised
    pools = {x.index: FixedPool(100, rng.randrange(1, 4)) for x in nodes}
    sim = FlockSim(net, pools, FlockConfig(ttl=ttl, require_signatures=False))
    sim.round(SETTLE_S)
    return sim, nodes


@pytest.fixture(scope="module")
def pastry_1000_ttl1() -> tuple[FlockSim, list[SimNode]]:
    return _run(1000, "pastry", 1)


@pytest.fixture(scope="module")
def pastry_300_ttl2() -> tuple[FlockSim, list[SimNode]]:
    return _run(300, "pastry", 2)


def _check_oracle(sim: FlockSim, nodes: list[SimNode], overlay: str, ttl: int) -> None:
    oracle = pastry_oracle(nodes, ttl) if overlay == "pastry" else smallworld_oracle(nodes, ttl)
    wrong = [x for x in nodes if willing_map(sim[x]) != oracle.get(x.id, {})]
    assert not wrong, f"{len(wrong)} of {len(nodes)} willing lists differ from the oracle"
    # the oracle is not trivial: every list is populated, several sublists are used
    assert min(len(willing_map(sim[x])) for x in nodes) > 0
    rows = max(len(sim[x].willing_list()) for x in nodes)
    assert rows >= 2 if (overlay == "pastry" or ttl > 1) else rows == 1


def _check_sorted(sim: FlockSim, nodes: list[SimNode]) -> int:
    lat = sim.net.latency
    tol = sim.config.rtt_tolerance_s
    checked = 0
    for x in nodes:
        for sub in sim[x].willing_list():
            for a, b in itertools.pairwise(sub):
                ra = lat.rtt_s(x.index, int(a.origin.address))
                rb = lat.rtt_s(x.index, int(b.origin.address))
                assert a.rtt_s is not None and b.rtt_s is not None  # every origin was probed
                assert abs(a.rtt_s - ra) < 1e-9  # the probe measured the model's RTT
                assert ra <= rb + tol
                if int(a.rtt_s // tol) == int(b.rtt_s // tol):  # one bucket: more free first
                    assert a.free_machines >= b.free_machines
                checked += 1
    return checked


def test_pastry_ttl1_willing_lists_equal_the_routing_tables(
    pastry_1000_ttl1: tuple[FlockSim, list[SimNode]],
) -> None:
    sim, nodes = pastry_1000_ttl1
    _check_oracle(sim, nodes, "pastry", 1)
    assert sum(f.stats["forwarded"] for f in sim.flocks.values()) == 0  # TTL 1: no forwarding


def test_pastry_ttl1_sublists_sorted_by_model_rtt(
    pastry_1000_ttl1: tuple[FlockSim, list[SimNode]],
) -> None:
    sim, nodes = pastry_1000_ttl1
    assert _check_sorted(sim, nodes) > 10_000


def test_pastry_sublists_get_farther_with_the_row(
    pastry_1000_ttl1: tuple[FlockSim, list[SimNode]],
) -> None:
    """'Exponentially nearer' (§3.2.1): mean RTT of sublist 0 < sublist 1 (PNS tables)."""
    sim, nodes = pastry_1000_ttl1
    by_row: dict[int, list[float]] = {}
    for x in nodes:
        for r, sub in enumerate(sim[x].willing_list()):
            by_row.setdefault(r, []).extend(e.rtt_s for e in sub if e.rtt_s is not None)
    means = [sum(v) / len(v) for _, v in sorted(by_row.items()) if len(v) > 100]
    assert len(means) >= 2 and means[0] < means[1]


def test_pastry_ttl2_equals_two_step_propagation(
    pastry_300_ttl2: tuple[FlockSim, list[SimNode]],
) -> None:
    sim, nodes = pastry_300_ttl2
    _check_oracle(sim, nodes, "pastry", 2)
    assert sum(f.stats["forwarded"] for f in sim.flocks.values()) > 0
    assert sum(f.stats["duplicate"] for f in sim.flocks.values()) > 0  # copies met twice


def test_pastry_ttl2_sublists_sorted_by_model_rtt(
    pastry_300_ttl2: tuple[FlockSim, list[SimNode]],
) -> None:
    sim, nodes = pastry_300_ttl2
    assert _check_sorted(sim, nodes) > 10_000


def test_smallworld_ttl1_willing_lists_equal_the_connections() -> None:
    sim, nodes = _run(1000, "smallworld", 1)
    _check_oracle(sim, nodes, "smallworld", 1)


def test_smallworld_ttl2_sublists_are_hop_counts() -> None:
    sim, nodes = _run(300, "smallworld", 2)
    _check_oracle(sim, nodes, "smallworld", 2)
    assert _check_sorted(sim, nodes) > 1000


@pytest.mark.slow
def test_pastry_ttl2_on_1000_nodes() -> None:
    sim, nodes = _run(1000, "pastry", 2)
    _check_oracle(sim, nodes, "pastry", 2)
    # what 300 nodes do not exercise: lists with a third row's sublist are common at this size
    # (436 of 1,000 nodes on seed 1, against 20 of 300)
    assert sum(len(sim[x].willing_list()) >= 3 for x in nodes) > len(nodes) // 3
