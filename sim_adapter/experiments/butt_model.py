"""The model of Butt et al. 2006 §5.1 (Tables 2-3): four 3-machine pools, 12 job sequences.

Theory of operation. Butt et al. 2006 §5.1.1 ran four Condor pools of three machines each on
PlanetLab (Table 1: Germany, Berkeley, New York, Texas), fed by 12 sequences of 100 jobs whose
lengths and inter-arrival times are uniform in [1, 17] min, merged into traces of 2, 2, 3 and 5
sequences for pools A-D. The configurations (their Fig. 5):

* **I** — the four pools alone (no flocking);
* **II** — the same pools, each central manager running the self-organizing flock on a Pastry
  ring: here the unmodified :class:`discovery.announce.Flock` plug-in on a simulated
  :class:`~sim_adapter.network.Network` whose latencies are the four sites' RTTs
  (:data:`SITES`, :func:`site_rtt_ms`); each manager's published
  :class:`~discovery.decision.FlockDecision` (collectors, nearest first) becomes its pool's
  ``FLOCK_TO`` list (:meth:`SimulatedPool.set_flock_targets`);
* **III** — one pool of all 12 machines fed all 12 sequences;
* **II-D** — configuration II with all 12 sequences submitted at pool D (their Table 3).

Pools are :class:`~discovery.pool.SimulatedPool` (FIFO, local jobs first, flocked jobs start
only on a machine free now and are never preempted — §5.1.2). Condor's negotiation cycle is
modelled in two places (the papers do not give Condor 6.4's value; PonD §4.2.1 uses 60 s, which
is the default here): a submitted job becomes visible to the pool at the next cycle boundary
of its pool (assumption: a schedd learns of a job only when the negotiator next asks), and once
a cycle each pool with queued jobs and flock targets offers its queue head to them again
(remote negotiation). A machine that frees up takes the next local job at once (assumption:
HTCondor's claim reuse by the schedd, Thain et al. 2004 §5). Wait times are measured from the
*true* submit time, so the cycle delay counts as waiting, as it did on the testbed.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Sequence
from typing import Any

import attrs

from discovery.announce import Flock, FlockConfig
from discovery.decision import FlockDecision
from discovery.pool import JobLedger, SimulatedPool
from sim_adapter.latency import Matrix
from sim_adapter.network import Network
from sim_adapter.plugins.flock import collector_of

__all__ = [
    "CONFIGURATIONS",
    "SITES",
    "ButtConfig",
    "ConfRun",
    "make_traces",
    "simulate",
    "site_rtt_ms",
]

#: Butt et al. 2006 Table 1 sites (pool letter, place, latitude, longitude in degrees). The
#: coordinates are those of the named institutions (Interxion's Frankfurt campus for "Interxion,
#: Germany", UC Berkeley, Columbia University, Rice University).
SITES: tuple[tuple[str, str, float, float], ...] = (
    ("A", "Interxion, Frankfurt, Germany", 50.11, 8.68),
    ("B", "UC Berkeley, CA", 37.87, -122.26),
    ("C", "Columbia University, New York", 40.81, -73.96),
    ("D", "Rice University, Houston, TX", 29.72, -95.40),
)

CONFIGURATIONS = ("I", "II", "III", "II-D")

_EARTH_RADIUS_KM = 6371.0
_FIBRE_KM_PER_MS = 299_792.458 * (2.0 / 3.0) / 1000.0  # light in fibre: ~200 km per ms


def site_rtt_ms(a: int, b: int, overhead_ms: float = 10.0) -> float:
    """RTT between sites ``a`` and ``b`` of :data:`SITES`: the great-circle distance there and
    back at 2/3 c (light in fibre) plus ``overhead_ms`` for routing detours and queues (an
    assumption; PlanetLab RTTs between these sites were not published with the paper)."""
    if a == b:
        return 0.0
    _, _, la1, lo1 = SITES[a]
    _, _, la2, lo2 = SITES[b]
    p1, p2 = math.radians(la1), math.radians(la2)
    dp, dl = p2 - p1, math.radians(lo2 - lo1)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    km = 2 * _EARTH_RADIUS_KM * math.asin(math.sqrt(h))
    return 2.0 * km / _FIBRE_KM_PER_MS + overhead_ms


@attrs.frozen(slots=True)
class ButtConfig:
    """Parameters of the Tables 2-3 experiment (sources beside each field)."""

    #: job sequences — Butt et al. 2006 §5.1.1: "We created 12 such job sequences"
    sequences: int = 12
    #: jobs per sequence — §5.1.1: "a sequence of 100 submissions"
    jobs_per_sequence: int = 100
    #: job length U[lo, hi] minutes — §5.1.1: "random duration between 1 and 17 min"
    length_min: tuple[float, float] = (1.0, 17.0)
    #: inter-arrival U[lo, hi] minutes — §5.1.1: "random interval between 1 and 17 min"
    interarrival_min: tuple[float, float] = (1.0, 17.0)
    #: sequences per pool A-D — §5.1.1: "2, 2, 3, 5 for pools A, B, C, and D"
    split: tuple[int, ...] = (2, 2, 3, 5)
    #: machines per pool — §5.1.1, Table 1: three (the central manager runs jobs too)
    machines_per_pool: int = 3
    #: announcement TTL — §5.1.1: one
    ttl: int = 1
    #: announcement validity — §5.1.1: 1 min
    validity_s: float = 60.0
    #: Flocking Manager period — §5.1.1: 1 min
    manager_period_s: float = 60.0
    #: announcement period — the paper says "periodically"; FlockConfig's default (validity/3)
    announce_period_s: float = 20.0
    #: Condor negotiation cycle — not in the paper; PonD §4.2.1 (Lee et al. 2012) uses 60 s
    negotiation_cycle_s: float = 60.0
    #: machine time each job costs beyond its length (claim activation, shadow/starter start,
    #: transfer): not in the paper; 0 by default, swept in docs/experiments.md (assumption)
    job_overhead_s: float = 0.0
    #: per-RTT overhead added to the great-circle fibre delay (assumption, see site_rtt_ms)
    rtt_overhead_ms: float = 10.0

    def __attrs_post_init__(self) -> None:
        if sum(self.split) != self.sequences or len(self.split) != len(SITES):
            raise ValueError(f"split {self.split} must give {self.sequences} sequences to 4 pools")
        if self.negotiation_cycle_s < 0 or self.job_overhead_s < 0:
            raise ValueError("negotiation_cycle_s and job_overhead_s must be >= 0")

    def as_dict(self) -> dict[str, Any]:
        """The parameters, JSON-friendly."""
        return attrs.asdict(self)


Trace = tuple[list[float], list[float]]  # (submit times, durations), seconds, sorted by submit


def make_traces(cfg: ButtConfig, seed: int) -> list[Trace]:
    """The ``cfg.sequences`` job sequences of one replicate (seconds), each sorted by time."""
    rng = random.Random(f"butt-2006-traces-{seed}")
    out: list[Trace] = []
    for _ in range(cfg.sequences):
        t = 0.0
        sub: list[float] = []
        dur: list[float] = []
        for _ in range(cfg.jobs_per_sequence):
            t += rng.uniform(*cfg.interarrival_min) * 60.0
            sub.append(t)
            dur.append(rng.uniform(*cfg.length_min) * 60.0)
        out.append((sub, dur))
    return out


def _merge(traces: Sequence[Trace]) -> Trace:
    rows = sorted((s, d) for sub, dur in traces for s, d in zip(sub, dur, strict=True))
    return [s for s, _ in rows], [d for _, d in rows]


@attrs.define(slots=True)
class ConfRun:
    """One configuration's run: the ledger, the true submit time of each job, pool names."""

    conf: str
    ledger: JobLedger
    true_submit: array[float]
    pools: list[SimulatedPool]
    flocked_out: int = 0
    decisions: int = 0
    messages: int = 0
    #: virtual time the traces start at (after the ring was built); submit times are offset by it
    t0_s: float = 0.0

    def waits_min(self, pool: str | None = None) -> list[float]:
        """Wait times (minutes, start - true submit) of jobs submitted at ``pool`` (None: all)."""
        led = self.ledger
        idx = None if pool is None else led.pool_names.index(pool)
        return [
            (led.start[j] - self.true_submit[j]) / 60.0
            for j in range(len(led))
            if idx is None or led.origin[j] == idx
        ]


def _visible(t: float, cycle: float, phase: float) -> float:
    """The first negotiation-cycle boundary (``phase + k * cycle``) at or after ``t``."""
    if cycle <= 0:
        return t
    return phase + math.ceil((t - phase) / cycle - 1e-12) * cycle


def _load(
    pool: SimulatedPool, tr: Trace, t0: float, cycle: float, phase: float, overhead_s: float
) -> list[float]:
    subs = [t0 + s for s in tr[0]]
    vis = [_visible(s, cycle, t0 + phase) for s in subs]
    pool.load_trace(vis, [d + overhead_s for d in tr[1]])
    return subs


def simulate(cfg: ButtConfig, seed: int, conf: str, traces: list[Trace] | None = None) -> ConfRun:
    """Run configuration ``conf`` (one of :data:`CONFIGURATIONS`) for replicate ``seed``."""
    if conf not in CONFIGURATIONS:
        raise ValueError(f"unknown configuration {conf!r}; one of {CONFIGURATIONS}")
    traces = traces if traces is not None else make_traces(cfg, seed)
    rng = random.Random(f"butt-2006-{conf}-{seed}")
    cycle = cfg.negotiation_cycle_s
    led = JobLedger()
    if conf == "III":
        pool = SimulatedPool("All", cfg.machines_per_pool * len(SITES), ledger=led)
        true = _load(pool, _merge(traces), 0.0, cycle, rng.uniform(0, cycle), cfg.job_overhead_s)
        _drain(pool)
        return ConfRun(conf, led, array("d", true), [pool])
    per_pool: list[list[Trace]] = []
    k = 0
    for n in cfg.split:
        per_pool.append(traces[k : k + n])
        k += n
    if conf == "II-D":
        per_pool = [[], [], [], list(traces)]
    if conf == "I":
        pools = [SimulatedPool(s[0], cfg.machines_per_pool, ledger=led) for s in SITES]
        true_by_pool = [
            _load(p, _merge(tr), 0.0, cycle, rng.uniform(0, cycle), cfg.job_overhead_s)
            for p, tr in zip(pools, per_pool, strict=True)
        ]
        for p in pools:
            _drain(p)
        return ConfRun(conf, led, _in_id_order(led, true_by_pool), pools)
    return _simulate_flock(cfg, seed, conf, per_pool, led, rng)


def _drain(pool: SimulatedPool) -> None:
    """Run a pool without flocking until nothing is left to happen."""
    while (t := pool.next_event_s()) is not None:
        pool.advance(t)


def _in_id_order(led: JobLedger, true_by_pool: list[list[float]]) -> array[float]:
    """True submit times indexed by job id (pools allocate ids in load order, per pool)."""
    out = array("d", [0.0]) * len(led)
    k = 0
    for subs in true_by_pool:
        for s in subs:
            out[k] = s
            k += 1
    # load_trace allocates ids in submit order within a pool; the visible time is monotone in
    # the true submit time, so ids and true times line up pool by pool
    return out


def _simulate_flock(
    cfg: ButtConfig,
    seed: int,
    conf: str,
    per_pool: list[list[Trace]],
    led: JobLedger,
    rng: random.Random,
) -> ConfRun:
    rows = [[site_rtt_ms(a, b, cfg.rtt_overhead_ms) / 2.0 for b in range(4)] for a in range(4)]
    net = Network(seed=seed, latency=Matrix(rows, unit_s=0.001, source="butt-2006 Table 1"))
    nodes = net.spawn(len(SITES), overlay="pastry", build="joins")
    fcfg = FlockConfig(
        ttl=cfg.ttl,
        validity_s=cfg.validity_s,
        manager_period_s=cfg.manager_period_s,
        announce_period_s=cfg.announce_period_s,
        require_signatures=False,
    )
    cycle = cfg.negotiation_cycle_s
    t0 = math.ceil(net.now / 60.0) * 60.0 + 120.0  # let the first announcements go out
    pools: list[SimulatedPool] = []
    for node, site in zip(nodes, SITES, strict=True):
        pools.append(
            SimulatedPool(
                site[0],
                cfg.machines_per_pool,
                collector=collector_of(node),
                ledger=led,
                runtime=node.core.runtime,
            )
        )
    by_collector = {p.collector: p for p in pools}
    counts = {"decisions": 0}

    def applier(pool: SimulatedPool) -> Any:
        def apply(d: FlockDecision) -> None:
            # the Condor Module: the decision's collectors, nearest first, become FLOCK_TO
            counts["decisions"] += 1
            targets = [by_collector[t.collector] for t in d.targets] if d.enabled else []
            pool.set_flock_targets([p for p in targets if p is not pool])

        return apply

    flocks = [
        Flock(
            node.core,
            pool,
            fcfg,
            collector=pool.collector,
            pool_name=pool.name,
            on_decision=applier(pool),
        )
        for node, pool in zip(nodes, pools, strict=True)
    ]
    for f in flocks:
        f.start()
    true_by_pool = []
    for node, pool, tr in zip(nodes, pools, per_pool, strict=True):
        phase = rng.uniform(0, cycle) if cycle > 0 else 0.0
        true_by_pool.append(_load(pool, _merge(tr), t0, cycle, phase, cfg.job_overhead_s))
        if cycle > 0:
            _arm_negotiator(node.core.runtime, pool, t0 + phase, cycle)
    total = len(led)
    while sum(p.stats["finished"] for p in pools) < total:
        net.run(3600.0)
        if net.now > t0 + 1e7:  # far beyond any trace: the model is broken, do not spin
            raise RuntimeError("butt-2006 simulation did not drain its queues")
    for f in flocks:
        f.stop()
    return ConfRun(
        conf,
        led,
        _in_id_order(led, true_by_pool),
        pools,
        flocked_out=sum(p.stats["flocked_out"] for p in pools),
        decisions=counts["decisions"],
        messages=net.message_count,
        t0_s=t0,
    )


def _arm_negotiator(runtime: Any, pool: SimulatedPool, first_s: float, cycle_s: float) -> None:
    """Once a negotiation cycle, a pool with queued jobs and flock targets offers its queue head
    to them again (the schedd's flocked negotiation), as long as the pool has work left."""

    def tick() -> None:
        if pool.flock_targets and pool.idle_jobs:
            pool.retry_flock()
        if pool.next_event_s() is not None or pool.idle_jobs:
            runtime.call_later(cycle_s, tick)

    runtime.call_later(max(0.0, first_s - runtime.now()), tick)
