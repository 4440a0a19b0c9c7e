"""Ponds that follow the job queue: one pond per autocluster, grown, shrunk and released.

Theory of operation (PonD §3.2 "upon detecting a job submission ... the number of required
nodes, which are derived from the ClassAds of the local submission queue", §3.2.2, §3.2.3, and
§4.1 on auto-clustering):

* **Autoclusters.** Idle jobs with the same ``Requirements`` and ``Rank`` (as HTCondor prints
  the parsed expressions) form one autocluster, as HTCondor's schedd groups jobs by their
  significant attributes; one query serves the whole autocluster (PonD §4.1).
* **One pond per autocluster**, stamped with the autocluster's id (PonD §3.2.2: machines found
  for one set of requirements are not taken by jobs of another). Each *cycle* the scheduler
  compares, per autocluster, the machines it needs — idle plus running jobs, capped at
  ``max_pond`` — with the pond's members: no pond and idle jobs → form one with ``k`` = idle
  jobs (capped); too few members and idle jobs → grow by the difference (after a round that
  found nobody, not again before ``grow_backoff_s``, unless this scheduler has since given
  machines back); more members than needed → shrink by
  members that run nothing; no idle and no running job → release.
* **Minimum interval** (PonD §3.2.3). Cycles run every ``min_interval_s`` and on
  :meth:`PondScheduler.kick` (a job submitted or finished), but never two within
  ``min_interval_s``: HTCondor's own ``NEGOTIATOR_MIN_INTERVAL`` default, 5 s. A pond serves a
  single submitter, so PonD argues the interval can be short without loading the negotiator.
* **Who starts jobs.** On a live node HTCondor's negotiator inside the pond matches idle jobs to
  the members (the manager is the pond's central manager). The scheduler only sizes ponds; it
  reads the queue through the small :class:`JobSource` protocol and, when given one, asks a
  :class:`PondNegotiator` which members are busy (never shrinking those) and to start jobs on a
  pond's members. :class:`SimulatedJobQueue` is both, in virtual time, for experiments, tests
  and live nodes without HTCondor (``flockring node --pool simulated:…``); :class:`CondorQueue`
  reads the schedds' idle and running jobs (``condor_q``) on a live site, where HTCondor's
  negotiator starts them (no :class:`PondNegotiator`: ponds then never shrink below the running
  jobs, they only grow and are released).
"""

from __future__ import annotations

import functools
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import attrs

from discovery.classads import JobAd
from discovery.pond import PondResult, PoolOnDemand
from overlay.handle import NodeHandle
from overlay.runtime import Runtime, Timer
from overlay.validators import positive

__all__ = [
    "DEMO_JOB_ADS",
    "CondorQueue",
    "JobSource",
    "PondNegotiator",
    "PondScheduler",
    "QueuedJob",
    "SchedulerConfig",
    "SimulatedJobQueue",
    "autocluster",
    "submit_demo_jobs",
]


@attrs.frozen(slots=True)
class QueuedJob:
    """A job of the local queue: its id and its ClassAd (``Requirements``, ``Rank``, ...)."""

    job_id: int
    ad: str


def autocluster(ad_text: str) -> str:
    """The autocluster key of a job ad: its ``Requirements`` and ``Rank`` as parsed and printed
    by ``classad2`` (so spacing does not split a cluster; other attributes do not matter)."""
    job = JobAd.from_text(ad_text)
    return f"{job.requirements!s}\x00{job.rank!s}"


class JobSource(Protocol):
    """The local queue as the scheduler reads it."""

    def idle_jobs(self) -> Sequence[QueuedJob]:
        """Jobs waiting to start, oldest first."""
        ...

    def running_jobs(self) -> Sequence[QueuedJob]:
        """Jobs running now (they hold a pond machine each)."""
        ...


class PondNegotiator(Protocol):
    """What matches a pond's idle jobs to its members (HTCondor's negotiator on live nodes)."""

    def negotiate(self, cluster: str, members: Sequence[NodeHandle]) -> None:
        """Start idle jobs of ``cluster`` on free ``members``."""
        ...

    def busy(self, machine: NodeHandle) -> bool:
        """True while ``machine`` runs a job."""
        ...


@attrs.frozen
class SchedulerConfig:
    """Knobs of :class:`PondScheduler`."""

    #: minimum time between two cycles (PonD §3.2.3; HTCondor NEGOTIATOR_MIN_INTERVAL = 5 s).
    min_interval_s: float = attrs.field(default=5.0, validator=positive)
    #: most machines one autocluster's pond may hold (k of its query is capped at this).
    max_pond: int = attrs.field(default=64, validator=positive)
    #: after a round that found no machine, wait this long before growing that pond again.
    grow_backoff_s: float = attrs.field(default=30.0, validator=positive)


class _Cluster:
    __slots__ = ("ad", "job_id", "next_grow_s", "pending", "pond_id")

    def __init__(self, ad: str, job_id: str) -> None:
        self.ad = ad
        self.job_id = job_id
        self.pond_id: int | None = None
        self.pending = True  # a forming/growing round is in flight
        self.next_grow_s = 0.0


class PondScheduler:
    """Keeps one pond per autocluster of a job queue, sized to the queue (module docstring).

    ``pond`` is this node's :class:`~discovery.pond.PoolOnDemand` (the manager side), ``source``
    the local queue, ``negotiator`` (optional) what starts jobs and knows busy machines.
    Call :meth:`start`; :meth:`kick` after the queue changed.
    """

    def __init__(
        self,
        pond: PoolOnDemand,
        source: JobSource,
        negotiator: PondNegotiator | None = None,
        config: SchedulerConfig | None = None,
    ) -> None:
        self.pond = pond
        self.source = source
        self.negotiator = negotiator
        self.config = config if config is not None else SchedulerConfig()
        self.stats: Counter[str] = Counter()
        self.clusters: dict[str, _Cluster] = {}
        self._timer: Timer | None = None
        self._last = -float("inf")
        self._seq = 0
        self._running = False

    @property
    def _rt(self) -> Runtime:
        return self.pond.core.runtime

    # ------------------------------------------------------------------ timing
    def start(self) -> None:
        """Run a cycle now and every ``min_interval_s`` after."""
        self._running = True
        self.kick()

    def stop(self) -> None:
        """No more cycles (ponds are left as they are: release them first if wanted)."""
        self._running = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def kick(self) -> None:
        """The queue changed: run a cycle as soon as the minimum interval allows."""
        if not self._running:
            return
        now = self._rt.now()
        due = self._last + self.config.min_interval_s
        if now >= due:
            self._cycle()
        elif self._timer is None:
            self._timer = self._rt.call_later(due - now, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._running:
            self._cycle()

    # ------------------------------------------------------------------ the cycle
    def _cycle(self) -> None:
        rt = self._rt
        now = rt.now()
        self._last = now
        self.stats["cycles"] += 1
        idle: dict[str, list[QueuedJob]] = {}
        for j in self.source.idle_jobs():
            idle.setdefault(autocluster(j.ad), []).append(j)
        running: Counter[str] = Counter(autocluster(j.ad) for j in self.source.running_jobs())
        freed = False
        # dict, not set: the order of the clusters' rounds must not depend on string hashing
        for key in list(dict.fromkeys([*idle, *running, *self.clusters])):
            freed |= self._size(key, idle.get(key, []), running[key], now)
        if freed:
            # Machines this scheduler just gave back are free for its other autoclusters: a
            # pond that found nobody need not sit out its back-off (it only guards against
            # re-querying a ring with nothing new to offer). Next cycle, not this one, so the
            # machines have left the released pond before they are asked again.
            soon = now + self.config.min_interval_s
            for c in self.clusters.values():
                c.next_grow_s = min(c.next_grow_s, soon)
        if self._timer is None and (self.clusters or idle):
            self._timer = rt.call_later(self.config.min_interval_s, self._on_timer)

    def _size(self, key: str, idle: list[QueuedJob], running: int, now: float) -> bool:
        """Size the pond of autocluster ``key``; True when it gave machines back."""
        cap = self.config.max_pond
        c = self.clusters.get(key)
        if c is None:
            if idle:  # a new autocluster: one pond, one query for all its jobs
                self._seq += 1
                c = _Cluster(idle[0].ad, f"{self.pond.core.id.short()}.ac{self._seq}")
                self.clusters[key] = c
                self.stats["ponds_formed"] += 1
                c.pond_id = self.pond.form_pond(
                    c.ad,
                    min(len(idle), cap),
                    job_id=c.job_id,
                    on_done=lambda r: self._round_done(key, r),
                )
            return False
        if c.pending or c.pond_id is None:
            return False
        members = self.pond.members(c.pond_id)
        if not idle and not running:
            self.stats["ponds_released"] += 1
            del self.clusters[key]
            self.pond.release(c.pond_id)
            return bool(members)
        neg = self.negotiator
        if neg is not None and idle:
            neg.negotiate(key, members)
        want = min(len(idle) + running, cap)
        if len(members) < want and idle and now >= c.next_grow_s:
            c.pending = True
            self.stats["ponds_grown"] += 1
            self.pond.grow(c.pond_id, want - len(members), lambda r: self._round_done(key, r))
        elif len(members) > want and neg is not None:
            free = [m for m in members if not neg.busy(m)][: len(members) - want]
            if free:
                self.stats["members_shrunk"] += len(free)
                self.pond.shrink(c.pond_id, members=free)
                return True
        return False

    def _round_done(self, key: str, r: PondResult) -> None:
        c = self.clusters.get(key)
        if c is None:
            return
        c.pending = False
        if not r.joined:
            c.next_grow_s = self._rt.now() + self.config.grow_backoff_s
        if self.negotiator is not None and r.members:
            self.negotiator.negotiate(key, r.members)
        self.kick()


# ---------------------------------------------------------------------- the simulated queue
class SimulatedJobQueue:
    """A submit node's queue in virtual time, and the pond negotiator that runs its jobs.

    Jobs are submitted with an ad and a duration; :meth:`negotiate` starts idle jobs of an
    autocluster, oldest first, on members that run nothing, one job a machine, and a job ends
    ``duration`` later (a runtime timer). Every run is recorded in :attr:`runs` as
    ``(job id, machine, start, end)`` so a test can check that each job ran exactly once.
    ``on_change`` (e.g. the scheduler's ``kick``) is called when a job ends.
    """

    def __init__(
        self,
        runtime: Runtime,
        on_change: Callable[[], None] | None = None,
        on_start: Callable[[QueuedJob, NodeHandle], None] | None = None,
    ) -> None:
        self.runtime = runtime
        self.on_change = on_change
        self.on_start = on_start
        self._idle: dict[str, deque[tuple[QueuedJob, float]]] = {}
        self._running: dict[int, tuple[QueuedJob, NodeHandle, float]] = {}
        self._busy: dict[NodeHandle, int] = {}
        self._next = 0
        self.runs: list[tuple[int, NodeHandle, float, float]] = []

    def submit(self, ad: str, duration_s: float) -> int:
        """Queue a job (its ad must parse); returns its id."""
        key = autocluster(ad)
        self._next += 1
        self._idle.setdefault(key, deque()).append((QueuedJob(self._next, ad), duration_s))
        return self._next

    def idle_jobs(self) -> list[QueuedJob]:
        """The queued jobs not yet started, by autocluster."""
        return [j for q in self._idle.values() for j, _ in q]

    def running_jobs(self) -> list[QueuedJob]:
        """The jobs running now."""
        return [j for j, _, _ in self._running.values()]

    def busy(self, machine: NodeHandle) -> bool:
        """Whether ``machine`` runs one of this queue's jobs."""
        return machine in self._busy

    def negotiate(self, cluster: str, members: Sequence[NodeHandle]) -> None:
        """Start idle jobs of ``cluster``, oldest first, one on each of ``members`` that runs
        nothing; each ends after its duration."""
        q = self._idle.get(cluster)
        for m in members:
            if not q:
                break
            if m in self._busy:
                continue
            job, dur = q.popleft()
            now = self.runtime.now()
            self._busy[m] = job.job_id
            self._running[job.job_id] = (job, m, now)
            if self.on_start is not None:
                self.on_start(job, m)
            self.runtime.call_later(dur, functools.partial(self._finish, job.job_id))
        if q is not None and not q:
            del self._idle[cluster]

    def _finish(self, job_id: int) -> None:
        _job, m, t0 = self._running.pop(job_id)
        del self._busy[m]
        self.runs.append((job_id, m, t0, self.runtime.now()))
        if self.on_change is not None:
            self.on_change()

    @property
    def empty(self) -> bool:
        """No idle and no running job."""
        return not self._idle and not self._running


# ---------------------------------------------------------------------- demo jobs
#: job ads of three autoclusters that match most of ``random_machine_ad``'s machines (a live
#: node's simulated queue draws from them: ``flockring node --pool simulated:… --queue-jobs``)
DEMO_JOB_ADS = (
    '[ Requirements = TARGET.Memory >= 2048; Rank = TARGET.Memory; Owner = "alice" ]',
    '[ Requirements = TARGET.Arch == "X86_64"; Rank = TARGET.Cpus; Owner = "bob" ]',
    '[ Requirements = TARGET.Cpus >= 2; Rank = 0; Owner = "carol" ]',
)


def submit_demo_jobs(
    queue: SimulatedJobQueue, n: int, mean_s: float, rng: Any, ads: Sequence[str] = DEMO_JOB_ADS
) -> list[int]:
    """Queue ``n`` jobs with ads drawn from ``ads`` and exponential lengths of mean ``mean_s``
    (``rng``: a seeded ``random.Random``); their ids."""
    return [queue.submit(rng.choice(ads), rng.expovariate(1.0 / mean_s)) for _ in range(n)]


# ---------------------------------------------------------------------- a live schedd
_IDLE, _RUNNING = 1, 2


class CondorQueue:
    """The schedds' queue as a :class:`JobSource`, read through an ad source (PonD §3.2: "the
    number of required nodes ... derived from the ClassAds of the local submission queue").

    ``jobs`` returns job ads (``classad2.ClassAd``: e.g. the second source of
    ``discovery.condor_pool.htcondor_ad_sources``, or recorded ``condor_q -long`` text).
    :meth:`read` calls it, keeps the idle (``JobStatus == 1``) and running (``2``) jobs and
    returns every ad, so that a ``CondorPool(job_ads=queue.read)`` refreshes both with one
    schedd query. Blocking: a live node calls it in a worker thread. A job's id is
    ``ClusterId * 1_000_000 + ProcId``; an ad without them, or whose ``Requirements``/``Rank``
    does not parse, is skipped and counted in :attr:`stats`.
    """

    def __init__(self, jobs: Callable[[], Iterable[Any]]) -> None:
        self._source = jobs
        self._idle: list[QueuedJob] = []
        self._running: list[QueuedJob] = []
        self.stats: Counter[str] = Counter()

    def read(self) -> list[Any]:
        """Read the queue now (blocking); returns the ads read."""
        ads = list(self._source())
        idle: list[QueuedJob] = []
        running: list[QueuedJob] = []
        for ad in ads:
            try:
                status = ad.eval("JobStatus")
                jid = int(ad.eval("ClusterId")) * 1_000_000 + int(ad.eval("ProcId"))
                text = str(ad)
                autocluster(text)  # parses Requirements and Rank: a bad ad is skipped here
            except Exception:
                self.stats["unreadable"] += 1
                continue
            if status == _IDLE:
                idle.append(QueuedJob(jid, text))
            elif status == _RUNNING:
                running.append(QueuedJob(jid, text))
        self._idle, self._running = idle, running
        self.stats["reads"] += 1
        return ads

    def idle_jobs(self) -> list[QueuedJob]:
        """Idle jobs of the last read, in the schedd's order."""
        return list(self._idle)

    def running_jobs(self) -> list[QueuedJob]:
        """Running jobs of the last read."""
        return list(self._running)
