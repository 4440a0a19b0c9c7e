"""The manager sits on both rings (Butt et al. 2006 §3.3): 50 flocking pools, one manager crashed.

49 pools run the flock plugin on their managers; pool X runs a pool ring of 6 machines (its
manager and 5 submit machines) with faultD, the flock plugin, the decision push and the
:class:`discovery.site.Site` coordinator. Simplification: the flock ring and X's pool ring are
one simulated overlay (X's machines have adjacent ids, so faultD's replica holders are X's own
machines). Every pool is a :class:`~discovery.pool.SimulatedPool` in one
:class:`~discovery.ledger.JobLedger`; the pools' ``FLOCK_TO`` lists are their managers'
published decisions (X's: the decision its submit machine applied).

Oracles: the ledger (every job started and finished exactly once), brute force over the
announcing manager's routing-table rows (every pool it announces to directly lists X by its
collector again within validity plus one announcement period of the takeover / preemption),
and the full record of applies on X's machines (versions only grow, every machine ends at the
newest decision).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from discovery.announce import Flock, FlockConfig
from discovery.decision import FlockDecision
from discovery.failover import FailoverConfig
from discovery.flock_messages import FlockAnnounce
from discovery.ledger import JobLedger
from discovery.pool import SimulatedPool
from overlay.handle import Address
from overlay.ids import NodeId
from overlay.messages import Message
from overlay.runtime import Runtime
from sim_adapter.latency import Uniform
from sim_adapter.network import Network
from sim_adapter.plugins.failover import failover_bound_s, preempt_bound_s
from sim_adapter.plugins.flock import FlockSim, collector_of
from sim_adapter.plugins.site import SitePool, pool_ids
from sim_adapter.simnode import SimNode

POOLS = 50
LOSS = 0.05  # message loss on every link
X_MACHINES = 6
FCFG = FlockConfig(require_signatures=False)  # validity 60 s, announce 20 s, manager 60 s
FOCFG = FailoverConfig()
X_COLLECTOR = "cmX.pool.sim:9618"
CYCLE_S = 60.0  # negotiation cycle (PonD §4.2.1)
RELIST_S = FCFG.validity_s + FCFG.announce_period_s


def _negotiator(runtime: Runtime, pool: SimulatedPool) -> None:
    """Once a cycle a pool with queued jobs and targets offers its queue head to them again."""

    def tick() -> None:
        if pool.flock_targets and pool.idle_jobs:
            pool.retry_flock()
        runtime.call_later(CYCLE_S, tick)

    runtime.call_later(CYCLE_S * runtime.rng.random(), tick)


def _setter(
    pool: SimulatedPool, by_collector: dict[str, SimulatedPool]
) -> Callable[[FlockDecision], None]:
    def apply(d: FlockDecision) -> None:
        targets = [by_collector[t.collector] for t in d.targets] if d.enabled else []
        pool.set_flock_targets([p for p in targets if p is not pool])

    return apply


def _listed_by(flock: Flock, origin: NodeId) -> bool:
    return any(
        e.collector == X_COLLECTOR and e.origin.id == origin for e in flock.willing_entries()
    )


def _direct_receivers(node: SimNode) -> set[NodeId]:
    """Brute force over the announcer's routing-table rows: who its announcements reach
    directly (the flock plugin sends one copy to every entry of every row, Butt §3.2.1)."""
    core = node.core
    out: set[NodeId] = set()
    r = 0
    while r < 40:
        out.update(h.id for h in core.routing_row(r))  # type: ignore[attr-defined]
        r += 1
    return out


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_flock_role_follows_the_manager_role(seed: int) -> None:
    rng = random.Random(seed)
    net = Network(seed=seed, latency=Uniform(0.01, 0.05, seed=seed), loss=LOSS)
    key = NodeId(rng.getrandbits(160))
    x_ids = pool_ids(key, X_MACHINES)
    others_ids = [NodeId(rng.getrandbits(160)) for _ in range(POOLS - 1)]
    nodes = net.spawn(len(x_ids) + len(others_ids), overlay="pastry", ids=x_ids + others_ids)
    xs, others = nodes[:X_MACHINES], nodes[X_MACHINES:]

    led = JobLedger()
    # X: many machines, little local work (the pool others flock to); its jobs and machines
    # live on, as HTCondor's startds and schedds do, while its central manager is down
    x_pool = SimulatedPool(
        "poolX", 200, collector=X_COLLECTOR, ledger=led, runtime=xs[1].core.runtime
    )
    pools: dict[int, SimulatedPool] = {
        n.index: SimulatedPool(
            f"pool{n.index}", 4, collector=collector_of(n), ledger=led, runtime=n.core.runtime
        )
        for n in others
    }
    by_collector = {p.collector: p for p in pools.values()}
    by_collector[X_COLLECTOR] = x_pool
    t0 = net.now + 150.0
    for p in [*pools.values(), x_pool]:
        k = 20 if p is not x_pool else 10
        sub = sorted(t0 + rng.uniform(0.0, 1200.0) for _ in range(k))
        p.load_trace(sub, [rng.uniform(60.0, 600.0) for _ in range(k)])

    sim = FlockSim(net, pools, FCFG, nodes=others)
    for n in others:
        sim[n].on_decision = _setter(pools[n.index], by_collector)
        _negotiator(n.core.runtime, pools[n.index])
    _negotiator(xs[1].core.runtime, x_pool)
    x_apply = _setter(x_pool, by_collector)
    site = SitePool(
        net,
        xs,
        xs[0],
        x_pool,
        collector=X_COLLECTOR,
        pool_name="poolX",
        flock_config=FCFG,
        failover_config=FOCFG,
        applier_for=lambda n: x_apply if n.index == xs[1].index else (lambda _d: None),
    )
    sim.start()
    site.start()
    t = site.failover.run_until(site.converged, 300.0)
    assert t == t, "pool X never published a first decision to all its machines"
    net.run(max(0.0, t0 + 250.0 - net.now))
    first = site.published()
    assert first is not None and site.site(xs[0]).serving

    # -------- the manager crashes mid-run: a replacement takes the flock role
    t_crash = net.now
    site.crash(xs[0])
    t = site.failover.run_until(lambda: len(site.serving()) == 1, failover_bound_s(FOCFG))
    assert t == t, "no replacement took the flock role"
    rep_node, rep = site.serving()[0]
    assert rep_node.id != xs[0].id
    t_take = net.now
    took_s = t_take - t_crash
    pub = rep.sync.published
    assert pub is not None and pub.epoch > first.epoch  # the replacement's epoch is higher
    # announcements resume under the replacement, with the pool's collector
    assert rep.flock.collector == X_COLLECTOR and rep.flock.stats.get("stray_payload", 0) == 0
    flocks = {n.id: sim[n] for n in others}
    by_id = {n.id: n for n in others}

    # every announcement the loss model drops: (origin, receiver index, issued_at_s)
    lost: list[tuple[NodeId, int, float]] = []

    def on_loss(src: int, dst: Address, msg: Message) -> None:
        if isinstance(msg, FlockAnnounce) and isinstance(dst, int):
            lost.append((msg.origin.id, dst, msg.issued_at_s))

    net.on_loss = on_loss

    def relist_s(node: SimNode) -> float:
        """Run ``RELIST_S`` (validity + one announcement period) from ``node`` taking the flock
        role. Oracle: every other pool that was in ``node``'s routing-table rows throughout
        ``[announce_period_s, RELIST_S]`` (so that several announcements were sent to it)
        lists X by its collector with ``node`` as origin at the end, unless the loss model
        dropped ``node``'s copy of every round issued within the last ``validity_s`` to it
        (soft state: an offer lapses when no copy of it arrives for a validity period, Butt
        et al. §3.2.1). Returns when the last of them listed it."""
        t_role = net.now
        others_ids = {n.id for n in others}
        flock = site.site(node).flock
        rounds: list[float] = []  # when node's flock sent a round (0.5 s resolution)
        sent = flock.stats["sent"]
        due: set[NodeId] | None = None
        first: dict[NodeId, float] = {}
        del lost[:]
        while net.now - t_role < RELIST_S:
            net.run(0.5)
            if flock.stats["sent"] > sent:
                sent = flock.stats["sent"]
                rounds.append(net.now)
            rows = _direct_receivers(node) & others_ids
            if net.now - t_role >= FCFG.announce_period_s:
                due = rows if due is None else due & rows
            for i in rows:
                if i not in first and _listed_by(flocks[i], node.id):
                    first[i] = net.now - t_role
        assert due, f"{node.id.short()} kept no pool in its rows"
        live = net.now - FCFG.validity_s
        recent = sum(1 for t in rounds if t > live)
        assert recent >= 2, f"{node.id.short()} sent {recent} rounds in a validity period"

        def all_lost(i: NodeId) -> bool:
            idx = by_id[i].index
            return sum(1 for o, d, at in lost if o == node.id and d == idx and at > live) >= recent

        missing = {i for i in due if not _listed_by(flocks[i], node.id)}
        excused = {i for i in missing if all_lost(i)}
        assert missing == excused, (
            f"{len(missing - excused)} pools do not list X though a copy reached them"
        )
        assert len(excused) <= 1, f"{len(excused)} pools lost every copy (loss model)"
        return max(first[i] for i in due - excused)

    relist_rep = relist_s(rep_node)

    # -------- the original returns and preempts: the flock role goes back
    net.run(max(0.0, t_crash + 200.0 - net.now))
    back = site.restart(xs[0])
    t = site.failover.run_until(
        lambda: [n.id for n, _ in site.serving()] == [xs[0].id], preempt_bound_s(FOCFG)
    )
    assert t == t, "the original did not take the flock role back"
    assert not site.site(rep_node).serving
    assert rep.flock.announce_now() == 0  # the replacement's flock fell silent
    back_pub = site.site(back).sync.published
    assert back_pub is not None and pub is not None and back_pub.epoch > pub.epoch
    relist_back = relist_s(back)

    # -------- every job of every pool completes exactly once
    total = len(led)
    for _ in range(40):
        if sum(p.stats["finished"] for p in [*pools.values(), x_pool]) >= total:
            break
        net.run(300.0)
    check = led.check()
    assert check.exactly_once, check
    assert sum(p.stats["accepted_remote"] for p in [*pools.values(), x_pool]) > 0  # flocking ran
    assert x_pool.stats["accepted_remote"] > 0  # others flocked to X
    # X's submit machines: versions only grow, and all end at the newest decision
    assert site.monotone()
    net.run(site.submit_config.republish_period_s + 5.0)
    assert site.converged()
    print(
        f"takeover {took_s:.1f} s after the crash; relisted {relist_rep:.1f} s after it, "
        f"{relist_back:.1f} s after the preemption"
    )
