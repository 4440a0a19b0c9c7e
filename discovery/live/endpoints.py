"""Control endpoints of a live node's discovery plugins: what ``flockring flock|query|pond|manager``
asks a running node (the requests of :mod:`discovery.control`), and the queue-driven ponds that
``flockring pond ADDR --from-queue`` starts and stops (PonD §3.2).

Every handler answers with one :class:`~discovery.control.InfoReply`: the plugin's state as
plain data, or a refusal naming what is missing (a plugin not attached, a bad expression). The
handlers run inside the node's tasks; an operation that completes later (a query, a pond, a
release) answers from its completion callback. :class:`ControlEndpoints` is a mixin of
:class:`discovery.live.Discovery`, which attaches the plugins it serves.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

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
from discovery.pond_scheduler import (
    JobSource,
    PondNegotiator,
    PondScheduler,
    SchedulerConfig,
    SimulatedJobQueue,
)
from discovery.pond_types import PondResult, ReleaseResult
from discovery.site import Site
from overlay.errors import OverlayError
from overlay.handle import NodeHandle
from overlay.messages import Message

if TYPE_CHECKING:
    from discovery.announce import Flock
    from discovery.failover import Failover
    from discovery.failover_agent import PoolAgent
    from discovery.pond import PoolOnDemand
    from discovery.query import ResourceQuery
    from overlay.live.node import Node

__all__ = ["ControlEndpoints", "Reply"]

#: how a control handler answers its request
Reply = Callable[[Message], None]


class ControlEndpoints:
    """The control handlers of :class:`discovery.live.Discovery` (which sets every attribute
    declared here)."""

    node: Node
    flock: Flock | None
    query: ResourceQuery | None
    pond: PoolOnDemand | None
    failover: Failover | None
    site: Site | None
    agent: PoolAgent | None
    scheduler: PondScheduler | None
    membership_log: deque[list[Any]]
    stats: dict[str, int]
    _applier: object
    _queue: JobSource | None
    _negotiator: PondNegotiator | None
    _queue_running: bool
    _dispatched: list[list[Any]]
    _violations: list[str]
    _ponds: set[int]
    _served: bool

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
            from discovery.condor_render import render_flock_config

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
