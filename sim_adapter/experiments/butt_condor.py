"""The Condor machinery behind Butt et al. 2006 Tables 2-3 and Butt et al. 2003 Table 1.

Theory of operation. The pools of :mod:`sim_adapter.experiments.butt_model` start a job the
instant a machine is free. Butt et al. explain the gap between their configurations by what that
leaves out (2006 §5.1.2): "four jobs may be processed simultaneously (one each by each Condor
manager) compared to just a single job processed by the single Condor manager", jobs "are first
sent to local managers, which then negotiate the jobs with remote managers (which may be
processing their local jobs and hence do not reply immediately)", and, for the single pool,
"jobs are distributed to any available resource regardless of its proximity to the issuing
machine. This introduces overhead due to shipping a job to far away nodes." This module models
that machinery, one rule at a time (the source of each, or "assumption"):

1. **One negotiator per pool, with its own cycle.** Pool ``Q``'s negotiator runs at
   ``t0 + phase_Q + k * cycle``; only then are idle jobs matched to ``Q``'s unclaimed machines
   (PonD §2.1, Lee et al. 2012: "at each negotiation cycle, this daemon retrieves a list of
   inactive jobs and resource ClassAds"). Condor 6.4's cycle is in neither Butt paper: swept.
   ``phase_Q`` is drawn in ``[0, phase_window_s)`` independently of the cycle, so the cycle
   instants of a longer cycle that is a multiple of a shorter one are a subset of the shorter
   one's (the sweep 20, 60, 300 s compares like with like).
2. **Local submitters first, then flocked ones** in random order (Butt et al. 2006 §5.1.2:
   "preference is given to local jobs"; the order among remote submitters is an assumption —
   HTCondor orders submitters by user priority, and every remote submitter here is one user).
   The machine given to a job is drawn at random among the unclaimed ones (§5.1.2: "jobs are
   distributed to any available resource regardless of its proximity").
3. **The schedd traverses ``FLOCK_TO`` in order**, as HTCondor's ``condor_schedd`` does with its
   flock level: negotiator 0 is the local one, ``FLOCK_TO[i]`` is negotiator ``i + 1``, and a
   schedd is negotiated with by negotiator ``n`` only while ``n <= level``. When negotiator
   ``n == level`` leaves jobs idle ("out of servers") the level rises by one; when negotiator
   ``n`` takes the last idle job ("out of jobs") the level falls to ``n`` (HTCondor
   ``condor_schedd``, ``Scheduler::negotiate``: "We are unsatisfied in this pool. Flock with
   less desirable pools" / "We are out of jobs. Stop flocking with less desirable pools").
   ``FLOCK_TO`` is the Flock plug-in's latest decision, nearest first.
4. **Dispatch costs time that grows with RTT, one job at a time per schedd.** A matched job
   is shipped by its schedd, one after the other (§5.1.2, "one each by each Condor manager"),
   in ``dispatch_fixed_s + dispatch_rtts * RTT(schedd site, machine site)`` seconds; the machine
   is claimed from the match on, and the job's wait ends when it starts running. The two
   constants are not in the papers (assumption): they stand for claim activation, shadow and
   starter start-up and the transfer of the executable (``dispatch_rtts`` round trips: a TCP
   transfer of ``S`` bytes with window ``W`` costs about ``S / W`` RTTs). They are *fitted*,
   once, to the two single-pool means the papers give — 13.02 min on the LAN of 2003 and
   27.47 min on the PlanetLab WAN of 2006
   (:func:`sim_adapter.experiments.butt_sweep.calibrate`); every other cell is then a
   prediction.
5. **Claim reuse; remote jobs are never preempted.** When a job ends, its schedd starts its
   next idle job on the same claimed machine (Thain et al. 2004 §5: "the agent considers
   itself the owner of that resource until told otherwise"); with none idle the claim is
   released. A remote schedd's claim is never taken back for a later local job (Butt et al.
   2006 §5.1.2: "pools are configured not to suspend and move a job once that job has started
   executing"; 2003 §5: "pool A would wait for remote jobs to finish").

Testbeds: ``planetlab-2006`` puts the four pools at the sites of 2006 Table 1 (the RTTs of
:func:`~sim_adapter.experiments.butt_model.site_rtt_ms`) and lets the central managers run jobs
too; ``lan-2003`` puts every machine on one LAN (2006 §5: the earlier work "utilized pools in a
local area setting") with jobs never on the central managers — in this model both give three
execute machines a pool, so only the RTTs differ (the managers' own load is not modelled).
"""

from __future__ import annotations

import functools
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from discovery.announce import Flock, FlockConfig
from discovery.decision import FlockDecision
from overlay.runtime import ManualRuntime, Runtime
from sim_adapter.experiments.butt_1000_model import announce_reach
from sim_adapter.experiments.butt_model import (
    SITES,
    ButtConfig,
    Trace,
    make_traces,
    site_rtt_ms,
)
from sim_adapter.latency import Matrix
from sim_adapter.network import Network
from sim_adapter.plugins.flock import collector_of

__all__ = [
    "TESTBEDS",
    "CondorRun",
    "Machinery",
    "pair_rtt_ms",
    "simulate_condor",
]

#: the two testbeds (module docstring)
TESTBEDS = ("planetlab-2006", "lan-2003")


@attrs.frozen(slots=True)
class Machinery:
    """Parameters of the Condor machinery model (sources in the module docstring)."""

    #: negotiation cycle, s — not in the papers (Condor 6.4); PonD §2.1 reports 60 s; swept
    negotiation_cycle_s: float = 60.0
    #: negotiator phases are drawn in [0, this): the smallest cycle of the sweep, so that the
    #: swept cycles' instants nest (assumption, see rule 1)
    phase_window_s: float = 20.0
    #: fixed part of a dispatch, s — fitted to 2003 Table 1's single pool (13.02 min, LAN) by
    #: ``flockring sim butt-calibrate`` (docs/experiments.md); assumption, not in the papers
    dispatch_fixed_s: float = 7.95
    #: RTT-proportional part of a dispatch (round trips) — fitted to 2006 Table 3's single pool
    #: (27.47 min, WAN) by ``flockring sim butt-calibrate``; assumption, not in the papers
    dispatch_rtts: float = 345.0
    #: a schedd reuses its claim for its next idle job (Thain et al. 2004 §5)
    claim_reuse: bool = True
    #: RTT between two machines of one site or of the 2003 LAN, ms (assumption: a campus LAN)
    lan_rtt_ms: float = 0.5
    #: site of the single pool's manager and schedd in configuration III (assumption: D, the
    #: pool configuration II-D loads, so Table 3's two rows differ only in the pool structure)
    single_pool_site: int = 3

    def __attrs_post_init__(self) -> None:
        if not self.negotiation_cycle_s > 0 or not self.phase_window_s >= 0:
            raise ValueError("negotiation_cycle_s must be > 0 and phase_window_s >= 0")
        if self.dispatch_fixed_s < 0 or self.dispatch_rtts < 0 or self.lan_rtt_ms < 0:
            raise ValueError("dispatch costs and lan_rtt_ms must be >= 0")
        if not 0 <= self.single_pool_site < len(SITES):
            raise ValueError(f"single_pool_site must be a site index 0..{len(SITES) - 1}")

    def as_dict(self) -> dict[str, Any]:
        """The parameters, JSON-friendly."""
        return attrs.asdict(self)


def pair_rtt_ms(testbed: str, a: int, b: int, mach: Machinery, overhead_ms: float) -> float:
    """RTT between sites ``a`` and ``b`` on ``testbed`` (ms)."""
    if testbed == "lan-2003" or a == b:
        return mach.lan_rtt_ms
    if testbed == "planetlab-2006":
        return site_rtt_ms(a, b, overhead_ms)
    raise ValueError(f"unknown testbed {testbed!r}; one of {TESTBEDS}")


class _Machine:
    __slots__ = ("claimed_by", "index", "pool", "site")

    def __init__(self, index: int, pool: int, site: int) -> None:
        self.index = index
        self.pool = pool
        self.site = site
        self.claimed_by: _Schedd | None = None


class _Schedd:
    __slots__ = ("busy", "dispatch", "flock_to", "home", "level", "queue", "site")

    def __init__(self, home: int, site: int) -> None:
        self.home = home
        self.site = site
        self.queue: deque[int] = deque()  # idle, unmatched jobs (FIFO)
        self.dispatch: deque[tuple[int, _Machine]] = deque()  # matched, waiting to be shipped
        self.busy = False
        self.flock_to: list[int] = []  # pool indexes, nearest first
        self.level = 0  # HTCondor's flock level


class _PoolView:
    """What the Flock plug-in reads of one modelled pool (PoolView)."""

    __slots__ = ("_machines", "_schedds")

    def __init__(self, machines: list[_Machine], schedds: list[_Schedd]) -> None:
        self._machines = machines
        self._schedds = schedds

    @property
    def machines(self) -> int:
        return len(self._machines)

    @property
    def free_machines(self) -> int:
        return sum(1 for m in self._machines if m.claimed_by is None)

    @property
    def idle_jobs(self) -> int:
        return sum(len(s.queue) for s in self._schedds)

    @property
    def running_jobs(self) -> int:
        return len(self._machines) - self.free_machines

    @property
    def utilization(self) -> float:
        n = len(self._machines)
        return self.running_jobs / n if n else 0.0


@attrs.define(slots=True)
class CondorRun:
    """One configuration under the machinery model: every job's submit/start/place."""

    conf: str
    pool_names: list[str]
    origin: list[int]  # pool whose schedd the job was submitted to
    schedd_site: list[int]  # site of that schedd
    submit: list[float]
    length: list[float]
    start: list[float]  # NaN until the job starts running
    ran_at: list[int]  # pool whose machine ran it (-1 before)
    ran_site: list[int]
    ran_machine: list[int]  # machine index (-1 before)
    starts: list[int]
    finishes: list[int]
    flocked_out: int = 0
    decisions: int = 0
    messages: int = 0
    t0_s: float = 0.0
    #: per pool, the pools whose TTL-1 announcements reach it (their routing table holds it)
    reach: list[list[int]] | None = None
    #: when each job was matched (left its schedd's idle queue), s
    matched: list[float] = attrs.field(factory=list)
    #: every claim: (machine index, its pool, claimed at s, released at s); with claim reuse
    #: one claim spans several jobs of its schedd
    claims: list[tuple[int, int, float, float]] = attrs.field(factory=list)
    #: pool of every machine, by machine index
    machine_pool: list[int] = attrs.field(factory=list)

    def waits_min(self, pool: str | None = None) -> list[float]:
        """Wait times (minutes, start - submit) of jobs submitted at ``pool`` (None: all)."""
        idx = None if pool is None else self.pool_names.index(pool)
        return [
            (s - t) / 60.0
            for o, s, t in zip(self.origin, self.start, self.submit, strict=True)
            if idx is None or o == idx
        ]

    def exactly_once(self) -> bool:
        """Every job started once and finished once."""
        return all(s == 1 for s in self.starts) and all(f == 1 for f in self.finishes)


class _Model:
    """Pools, schedds and negotiators of one configuration, driven by a Runtime's timers."""

    def __init__(
        self,
        rt: Runtime,
        mach: Machinery,
        rtt_ms: Callable[[int, int], float],
        pool_sites: Sequence[Sequence[int]],
        names: Sequence[str],
        rng: random.Random,
    ) -> None:
        self.rt = rt
        self.mach = mach
        self.rng = rng
        self.rtt_s = [[rtt_ms(a, b) / 1000.0 for b in range(len(SITES))] for a in range(4)]
        self.names = list(names)
        self.machines: list[list[_Machine]] = []
        k = 0
        for p, sites in enumerate(pool_sites):
            row = []
            for s in sites:
                row.append(_Machine(k, p, s))
                k += 1
            self.machines.append(row)
        self.schedds: list[_Schedd] = []
        self.local: list[list[_Schedd]] = [[] for _ in pool_sites]
        self.origin: list[int] = []
        self.schedd_site: list[int] = []
        self.submit: list[float] = []
        self.length: list[float] = []
        self.start: list[float] = []
        self.ran_at: list[int] = []
        self.ran_site: list[int] = []
        self.ran_machine: list[int] = []
        self.starts: list[int] = []
        self.finishes: list[int] = []
        self.owner: list[_Schedd] = []
        self.matched: list[float] = []
        self.claims: list[tuple[int, int, float, float]] = []
        self._claimed_at: dict[int, float] = {}
        self.finished = 0
        self.flocked_out = 0

    def add_schedd(self, home: int, site: int) -> _Schedd:
        s = _Schedd(home, site)
        self.schedds.append(s)
        self.local[home].append(s)
        return s

    def view(self, pool: int) -> _PoolView:
        return _PoolView(self.machines[pool], self.local[pool])

    # -- jobs in ---------------------------------------------------------------------------
    def load(self, s: _Schedd, trace: Trace, t0: float) -> None:
        """Submit ``trace``'s jobs to schedd ``s`` at ``t0`` + their submit times."""
        for sub, dur in zip(*trace, strict=True):
            j = len(self.origin)
            self.origin.append(s.home)
            self.schedd_site.append(s.site)
            self.submit.append(t0 + sub)
            self.length.append(dur)
            self.start.append(math.nan)
            self.ran_at.append(-1)
            self.ran_site.append(-1)
            self.ran_machine.append(-1)
            self.starts.append(0)
            self.finishes.append(0)
            self.matched.append(math.nan)
            self.owner.append(s)
            self.rt.call_later(t0 + sub - self.rt.now(), functools.partial(self._submit, j))

    def _submit(self, j: int) -> None:
        self.owner[j].queue.append(j)

    # -- negotiation -----------------------------------------------------------------------
    def arm_negotiator(self, pool: int, first_s: float) -> None:
        cycle = self.mach.negotiation_cycle_s

        def tick() -> None:
            self.negotiate(pool)
            if self.finished < len(self.origin):
                self.rt.call_later(cycle, tick)

        self.rt.call_later(max(0.0, first_s - self.rt.now()), tick)

    def negotiate(self, pool: int) -> None:
        """One negotiation cycle of ``pool``'s negotiator (rules 1-3)."""
        idle = [m for m in self.machines[pool] if m.claimed_by is None]
        remote = [
            (s, s.flock_to.index(pool) + 1)
            for s in self.schedds
            if s.home != pool and s.queue and pool in s.flock_to[: s.level]
        ]
        self.rng.shuffle(remote)
        for s, n in [(s, 0) for s in self.local[pool] if s.queue] + remote:
            while idle and s.queue:
                m = idle.pop(self.rng.randrange(len(idle)))
                m.claimed_by = s
                self._claimed_at[m.index] = self.rt.now()
                self._matched(s, s.queue.popleft(), m)
            if s.queue:  # out of servers: flock with the next, less desirable pool
                if s.level == n and s.level < len(s.flock_to):
                    s.level += 1
            else:  # out of jobs: stop flocking with less desirable pools
                s.level = n

    # -- dispatch and claims ---------------------------------------------------------------
    def _matched(self, s: _Schedd, j: int, m: _Machine) -> None:
        self.matched[j] = self.rt.now()
        s.dispatch.append((j, m))
        if not s.busy:
            self._ship_next(s)

    def _ship_next(self, s: _Schedd) -> None:
        if not s.dispatch:
            s.busy = False
            return
        s.busy = True
        _j, m = s.dispatch[0]
        mach = self.mach
        d = mach.dispatch_fixed_s + mach.dispatch_rtts * self.rtt_s[s.site][m.site]
        self.rt.call_later(d, lambda: self._shipped(s))

    def _shipped(self, s: _Schedd) -> None:
        j, m = s.dispatch.popleft()
        now = self.rt.now()
        self.start[j] = now
        self.ran_at[j] = m.pool
        self.ran_site[j] = m.site
        self.ran_machine[j] = m.index
        self.starts[j] += 1
        if m.pool != s.home:
            self.flocked_out += 1
        self.rt.call_later(self.length[j], lambda: self._finished(j, m))
        self._ship_next(s)

    def _finished(self, j: int, m: _Machine) -> None:
        self.finishes[j] += 1
        self.finished += 1
        s = m.claimed_by
        assert s is not None
        if self.mach.claim_reuse and s.queue:
            self._matched(s, s.queue.popleft(), m)  # claim reuse: no negotiation
        else:
            m.claimed_by = None
            self.claims.append((m.index, m.pool, self._claimed_at.pop(m.index), self.rt.now()))

    def result(self, conf: str, t0: float) -> CondorRun:
        return CondorRun(
            conf,
            self.names,
            self.origin,
            self.schedd_site,
            self.submit,
            self.length,
            self.start,
            self.ran_at,
            self.ran_site,
            self.ran_machine,
            self.starts,
            self.finishes,
            flocked_out=self.flocked_out,
            t0_s=t0,
            matched=self.matched,
            claims=self.claims,
            machine_pool=[m.pool for row in self.machines for m in row],
        )


def _merge(traces: Sequence[Trace]) -> Trace:
    rows = sorted((s, d) for sub, dur in traces for s, d in zip(sub, dur, strict=True))
    return [s for s, _ in rows], [d for _, d in rows]


def _split(cfg: ButtConfig, traces: list[Trace]) -> list[list[Trace]]:
    out: list[list[Trace]] = []
    k = 0
    for n in cfg.split:
        out.append(traces[k : k + n])
        k += n
    return out


CONFIGURATIONS = ("I", "II", "III", "II-D", "II-A")


def simulate_condor(
    cfg: ButtConfig,
    mach: Machinery,
    seed: int,
    conf: str,
    *,
    testbed: str = "planetlab-2006",
    traces: list[Trace] | None = None,
) -> CondorRun:
    """Run configuration ``conf`` (I, II, III, II-D or II-A: II with every sequence at A, the
    2003 variant) of replicate ``seed`` under the machinery model on ``testbed``."""
    if conf not in CONFIGURATIONS:
        raise ValueError(f"unknown configuration {conf!r}; one of {CONFIGURATIONS}")
    if testbed not in TESTBEDS:
        raise ValueError(f"unknown testbed {testbed!r}; one of {TESTBEDS}")
    traces = traces if traces is not None else make_traces(cfg, seed)
    # phases and machine draws come from their own generator, independent of the cycle and of
    # the testbed, so that a sweep or a testbed changes nothing else (rule 1)
    rng = random.Random(f"butt-condor-{conf}-{seed}")
    phases = [rng.uniform(0.0, mach.phase_window_s) for _ in range(len(SITES))]

    def rtt(a: int, b: int) -> float:
        return pair_rtt_ms(testbed, a, b, mach, cfg.rtt_overhead_ms)

    per_site = cfg.machines_per_pool
    if conf in ("I", "III"):
        rt = ManualRuntime(seed=seed)
        if conf == "III":
            sites = [[s for s in range(len(SITES)) for _ in range(per_site)]]
            model = _Model(rt, mach, rtt, sites, ["All"], rng)
            model.load(model.add_schedd(0, mach.single_pool_site), _merge(traces), 0.0)
            model.arm_negotiator(0, phases[mach.single_pool_site])
        else:
            sites = [[s] * per_site for s in range(len(SITES))]
            model = _Model(rt, mach, rtt, sites, [s[0] for s in SITES], rng)
            for p, tr in enumerate(_split(cfg, traces)):
                model.load(model.add_schedd(p, p), _merge(tr), 0.0)
                model.arm_negotiator(p, phases[p])
        total = len(model.origin)
        while model.finished < total:
            rt.advance(86_400.0)
            if rt.now() > 1e8:
                raise RuntimeError("Condor machinery model did not drain its queues")
        return model.result(conf, 0.0)
    return _simulate_flock(cfg, mach, seed, conf, testbed, traces, rtt, phases, rng)


def _simulate_flock(
    cfg: ButtConfig,
    mach: Machinery,
    seed: int,
    conf: str,
    testbed: str,
    traces: list[Trace],
    rtt: Callable[[int, int], float],
    phases: list[float],
    rng: random.Random,
) -> CondorRun:
    rows = [[rtt(a, b) / 2.0 for b in range(4)] for a in range(4)]
    lat = Matrix(rows, unit_s=0.001, same_row_s=mach.lan_rtt_ms / 2000.0, source=testbed)
    net = Network(seed=seed, latency=lat)
    nodes = net.spawn(len(SITES), overlay="pastry", build="joins")
    rt = nodes[0].core.runtime  # every node's runtime schedules on the network's one engine
    sites = [[s] * cfg.machines_per_pool for s in range(len(SITES))]
    model = _Model(rt, mach, rtt, sites, [s[0] for s in SITES], rng)
    schedds = [model.add_schedd(p, p) for p in range(len(SITES))]
    t0 = math.ceil(net.now / 60.0) * 60.0 + 120.0  # let the first announcements go out
    loads: list[list[Trace]]
    if conf == "II":
        loads = _split(cfg, traces)
    else:
        loads = [[], [], [], []]
        loads[3 if conf == "II-D" else 0] = list(traces)
    for s, tr in zip(schedds, loads, strict=True):
        if tr:
            model.load(s, _merge(tr), t0)
    by_collector = {collector_of(n): p for p, n in enumerate(nodes)}
    counts = {"decisions": 0}

    def applier(p: int) -> Callable[[FlockDecision], None]:
        def apply(d: FlockDecision) -> None:
            # the Condor Module renders the decision into FLOCK_TO (nearest first); the schedd
            # keeps its flock level but never beyond the new list
            counts["decisions"] += 1
            s = schedds[p]
            s.flock_to = [by_collector[t.collector] for t in d.targets] if d.enabled else []
            s.flock_to = [q for q in s.flock_to if q != p]
            s.level = min(s.level, len(s.flock_to))

        return apply

    fcfg = FlockConfig(
        ttl=cfg.ttl,
        validity_s=cfg.validity_s,
        manager_period_s=cfg.manager_period_s,
        announce_period_s=cfg.announce_period_s,
        require_signatures=False,
    )
    flocks = [
        Flock(
            node.core,
            model.view(p),
            fcfg,
            collector=collector_of(node),
            pool_name=SITES[p][0],
            on_decision=applier(p),
        )
        for p, node in enumerate(nodes)
    ]
    for f in flocks:
        f.start()
    for p in range(len(SITES)):
        model.arm_negotiator(p, t0 + phases[p])
    total = len(model.origin)
    while model.finished < total:
        net.run(3600.0)
        if net.now > t0 + 1e8:
            raise RuntimeError("Condor machinery model did not drain its queues")
    for f in flocks:
        f.stop()
    run = model.result(conf, t0)
    run.decisions = counts["decisions"]
    run.messages = net.message_count
    run.reach = [sorted(s) for s in announce_reach(nodes)]
    return run
