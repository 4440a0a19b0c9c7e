"""The per-node tree protocol of multicast: dispatch to children, answers, deadlines, repair.

Split from :mod:`overlay.multicast.app` (theory of operation there; PonD §2.3, §3.1, §4.1).
:class:`TreeProtocol` is the base of :class:`overlay.multicast.Multicast` and owns what a
node does once it holds a :class:`~overlay.multicast.session.Session` for a region, whether as
root or as an internal node:

* **Dispatch** (``_dispatch``/``_relay``/``_send_child``): partition the region over the nodes
  this node knows there (:mod:`overlay.multicast.tree`), or relay it towards the region with the
  overlay's ``next_hop``; each child gets a budget of ``level_s · (depth_factor · log2(s + 1) +
  slack)`` for its estimated s nodes, clamped to the parent's own deadline.
* **Answers** (``_on_ack``/``_on_reply``/``_finish``): reduce the children's values, collect
  their missing ranges, answer the parent once (or call the root's callback).
* **Timers and repair** (``_arm``/``_on_timer``/``_child_failed``): one timer per session;
  unacknowledged queries are retransmitted with the peer's RFC 6298 RTO and back-off; a child
  presumed dead is suspected, reported as the one-id range [c, c+1) and its sub-region is
  dispatched again.
* **Reliable replies** (``_arm_reply``/``_reply_timeout``/``_on_reply_ack``): an internal node
  keeps its reply until the parent acknowledges it, retransmitting ``reply_retries`` times.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from overlay.handle import NodeHandle
from overlay.ids import RING, NodeId
from overlay.kbr import BaseApplication
from overlay.multicast.api import Aggregator, MulticastConfig, MulticastResult
from overlay.multicast.messages import McAck, McQuery, McReply, McReplyAck
from overlay.multicast.ranges import in_region, normalize, region_to_cw
from overlay.multicast.session import (
    ACKED,
    ANSWERED,
    EPS,
    FAILED,
    INF,
    NO_SESSIONS,
    SENT,
    Cached,
    ChildRecord,
    Session,
)
from overlay.multicast.tree import inside_region, partition, region_members

if TYPE_CHECKING:
    from overlay.kbr import KbrCore

__all__ = ["TreeProtocol"]


class TreeProtocol(BaseApplication):
    """One node's side of the partition trees: children, answers, deadlines, repair, retries.

    The base of :class:`overlay.multicast.Multicast`, which adds the public API, the root side
    and query handling; this class holds the per-node state both share.
    """

    __slots__ = (
        "_aggs",
        "_estimate",
        "_recent",
        "_sessions",
        "config",
        "core",
        "listeners",
    )

    default_config: ClassVar[MulticastConfig] = MulticastConfig()

    def __init__(self, core: KbrCore, config: MulticastConfig | None = None) -> None:
        self.core = core
        self.config = config if config is not None else self.default_config
        self._aggs: dict[str, Aggregator] | None = None
        self._sessions: dict[int, Session] = NO_SESSIONS
        #: (parent id, token, slot) of recent queries -> None (internal node: re-ack a
        #: duplicate) or a leaf's answer (value, missing, nodes), re-sent on a duplicate
        self._recent: dict[tuple[int, int, int], Cached | None] | None = None
        self._estimate: tuple[float, int] | None = None
        #: dissemination listeners: ``fn(payload)`` for every :meth:`broadcast` reaching us.
        self.listeners: list[Callable[[Any], None]] | tuple[()] = ()

    def _new_session(self, qid: int, name: str, a: Aggregator, arg: Any) -> Session:
        # Random tokens: a reply or reply-ack must echo one, so an off-path sender cannot
        # guess a live session (a counter would be trivially guessed).
        if self._sessions is NO_SESSIONS:
            self._sessions = {}
        rng = self.core.runtime.rng
        token = rng.getrandbits(62) | 1
        while token in self._sessions:
            token = rng.getrandbits(62) | 1
        s = Session(token, qid, name, a, arg)
        self._sessions[token] = s
        return s

    def _dispatch(
        self,
        s: Session,
        b: NodeId,
        e: NodeId,
        avoid: NodeId | None,
        ttl: int,
        pts: list[NodeHandle] | None = None,
    ) -> None:
        """Give every known node of region (b, e) its sub-region, or relay towards it."""
        core = self.core
        d = s.direction
        if pts is None:
            pts = region_members(core, d, b, e, avoid)
        me = core.id
        if not pts:
            if b == me or inside_region(d, me, b, e):
                return  # only this node: a leaf
            self._relay(s, b, e, avoid, ttl)
            return
        send_child = self._send_child
        ttl = self.config.relay_ttl
        for c, sb, se in partition(me, d, b, e, pts):
            send_child(s, c, sb, se, None, ttl)

    def _relay(self, s: Session, b: NodeId, e: NodeId, avoid: NodeId | None, ttl: int) -> None:
        """This node is outside (b, e) and knows nobody inside: hand the region to the overlay's
        next hop towards its start; if this node is the closest, the region is empty."""
        lo, hi = region_to_cw(s.direction, b, e)
        if ttl <= 0:
            s.missing.append((NodeId(lo), NodeId(hi)))
            return
        core = self.core
        nh = core.next_hop(b)
        if nh is not None and nh.id == avoid:
            nh = core.next_hop(b, {nh})
        if nh is None or nh == core.handle:
            if avoid is not None:
                # Repairing around a dead node: what we knew of this region came through it,
                # so "nobody closer knows of it" proves nothing. Report it rather than declare
                # it empty (never silent loss).
                s.missing.append((NodeId(lo), NodeId(hi)))
            return  # nobody closer to the region knows of it: it holds no node
        self._send_child(s, nh, b, e, avoid, ttl - 1)

    def _send_child(
        self,
        s: Session,
        h: NodeHandle,
        b: NodeId,
        e: NodeId,
        avoid: NodeId | None,
        ttl: int,
    ) -> None:
        core = self.core
        now = core.runtime.now()
        lvl = s.level_s
        cfg = self.config
        d = s.direction
        w = (e - b) % RING if d > 0 else (b - e) % RING
        size = s.n_est * (w if w else RING) / RING
        budget = lvl * (cfg.depth_factor * math.log2(size + 1.0) + cfg.slack_levels)
        room = s.answer_by - now - lvl
        if room < budget:
            budget = room
            if budget < 0.0:  # no time left for this sub-region: report it, do not send
                lo, hi = region_to_cw(d, b, e)
                s.missing.append((NodeId(lo), NodeId(hi)))
                return
        children = s.children
        if len(children) >= cfg.max_children:
            # repairs re-dispatch regions; past the cap the sub-region is reported, not sent, so
            # one session's state stays bounded whatever its children do
            core.stats["multicast_children_capped"] += 1
            lo, hi = region_to_cw(d, b, e)
            s.missing.append((NodeId(lo), NodeId(hi)))
            if len(s.missing) > cfg.max_children:
                s.missing[:] = normalize(s.missing)
            return
        msg = McQuery(
            s.qid, s.name, s.arg, d, b, e, budget, lvl, s.n_est, ttl, avoid,
            s.token, len(children),
        )  # fmt: skip
        ack_by = now + core.prox.rto(h) if cfg.acks else INF
        children.append(ChildRecord(h, msg, now, ack_by))
        s.pending += 1
        core.runtime.send(h, msg)

    # ------------------------------------------------------------------ answers
    def _on_ack(self, src: NodeHandle, m: McAck) -> None:
        s = self._sessions.get(m.token)
        if s is None or s.closed or m.slot >= len(s.children):
            return
        c = s.children[m.slot]
        if c.state == SENT and c.handle == src:
            c.state = ACKED
            if c.attempts == 0:  # Karn's rule
                core = self.core
                core.prox.sample(src, core.runtime.now() - c.sent_at)

    def _on_reply(self, src: NodeHandle, m: McReply) -> None:
        if m.ctoken:
            self.core.runtime.send(src, McReplyAck(m.ctoken))
        s = self._sessions.get(m.token)
        if s is None or s.closed or m.slot >= len(s.children):
            return  # late answer to a finished session
        c = s.children[m.slot]
        if c.state >= ANSWERED or c.handle != src:
            return
        c.state = ANSWERED
        s.pending -= 1
        v = m.value
        if v is not None:
            s.acc = v if s.acc is None else s.agg.reduce(s.arg, s.acc, v)
            s.nodes += m.nodes
        if m.depth >= s.depth:
            s.depth = m.depth + 1
        if m.missing:
            s.missing.extend(m.missing)
        if m.early:
            s.early = True
        if v is not None and s.agg.done(s.arg, s.acc):
            s.early = True
            self._finish(s)
        elif s.pending == 0:
            self._finish(s)

    def _settle(self, s: Session) -> None:
        """After dispatching: finish at once if nothing is pending, else arm the one timer."""
        if s.pending == 0 or s.early:
            self._finish(s)
            return
        self._arm(s)

    def _arm(self, s: Session) -> None:
        t = INF
        for c in s.children:
            st = c.state
            if st == SENT:
                if c.ack_by < t:
                    t = c.ack_by
                if c.deadline < t:
                    t = c.deadline
            elif st == ACKED and c.deadline < t:
                t = c.deadline
        if t == INF:
            return
        rt = self.core.runtime
        s.timer = rt.call_later(t - rt.now(), lambda: self._on_timer(s))

    def _on_timer(self, s: Session) -> None:
        s.timer = None
        if s.closed:
            return
        core = self.core
        now = core.runtime.now() + EPS
        cfg = self.config
        i = 0
        while i < len(s.children):  # repairs may append children while we walk
            c = s.children[i]
            i += 1
            st = c.state
            if st >= ANSWERED:
                continue
            if c.deadline <= now:
                self._child_failed(s, c, dead=st == SENT and cfg.acks)
            elif st == SENT and c.ack_by <= now:
                if c.attempts < cfg.ack_retries:
                    c.attempts += 1
                    core.stats["multicast_retransmits"] += 1
                    rto = core.prox.rto(c.handle) * (2**c.attempts)
                    c.ack_by = now + rto
                    core.runtime.send(c.handle, c.msg)
                else:
                    self._child_failed(s, c, dead=True)
        if s.closed:
            return
        if s.pending == 0:
            self._finish(s)
        else:
            self._arm(s)

    def _child_failed(self, s: Session, c: ChildRecord, dead: bool) -> None:
        c.state = FAILED
        s.pending -= 1
        q = c.msg
        d = s.direction
        core = self.core
        core.stats["multicast_child_missing"] += 1
        cid = c.handle.id
        if dead:
            core.prox.suspect(c.handle)
        if not (dead and self.config.repair):
            lo, hi = region_to_cw(d, q.begin, q.end)
            s.missing.append((NodeId(lo), NodeId(hi)))
            return
        core.stats["multicast_repairs"] += 1
        if not in_region(d, cid, q.begin, q.end):
            # a relay towards the region died: hand the region to another next hop (the dead
            # one is suspected now, so the overlay routes around it); bounded by the ttl
            self._dispatch(s, q.begin, q.end, cid, q.ttl - 1)
            return
        # the child itself is missing; the rest of its sub-region is dispatched again
        s.missing.append((cid, NodeId((cid + 1) % RING)))
        ttl = self.config.relay_ttl
        if q.begin != cid:  # the stretch before the child, which it was to cover too
            self._dispatch(s, q.begin, cid, cid, ttl)
        rb = NodeId((cid + d) % RING)
        if rb != q.end:
            self._dispatch(s, rb, q.end, cid, ttl)

    def _finish(self, s: Session) -> None:
        if s.closed:
            return
        s.closed = True
        if s.timer is not None:
            s.timer.cancel()
            s.timer = None
        if s.parent is not None:
            cfg = self.config
            want_ack = cfg.acks and cfg.reply_retries > 0
            rep = McReply(
                s.p_token,
                s.p_slot,
                s.acc,
                tuple(s.missing),
                s.depth,
                s.nodes,
                s.early,
                s.token if want_ack else 0,
            )
            self.core.runtime.send(s.parent, rep)
            if want_ack:  # keep the session as the retransmission record until acknowledged
                s.reply = rep
                s.children = []
                s.pending = 0
                self._arm_reply(s, 0)
                return
            del self._sessions[s.token]
            return
        del self._sessions[s.token]
        cb = s.on_done
        if cb is not None:
            cb(
                MulticastResult(
                    value=s.acc,
                    missing=tuple(normalize(s.missing)),
                    depth=s.depth,
                    elapsed_s=self.core.runtime.now() - s.t0,
                    nodes=s.nodes,
                    early=s.early,
                    qid=s.qid,
                )
            )

    # ------------------------------------------------------------------ reliable replies
    def _arm_reply(self, s: Session, attempt: int) -> None:
        parent = s.parent
        if parent is None:
            return
        rt = self.core.runtime
        rto = self.core.prox.rto(parent) * (2**attempt)
        s.timer = rt.call_later(rto, lambda: self._reply_timeout(s, attempt))

    def _reply_timeout(self, s: Session, attempt: int) -> None:
        s.timer = None
        if s.reply is None or s.parent is None or self._sessions.get(s.token) is not s:
            return
        if attempt >= self.config.reply_retries:
            self.core.stats["multicast_reply_given_up"] += 1
            del self._sessions[s.token]
            return
        self.core.stats["multicast_reply_retransmits"] += 1
        self.core.runtime.send(s.parent, s.reply)
        self._arm_reply(s, attempt + 1)

    def _on_reply_ack(self, src: NodeHandle, m: McReplyAck) -> None:
        s = self._sessions.get(m.token)
        if s is None or s.reply is None:
            return
        if s.parent is None or s.parent.id != src.id:  # only our parent may acknowledge
            self.core.stats["multicast_foreign_reply_ack"] += 1
            return
        if s.timer is not None:
            s.timer.cancel()
            s.timer = None
        del self._sessions[s.token]
