"""The transitions the paper leaves implicit (Butt et al. 2006 §4.2), in the simulator.

* Two replicas both believe they are the closest to the dead manager (churn): both receive
  ``manager_missing`` and run for the same term; the holders' promises let only one win, and
  the observer (after every event) sees at most one manager per term.
* A spurious ``manager_missing`` (lost alives) reaching a neighbour of a live manager: the
  neighbour does not take over (its own lease, then the holders' leases).
* The original returns while the takeover is still in flight.
"""

from __future__ import annotations

import pytest
from failover_pool import Ledger, manager_id, pool_ring, role

from discovery.failover_messages import ManagerMissing
from discovery.failover_roles import Event, Role
from sim_adapter.plugins.failover import failover_bound_s, preempt_bound_s

OVERLAYS = ("pastry", "smallworld")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_two_replicas_claiming_at_once_yield_one_manager_per_term(overlay: str) -> None:
    net, _nodes, pool = pool_ring(overlay, seed=8)
    ledger = Ledger(pool)
    for _ in range(3):
        ledger.commit()
    net.run(5.0)
    m, mfo = pool.the_manager()  # type: ignore[misc]
    holders = [net.node_by_id(int(h.id)) for h in mfo.holders]
    seq = mfo.seq
    pool.run_until(lambda: mfo.seq > seq, 20.0, step_s=0.01)
    net.run(1.0)  # the alive reached everyone; crash right after it
    pool.crash(m)
    # past the holders' leases on the dead manager, before any listener's detection fires
    net.run(pool.config.lease_s + 2.0)
    assert not any(pool.app(h).stats["takeovers_started"] for h in holders)
    known = pool.app(holders[0]).known
    assert known is not None
    msg = ManagerMissing(known.pool, m.handle, known.term, holders[0].handle, known.holders)
    # deliver the report to every holder at the same instant, as a churned ring could
    for h in holders:
        pool.app(h).deliver(m.id, msg, holders[0].handle)
    claimants = [h for h in holders if pool.app(h).stats["takeovers_started"]]
    assert len(claimants) >= 2
    assert len({pool.app(h).epoch.term for h in claimants}) == 1  # type: ignore[union-attr]
    t = pool.run_until(pool.agreed, failover_bound_s(pool.config))
    assert t == t
    winners = [h for h in holders if pool.app(h).stats["became_manager_takeover"]]
    assert len(winners) == 1
    ledger.check(pool.the_manager()[1])  # type: ignore[index]
    assert pool.violations == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_spurious_manager_missing_does_not_depose_a_live_manager(overlay: str) -> None:
    net, nodes, pool = pool_ring(overlay, seed=9)
    m, mfo = pool.the_manager()  # type: ignore[misc]
    h = net.node_by_id(int(mfo.holders[0].id))
    hfo = pool.app(h)
    known = hfo.known
    assert known is not None
    msg = ManagerMissing(known.pool, m.handle, known.term, nodes[5].handle, known.holders)
    hfo.deliver(m.id, msg, nodes[5].handle)  # its own lease: it answers with the alive
    assert role(hfo) is Role.LISTENER and hfo.stats["missing_redirected"] == 1
    hfo.fire(Event.MISSING_RECEIVED, msg)  # force the candidacy: the holders' leases refuse
    assert role(hfo) is Role.CANDIDATE
    net.run(pool.config.election_timeout_s + 1.0)
    assert role(hfo) is Role.LISTENER
    assert sum(pool.app(x).stats["votes_refused_lease"] for x in nodes if x.alive) >= 2
    assert [n.id for n, _ in pool.serving()] == [m.id]
    assert mfo.epoch is not None and mfo.epoch.term == known.term
    net.run(60.0)
    assert pool.agreed() and manager_id(pool) == m.id


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_original_returning_during_the_takeover(overlay: str) -> None:
    net, _nodes, pool = pool_ring(overlay, seed=10)
    ledger = Ledger(pool)
    for _ in range(4):
        ledger.commit()
    net.run(5.0)
    m, _ = pool.the_manager()  # type: ignore[misc]
    pool.crash(m)
    net.run(pool.config.detection_s - 2.0)  # the listeners are about to report
    back = pool.restart(m)
    t = pool.run_until(
        lambda: pool.agreed() and manager_id(pool) == m.id,
        failover_bound_s(pool.config) + preempt_bound_s(pool.config),
    )
    assert t == t, "no single manager after the original came back mid-takeover"
    fo = pool.app(back)
    ledger.check(fo)
    assert Ledger.number(fo) == 3
    assert pool.violations == []
