"""The simulated Network itself: determinism, crash, loss, partitions, misuse (toy overlay)."""

from __future__ import annotations

import pytest
from sim_oracles import lookups

from overlay import ConfigError, NodeId, OverlayError
from sim_adapter.latency import Uniform
from sim_adapter.network import Network


@pytest.fixture(autouse=True)
def _toy(toy_overlay: str) -> None:
    return None


def _run(seed: int) -> tuple[list[int], list[int | None], int]:
    net = Network(seed=seed, latency=Uniform(0.01, 0.05, seed=seed), loss=0.02)
    net.spawn(150, overlay="toy", build="oracle")
    rng = net.rng
    pairs = [(rng.choice(net.nodes), NodeId.random(rng)) for _ in range(200)]
    res = net.lookup_many(pairs)
    return [int(n.id) for n in net.nodes], [r.result for r in res], net.message_count


def test_same_seed_same_run_bit_for_bit() -> None:
    assert _run(3) == _run(3)
    assert _run(3)[0] != _run(4)[0]


def test_crash_updates_the_oracle_and_silences_the_node() -> None:
    net = Network(seed=2, latency=Uniform(0.01, 0.05))
    nodes = net.spawn(50, overlay="toy", build="oracle")
    ids = sorted(int(n.id) for n in nodes)
    victim = net.node_by_id(ids[10])
    assert net.closest_live(ids[10]) == victim.id
    net.crash(victim)
    net.crash(victim)  # idempotent
    assert not victim.alive
    assert net.closest_live(ids[10]) in (ids[9], ids[11])
    assert len(net.live_nodes()) == 49
    with pytest.raises(OverlayError, match="crashed"):
        net.lookup(victim, NodeId(1))


def test_partition_drops_cross_traffic_until_healed() -> None:
    net = Network(seed=5, latency=Uniform(0.01, 0.05))
    nodes = net.spawn(100, overlay="toy", build="oracle")
    ordered = sorted(nodes, key=lambda n: n.id)
    left, right = ordered[:50], ordered[50:]
    net.partition([left, right])
    # a key owned by the right half, looked up from the left half, cannot arrive
    r = net.lookup(left[0], right[25].id, timeout_s=30)
    assert r.result != right[25].id
    assert net.dropped_partition > 0
    net.heal()
    net.run(120)  # let suspicions clear through probes
    r = net.lookup(left[0], right[25].id, timeout_s=30)
    assert r.result == right[25].id


def test_loss_is_counted_and_timeouts_return_none() -> None:
    net = Network(seed=1, latency=Uniform(0.01, 0.05), loss=0.5)
    net.spawn(60, overlay="toy", build="oracle")
    res = net.lookup_many([(net.nodes[0], NodeId.random(net.rng)) for _ in range(50)], 0.5)
    assert net.dropped_loss > 0
    assert any(r.result is None for r in res)
    assert all(r.latency_s <= 0.5 for r in res)


def test_misuse_raises_clear_errors() -> None:
    with pytest.raises(ConfigError, match="loss"):
        Network(loss=1.5)
    net = Network(seed=1)
    with pytest.raises(ConfigError, match="unknown overlay 'kad'"):
        net.spawn(3, overlay="kad")
    with pytest.raises(ConfigError, match="unknown build"):
        net.spawn(3, overlay="toy", build="magic")
    net.spawn(3, overlay="toy", build="oracle")
    with pytest.raises(ConfigError, match="cannot add"):
        net.spawn(3, overlay="pastry", build="oracle")
    with pytest.raises(ConfigError):
        net.run(-1)


def test_overlapping_joins_build_a_correct_ring() -> None:
    overlay = "pastry"
    net = Network(seed=11, latency=Uniform(0.02, 0.12, seed=11))
    nodes = net.spawn(300, overlay=overlay, join_interval_s=0.1)
    assert all(n.core.ready for n in nodes)
    # the joins really overlapped: 300 joins in far less virtual time than one at a time
    assert net.now < 300 * 1.0
    rng = net.rng
    pairs = [(rng.choice(nodes), NodeId.random(rng)) for _ in range(600)]
    res = net.lookup_many(pairs)
    assert [r.result for r in res] == [net.closest_live(k) for _, k in pairs]
    with pytest.raises(ConfigError, match="join_interval_s"):
        net.spawn(1, overlay=overlay, join_interval_s=0)


def test_restart_brings_a_crashed_node_back_under_its_id() -> None:
    net = Network(seed=31)
    nodes = net.spawn(60, overlay="pastry", build="oracle")
    net.run(10.0)
    victim = nodes[17]
    net.crash(victim)
    net.run(60.0)
    back = net.restart(victim)
    assert back.id == victim.id and back.index == victim.index and back.alive
    assert net.nodes[victim.index] is back and not victim.alive
    net.run(120.0)
    assert back.core.ready
    assert net.closest_live(back.id) == back.id
    ok, _ = lookups(net, [n for n in net.nodes if n.alive], 300, seed=2)
    assert ok == 1.0
    with pytest.raises(OverlayError):
        net.restart(back)
