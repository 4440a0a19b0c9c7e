"""A submit node's job queue for the PonD job experiments, and the log every check reads.

Theory of operation (PonD §3.2, Fig. 4; Thain et al. 2004 §5). A C-PonD submit node runs a
``condor_schedd`` (the queue) and, as the pond's central manager, the negotiator that matches
the pond's members to its idle jobs. :class:`PondJobQueue` is both, in virtual time, for
:class:`discovery.pond_scheduler.PondScheduler` (it implements the scheduler's ``JobSource`` and
``PondNegotiator`` protocols):

* a task is queued with its job ad and run time; ``idle_jobs``/``running_jobs`` are what the
  schedd reports (``condor_q``);
* ``negotiate(cluster, members)`` starts idle tasks of an autocluster, oldest first, one per
  member that runs nothing **and whose startd reports to this pond** — the machine is alive
  and its ad carries this autocluster's pond stamp (the negotiator of a pond only sees startds
  whose ``CONDOR_HOST`` is its manager; a crashed or released machine is not among them);
* a task ends after its run time; if its machine is lost first (:meth:`worker_lost`), the run
  is recorded as evicted and the task goes back to the head of the queue after
  ``requeue_after_s`` (the shadow notices its starter is gone; HTCondor then re-runs the job).

Every start is appended to a shared :class:`TaskLog` with the machine, the stamp it carried
and the pond it was meant for, so a test can check — by brute force, with ``classad2`` — that
each task ran exactly once, on a machine that satisfied it at claim time.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from discovery.pond_scheduler import QueuedJob, autocluster
from overlay.handle import NodeHandle
from overlay.runtime import Runtime

__all__ = ["PondJobQueue", "Run", "TaskLog", "TaskSpec"]


@attrs.frozen(slots=True)
class TaskSpec:
    """One task: its job, its index in the job, the job ad, run time, submit time and node."""

    task_id: int
    job_id: int
    ad: str
    duration_s: float
    submit_s: float
    node: int
    zipf: int = 0
    region: str = ""


@attrs.define(slots=True)
class Run:
    """One run of a task on a machine (``end_s`` None while it runs)."""

    task_id: int
    machine: int
    start_s: float
    end_s: float | None = None
    evicted: bool = False
    #: the pond job id stamped on the machine when the run started, and the one it should be
    stamp: str = ""
    pond_job_id: str = ""


class TaskLog:
    """Every task and every run of an experiment (what the checks and figures read)."""

    def __init__(self) -> None:
        self.tasks: dict[int, TaskSpec] = {}
        self.runs: list[Run] = []

    def completed(self) -> dict[int, Run]:
        """The completed run of each task (task id -> run)."""
        return {r.task_id: r for r in self.runs if r.end_s is not None and not r.evicted}

    def waits(self) -> dict[int, float]:
        """Task wait: from submission to the start of the run that completed it."""
        done = self.completed()
        return {t: done[t].start_s - self.tasks[t].submit_s for t in done}


class PondJobQueue:
    """A submit node's queue and pond negotiator (module docstring).

    ``eligible(machine, cluster)`` answers whether ``machine`` can take a task of ``cluster``
    now and returns ``(ok, stamp, pond_job_id)`` for the log. ``on_change`` (the scheduler's
    ``kick``) is called when a task ends or is requeued.
    """

    def __init__(
        self,
        runtime: Runtime,
        log: TaskLog,
        eligible: Callable[[NodeHandle, str], tuple[bool, str, str]],
        *,
        on_change: Callable[[], None] | None = None,
        requeue_after_s: float = 300.0,
    ) -> None:
        self.runtime = runtime
        self.log = log
        self.eligible = eligible
        self.on_change = on_change
        self.requeue_after_s = requeue_after_s
        self._idle: dict[str, deque[TaskSpec]] = {}
        self._running: dict[int, tuple[TaskSpec, NodeHandle, Run]] = {}
        self._busy: dict[int, int] = {}  # machine index -> task id
        self._keys: dict[str, str] = {}  # ad text -> autocluster key (parsing is not free)

    def _key(self, ad: str) -> str:
        k = self._keys.get(ad)
        if k is None:
            k = self._keys[ad] = autocluster(ad)
        return k

    def submit(self, task: TaskSpec) -> None:
        """Queue a task (its ad must parse)."""
        self.log.tasks[task.task_id] = task
        self._idle.setdefault(self._key(task.ad), deque()).append(task)

    # ------------------------------------------------------------------ JobSource
    def idle_jobs(self) -> list[QueuedJob]:
        """Queued tasks not running, by autocluster, oldest first."""
        return [QueuedJob(t.task_id, t.ad) for q in self._idle.values() for t in q]

    def running_jobs(self) -> list[QueuedJob]:
        """Tasks running now."""
        return [QueuedJob(t.task_id, t.ad) for t, _, _ in self._running.values()]

    # ------------------------------------------------------------------ PondNegotiator
    def busy(self, machine: NodeHandle) -> bool:
        """Whether ``machine`` runs one of this queue's tasks."""
        return int(machine.address) in self._busy  # type: ignore[call-overload]

    def negotiate(self, cluster: str, members: Sequence[NodeHandle]) -> None:
        """Start idle tasks of ``cluster`` on free members that report to this pond."""
        q = self._idle.get(cluster)
        for m in members:
            if not q:
                break
            idx = int(m.address)  # type: ignore[call-overload]
            if idx in self._busy:
                continue
            ok, stamp, pond_job = self.eligible(m, cluster)
            if not ok:
                continue
            task = q.popleft()
            run = Run(task.task_id, idx, self.runtime.now(), stamp=stamp, pond_job_id=pond_job)
            self.log.runs.append(run)
            self._busy[idx] = task.task_id
            self._running[task.task_id] = (task, m, run)
            self.runtime.call_later(
                task.duration_s, functools.partial(self._finish, task.task_id, run)
            )
        if q is not None and not q:
            del self._idle[cluster]

    def _finish(self, task_id: int, run: Run) -> None:
        cur = self._running.get(task_id)
        if cur is None or cur[2] is not run:
            return  # evicted meanwhile
        del self._running[task_id]
        del self._busy[run.machine]
        run.end_s = self.runtime.now()
        if self.on_change is not None:
            self.on_change()

    # ------------------------------------------------------------------ failures
    def worker_lost(self, machine: int) -> None:
        """``machine`` crashed: its run (if any) is evicted now and the task requeued at the
        head of its autocluster ``requeue_after_s`` later."""
        tid = self._busy.pop(machine, None)
        if tid is None:
            return
        task, _, run = self._running.pop(tid)
        run.end_s = self.runtime.now()
        run.evicted = True
        self.runtime.call_later(self.requeue_after_s, functools.partial(self._requeue, task))

    def _requeue(self, task: TaskSpec) -> None:
        self._idle.setdefault(self._key(task.ad), deque()).appendleft(task)
        if self.on_change is not None:
            self.on_change()

    @property
    def empty(self) -> bool:
        """No idle and no running task."""
        return not self._idle and not self._running

    def pending(self) -> int:
        """Idle plus running tasks."""
        return sum(len(q) for q in self._idle.values()) + len(self._running)

    def snapshot(self) -> dict[str, Any]:
        """Counts for progress reports."""
        return {"idle": sum(len(q) for q in self._idle.values()), "running": len(self._running)}
