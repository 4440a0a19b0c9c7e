"""The model of PonD §4.3 (Fig. 8): jobs of concurrent tasks in ponds over 240 WAN machines.

Theory of operation (Lee et al. 2012 §4.3). 240 single-core machines with 1 GB of memory at four
FutureGrid sites — 80 at the University of Chicago, 80 at TACC (Austin), 70 at SDSC (San
Diego), 10 at the University of Florida (Gainesville) — each drawing a ``ZipfAttribute`` 1..10
at start. Delays come from :class:`~sim_adapter.experiments.pond_common.GeoLatency`: the sites'
coordinates, great-circle distance at 2/3 c plus 5 ms one way (an assumption: FutureGrid's
measured RTTs were not published with the paper), 0.25 ms within a site.

Jobs arrive at exponential intervals at a given rate for ``duration_s`` (two hours), each at a
random machine, with several independent concurrent tasks, a memory need and a run time
(:mod:`.pond_workload`) and a Zipf-drawn target value: its tasks' ``Requirements`` are
``TARGET.Memory >= m && TARGET.ZipfAttribute == v``.

* **C-PonD** (:func:`simulate_pond`): every machine runs the unmodified query and pond
  applications (``discovery.query``, ``discovery.pond``) on the small-world ring (Brunet's
  kind) in :class:`~sim_adapter.network.Network`; a submit node's queue
  (:class:`~.pond_queue.PondJobQueue`) is driven by the queue-driven
  :class:`~discovery.pond_scheduler.PondScheduler` (one pond per autocluster, formed, grown,
  shrunk and released with the queue). Every query a scheduler starts is recorded with its
  latency (PonD Fig. 8b).
* **Condor** (:func:`simulate_condor`): one central pool of the same 240 machines, its
  collector and negotiator at UChicago (assumption: the largest site). The negotiator runs a
  cycle every ``cycle_s`` (60 s) and, on a submission, at once if ``min_interval_s`` (20 s) has
  passed since the last cycle, else when it has (PonD Fig. 2); a cycle costs the linear
  matchmaking time (PonD §4.2.1: 1 s per 10^4 machines) and matches idle tasks, oldest first,
  to free machines whose ads satisfy them (``classad2``); a claimed task starts one round trip
  (submit node ↔ machine) later. A machine whose task ends runs the next idle task of the same
  submitter and autocluster at once (claim reuse, Thain et al. 2004 §5; an assumption about
  the schedd's behaviour), else it waits for the next cycle. In a pond the member simply stays
  in the pond, and the scheduler's next cycle (at most ``min_interval_s`` later) gives it the
  next task.

Both write the same :class:`~.pond_queue.TaskLog`; utilisation is ΣRunTime / (T · N) with ``T``
from the first submission to the last task's end (PonD §4.3's formula).
"""

from __future__ import annotations

import functools
import math
import random
from collections import deque
from collections.abc import Sequence
from typing import Any

import attrs

from discovery.classads import MATCH, ClassAd, JobAd, evaluate
from discovery.machine import DictProvider, MachineAd, zipf_value
from discovery.pond_scheduler import PondScheduler, SchedulerConfig
from overlay.handle import NodeHandle
from overlay.smallworld import SmallWorldConfig
from sim_adapter.engine import Engine
from sim_adapter.experiments.pond_common import GeoLatency, great_circle_km, job_ad
from sim_adapter.experiments.pond_queue import PondJobQueue, Run, TaskLog, TaskSpec

__all__ = [
    "SITES",
    "JobsConfig",
    "JobsRun",
    "machine_ads",
    "make_jobs",
    "simulate_condor",
    "simulate_pond",
    "site_rtt_ms",
    "utilisation",
]

#: PonD §4.3 FutureGrid sites: name, latitude, longitude, machines (coordinates of the
#: institutions: U. Chicago, TACC in Austin, SDSC in San Diego, U. Florida in Gainesville)
SITES: tuple[tuple[str, float, float, int], ...] = (
    ("UChicago", 41.79, -87.60, 80),
    ("TACC", 30.39, -97.73, 80),
    ("SDSC", 32.88, -117.24, 70),
    ("UFL", 29.64, -82.35, 10),
)


@attrs.frozen(slots=True)
class JobsConfig:
    """Parameters of the Fig. 8 experiment (sources beside each field)."""

    #: submission rates, jobs per minute (PonD does not print its x values; ours span offered
    #: loads ~0.1-1.15 of the machines under the default job model)
    rates_per_min: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 3.0)
    #: submissions last this long per rate — PonD §4.3: "two hours per each job submission rate"
    duration_s: float = 7200.0
    #: after the last submission, run until every task ended, at most this long
    drain_max_s: float = 3 * 86400.0
    #: machine memory, MiB — PonD §4.3: "1 GB of RAM"
    memory_mb: int = 1024
    #: the ring (C-PonD ran on Brunet, a small-world ring)
    overlay: str = "smallworld"
    #: run the ring's periodic maintenance (near-list exchange, keep-alive pings). Off by
    #: default: no machine fails in PonD §4.3, so the oracle-built ring stays exact, and the
    #: simulator has no bandwidth or queueing model, so maintenance traffic changes no delay a
    #: query sees; it only costs ~95 % of the run time (measured with cProfile)
    ring_maintenance: bool = False
    #: the pond scheduler's knobs (discovery.pond_scheduler defaults: 5 s minimum interval,
    #: 64 machines per pond, 30 s back-off)
    min_interval_s: float = 5.0
    max_pond: int = 64
    grow_backoff_s: float = 30.0
    #: Condor baseline: negotiation cycle and minimum interval — PonD §2.1: 60 s and 20 s
    cycle_s: float = 60.0
    condor_min_interval_s: float = 20.0
    #: Condor's matchmaking round at 10^4 machines (PonD §4.2.1)
    condor_round_s: float = 1.0
    #: per-path delay overhead beyond fibre, one way (assumption, see GeoLatency)
    overhead_s: float = 0.005

    def as_dict(self) -> dict[str, Any]:
        """The parameters, JSON-friendly."""
        return attrs.asdict(self)


def site_rtt_ms(cfg: JobsConfig) -> dict[str, float]:
    """The inter-site RTTs the model uses (ms)."""
    out = {}
    for i, (a, la, lo, _) in enumerate(SITES):
        for b, lb, lob, _ in SITES[i + 1 :]:
            km = great_circle_km(la, lo, lb, lob)
            out[f"{a}-{b}"] = round(2 * (km / (299_792.458 * 2 / 3) + cfg.overhead_s) * 1000, 1)
    return out


def machine_sites() -> list[int]:
    """Site index of each machine, in spawn order."""
    return [i for i, (*_, n) in enumerate(SITES) for _ in range(n)]


def machine_ads(cfg: JobsConfig, seed: int) -> list[ClassAd]:
    """The 240 machines' static ads (``ZipfAttribute`` drawn per machine, PonD §4.3)."""
    rng = random.Random(f"pond-jobs-machines-{seed}")
    ads = []
    for i, s in enumerate(machine_sites()):
        ad = ClassAd()
        name = f"slot1@vm{i}.{SITES[s][0].lower()}"
        ad.update(
            {
                "MyType": "Machine",
                "Name": name,
                "Machine": name,
                "OpSys": "LINUX",
                "Arch": "X86_64",
                "Cpus": 1,
                "Memory": cfg.memory_mb,
                "ZipfAttribute": zipf_value(rng),
                "Site": SITES[s][0],
                "Requirements": True,
                "Rank": 0,
            }
        )
        ads.append(ad)
    return ads


def make_jobs(
    cfg: JobsConfig, model: Any, rate_per_min: float, seed: int, zipf_present: set[int]
) -> tuple[list[TaskSpec], int, int]:
    """Tasks of the jobs submitted at ``rate_per_min`` over ``duration_s``; returns (tasks,
    jobs, jobs skipped because no machine holds their Zipf target)."""
    rng = random.Random(f"pond-jobs-{seed}-{rate_per_min}")
    n = sum(s[3] for s in SITES)
    t = 0.0
    tasks: list[TaskSpec] = []
    jobs = skipped = 0
    while True:
        t += rng.expovariate(rate_per_min / 60.0)
        if t >= cfg.duration_s:
            break
        d = model.draw(rng)
        z = zipf_value(rng)
        node = rng.randrange(n)
        if z not in zipf_present:
            skipped += 1
            continue
        ad = job_ad(f"TARGET.Memory >= {int(d.memory_mb)} && TARGET.ZipfAttribute == {z}")
        for _ in range(d.tasks):
            tasks.append(TaskSpec(len(tasks), jobs, ad, d.runtime_s, t, node, zipf=z))
        jobs += 1
    return tasks, jobs, skipped


@attrs.define(slots=True)
class JobsRun:
    """One system's run at one rate: the log, query latencies and counters."""

    system: str
    rate_per_min: float
    log: TaskLog
    jobs: int
    skipped_jobs: int
    query_latency_s: list[float] = attrs.Factory(list)
    counters: dict[str, int] = attrs.Factory(dict)
    end_s: float = 0.0


def utilisation(log: TaskLog, machines: int) -> float:
    """ΣRunTime / (T · N), T from the first submission to the last task's end (PonD §4.3)."""
    runs = [r for r in log.runs if r.end_s is not None]
    if not runs:
        return 0.0
    t0 = min(t.submit_s for t in log.tasks.values())
    t1 = max(r.end_s for r in runs if r.end_s is not None)
    busy = sum(r.end_s - r.start_s for r in runs if r.end_s is not None)
    return busy / ((t1 - t0) * machines) if t1 > t0 else 0.0


# ---------------------------------------------------------------------- C-PonD
def simulate_pond(
    cfg: JobsConfig, ads: Sequence[ClassAd], tasks: list[TaskSpec], seed: int
) -> tuple[TaskLog, list[float], dict[str, int], float]:
    """Run the tasks through ponds (module docstring); returns the log, every query's latency,
    counters and the end time."""
    from sim_adapter.network import Network
    from sim_adapter.plugins import query as pq

    coords = [(SITES[s][1], SITES[s][2]) for s in machine_sites()]
    net = Network(seed=seed, latency=GeoLatency(coords, overhead_s=cfg.overhead_s), loss=0.0)
    swcfg = (
        SmallWorldConfig(maintenance_enabled=cfg.ring_maintenance)
        if cfg.overlay == "smallworld"
        else None
    )
    net.spawn(len(ads), overlay=cfg.overlay, build="oracle", config=swcfg)
    lat: list[float] = []
    pq.attach(
        net,
        machine_ad=lambda node, _rng: MachineAd(ads[node.index], DictProvider()),
        seed=seed,
        on_query=lambda _node, r: lat.append(r.elapsed_s),
    )
    log = TaskLog()
    scfg = SchedulerConfig(
        min_interval_s=cfg.min_interval_s, max_pond=cfg.max_pond, grow_backoff_s=cfg.grow_backoff_s
    )
    queues: dict[int, tuple[PondJobQueue, PondScheduler]] = {}

    def submitter(i: int) -> tuple[PondJobQueue, PondScheduler]:
        if i in queues:
            return queues[i]
        node = net.nodes[i]
        holder: list[PondScheduler] = []

        def eligible(m: NodeHandle, cluster: str) -> tuple[bool, str, str]:
            w = net.nodes[int(m.address)]  # type: ignore[call-overload]
            c = holder[0].clusters.get(cluster)
            want = c.job_id if c is not None else ""
            mad = pq.machine_of(w) if w.alive else None
            st = mad.stamp if mad is not None else None
            got = st.job_id if st is not None else ""
            return (bool(want) and got == want, got, want)

        q = PondJobQueue(node.core.runtime, log, eligible)
        s = PondScheduler(pq.pond_app(node), q, q, scfg)
        holder.append(s)
        q.on_change = s.kick
        queues[i] = (q, s)
        return q, s

    def submit(batch: list[TaskSpec]) -> None:
        fresh = batch[0].node not in queues
        q, s = submitter(batch[0].node)
        for t in batch:
            q.submit(t)
        if fresh:
            s.start()  # the first cycle sees the job (start() runs one at once)
        else:
            s.kick()

    for batch in _by_job(tasks):
        net.engine.call_later(batch[0].submit_s - net.now, functools.partial(submit, batch))
    t_end = _drive(net, log, len(tasks), cfg)
    counters = {
        "ponds_formed": sum(s.stats["ponds_formed"] for _, s in queues.values()),
        "ponds_grown": sum(s.stats["ponds_grown"] for _, s in queues.values()),
        "ponds_released": sum(s.stats["ponds_released"] for _, s in queues.values()),
        "members_shrunk": sum(s.stats["members_shrunk"] for _, s in queues.values()),
        "stale_declines": sum(pq.pond_app(n).stats["declined_stale"] for n in net.nodes),
        "claimed_declines": sum(pq.pond_app(n).stats["declined_claimed"] for n in net.nodes),
        "messages": net.message_count,
    }
    for _, s in queues.values():
        s.stop()
    return log, lat, counters, t_end


def _by_job(tasks: list[TaskSpec]) -> list[list[TaskSpec]]:
    out: dict[int, list[TaskSpec]] = {}
    for t in tasks:
        out.setdefault(t.job_id, []).append(t)
    return list(out.values())


def _drive(net: Any, log: TaskLog, total: int, cfg: JobsConfig) -> float:
    """Run until every task completed (bounded by ``duration_s + drain_max_s``)."""
    limit = net.now + cfg.duration_s + cfg.drain_max_s
    while len(log.completed()) < total:
        if net.now >= limit:
            raise RuntimeError(
                f"pond-jobs: {total - len(log.completed())} tasks unfinished at {net.now:.0f} s"
            )
        net.run(600.0)
    return max((r.end_s or 0.0) for r in log.runs) if log.runs else 0.0


# ---------------------------------------------------------------------- Condor
def simulate_condor(
    cfg: JobsConfig, ads: Sequence[ClassAd], tasks: list[TaskSpec], seed: int
) -> tuple[TaskLog, dict[str, int], float]:
    """Run the tasks through one central Condor pool (module docstring)."""
    eng = Engine()
    coords = [(SITES[s][1], SITES[s][2]) for s in machine_sites()]
    geo = GeoLatency(coords, overhead_s=cfg.overhead_s)
    n = len(ads)
    order = list(range(n))
    random.Random(f"pond-jobs-condor-{seed}").shuffle(order)
    log = TaskLog()
    idle: deque[TaskSpec] = deque()
    free = set(range(n))
    busy: dict[int, TaskSpec] = {}
    match: dict[tuple[str, int], bool] = {}
    jobs: dict[str, JobAd] = {}
    state = {"last": -math.inf, "next": 0.0, "pending": False, "cycles": 0}
    mm_s = cfg.condor_round_s * n / 10_000

    def ok(t: TaskSpec, m: int) -> bool:
        key = (t.ad, m)
        v = match.get(key)
        if v is None:
            j = jobs.get(t.ad) or jobs.setdefault(t.ad, JobAd.from_text(t.ad))
            v = match[key] = evaluate(j, ads[m])[0] == MATCH
        return v

    def start(t: TaskSpec, m: int, at: float) -> None:
        run = Run(t.task_id, m, at, stamp="condor", pond_job_id="condor")
        log.runs.append(run)
        eng.call_later(at - eng.now + t.duration_s, functools.partial(finish, t, m, run))

    def finish(t: TaskSpec, m: int, run: Run) -> None:
        run.end_s = eng.now
        del busy[m]
        for nxt in idle:  # claim reuse: same submitter, same autocluster
            if nxt.node == t.node and nxt.ad == t.ad:
                idle.remove(nxt)
                busy[m] = nxt
                start(nxt, m, eng.now)
                return
        free.add(m)

    def cycle() -> None:
        state["pending"] = False
        state["last"] = eng.now
        state["cycles"] += 1
        done_at = eng.now + mm_s
        for t in list(idle):
            if not free:
                break
            for m in order:
                if m in free and ok(t, m):
                    free.discard(m)
                    busy[m] = t
                    idle.remove(t)
                    start(t, m, done_at + geo.rtt_s(t.node, m))
                    break
        arm(eng.now + cfg.cycle_s)

    def arm(at: float) -> None:
        if state["pending"] and state["next"] <= at:
            return
        state["next"] = at
        state["pending"] = True
        eng.call_later(at - eng.now, functools.partial(tick, at))

    def tick(at: float) -> None:
        if state["pending"] and state["next"] == at:
            cycle()

    def submit(batch: list[TaskSpec]) -> None:
        idle.extend(batch)
        due = state["last"] + cfg.condor_min_interval_s
        arm(max(eng.now, due))

    for batch in _by_job(tasks):
        eng.call_later(batch[0].submit_s, functools.partial(submit, batch))
    for t in tasks:
        log.tasks[t.task_id] = t
    limit = cfg.duration_s + cfg.drain_max_s
    while len(log.completed()) < len(tasks):
        if eng.now >= limit:
            raise RuntimeError("pond-jobs: Condor baseline did not drain")
        eng.run_until(eng.now + 3600.0)
    end = max((r.end_s or 0.0) for r in log.runs) if log.runs else 0.0
    return log, {"cycles": int(state["cycles"])}, end
