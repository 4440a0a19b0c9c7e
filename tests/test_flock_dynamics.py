"""Flock behaviour over time on simulated rings: random order of RTT ties across receivers,
expiry after a pool stops announcing, a denied origin, and a fully signed ring.

Transit-stub latency, static rings (``build="oracle"``), the plugin's own timers where time
matters. Oracles: the brute-force propagation of ``flock_support``.
"""

from __future__ import annotations

from flock_support import pastry_oracle, willing_map

from discovery.announce import FlockConfig
from discovery.policy import Policy
from sim_adapter import Network, latency
from sim_adapter.plugins.flock import FixedPool, FlockSim, spawn_signed
from sim_adapter.simnode import SimNode

SETTLE_S = 3.0


def _ring(n: int, overlay: str, seed: int) -> tuple[Network, list[SimNode]]:
    net = Network(seed=seed, latency=latency.TransitStub(seed=seed))
    return net, net.spawn(n, overlay=overlay, build="oracle")


def _pools(nodes: list[SimNode], free: int = 10) -> dict[int, FixedPool]:
    return {x.index: FixedPool(100, free) for x in nodes}


def test_rtt_ties_are_ordered_differently_on_different_receivers() -> None:
    """§3.2.1: equal proximity is randomized — receivers seeing the same tied pools do not all
    rank them alike. With a huge tolerance every RTT ties, and equal free counts too."""
    net, nodes = _ring(150, "pastry", seed=5)
    cfg = FlockConfig(ttl=2, require_signatures=False, rtt_tolerance_s=10.0)
    sim = FlockSim(net, _pools(nodes), cfg)
    sim.round(SETTLE_S)
    # for every pair of origins listed by two receivers in the same sublist, compare orders
    orders: dict[tuple[int, int], set[bool]] = {}
    for x in nodes:
        for sub in sim[x].willing_list():
            pos = {int(e.origin.id): i for i, e in enumerate(sub)}
            ids = sorted(pos)
            for i, a in enumerate(ids[:6]):
                for b in ids[i + 1 : 6]:
                    orders.setdefault((a, b), set()).add(pos[a] < pos[b])
    shared = list(orders.values())
    assert sum(len(v) == 2 for v in shared) > 0.2 * len(shared)


def test_a_crashed_pool_leaves_every_list_within_validity_plus_a_period() -> None:
    net, nodes = _ring(100, "pastry", seed=2)
    cfg = FlockConfig(ttl=2, require_signatures=False, validity_s=60.0, announce_period_s=20.0)
    sim = FlockSim(net, _pools(nodes), cfg)
    sim.start()
    net.run(65.0)  # every pool announced at least three times
    victim = nodes[17]
    holders = [x for x in nodes if victim.id in willing_map(sim[x])]
    assert len(holders) > 10
    net.crash(victim)
    # its last announcement is at most one period old, so every holder still lists it ...
    net.run(cfg.validity_s - cfg.announce_period_s - 1.0)
    assert all(victim.id in willing_map(sim[x]) for x in holders)
    # ... and by validity + one period after the crash nobody does
    net.run(2 * cfg.announce_period_s + 1.0)
    still = [x for x in nodes if x.alive and victim.id in willing_map(sim[x])]
    assert not still
    # the others are still there (expiry did not empty the lists)
    assert all(len(willing_map(sim[x])) > 0 for x in holders)


def test_a_denied_origin_never_appears_but_is_still_forwarded() -> None:
    net, nodes = _ring(150, "pastry", seed=4)
    bad = nodes[5]
    pol = Policy.loads(f'[announce-from]\ndeny = ["id:{str(bad.id)[:12]}"]\n')
    sim = FlockSim(net, _pools(nodes), FlockConfig(ttl=2, require_signatures=False), policies=pol)
    for _ in range(3):
        sim.round(SETTLE_S)
    assert not [x for x in nodes if bad.id in willing_map(sim[x])]
    denied = sum(f.stats["denied"] for f in sim.flocks.values())
    assert denied > 0
    # the paper forwards "in either case": everyone else's lists still match the oracle
    oracle = pastry_oracle(nodes, 2)
    for x in nodes:
        want = {k: v for k, v in oracle.get(x.id, {}).items() if k != bad.id}
        assert willing_map(sim[x]) == want


def test_signed_ring_end_to_end() -> None:
    """With keyed ids every announcement is signed and verified, and lists still match."""
    net = Network(seed=9, latency=latency.TransitStub(seed=9))
    nodes, idents = spawn_signed(net, 60, overlay="pastry")
    sim = FlockSim(net, _pools(nodes), FlockConfig(ttl=2), identities=idents)
    assert sim.config.require_signatures
    sim.round(SETTLE_S)
    oracle = pastry_oracle(nodes, 2)
    assert all(willing_map(sim[x]) == oracle.get(x.id, {}) for x in nodes)
    rejected = sum(
        f.stats[k] for f in sim.flocks.values() for k in ("forged", "tampered", "unsigned")
    )
    assert rejected == 0
