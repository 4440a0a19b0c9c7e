"""Pool models: what the Flocking Manager reads about a pool, simulated or live.

Theory of operation. Butt et al. 2006 §4.1 has the Flocking Manager ask the local Condor Module
for the pool's state (machines, free machines, queued jobs, utilization) once a period and decide
whether to flock. :class:`PoolState` is that question as a protocol; two models answer it:

* :class:`SimulatedPool` (this module) — the pool of Butt et al. 2006 §5.1-§5.2: identical
  machines, one job a machine, a FIFO queue of local jobs, local jobs dispatched first, and
  remote (flocked-in) jobs that start only on a machine that is free *now* and are never
  preempted by local jobs that arrive later (§5.1.2: "pools are configured not to suspend and
  move a job once that job has started executing"). It runs in virtual time, either through a
  :class:`~overlay.runtime.Runtime` (one timer a pool, never one a job) or by an explicit
  :meth:`SimulatedPool.advance` from a simulator's loop. Jobs are rows of a shared
  :class:`JobLedger` (typed arrays, ~38 bytes a job) so that 10^7 jobs over 1000 pools fit in
  memory, and every experiment can check that each job ran exactly once, where, and how long
  it waited.
* :class:`~discovery.condor_pool.CondorPool` — a live HTCondor pool read through ``htcondor2``
  (re-exported here).

Sharing rules are enforced by the *accepting* pool when a remote job is offered, as HTCondor's
execute side does at claim time (Thain et al. 2004 §5, matchmaking and claiming: "a resource is
free to refuse a claim even after it has been matched"): admission (one-way agreements and
per-user rules, Epema et al. 1996 §3.1), a per-origin and per-user quota of machines held at
once, and Epema's "number of idle machines must exceed a threshold before transfers to it are
allowed". A refused offer says why (:class:`Refusal`) and leaves the job at the head of its
origin's queue.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Protocol, runtime_checkable

import attrs

from discovery.condor_pool import CondorPool
from discovery.flock_config import PoolView
from discovery.ledger import JobLedger, LedgerCheck, PoolError
from overlay.runtime import Runtime, Timer

__all__ = [
    "CondorPool",
    "JobLedger",
    "LedgerCheck",
    "PoolError",
    "PoolState",
    "Refusal",
    "SharingRules",
    "SimulatedPool",
]

_INF = math.inf


@runtime_checkable
class PoolState(PoolView, Protocol):
    """What the Flocking Manager reads about its pool (Butt et al. 2006 §4.1): the counts of
    :class:`~discovery.flock_config.PoolView` plus the pool's name and collector."""

    @property
    def name(self) -> str:
        """The pool's name (informational)."""
        ...

    @property
    def collector(self) -> str:
        """The pool's central manager as HTCondor names it (``host`` or ``host:port``)."""
        ...


class Refusal(StrEnum):
    """Why an accepting pool refused a remote job (the job stays queued at its origin)."""

    #: this pool does not take jobs from that pool or user (one-way agreement, policy)
    NOT_ADMITTED = "not-admitted"
    #: the origin pool or user already holds its quota of this pool's machines
    QUOTA = "quota"
    #: no machine is free (local jobs go first, so a local queue also means none)
    NO_FREE_MACHINE = "no-free-machine"
    #: free machines do not exceed the sharing threshold (Epema et al. 1996 §3.1)
    IDLE_THRESHOLD = "idle-threshold"


#: ``quota(origin_pool, user)`` -> most machines of this pool that ``user``'s jobs from
#: ``origin_pool`` may hold at once (``user`` is None for the origin pool as a whole); None means
#: no limit. Called with both forms on each offer; both limits must hold.
QuotaFn = Callable[[str, "str | None"], "int | None"]
#: ``admit(origin_pool, user)`` -> may this pool run that user's jobs from that pool at all.
AdmitFn = Callable[[str, str], bool]


@attrs.frozen(slots=True)
class SharingRules:
    """The accepting side's rules for remote jobs (plain callables: no policy-file dependency)."""

    #: admission: one-way agreements and per-user rules (Epema et al. 1996 §3.1); None admits all
    admit: AdmitFn | None = None
    #: machines a remote pool / user may hold at once (Thain et al. 2004 §5: the resource side
    #: decides at claim time); None: unlimited
    quota: QuotaFn | None = None
    #: accept remote jobs only while more than this many machines are free (Epema et al. 1996
    #: §3.1: "the number of idle machines in his pool must exceed a certain threshold")
    idle_machines_threshold: int = attrs.field(default=0)

    @idle_machines_threshold.validator
    def _check_threshold(self, _a: object, v: int) -> None:
        if v < 0:
            raise PoolError(f"idle_machines_threshold must be >= 0, got {v}")


class SimulatedPool:
    """A simulated HTCondor pool (Butt et al. 2006 §5): FIFO queue, local first, no preemption.

    ``machines`` identical machines run one job each. Jobs enter the local FIFO queue by
    :meth:`submit` (now) or :meth:`load_trace` (future arrivals, no per-job timers); a free
    machine takes the head of the local queue at once. Remote jobs come through
    :meth:`offer` / :meth:`flock_to` and start only on a machine free *now* with no local job
    waiting; once started, a job runs to completion. With :meth:`set_flock_targets` the pool
    flocks its queue head to the targets, in order, whenever jobs wait and no local machine is
    free (Butt et al. 2006 §5.2.1: "invokes the flocking mechanism only if all the local
    machines are busy").

    At one virtual instant, completions are processed before arrivals (a machine freed at ``t``
    can take a job that arrives at ``t``), then the queue is dispatched, then the pool flocks.

    Time: with ``runtime`` the pool keeps one timer for its next event and ``now`` defaults to
    ``runtime.now()``; without it a simulator calls :meth:`advance` (see :meth:`next_event_s`).
    """

    def __init__(
        self,
        name: str,
        machines: int,
        *,
        collector: str | None = None,
        ledger: JobLedger | None = None,
        sharing: SharingRules | None = None,
        quota: QuotaFn | None = None,
        admit: AdmitFn | None = None,
        runtime: Runtime | None = None,
        start_s: float | None = None,
    ) -> None:
        if machines < 0:
            raise PoolError(f"machines must be >= 0, got {machines}")
        rules = sharing if sharing is not None else SharingRules()
        if quota is not None:
            rules = attrs.evolve(rules, quota=quota)
        if admit is not None:
            rules = attrs.evolve(rules, admit=admit)
        self._name = name
        self._collector = collector if collector is not None else name
        self._machines = machines
        self._free = machines
        self.sharing = rules
        self.ledger = ledger if ledger is not None else JobLedger()
        self.index = self.ledger._add_pool(self)
        self._runtime = runtime
        self._now = start_s if start_s is not None else (runtime.now() if runtime else 0.0)
        # running jobs: a heap of (finish time, job id); the only per-job state besides the
        # ledger row and, while queued, one slot of the queue array
        self._heap: list[tuple[float, int]] = []
        self._q = array("q")
        self._qhead = 0
        # future arrivals in submit-time order: a range (one trace) or an array (merged)
        self._arr: Sequence[int] = range(0)
        self._arr_pos = 0
        # remote jobs running here, by origin pool index and by (origin, user)
        self._remote_by_origin: Counter[int] = Counter()
        self._remote_by_user: Counter[tuple[int, int]] = Counter()
        self._remote = 0
        self._targets: tuple[SimulatedPool, ...] = ()
        self._advancing = False
        self._flock_pending = False
        self._timer: Timer | None = None
        self._timer_at = _INF
        #: counters: started_local, accepted_remote, flocked_out, finished, refused_<reason>
        self.stats: Counter[str] = Counter()

    # -- PoolState ---------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The pool's name (unique within its ledger)."""
        return self._name

    @property
    def collector(self) -> str:
        """The contact string used when this pool is rendered into ``FLOCK_TO``."""
        return self._collector

    @property
    def machines(self) -> int:
        """Machines of the pool."""
        return self._machines

    @property
    def free_machines(self) -> int:
        """Machines running nothing (as of :attr:`now`)."""
        return self._free

    @property
    def idle_jobs(self) -> int:
        """Local jobs queued (arrived, not started, not flocked out)."""
        return len(self._q) - self._qhead

    @property
    def running_jobs(self) -> int:
        """This pool's jobs running now, here or in other pools."""
        return self.ledger.running_of[self.index]

    @property
    def busy_machines(self) -> int:
        """Machines running a job (local or remote)."""
        return self._machines - self._free

    @property
    def remote_running(self) -> int:
        """Flocked-in jobs running on this pool's machines."""
        return self._remote

    @property
    def utilization(self) -> float:
        """Busy fraction of the machines (0.0 for a pool with none)."""
        return (self._machines - self._free) / self._machines if self._machines else 0.0

    @property
    def now(self) -> float:
        """The pool's virtual clock: events up to here have been processed."""
        return self._now

    # -- jobs in -----------------------------------------------------------------------------

    def submit(self, duration_s: float, *, user: str = "", now: float | None = None) -> int:
        """Queue a local job arriving now; returns its job id (a ledger row)."""
        if not duration_s >= 0.0:
            raise PoolError(f"job duration must be >= 0, got {duration_s}")
        t = self._clock(now)
        self.advance(t)
        j = self.ledger._append(self.index, self.ledger.user_id(user), t, duration_s)
        self._q.append(j)
        self._dispatch(t)
        if self._targets and self._qhead < len(self._q) and not self._advancing:
            self._flock(t)
        self._after_change(t)
        return j

    def load_trace(
        self, submit_s: Sequence[float], duration_s: Sequence[float], *, user: str = ""
    ) -> range:
        """Register future local arrivals (ids are allocated now; jobs queue at their time).

        ``submit_s`` must be sorted and not before :attr:`now`. Returns the job ids. Costs no
        timer and no event per job: arrivals are walked by :meth:`advance`.
        """
        if len(submit_s) != len(duration_s):
            raise PoolError("submit_s and duration_s differ in length")
        if not submit_s:
            return range(0)
        prev = self._now
        for t in submit_s:
            if not t >= prev:
                raise PoolError("trace submit times must be sorted and not in the past")
            prev = t
        if min(duration_s) < 0.0:
            raise PoolError("job durations must be >= 0")
        ids = self.ledger._extend(self.index, self.ledger.user_id(user), submit_s, duration_s)
        pending = self._arr[self._arr_pos :]
        if not pending:
            self._arr = ids
        else:  # merge with arrivals still pending, by submit time (stable: older ids first)
            sub = self.ledger.submit
            self._arr = array("q", sorted([*pending, *ids], key=lambda j: (sub[j], j)))
        self._arr_pos = 0
        self._after_change(self._now)
        return ids

    def queued_jobs(self, limit: int | None = None) -> list[int]:
        """Ids of the queued local jobs, head first (at most ``limit``)."""
        end = len(self._q) if limit is None else min(len(self._q), self._qhead + limit)
        return list(self._q[self._qhead : end])

    # -- time --------------------------------------------------------------------------------

    def next_event_s(self) -> float | None:
        """Virtual time of the next completion or arrival (None: nothing will happen)."""
        t = self._next_event()
        return None if t == _INF else t

    def advance(self, now: float) -> None:
        """Process every completion and arrival up to ``now``, in time order."""
        if now < self._now:
            raise PoolError(f"pool {self._name}: time runs backwards ({now} < {self._now})")
        if self._advancing:
            # an offer from a pool this one is flocking to, at the same instant: this pool is
            # between two instants and consistent; nothing is due before ``now`` here
            if now > self._now and self._next_event() <= now:
                raise PoolError(f"pool {self._name}: re-entrant advance to a later time")
            return
        self._advancing = True
        try:
            self._run_until(now)
        finally:
            self._advancing = False
        self._after_change(now)

    def _run_until(self, now: float) -> None:
        heap, led = self._heap, self.ledger
        sub = led.submit
        nested = led._nesting > 0
        while True:
            tf = heap[0][0] if heap else _INF
            ta = sub[self._arr[self._arr_pos]] if self._arr_pos < len(self._arr) else _INF
            t = tf if tf < ta else ta
            if t > now:
                break
            self._now = t
            while heap and heap[0][0] <= t:  # completions at t first
                self._finish(heapq.heappop(heap)[1])
            arr, pos, q = self._arr, self._arr_pos, self._q
            n = len(arr)
            while pos < n and sub[arr[pos]] <= t:  # then arrivals at t
                q.append(arr[pos])
                pos += 1
            self._arr_pos = pos
            self._dispatch(t)
            if self._targets and self._qhead < len(self._q):
                if nested:
                    self._flock_pending = True
                else:
                    self._flock(t)
        self._now = now
        if self._flock_pending and not nested:
            # deferred from an offer, or new targets: flock at the time reached, never at an
            # earlier one (the targets may have moved on since)
            self._flock(now)

    def _clock(self, now: float | None) -> float:
        if now is not None:
            return now
        return self._runtime.now() if self._runtime is not None else self._now

    def _next_event(self) -> float:
        tf = self._heap[0][0] if self._heap else _INF
        if self._arr_pos < len(self._arr):
            ta = self.ledger.submit[self._arr[self._arr_pos]]
            return ta if ta < tf else tf
        return tf

    def _after_change(self, now: float) -> None:
        rt = self._runtime
        if rt is None or self._advancing:
            return
        nxt = now if self._flock_pending else self._next_event()
        if nxt < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = nxt
            self._timer = rt.call_later(max(0.0, nxt - rt.now()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = _INF
        assert self._runtime is not None
        self.advance(max(self._now, self._runtime.now()))

    # -- dispatch ----------------------------------------------------------------------------

    def _dispatch(self, t: float) -> None:
        q = self._q
        while self._free > 0 and self._qhead < len(q):
            j = q[self._qhead]
            self._qhead += 1
            self._start(j, t)
            self.stats["started_local"] += 1
        if self._qhead > 4096 and self._qhead * 2 > len(q):
            del q[: self._qhead]  # compact the consumed head of the queue array
            self._qhead = 0

    def _start(self, j: int, t: float) -> None:
        led = self.ledger
        led.start[j] = t
        led.ran_at[j] = self.index
        if led.starts[j] < 255:
            led.starts[j] += 1
        led.running_of[led.origin[j]] += 1
        self._free -= 1
        heapq.heappush(self._heap, (t + led.duration[j], j))

    def _finish(self, j: int) -> None:
        led = self.ledger
        if led.finishes[j] < 255:
            led.finishes[j] += 1
        o = led.origin[j]
        led.running_of[o] -= 1
        self._free += 1
        self.stats["finished"] += 1
        if o != self.index:
            self._remote -= 1
            self._remote_by_origin[o] -= 1
            self._remote_by_user[(o, led.user[j])] -= 1

    # -- flocking ----------------------------------------------------------------------------

    def set_flock_targets(self, targets: Sequence[SimulatedPool]) -> None:
        """Pools to flock to, in preference order (nearest first); empty turns flocking off."""
        for p in targets:
            if p.ledger is not self.ledger:
                raise PoolError(f"pool {p.name} keeps its jobs in another ledger")
            if p is self:
                raise PoolError("a pool cannot flock to itself")
        self._targets = tuple(targets)
        if self._targets and self._qhead < len(self._q):
            self._flock_pending = True
            self._after_change(self._now)

    @property
    def flock_targets(self) -> tuple[SimulatedPool, ...]:
        """The current flock targets, in order."""
        return self._targets

    def retry_flock(self, now: float | None = None) -> int:
        """Advance to ``now`` and offer queued jobs to the flock targets; returns jobs sent."""
        t = self._clock(now)
        self.advance(t)
        sent = self._flock(t)
        self._after_change(t)
        return sent

    def _flock(self, t: float) -> int:
        self._flock_pending = False
        sent = 0
        for target in self._targets:
            if self._qhead >= len(self._q):
                break
            n, _ = self._send_head(target, t, None)
            sent += n
        return sent

    def flock_to(
        self, target: SimulatedPool, now: float | None = None, max_jobs: int | None = None
    ) -> tuple[int, Refusal | None]:
        """Offer queued jobs, head first, to ``target`` until it refuses one (or ``max_jobs``).

        Returns ``(jobs sent, the refusal that stopped it or None)``. Both pools are advanced
        to ``now`` first.
        """
        if target.ledger is not self.ledger or target is self:
            raise PoolError(f"cannot flock from {self._name} to {target.name}")
        t = self._clock(now)
        self.advance(t)
        res = self._send_head(target, t, max_jobs)
        self._after_change(t)
        return res

    def _send_head(
        self, target: SimulatedPool, t: float, max_jobs: int | None
    ) -> tuple[int, Refusal | None]:
        sent = 0
        q = self._q
        while self._qhead < len(q) and (max_jobs is None or sent < max_jobs):
            refusal = target._accept(q[self._qhead], t)
            if refusal is not None:
                return sent, refusal
            self._qhead += 1
            sent += 1
            self.stats["flocked_out"] += 1
        return sent, None

    def offer(self, job: int, now: float | None = None) -> Refusal | None:
        """Offer another pool's job to this one; None means accepted and started here.

        The job must be at the head of its origin pool's queue (queues are FIFO); on
        acceptance it leaves that queue.
        """
        led = self.ledger
        if not 0 <= job < len(led):
            raise PoolError(f"unknown job {job}")
        origin = led.pool(led.origin[job])
        assert isinstance(origin, SimulatedPool)  # only SimulatedPools register in a ledger
        if origin is self:
            raise PoolError(f"job {job} is local to {self._name}; it is dispatched, not offered")
        t = self._clock(now)
        origin.advance(t)
        if origin._qhead >= len(origin._q) or origin._q[origin._qhead] != job:
            raise PoolError(f"job {job} is not at the head of {origin.name}'s queue")
        _n, refusal = origin._send_head(self, t, 1)
        origin._after_change(t)
        return refusal

    def _accept(self, j: int, t: float) -> Refusal | None:
        led = self.ledger
        led._nesting += 1
        try:
            self.advance(t)  # free what finished by t; this pool's own flocking waits
        finally:
            led._nesting -= 1
        o, u = led.origin[j], led.user[j]
        rules = self.sharing
        refusal: Refusal | None = None
        if rules.admit is not None and not rules.admit(led.pool_names[o], led.user_names[u]):
            refusal = Refusal.NOT_ADMITTED
        elif self._free == 0 or self._qhead < len(self._q):
            refusal = Refusal.NO_FREE_MACHINE
        elif self._free <= rules.idle_machines_threshold:
            refusal = Refusal.IDLE_THRESHOLD
        elif rules.quota is not None:
            origin_name = led.pool_names[o]
            limit = rules.quota(origin_name, None)
            if limit is not None and self._remote_by_origin[o] >= limit:
                refusal = Refusal.QUOTA
            else:
                limit = rules.quota(origin_name, led.user_names[u])
                if limit is not None and self._remote_by_user[(o, u)] >= limit:
                    refusal = Refusal.QUOTA
        if refusal is not None:
            self.stats["refused_" + refusal.value] += 1
            return refusal
        self._start(j, t)
        self._remote += 1
        self._remote_by_origin[o] += 1
        self._remote_by_user[(o, u)] += 1
        self.stats["accepted_remote"] += 1
        self._after_change(t)
        return None

    def remote_running_from(self, origin: str, user: str | None = None) -> int:
        """Remote jobs of ``origin`` (and ``user``, if given) running here now."""
        led = self.ledger
        o = led._pool_index.get(origin)
        if o is None:
            return 0
        if user is None:
            return self._remote_by_origin[o]
        u = led._user_index.get(user)
        return 0 if u is None else self._remote_by_user[(o, u)]

    def __repr__(self) -> str:
        return (
            f"SimulatedPool({self._name!r}, machines={self._machines}, free={self._free}, "
            f"idle_jobs={self.idle_jobs}, now={self._now})"
        )
