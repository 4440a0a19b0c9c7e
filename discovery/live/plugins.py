"""Attaching the discovery plugins to a live node, and their operations as awaitables.

Theory of operation: see :mod:`discovery.live`. :class:`Discovery` creates each plugin on the
node's core with the node's Ed25519 identity as its signer, stamps flock announcements with the
wall clock (pools compare them across hosts), wires the two compositions (a *site* node, Butt et
al. 2006 §3.3, §4.1, §4.2; queue-driven ponds, PonD §3.2) and serves the control endpoints of
:mod:`discovery.live.endpoints`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from discovery import failover as _failover
from discovery import pond as _pond
from discovery import query as _query
from discovery.announce import Flock
from discovery.decision import FlockDecision
from discovery.failover import Failover, FailoverConfig, ManagerChange
from discovery.failover_agent import AgentConfig, CollectorView, PoolAgent
from discovery.flock_config import FlockConfig, PoolView
from discovery.live.endpoints import ControlEndpoints
from discovery.live.wait import wait_for
from discovery.machine import MachineAd
from discovery.pond import PondConfig, PoolOnDemand
from discovery.pond_scheduler import (
    JobSource,
    PondNegotiator,
    PondScheduler,
    QueuedJob,
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

if TYPE_CHECKING:
    from discovery.policy import Policy
    from overlay.live.node import Node

__all__ = ["Discovery"]

# the logger of the whole trio side, as before it was split into modules
log = logging.getLogger("discovery.live")

T = TypeVar("T")


class Discovery(ControlEndpoints):
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
        """Run the self-organizing flock for this node's pool (Butt et al. 2006 §3.2, §4.1)."""
        self.flock = self._new_flock(pool, collector, pool_name, policy, config, on_decision)
        self.flock.start()
        return self.flock

    def _new_flock(
        self,
        pool: PoolView,
        collector: str,
        pool_name: str,
        policy: Policy | None,
        config: FlockConfig | None,
        on_decision: Callable[[Any], object] | None = None,
    ) -> Flock:
        """The flock plugin on this node: signed with the node's key (signatures required when
        it signs), and announcements stamped with the wall clock, since pools compare them
        across hosts."""
        signed = self.signer is not None
        return Flock(
            self.core,
            pool,
            config if config is not None else FlockConfig(require_signatures=signed),
            policy=policy,
            signer=self.signer,
            collector=collector,
            pool_name=pool_name,
            clock=time.time,
            on_decision=on_decision,
        )

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
        view = pool if pool is not None else CollectorView(self.agent)
        self.flock = self._new_flock(view, collector, pool_name, policy, flock_config)
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
