"""Failover under 5% message loss and under a partition that heals, both overlays.

The invariant observer (``sim_adapter.plugins.failover.observe``) runs after every event of the
simulation and raises at the first breach of "at most one serving manager per term" (terms are
unique per epoch too); after healing there must be exactly one manager, every listener must
know it, and no committed state may be lost (the ledger's numbered states).
"""

from __future__ import annotations

import pytest
from failover_pool import Ledger, manager_id, pool_ring

from sim_adapter.plugins.failover import failover_bound_s, preempt_bound_s
from sim_adapter.simnode import SimNode

OVERLAYS = ("pastry", "smallworld")


def _run_committing(ledger: Ledger, seconds: float, every_s: float = 2.0) -> None:
    net = ledger.pool.net
    end = net.now + seconds
    while net.now < end:
        ledger.commit()
        net.run(every_s)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("seed", [1, 2])
def test_five_percent_loss_crash_and_return(overlay: str, seed: int) -> None:
    net, _nodes, pool = pool_ring(overlay, seed=seed, loss=0.05)
    events0 = net.engine.events - pool.checks
    ledger = Ledger(pool)
    _run_committing(ledger, 20.0)
    assert ledger.committed, "nothing committed under 5% loss"
    old, _ = pool.the_manager()  # type: ignore[misc]
    pool.crash(old)
    t = pool.run_until(
        lambda: pool.agreed() and manager_id(pool) != old.id,
        failover_bound_s(pool.config),
    )
    assert t == t, "no agreed replacement within the bound under loss"
    ledger.check(pool.the_manager()[1])  # type: ignore[index]
    _run_committing(ledger, 20.0)
    pool.restart(old)
    t = pool.run_until(
        lambda: pool.agreed() and manager_id(pool) == old.id,
        preempt_bound_s(pool.config),
    )
    assert t == t, "the original did not preempt within the bound under loss"
    ledger.check(pool.the_manager()[1])  # type: ignore[index]
    _run_committing(ledger, 20.0)
    net.run(10.0)
    fo = pool.the_manager()[1]  # type: ignore[index]
    assert Ledger.number(fo) == ledger.last == ledger.next - 1
    assert pool.violations == [] and pool.checks == net.engine.events - events0
    assert net.dropped_loss > 0


def _far_group(nodes: list[SimNode], manager: SimNode, n: int) -> list[SimNode]:
    """``manager`` plus ``n`` nodes half a ring away (none of its replica holders)."""
    ring = sorted(nodes, key=lambda x: int(x.id))
    i = ring.index(manager)
    return [manager] + [ring[(i + len(ring) // 2 + k) % len(ring)] for k in range(n)]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_partition_of_the_manager_heals_to_one_manager(overlay: str) -> None:
    net, nodes, pool = pool_ring(overlay, seed=3, loss=0.05)
    ledger = Ledger(pool)
    _run_committing(ledger, 10.0)
    m, mfo = pool.the_manager()  # type: ignore[misc]
    side_a = _far_group(nodes, m, 5)
    side_b = [x for x in nodes if x not in side_a]
    assert not {h.id for h in mfo.holders} & {x.id for x in side_a}
    net.partition([side_a, side_b])
    # keep committing through whoever is the one manager: the cut-off manager cannot commit
    # (its holders are on the other side) until the other side elects a manager of its own
    _run_committing(ledger, 90.0)
    serving = pool.serving()
    assert len(serving) == 2  # one per side, in different terms (checked at every event)
    assert len({f.epoch.term for _, f in serving if f.epoch}) == 2
    other = next(f for n, f in serving if n.id != m.id)
    assert other.epoch is not None and mfo.epoch is not None and other.epoch > mfo.epoch
    committed_before_heal = ledger.last
    net.heal()
    t = pool.run_until(pool.agreed, 200.0)
    assert t == t, "no single agreed manager after healing"
    final = pool.the_manager()[1]  # type: ignore[index]
    assert Ledger.number(final) >= committed_before_heal
    ledger.check(final)
    assert pool.violations == []
    net.run(60.0)
    assert pool.agreed()  # and it stays that way


def test_partition_keeping_the_holders_with_the_manager_elects_nobody() -> None:
    """The side without a quorum of the holders cannot elect (it would lose committed state);
    after healing its listeners come back to the manager."""
    net, nodes, pool = pool_ring("pastry", seed=4)
    m, mfo = pool.the_manager()  # type: ignore[misc]
    side_a = [m] + [net.node_by_id(int(h.id)) for h in mfo.holders]
    side_b = [x for x in nodes if x not in side_a]
    net.partition([side_a, side_b])
    net.run(120.0)
    assert [n.id for n, _ in pool.serving()] == [m.id]
    assert sum(f.stats["became_manager_takeover"] for _, f in pool.live()) == 0
    net.heal()
    t = pool.run_until(pool.agreed, 120.0)
    assert t == t
    assert manager_id(pool) == m.id
