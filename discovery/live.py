"""The discovery plugins on a live ``overlay.Node``: trio wrappers and control endpoints.

The plugins are sans-io objects registered on the node's core; their timers run on the node's
trio runtime and their completion callbacks fire inside the node's tasks. This module turns
those callbacks into awaitables (:func:`wait_for`), attaches the plugins to a running node with
the node's own Ed25519 identity as their signer (:class:`Discovery`), and answers the control
requests of :mod:`discovery.control` so that ``flockring flock|query|pond|manager`` can talk to
a running node. The same plugin objects run unchanged in the simulator
(``sim_adapter.plugins``): nothing here changes protocol behaviour.

Two compositions are wired here: a *site* node (:meth:`Discovery.attach_site`: faultD, the
flock, the decision push, the pool agent and the :class:`~discovery.site.Site` coordinator on
one pool ring, Butt et al. 2006 §3.3, §4.1, §4.2) and *queue-driven ponds*
(:meth:`Discovery.attach_pond_queue`: a :class:`~discovery.pond_scheduler.PondScheduler` over
the node's job queue, started and stopped by ``flockring pond ADDR --from-queue``, PonD §3.2).
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from discovery import failover as _failover
from discovery import pond as _pond
from discovery import query as _query
from discovery.announce import Flock
from discovery.control import (
    FlockInfoRequest,
    InfoReply,
    ManagerInfoRequest,
    PondMemberRequest,
    PondQueueRequest,
    PondReleaseRequest,
    PondRequest,
    QueryRequest,
    flock_info,
    pond_info,
    pond_queue_info,
    query_info,
    release_info,
)
from discovery.decision import FlockDecision
from discovery.failover import Failover, FailoverConfig, ManagerChange
from discovery.failover_agent import AgentConfig, CollectorView, PoolAgent
from discovery.flock_config import FlockConfig, PoolView
from discovery.machine import MachineAd
from discovery.pond import PondConfig, PoolOnDemand
from discovery.pond_scheduler import (
    JobSource,
    PondNegotiator,
    PondScheduler,
    QueuedJob,
    SchedulerConfig,
    SimulatedJobQueue,
    autocluster,
)
from discovery.pond_types import PondResult, ReleaseResult
from discovery.query import QueryConfig, QueryResult, ResourceQuery
from discovery.signing import Ed25519Signer
from discovery.site import Site
from discovery.submit import SubmitConfig, SubmitSync
from overlay.errors import OverlayError
from overlay.handle import NodeHandle
from overlay.messages import Message

if TYPE_CHECKING:
    from discovery.policy import Policy
    from overlay.live.node import Node

__all__ = ["Discovery", "DiscoveryTimeout", "simulated_load", "wait_for"]

log = logging.getLogger(__name__)

T = TypeVar("T")
#: how a control handler answers its request
Reply = Callable[[Message], None]


class DiscoveryTimeout(OverlayError):
    """A discovery operation did not complete in time."""


async def wait_for(start: Callable[[Callable[[T], None]], object], timeout_s: float) -> T:
    """Start a plugin operation with a completion callback and await its result.

    ``start(cb)`` must arrange for ``cb(result)`` to be called once (possibly before it
    returns). Raises :class:`DiscoveryTimeout` after ``timeout_s``.
    """
    done = trio.Event()
    out: list[T] = []

    def cb(result: T) -> None:
        if not out:
            out.append(result)
            done.set()

    start(cb)
    with trio.move_on_after(timeout_s):
        await done.wait()
    if not out:
        raise DiscoveryTimeout(f"no result within {timeout_s:g} s")
    return out[0]


def simulated_load(
    pool: Any, load: float, mean_job_s: float, horizon_s: float, rng: random.Random
) -> int:
    """Give a ``SimulatedPool`` a Poisson stream of local jobs that keeps its machines busy at
    ``load`` (1.0 = arrivals exactly fill it; above 1 the queue grows and the pool flocks).

    Exponential job lengths of mean ``mean_job_s``; arrivals up to ``horizon_s`` from now are
    registered at once (``load_trace``: no timer per job). Returns the number of jobs.
    """
    if load <= 0 or pool.machines == 0:
        return 0
    rate = load * pool.machines / mean_job_s
    t = pool.now
    submit: list[float] = []
    length: list[float] = []
    while True:
        t += rng.expovariate(rate)
        if t > pool.now + horizon_s:
            break
        submit.append(t)
        length.append(rng.expovariate(1.0 / mean_job_s))
    pool.load_trace(submit, length)
    return len(submit)


class Discovery:
    """The discovery plugins of one live node, attached and served.

    ``Discovery(node)`` inside ``async with node``; then call the ``attach_*`` methods for the
    plugins this node runs (a central manager runs the flock; every machine runs the query and
    pond plugins with its machine ad; the machines of one pool run the failover plugin on their
    pool ring) and :meth:`serve` to answer ``flockring`` tools. Signing uses the node's
    identity key (signatures required), as the live security model asks.
    """

    def __init__(self, node: Node) -> None:
        self.node = node
        self.core = node.core
        self.signer = Ed25519Signer(node.identity.private_key) if node.signing else None
        self.flock: Flock | None = None
        self.query: ResourceQuery | None = None
        self.pond: PoolOnDemand | None = None
        self.failover: Failover | None = None
        self.site: Site | None = None
        self._applier: object = None
        self.agent: PoolAgent | None = None
        self.scheduler: PondScheduler | None = None
        self._queue: JobSource | None = None
        self._negotiator: PondNegotiator | None = None
        self._queue_running = False
        self._dispatched: list[list[Any]] = []
        self._violations: list[str] = []
        #: this machine's pond memberships: [wall time, manager id or None, pond job id]
        self.membership_log: deque[list[Any]] = deque(maxlen=512)
        self._in_pond: str | None = None
        self.stats: dict[str, int] = {"joined_while_in_pond": 0}
        self._ponds: set[int] = set()
        self._served = False

    # ------------------------------------------------------------------ attaching
    def attach_flock(
        self,
        pool: PoolView,
        *,
        collector: str,
        pool_name: str = "",
        policy: Policy | None = None,
        config: FlockConfig | None = None,
        on_decision: Callable[[Any], object] | None = None,
    ) -> Flock:
        """Run the self-organizing flock for this node's pool (Butt et al. 2006 §3.2, §4.1).

        Announcements are stamped with the wall clock, since pools compare them across hosts.
        """
        cfg = (
            config
            if config is not None
            else FlockConfig(require_signatures=self.signer is not None)
        )
        self.flock = Flock(
            self.core,
            pool,
            cfg,
            policy=policy,
            signer=self.signer,
            collector=collector,
            pool_name=pool_name,
            clock=time.time,
            on_decision=on_decision,
        )
        self.flock.start()
        return self.flock

    def attach_query(
        self,
        machine: MachineAd | None,
        *,
        policy: Policy | None = None,
        query_config: QueryConfig | None = None,
        pond_config: PondConfig | None = None,
        on_condor_host: Callable[[NodeHandle | None, Any], None] | None = None,
    ) -> tuple[ResourceQuery, PoolOnDemand]:
        """Answer ClassAd tree queries with ``machine`` (None: this node has no machine but
        may still start queries) and take part in Pools on Demand (PonD §3.1–3.2)."""
        self.query = _query.attach(self.core, machine, query_config)

        def hook(manager: NodeHandle | None, stamp: Any) -> None:
            # the machine's own record of its ponds (what ``flockring pond --member`` shows)
            if manager is not None and self._in_pond is not None:
                self.stats["joined_while_in_pond"] += 1
            self._in_pond = str(manager.id) if manager is not None else None
            job = str(getattr(stamp, "job_id", "") or "")
            self.membership_log.append([time.time(), self._in_pond, job])
            if on_condor_host is not None:
                on_condor_host(manager, stamp)

        self.pond = _pond.attach(
            self.core,
            machine,
            pond_config,
            signer=self.signer,
            policy=policy,
            on_condor_host=hook,
        )
        return self.query, self.pond

    def attach_site(
        self,
        *,
        pool: PoolView | None,
        collector: str,
        pool_name: str,
        original: bool = False,
        applier: Callable[[FlockDecision], object] | None = None,
        applied: FlockDecision | None = None,
        machine: bool = False,
        policy: Policy | None = None,
        flock_config: FlockConfig | None = None,
        failover_config: FailoverConfig | None = None,
        submit_config: SubmitConfig | None = None,
        agent_config: AgentConfig | None = None,
    ) -> Site:
        """Make this node a machine of a pool ring that carries the flock role (Butt et al.
        2006 §3.3): faultD, a :class:`PoolAgent` (re-sends its ad to every new manager), the
        flock (announcing only while this node is the manager), the decision push with
        ``applier`` (e.g. a persisting ``FlockConfigApplier``; ``applied``: what it applied
        before a restart) and the :class:`Site` that moves the flock role with the manager
        role. ``pool``: what the flock reads when this node manages (None: the ads the
        machines re-sent to this node's collector, :class:`CollectorView`)."""
        signed = self.signer is not None
        fo = self.attach_failover(None, original=original, config=failover_config)
        self.agent = PoolAgent(fo, agent_config, machine=machine)
        cfg = flock_config if flock_config is not None else FlockConfig(require_signatures=signed)
        self.flock = Flock(
            self.core,
            pool if pool is not None else CollectorView(self.agent),
            cfg,
            policy=policy,
            signer=self.signer,
            collector=collector,
            pool_name=pool_name,
            clock=time.time,
        )
        sync = SubmitSync(
            self.core,
            fo.pool,
            applier if applier is not None else (lambda _d: None),
            submit_config if submit_config is not None else SubmitConfig(require_signatures=signed),
            signer=self.signer,
            applied=applied,
        )
        self.site = Site(fo, self.flock, sync, collector=collector, pool_name=pool_name)
        self._applier = applier
        return self.site

    def attach_pond_queue(
        self, source: JobSource, negotiator: PondNegotiator | None = None
    ) -> None:
        """Let ``flockring pond ADDR --from-queue`` run queue-driven ponds over ``source``
        (PonD §3.2); a :class:`SimulatedJobQueue` is its own negotiator. Needs the pond plugin
        (:meth:`attach_query`)."""
        self._need(self.pond, "pond")
        self._queue = source
        self._negotiator = negotiator
        if negotiator is None and isinstance(source, SimulatedJobQueue):
            self._negotiator = source
        if isinstance(source, SimulatedJobQueue):
            source.on_start = self._on_job_start

    def _on_job_start(self, job: QueuedJob, machine: NodeHandle) -> None:
        s, p = self.scheduler, self.pond
        c = s.clusters.get(autocluster(job.ad)) if s is not None else None
        job_id = c.job_id if c is not None else ""
        ok = (
            p is not None
            and c is not None
            and c.pond_id in p.ponds
            and machine in p.members(c.pond_id)
        )
        if not ok:
            self._violations.append(f"job {job.job_id} started on {machine.id} outside its pond")
        self._dispatched.append([job.job_id, str(machine.id), job_id])

    def attach_failover(
        self,
        pool_key: Any,
        *,
        original: bool = False,
        config: FailoverConfig | None = None,
        **kw: Any,
    ) -> Failover:
        """Take part in the replica-based manager failover of the pool ring this node's overlay
        is (Butt et al. 2006 §3.3, §4.2); ``original`` on the pool's designated manager."""
        self.failover = _failover.attach(
            self.core,
            config,
            pool_key=pool_key,
            original=original,
            signer=self.signer,
            require_signatures=self.signer is not None,
            **kw,
        )
        self.failover.start()
        return self.failover

    # ------------------------------------------------------------------ awaitables
    async def run_query(
        self,
        requirements: str,
        rank: str | None = None,
        *,
        k: int = 1,
        mode: str = "best",
        redundant: bool = False,
        timeout_s: float = 120.0,
    ) -> QueryResult:
        """Run a ClassAd tree query from this node (raises ``QuerySyntaxError`` at once)."""
        q = self._need(self.query, "query")
        return await wait_for(
            lambda cb: q.query(
                requirements, rank or None, k=k, mode=mode, redundant=redundant, on_done=cb
            ),
            timeout_s,
        )

    async def form_pond(
        self, requirements: str, rank: str | None = None, *, k: int = 1, timeout_s: float = 120.0
    ) -> PondResult:
        """Discover ``k`` machines and invite them into a pond managed by this node."""
        p = self._need(self.pond, "pond")
        res: PondResult = await wait_for(
            lambda cb: p.form_pond(
                None, k, requirements=requirements, rank=rank or None, on_done=cb
            ),
            timeout_s,
        )
        self._ponds.add(res.pond_id)
        return res

    async def release_pond(self, pond_id: int, timeout_s: float = 60.0) -> ReleaseResult:
        """Release a pond (destroy, collect acknowledgements)."""
        p = self._need(self.pond, "pond")
        res: ReleaseResult = await wait_for(lambda cb: p.release(pond_id, cb), timeout_s)
        self._ponds.discard(pond_id)
        return res

    async def commit(self, state: bytes, timeout_s: float = 60.0) -> bool:
        """Replicate manager state; True once a quorum of replica holders acknowledged it,
        False if this node stopped serving first (that state may then be lost)."""
        fo = self._need(self.failover, "failover")
        ok: bool = await wait_for(lambda cb: fo.commit(state, cb), timeout_s)
        return ok

    async def manager_changes(self) -> AsyncIterator[ManagerChange]:
        """Every manager change from now on (an async iterator; stops when the node closes)."""
        fo = self._need(self.failover, "failover")
        feed = fo.changes()
        wake = trio.Event()

        def waker() -> None:
            wake.set()

        feed.set_waker(waker)
        while not self.node.closed:
            for change in feed:
                yield change
            await wake.wait()
            wake = trio.Event()

    @staticmethod
    def _need(plugin: T | None, name: str) -> T:
        if plugin is None:
            raise OverlayError(f"the {name} plugin is not attached to this node")
        return plugin

    # ------------------------------------------------------------------ control endpoints
    def serve(self) -> None:
        """Answer ``flockring`` tools' requests for the attached plugins (idempotent)."""
        if self._served:
            return
        self._served = True
        n = self.node
        n.add_control_handler(FlockInfoRequest, self._on_flock_info)
        n.add_control_handler(QueryRequest, self._on_query)
        n.add_control_handler(PondRequest, self._on_pond)
        n.add_control_handler(PondReleaseRequest, self._on_release)
        n.add_control_handler(ManagerInfoRequest, self._on_manager)
        n.add_control_handler(PondQueueRequest, self._on_pond_queue)
        n.add_control_handler(PondMemberRequest, self._on_pond_member)

    @staticmethod
    def _fail(nonce: int, reply: Reply, why: str) -> None:
        reply(InfoReply(nonce, False, None, why))

    def _on_flock_info(
        self, src: NodeHandle, msg: Message, reply: Callable[[Message], None]
    ) -> None:
        assert isinstance(msg, FlockInfoRequest)
        f = self.flock
        if f is None:
            self._fail(msg.nonce, reply, "this node runs no flock (start it with --pool)")
            return
        fragment = None
        if msg.condor_config:
            from discovery.condor import render_flock_config

            fragment = render_flock_config(f.decision)
        reply(InfoReply(msg.nonce, True, flock_info(f, time.time(), fragment)))

    def _on_query(self, src: NodeHandle, msg: Message, reply: Reply) -> None:
        assert isinstance(msg, QueryRequest)
        q = self.query
        if q is None:
            self._fail(msg.nonce, reply, "this node runs no query plugin")
            return
        try:
            q.query(
                msg.requirements,
                msg.rank or None,
                k=msg.k,
                mode=msg.mode,
                redundant=msg.redundant,
                on_done=lambda r: reply(InfoReply(msg.nonce, True, query_info(r))),
            )
        except OverlayError as e:  # a bad expression: the tool prints the parser's message
            self._fail(msg.nonce, reply, str(e))

    def _on_pond(self, src: NodeHandle, msg: Message, reply: Reply) -> None:
        assert isinstance(msg, PondRequest)
        p = self.pond
        if p is None:
            self._fail(msg.nonce, reply, "this node runs no pond plugin")
            return

        def done(r: PondResult) -> None:
            self._ponds.add(r.pond_id)
            reply(InfoReply(msg.nonce, True, pond_info(r)))

        try:
            p.form_pond(
                None, msg.k, requirements=msg.requirements, rank=msg.rank or None, on_done=done
            )
        except OverlayError as e:
            self._fail(msg.nonce, reply, str(e))

    def _on_release(self, src: NodeHandle, msg: Message, reply: Reply) -> None:
        assert isinstance(msg, PondReleaseRequest)
        p = self.pond
        if p is None or msg.pond_id not in self._ponds:
            self._fail(msg.nonce, reply, f"no pond {msg.pond_id} managed here")
            return
        self._ponds.discard(msg.pond_id)
        p.release(msg.pond_id, lambda r: reply(InfoReply(msg.nonce, True, release_info(r))))

    def _on_manager(self, src: NodeHandle, msg: Message, reply: Reply) -> None:
        assert isinstance(msg, ManagerInfoRequest)
        fo = self.failover
        if fo is None:
            self._fail(msg.nonce, reply, "this node is on no pool ring (start it with --pool-ring)")
            return
        data = fo.status()
        if self.site is not None:
            data["site"] = self._site_info(self.site)
        reply(InfoReply(msg.nonce, True, data))

    def _site_info(self, site: Site) -> dict[str, Any]:
        out = site.status()
        a = site.sync.applied
        out["applied_flock_to"] = (
            [t.collector for t in a.targets] if a is not None and a.enabled else []
        )
        out["applied_version"] = list(a.version) if a is not None else None
        if self.agent is not None:
            out["agent"] = self.agent.status()
        stats = getattr(self._applier, "stats", None)
        if isinstance(stats, Mapping):  # e.g. FlockConfigApplier: state_loaded, applied, failed
            out["applier"] = {str(k): int(v) for k, v in stats.items()}
        return out

    # ------------------------------------------------------------------ queue-driven ponds
    def _queue_info(self) -> dict[str, Any]:
        s = self.scheduler
        assert s is not None
        q = self._queue
        finished: list[list[Any]] = []
        empty: bool | None = None
        if isinstance(q, SimulatedJobQueue):
            finished = [[j, str(m.id), t0, t1] for j, m, t0, t1 in q.runs]
            empty = q.empty
        return pond_queue_info(
            s,
            running=self._queue_running,
            dispatched=self._dispatched,
            finished=finished,
            violations=self._violations,
            queue_empty=empty,
        )

    def _on_pond_queue(self, src: NodeHandle, msg: Message, reply: Reply) -> None:
        assert isinstance(msg, PondQueueRequest)
        p, q = self.pond, self._queue
        if p is None or q is None:
            self._fail(msg.nonce, reply, "this node has no job queue (start it with --pool)")
            return
        if msg.action == "start":
            if not self._queue_running:
                try:
                    cfg = SchedulerConfig(min_interval_s=msg.interval_s, max_pond=msg.max_pond)
                except (ValueError, TypeError) as e:
                    self._fail(msg.nonce, reply, f"bad scheduler settings: {e}")
                    return
                if self.scheduler is None or not self.scheduler.clusters:
                    self.scheduler = PondScheduler(p, q, self._negotiator, cfg)
                if isinstance(q, SimulatedJobQueue):
                    q.on_change = self.scheduler.kick
                self._queue_running = True
                self.scheduler.start()
            reply(InfoReply(msg.nonce, True, self._queue_info()))
        elif msg.action == "status":
            if self.scheduler is None:
                self._fail(msg.nonce, reply, "no queue-driven ponds have run here")
                return
            reply(InfoReply(msg.nonce, True, self._queue_info()))
        elif msg.action == "stop":
            self._stop_queue(lambda: reply(InfoReply(msg.nonce, True, self._queue_info())))
        else:
            self._fail(msg.nonce, reply, f"unknown action {msg.action!r}")

    def _stop_queue(self, done: Callable[[], None]) -> None:
        """Stop the scheduler and release every pond it holds; ``done()`` once released."""
        s, p = self.scheduler, self.pond
        self._queue_running = False
        if s is None or p is None:
            done()
            return
        s.stop()
        ponds = [c.pond_id for c in s.clusters.values() if c.pond_id in p.ponds]
        s.clusters.clear()
        left = [len(ponds)]

        def one(_r: ReleaseResult) -> None:
            left[0] -= 1
            if left[0] == 0:
                done()

        if not ponds:
            done()
        for pid in ponds:
            if pid is not None:
                p.release(pid, one)

    def _on_pond_member(self, src: NodeHandle, msg: Message, reply: Reply) -> None:
        assert isinstance(msg, PondMemberRequest)
        p = self.pond
        if p is None:
            self._fail(msg.nonce, reply, "this node runs no pond plugin")
            return
        m = p.membership
        data = {
            "member_of": None
            if m is None
            else {"manager": str(m.manager.id), "pond_id": m.pond_id, "job_id": m.job_id},
            "history": list(self.membership_log),
            "joined_while_in_pond": self.stats["joined_while_in_pond"],
        }
        reply(InfoReply(msg.nonce, True, data))

    def stop(self) -> None:
        """Stop every attached plugin (pending operations end)."""
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.site is not None:
            self.site.sync.stop_publishing()
        for p in (self.flock, self.pond, self.failover, self.agent):
            if p is not None:
                try:
                    p.stop()
                except Exception:
                    log.exception("stopping %s failed", type(p).__name__)
