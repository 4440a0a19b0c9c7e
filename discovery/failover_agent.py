"""After a manager change, machines re-send their ads and submitters their job requests.

Theory of operation (Butt et al. 2006 §4.2: when faultD installs a new central manager, "the
resources ... send their ClassAds to the new manager" and the schedds their job requests, so the
new manager rebuilds the collector's and negotiator's view; Thain et al. 2004 §5 for the
match-then-claim protocol). A :class:`PoolAgent` runs on every machine of a pool ring next to
faultD (:class:`discovery.failover.Failover`) and plays up to three HTCondor daemons:

* **startd** (``machine=True``): its ad (:class:`AdUpdate`: Unclaimed or Claimed with the job)
  goes to the manager every ``update_period_s``, on every change of the ad, and **at once on
  every manager change** (faultD's change listener is the hook), re-sent every
  ``update_retry_s`` until the manager acknowledges that version. A claim starts the job if the
  machine is free (it is the authority on its slot: one job at a time); a claim for the job it
  runs or ran is answered "accepted" again (idempotent), any other is refused. When the job
  ends it tells the submitter (:class:`JobDone`, re-sent until acknowledged).
* **schedd** (:meth:`PoolAgent.submit`): its idle jobs (:class:`JobRequests`, the whole list)
  go to the manager every ``request_period_s``, on every change of the list, and at once on
  every manager change. A match from the manager it follows moves an idle job to *claiming* and
  sends the claim (re-sent every ``claim_retry_s``); accepted → running, refused or unanswered
  ``claim_retries`` times → idle again. The schedd is the authority on its jobs: a job is
  claimed on one machine at a time and never again once it ran.
* **collector + negotiator** (while faultD makes this node the manager): keeps the newest ad of
  every machine and the newest request list of every submitter, starting *empty* at every
  change (what it holds was re-sent to it), and every ``negotiate_period_s`` matches idle jobs
  to Unclaimed machines, holding a matched machine and job for one cycle.

So a manager change loses nothing and runs nothing twice: running jobs go on (their claims are
between schedd and startd), idle jobs are re-requested, and a split-brain match of one machine
for two jobs is refused by the machine. :class:`CollectorView` shows the collector as the
flock's :class:`~discovery.flock_config.PoolView`: a replacement manager's flock announces what
the re-sent ads say. Malformed or misattributed input is dropped and counted in ``stats``.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

import attrs

from discovery.failover import Failover, ManagerChange
from discovery.failover_agent_messages import (
    CLAIMED,
    UNCLAIMED,
    AdUpdate,
    ClaimReply,
    ClaimRequest,
    DoneAck,
    JobDone,
    JobRequests,
    MatchNotice,
    UpdateAck,
)
from overlay.errors import ConfigError
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.messages import Message
from overlay.runtime import Timer
from overlay.validators import positive

__all__ = ["AgentConfig", "CollectorView", "PoolAgent"]

_MAX_JOBS = 1000  # a request list longer than this is cut (a datagram must hold it)
_MAX_JOB_ID = 64
_RAN_MEMORY = 4096  # jobs a machine remembers having run (answers late duplicate claims)


@attrs.frozen(slots=True)
class AgentConfig:
    """Knobs of the pool agent (HTCondor's names and defaults where it has them)."""

    #: startd ad refresh: HTCondor's UPDATE_INTERVAL default, 300 s
    update_period_s: float = attrs.field(default=300.0, validator=positive)
    #: schedd request refresh: HTCondor's SCHEDD_INTERVAL default, 300 s
    request_period_s: float = attrs.field(default=300.0, validator=positive)
    #: negotiation cycle: HTCondor's NEGOTIATOR_INTERVAL default, 60 s
    negotiate_period_s: float = attrs.field(default=60.0, validator=positive)
    #: an ad or request list the manager has not acknowledged is sent again this often (so
    #: a re-send after a manager change survives datagram loss)
    update_retry_s: float = attrs.field(default=1.0, validator=positive)
    #: ... at most this many times in a row (a dead manager is not flooded; the periodic
    #: refresh and the next manager change send again)
    update_retries: int = attrs.field(default=10, validator=positive)
    #: a claim unanswered this long is sent again (a few WAN round trips)
    claim_retry_s: float = attrs.field(default=2.0, validator=positive)
    #: unanswered claims before the job goes back to idle
    claim_retries: int = attrs.field(default=10, validator=positive)
    #: a job-done unacknowledged this long is sent again, up to ``done_retries`` times
    done_retry_s: float = attrs.field(default=2.0, validator=positive)
    done_retries: int = attrs.field(default=30, validator=positive)


class _Job:
    __slots__ = ("duration_s", "machine", "state", "timer", "tries")

    def __init__(self, duration_s: float) -> None:
        self.duration_s = duration_s
        self.state = "idle"  # idle | claiming | running | done
        self.machine: NodeHandle | None = None
        self.tries = 0
        self.timer: Timer | None = None


class PoolAgent:
    """startd, schedd and (while managing) collector + negotiator of one pool-ring machine."""

    def __init__(
        self,
        failover: Failover,
        config: AgentConfig | None = None,
        *,
        machine: bool = True,
        on_run: Callable[[str, float, float], None] | None = None,
    ) -> None:
        """``machine``: this node runs jobs (a startd); ``on_run(job, start, end)`` is called
        when a job it ran ends (tests, metrics)."""
        self.failover = failover
        self.core = failover.core
        self.config = config if config is not None else AgentConfig()
        self.machine = machine
        self.on_run = on_run
        rt = self.core.runtime
        self.incarnation = rt.rng.getrandbits(62)
        self.stats: Counter[str] = Counter()
        #: the manager this node sends to (itself while serving)
        self.manager: NodeHandle | None = None
        # startd
        self.ad_version = 0
        self.running: tuple[str, NodeHandle] | None = None
        self._ran: OrderedDict[tuple[NodeId, str], None] = OrderedDict()
        self._done: dict[tuple[NodeId, str], tuple[NodeHandle, int, Timer | None]] = {}
        # schedd
        self.jobs: dict[str, _Job] = {}
        self.req_version = 0
        self._next_job = 0
        # collector + negotiator
        self.serving = False
        self.ads: dict[NodeId, AdUpdate] = {}
        self.requests: dict[NodeId, JobRequests] = {}
        self._held_machines: dict[NodeId, tuple[int, float]] = {}
        self._held_jobs: dict[tuple[NodeId, str], float] = {}
        self._timers: dict[str, Timer] = {}
        self._tries: Counter[str] = Counter()
        self._stopped = False
        for cls, fn in (
            (AdUpdate, self._on_ad),
            (JobRequests, self._on_requests),
            (MatchNotice, self._on_match),
            (ClaimRequest, self._on_claim),
            (ClaimReply, self._on_claim_reply),
            (JobDone, self._on_done),
            (DoneAck, self._on_done_ack),
            (UpdateAck, self._on_update_ack),
        ):
            self.core.add_handler(cls, fn)
        failover.add_change_listener(self._on_change)
        if machine:
            self._arm("update", self.config.update_period_s, self._tick_update)
        self._arm("requests", self.config.request_period_s, self._tick_requests)
        if failover.is_manager:
            self._become_manager()
        self.manager = failover.manager
        if machine:  # a startd advertises when it starts
            self.send_ad()

    # ------------------------------------------------------------------ plumbing
    def _arm(self, name: str, delay_s: float, fn: Callable[[], None]) -> None:
        old = self._timers.pop(name, None)
        if old is not None:
            old.cancel()
        if not self._stopped:
            self._timers[name] = self.core.runtime.call_later(delay_s, fn)

    def _send(self, dst: NodeHandle, msg: Message) -> None:
        if dst == self.core.handle:  # this node plays both ends: deliver on the next turn
            me = self.core.handle
            self.core.runtime.call_later(0.0, lambda: self.core.receive(me, msg))
        else:
            self.core.runtime.send(dst, msg)

    @property
    def pool(self) -> NodeId | None:
        """The pool key (faultD's: the original manager's id)."""
        return self.failover.pool

    def stop(self) -> None:
        """Cancel every timer (the node is shutting down)."""
        self._stopped = True
        for t in self._timers.values():
            t.cancel()
        self._timers.clear()
        for j in self.jobs.values():
            if j.timer is not None:
                j.timer.cancel()
        for _h, _n, dt in self._done.values():
            if dt is not None:
                dt.cancel()

    # ------------------------------------------------------------------ the hook
    def _on_change(self, ch: ManagerChange) -> None:
        if ch.i_am_manager and not self.serving:
            self._become_manager()
        elif not ch.i_am_manager and self.serving:
            self.serving = False
            self.stats["stopped_managing"] += 1
            self.ads.clear()
            self.requests.clear()
            t = self._timers.pop("negotiate", None)
            if t is not None:
                t.cancel()
        mgr = self.failover.manager
        if mgr is not None:
            self.manager = mgr
            self.resend()

    def _become_manager(self) -> None:
        # a new reign starts empty: what the collector holds is what was (re-)sent to it
        self.serving = True
        self.stats["became_manager"] += 1
        self.ads.clear()
        self.requests.clear()
        self._held_machines.clear()
        self._held_jobs.clear()
        self._arm("negotiate", self.config.negotiate_period_s, self._negotiate)

    def resend(self) -> None:
        """Send this node's ad and job requests to the manager now (Butt et al. 2006 §4.2)."""
        self.stats["resends"] += 1
        if self.machine:
            self.send_ad()
        if self.jobs:
            self.send_requests()

    # ------------------------------------------------------------------ startd
    def ad_now(self) -> tuple[str, str]:
        """(state, job) of this machine's ad now."""
        r = self.running
        return (CLAIMED, r[0]) if r is not None else (UNCLAIMED, "")

    def send_ad(self, *, retry: bool = False) -> None:
        """Send the ad to the manager (no manager known: nothing)."""
        if not retry:
            self._tries["ad"] = 0
        m, pool = self.manager, self.pool
        if m is None or pool is None or not self.machine:
            return
        state, job = self.ad_now()
        msg = AdUpdate(pool, self.core.handle, self.incarnation, self.ad_version, state, job)
        self._send(m, msg)
        self.stats["ads_sent"] += 1
        self._arm("ad_retry", self.config.update_retry_s, self._retry_ad)

    def _retry_ad(self) -> None:
        self._retry("ad", "ads_retried", self.send_ad)

    def _retry(self, kind: str, retried_stat: str, resend: Callable[..., None]) -> None:
        """The ``{kind}_retry`` timer fired unacknowledged (``kind`` is ``"ad"`` or
        ``"requests"``): send again with ``resend(retry=True)`` unless out of tries."""
        self._timers.pop(f"{kind}_retry", None)
        if self._tries[kind] >= self.config.update_retries:
            self.stats[f"{kind}_unacked"] += 1
            return
        self._tries[kind] += 1
        self.stats[retried_stat] += 1
        resend(retry=True)

    def _on_update_ack(self, src: NodeHandle, m: UpdateAck) -> None:
        mgr = self.manager
        if mgr is None or src.id != mgr.id or m.incarnation != self.incarnation:
            self.stats["ack_ignored"] += 1
            return
        if m.kind == "ad" and m.version == self.ad_version:
            name = "ad_retry"
        elif m.kind == "requests" and m.version == self.req_version:
            name = "requests_retry"
        else:
            return  # an ack of an older version: the newer one is still due
        t = self._timers.pop(name, None)
        if t is not None:
            t.cancel()

    def _tick_update(self) -> None:
        self.send_ad()
        self._arm("update", self.config.update_period_s, self._tick_update)

    def _on_claim(self, src: NodeHandle, m: ClaimRequest) -> None:
        if not self.machine or not isinstance(m.job, str) or not isinstance(m.duration_s, float):
            self.stats["claim_dropped"] += 1
            return
        key = (src.id, m.job)
        r = self.running
        if (r is not None and r[0] == m.job and r[1].id == src.id) or key in self._ran:
            self.stats["claim_duplicate"] += 1
            self._send(src, ClaimReply(m.job, True))
            return
        if r is not None:
            self.stats["claim_refused_busy"] += 1
            self._send(src, ClaimReply(m.job, False))
            return
        if not 0.0 <= m.duration_s <= 1e7:
            self.stats["claim_dropped"] += 1
            return
        rt = self.core.runtime
        self.running = (m.job, src)
        self.ad_version += 1
        self.stats["jobs_started"] += 1
        t0 = rt.now()
        self._arm("job", m.duration_s, lambda: self._finish(m.job, src, t0))
        self._send(src, ClaimReply(m.job, True))
        self.send_ad()

    def _finish(self, job: str, submitter: NodeHandle, t0: float) -> None:
        self.running = None
        self.ad_version += 1
        key = (submitter.id, job)
        self._ran[key] = None
        while len(self._ran) > _RAN_MEMORY:
            self._ran.popitem(last=False)
        self.stats["jobs_finished"] += 1
        if self.on_run is not None:
            self.on_run(job, t0, self.core.runtime.now())
        self._send_done(key, submitter, 0)
        self.send_ad()

    def _send_done(self, key: tuple[NodeId, str], submitter: NodeHandle, n: int) -> None:
        if n >= self.config.done_retries or self._stopped:
            self._done.pop(key, None)
            self.stats["done_unacked"] += 1
            return
        self._send(submitter, JobDone(key[1]))
        t = self.core.runtime.call_later(
            self.config.done_retry_s, lambda: self._send_done(key, submitter, n + 1)
        )
        self._done[key] = (submitter, n, t)

    def _on_done_ack(self, src: NodeHandle, m: DoneAck) -> None:
        d = self._done.pop((src.id, m.job), None)
        if d is not None and d[2] is not None:
            d[2].cancel()

    # ------------------------------------------------------------------ schedd
    def submit(self, duration_s: float, job_id: str | None = None) -> str:
        """Queue a job that runs ``duration_s`` on the machine it is matched to; its id."""
        if duration_s < 0:
            raise ConfigError("duration_s must be >= 0")
        self._next_job += 1
        jid = job_id or f"{self.core.id.short()}.{self._next_job}"
        if jid in self.jobs or len(jid) > _MAX_JOB_ID:
            raise ConfigError(f"job id {jid!r} is taken or too long")
        self.jobs[jid] = _Job(float(duration_s))
        self._queue_changed()
        return jid

    def pending(self) -> frozenset[str]:
        """The idle jobs (what the requests list)."""
        return frozenset(j for j, r in self.jobs.items() if r.state == "idle")

    def _queue_changed(self) -> None:
        self.req_version += 1
        self.send_requests()

    def send_requests(self, *, retry: bool = False) -> None:
        """Send the idle-job list to the manager."""
        if not retry:
            self._tries["requests"] = 0
        m, pool = self.manager, self.pool
        if m is None or pool is None:
            return
        idle = tuple(sorted(self.pending()))[:_MAX_JOBS]
        msg = JobRequests(pool, self.core.handle, self.incarnation, self.req_version, idle)
        self._send(m, msg)
        self.stats["requests_sent"] += 1
        self._arm("requests_retry", self.config.update_retry_s, self._retry_requests)

    def _retry_requests(self) -> None:
        self._retry("requests", "requests_retried", self.send_requests)

    def _tick_requests(self) -> None:
        if self.jobs:
            self.send_requests()
        self._arm("requests", self.config.request_period_s, self._tick_requests)

    def _on_match(self, src: NodeHandle, m: MatchNotice) -> None:
        mgr = self.manager
        if mgr is None or src.id != mgr.id or m.pool != self.pool:
            self.stats["match_not_from_manager"] += 1
            return
        j = self.jobs.get(m.job) if isinstance(m.job, str) else None
        if j is None or j.state != "idle" or not isinstance(m.machine, NodeHandle):
            self.stats["match_ignored"] += 1
            return
        j.state, j.machine, j.tries = "claiming", m.machine, 0
        self.stats["claims"] += 1
        self._queue_changed()
        self._claim(m.job, j)

    def _claim(self, jid: str, j: _Job) -> None:
        if j.state != "claiming" or j.machine is None or self._stopped:
            return
        if j.tries >= self.config.claim_retries:
            self.stats["claim_timeout"] += 1
            j.state, j.machine = "idle", None
            self._queue_changed()
            return
        j.tries += 1
        self._send(j.machine, ClaimRequest(jid, j.duration_s))
        j.timer = self.core.runtime.call_later(
            self.config.claim_retry_s, lambda: self._claim(jid, j)
        )

    def _on_claim_reply(self, src: NodeHandle, m: ClaimReply) -> None:
        j = self.jobs.get(m.job) if isinstance(m.job, str) else None
        if j is None or j.state != "claiming" or j.machine is None or j.machine.id != src.id:
            self.stats["claim_reply_ignored"] += 1
            return
        if j.timer is not None:
            j.timer.cancel()
            j.timer = None
        if m.accepted is True:
            j.state = "running"
            self.stats["claims_accepted"] += 1
        else:
            j.state, j.machine = "idle", None
            self.stats["claims_refused"] += 1
            self._queue_changed()

    def _on_done(self, src: NodeHandle, m: JobDone) -> None:
        j = self.jobs.get(m.job) if isinstance(m.job, str) else None
        if j is None:
            self.stats["done_unknown"] += 1
            return
        if j.state != "done":
            # the machine says it ran the job: done, whatever this side thought (a claim whose
            # answers were all lost went back to idle; it must not be matched again)
            if j.machine is None or j.machine.id != src.id:
                self.stats["done_from_other_machine"] += 1
            if j.timer is not None:
                j.timer.cancel()
                j.timer = None
            was_idle = j.state == "idle"
            j.state, j.machine = "done", src
            self.stats["jobs_done"] += 1
            if was_idle:
                self._queue_changed()
        self._send(src, DoneAck(m.job))

    @property
    def finished(self) -> bool:
        """Every job this node submitted is done."""
        return all(j.state == "done" for j in self.jobs.values())

    # ------------------------------------------------------------------ collector + negotiator
    def _on_ad(self, src: NodeHandle, m: AdUpdate) -> None:
        if not self.serving:
            self.stats["ad_not_manager"] += 1
            return
        if src.id != m.machine.id or m.pool != self.pool or m.state not in (UNCLAIMED, CLAIMED):
            self.stats["ad_dropped"] += 1
            return
        old = self.ads.get(src.id)
        self._send(src, UpdateAck("ad", m.incarnation, m.version))
        if old is not None and old.incarnation == m.incarnation and old.version >= m.version:
            self.stats["ad_old"] += 1
            return
        self.ads[src.id] = m
        self.stats["ads_received"] += 1

    def _on_requests(self, src: NodeHandle, m: JobRequests) -> None:
        if not self.serving:
            self.stats["requests_not_manager"] += 1
            return
        if src.id != m.submitter.id or m.pool != self.pool or len(m.jobs) > _MAX_JOBS:
            self.stats["requests_dropped"] += 1
            return
        old = self.requests.get(src.id)
        self._send(src, UpdateAck("requests", m.incarnation, m.version))
        if old is not None and old.incarnation == m.incarnation and old.version >= m.version:
            self.stats["requests_old"] += 1
            return
        self.requests[src.id] = m
        self.stats["requests_received"] += 1

    def _negotiate(self) -> None:
        if not self.serving:
            return
        now = self.core.runtime.now()
        hold = now + self.config.negotiate_period_s
        free = [
            a
            for mid, a in sorted(self.ads.items())
            if a.state == UNCLAIMED
            and not (mid in self._held_machines and self._held_machines[mid][0] >= a.version)
        ]
        for sid, req in sorted(self.requests.items()):
            for job in req.jobs:
                if not free:
                    break
                if self._held_jobs.get((sid, job), -1.0) > now:
                    continue
                ad = free.pop(0)
                self._held_machines[ad.machine.id] = (ad.version, hold)
                self._held_jobs[(sid, job)] = hold
                self._send(req.submitter, MatchNotice(req.pool, job, ad.machine))
                self.stats["matches"] += 1
        # holds last one cycle: a match that came to nothing is made again
        self._held_machines = {k: v for k, v in self._held_machines.items() if v[1] > now}
        self._held_jobs = {k: v for k, v in self._held_jobs.items() if v > now}
        self._arm("negotiate", self.config.negotiate_period_s, self._negotiate)

    def held_ads(self) -> dict[NodeId, tuple[str, str]]:
        """What the collector holds: machine id → (state, job)."""
        return {k: (a.state, a.job) for k, a in self.ads.items()}

    def held_requests(self) -> dict[NodeId, frozenset[str]]:
        """What the negotiator holds: submitter id → idle jobs."""
        return {k: frozenset(r.jobs) for k, r in self.requests.items()}

    def status(self) -> dict[str, Any]:
        """Counts for tools: the ad, the queue and (while managing) the collector."""
        states = Counter(j.state for j in self.jobs.values())
        return {
            "serving": self.serving,
            "manager": str(self.manager.id) if self.manager is not None else None,
            "ad": list(self.ad_now()) if self.machine else None,
            "jobs": dict(states),
            "collector": {"machines": len(self.ads), "submitters": len(self.requests)},
            "stats": dict(self.stats),
        }


class CollectorView:
    """The collector of a :class:`PoolAgent` as a :class:`~discovery.flock_config.PoolView`:
    what a (replacement) manager's flock announces comes from the re-sent ads."""

    def __init__(self, agent: PoolAgent) -> None:
        self.agent = agent

    @property
    def machines(self) -> int:
        """Machines whose ad the collector holds."""
        return len(self.agent.ads)

    @property
    def free_machines(self) -> int:
        """Unclaimed machines."""
        return sum(1 for a in self.agent.ads.values() if a.state == UNCLAIMED)

    @property
    def idle_jobs(self) -> int:
        """Idle jobs the submitters requested."""
        return sum(len(r.jobs) for r in self.agent.requests.values())

    @property
    def running_jobs(self) -> int:
        """Claimed machines."""
        return sum(1 for a in self.agent.ads.values() if a.state == CLAIMED)

    @property
    def utilization(self) -> float:
        """Fraction of machines claimed (0.0 with no ads)."""
        n = self.machines
        return self.running_jobs / n if n else 0.0
