"""Recursive-partition multicast and map-reduce aggregation on the KBR API (both overlays).

Theory of operation (PonD, Lee et al. HPDC 2012, §2.3, §3.1, §4.1; DeeToo;
Vishnevsky et al.'s self-organising trees):

* **Partition.** A node responsible for a region takes the live nodes it knows there
  (``KbrCore.known_in_range``), sorts them from the region's start in the tree's direction,
  n1..ni (itself among them when it lies inside), and gives n_j the sub-region [n_j, n_{j+1})
  and n_i [n_i, end); n1 also gets the stretch between the region's start and itself (a node
  always knows its ring neighbours, so that stretch holds no node the parent could have named).
  A node whose sub-region holds no other node it knows is a leaf (PonD §2.3). The
  counter-clockwise tree mirrors this: n_j gets (n_{j+1}, n_j] (PonD §3.1.4). Nothing is kept
  between queries: the tree is rebuilt from routing state every time, so it follows churn.
  The partition itself is two pure functions in :mod:`overlay.multicast.tree`, shared with the
  simulator's analytic mode (``sim_adapter.fastquery``), so both build the same tree.
* **Map-reduce.** Each node maps locally (``Aggregator.map``), sends the query to its children,
  reduces their answers into its own (``Aggregator.reduce``) and answers its parent **once**
  (PonD §3.1.2). If the reduction declares itself done (``Aggregator.done``, the First-Fit mode
  of PonD §3.1.3) the node answers at once and ignores later children.
* **Deadlines, never silent loss.** A query carries a time budget. A child's budget is derived
  from the estimated number of nodes in its sub-region s (the root's ring-size estimate times
  the sub-region's share of the ring): ``level_s · (depth_factor · log2(s + 1) + slack)``,
  because the partition tree over s nodes is O(log s) deep (PonD §4.1, DeeToo), clamped so that
  the parent's own deadline is never exceeded. A child that has not answered by its deadline is
  reported with its whole sub-region as a **missing range**; a reply lists the missing ranges
  of its subtree, so the root knows exactly which ids its value does not cover.
* **Failure detection and repair.** A child acknowledges a query at once (``McAck``). An
  unacknowledged query is retransmitted with RFC 6298 back-off (the core's RTO for that peer);
  after ``ack_retries`` the child is presumed dead, suspected to the overlay (which probes it),
  reported as the one-id missing range [c, c+1), and the rest of its sub-region is re-dispatched
  by the parent: through the nodes it knows there, or relayed towards the region with the
  overlay's own ``next_hop`` (which routes around suspected nodes) until a node that knows nodes
  inside takes over. The same relay lets a root query a region it is not part of (DeeToo).
* **Redundant topology** (PonD §3.1.4). ``direction="both"`` runs the clockwise and the
  counter-clockwise tree concurrently from the root and merges them: values by
  ``Aggregator.merge`` (dedupe by node id for values that carry ids; ``max`` for plain counts,
  as PondSim's ``combineResults``) and missing ranges by intersection: a range is missing only
  if it is missing in both trees. The two trees' ancestor chains are disjoint except the root,
  so one crash rarely hides a node from both.
* **Cost.** Per edge: one query, one ack, one reply; O(1) bytes for a fixed-size value plus one
  id pair per missing range (PonD §4.1). One timer per internal node per query, none on leaves.
  The messages are top-level wire messages (no ``DirectMsg`` wrapper); :func:`attach` installs
  their handlers once per core class. A leaf remembers its answer as a tuple of plain values
  keyed by ints, which the cyclic GC does not track.

Split by concern: this module is the application's public API, the root side (starting a query,
merging the redundant trees) and query handling on a child; :mod:`overlay.multicast.protocol`
holds the per-node tree protocol (dispatch, answers, deadlines, repair, reliable replies) and
:mod:`overlay.multicast.session` its bookkeeping records. Public names are re-exported here.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from overlay.errors import OverlayError
from overlay.handle import NodeHandle
from overlay.ids import RING, NodeId, ring_distance
from overlay.messages import Message
from overlay.multicast.api import (
    BUILTIN_AGGREGATORS,
    Aggregator,
    CollectIds,
    Count,
    MulticastConfig,
    MulticastResult,
    ResultCallback,
    UnknownAggregatorError,
)
from overlay.multicast.messages import McAck, McQuery, McReply, McReplyAck
from overlay.multicast.protocol import TreeProtocol
from overlay.multicast.ranges import (
    CCW,
    CW,
    in_region,
    intersect,
    region_to_cw,
)
from overlay.multicast.session import INF, Pair
from overlay.multicast.tree import inside_region, region_members

if TYPE_CHECKING:
    from overlay.kbr import KbrCore

__all__ = [
    "CCW",
    "CW",
    "MULTICAST_APP",
    "Aggregator",
    "CollectIds",
    "Count",
    "Multicast",
    "MulticastConfig",
    "MulticastResult",
    "UnknownAggregatorError",
    "attach",
]

#: the name the multicast application is registered under on every core.
MULTICAST_APP = "multicast"


# ---------------------------------------------------------------------- the application
class Multicast(TreeProtocol):
    """The per-node multicast/aggregation application (register it with :func:`attach`)."""

    __slots__ = ()

    # ------------------------------------------------------------------ public API
    def add_aggregator(self, name: str, agg: Aggregator) -> None:
        """Register a map-reduce under ``name`` on this node (every node of a ring needs it)."""
        if self._aggs is None:
            self._aggs = {}
        self._aggs[name] = agg

    def add_listener(self, fn: Callable[[Any], None]) -> None:
        """Call ``fn(payload)`` for every :meth:`broadcast` that reaches this node."""
        if isinstance(self.listeners, tuple):
            self.listeners = []
        self.listeners.append(fn)

    def aggregator(self, name: str) -> Aggregator | None:
        """The aggregator registered here under ``name``, else the built-in one, else None."""
        if self._aggs is not None:
            a = self._aggs.get(name)
            if a is not None:
                return a
        return BUILTIN_AGGREGATORS.get(name)

    def aggregate(
        self,
        agg: str,
        arg: Any = None,
        *,
        on_done: ResultCallback,
        begin: NodeId | None = None,
        end: NodeId | None = None,
        direction: str = "cw",
        timeout_s: float | None = None,
        level_s: float | None = None,
    ) -> int:
        """Run aggregation ``agg`` over the clockwise region [begin, end) (default: the whole
        ring) and call ``on_done(MulticastResult)`` once. Returns the query id.

        ``direction`` is ``"cw"``, ``"ccw"`` or ``"both"`` (redundant trees, merged).
        ``timeout_s`` bounds the answer time (unanswered parts are reported missing);
        ``level_s`` overrides the per-level allowance for this query. The callback may run
        before this method returns if the region holds nobody else.
        """
        a = self.aggregator(agg)
        if a is None:
            raise UnknownAggregatorError(f"no aggregator {agg!r} is registered on this node")
        if direction not in ("cw", "ccw", "both"):
            raise OverlayError(f"direction must be 'cw', 'ccw' or 'both', got {direction!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise OverlayError("timeout_s must be > 0")
        if level_s is not None and not level_s > 0:
            raise OverlayError("level_s must be > 0")
        if (begin is None) != (end is None):
            raise OverlayError("give both begin and end, or neither (whole ring)")
        rt = self.core.runtime
        qid = rt.rng.getrandbits(62)
        me = self.core.id
        b = me if begin is None else begin
        e = me if end is None else end
        # the same ids seen counter-clockwise: start at end-1, stop before begin-1
        ccw_b, ccw_e = (b, e) if b == e else (NodeId((e - 1) % RING), NodeId((b - 1) % RING))
        lvl = self.config.level_s if level_s is None else level_s
        n_est = self.estimate_size()
        answer_by = rt.now() + timeout_s if timeout_s is not None else INF
        if direction == "both":
            pair = Pair(a, arg, on_done)
            local = self._local_value(a, arg, CW, b, e)

            def pair_cb(r: MulticastResult) -> None:
                self._pair_done(pair, r)

            for d, rb, re_ in ((CW, b, e), (CCW, ccw_b, ccw_e)):
                self._start_root(
                    qid, agg, a, arg, d, rb, re_, lvl, n_est, answer_by, local, pair_cb
                )
        elif direction == "cw":
            local = self._local_value(a, arg, CW, b, e)
            self._start_root(qid, agg, a, arg, CW, b, e, lvl, n_est, answer_by, local, on_done)
        else:
            local = self._local_value(a, arg, CCW, ccw_b, ccw_e)
            self._start_root(
                qid, agg, a, arg, CCW, ccw_b, ccw_e, lvl, n_est, answer_by, local, on_done
            )
        return qid

    def broadcast(
        self,
        payload: Any,
        *,
        on_done: ResultCallback | None = None,
        begin: NodeId | None = None,
        end: NodeId | None = None,
        direction: str = "cw",
        timeout_s: float | None = None,
    ) -> int:
        """Disseminate ``payload`` to the listeners of every node in the region; the result's
        value is the number of nodes reached (missing ranges as for any aggregation)."""
        return self.aggregate(
            "deliver",
            payload,
            on_done=on_done if on_done is not None else _ignore,
            begin=begin,
            end=end,
            direction=direction,
            timeout_s=timeout_s,
        )

    def estimate_size(self) -> int:
        """Ring-size estimate from the spread of the nearest ring neighbours (cached 300 s)."""
        now = self.core.runtime.now()
        est = self._estimate
        if est is not None and now - est[0] < 300.0:
            return est[1]
        nb = self.core.neighbor_set(self.config.estimate_neighbors)
        me = self.core.id
        far = max((ring_distance(me, h.id) for h in nb), default=0)
        n = len(nb) + 1 if far == 0 else max(len(nb) + 1, round(RING * len(nb) / (2 * far)))
        self._estimate = (now, n)
        return n

    @property
    def active_sessions(self) -> int:
        """Queries this node is still waiting on (0 when idle: nothing leaks)."""
        return len(self._sessions)

    # ------------------------------------------------------------------ KBR upcall
    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        """Multicast messages arrive as top-level messages through the handlers that
        :func:`attach` installs; this upcall serves peers that wrap them in a ``DirectMsg``."""
        t = type(payload)
        if t is McReply:
            self._on_reply(src, payload)
        elif t is McQuery:
            self._on_query(src, payload)
        elif t is McAck:
            self._on_ack(src, payload)
        elif t is McReplyAck:
            self._on_reply_ack(src, payload)
        else:
            self.core.stats["multicast_dropped"] += 1

    # ------------------------------------------------------------------ root side
    def _local_value(self, a: Aggregator, arg: Any, d: int, b: int, e: int) -> tuple[Any, int]:
        if in_region(d, self.core.id, b, e):
            return a.map(self, arg), 1
        return None, 0

    def _start_root(
        self,
        qid: int,
        name: str,
        a: Aggregator,
        arg: Any,
        d: int,
        b: NodeId,
        e: NodeId,
        level_s: float,
        n_est: int,
        answer_by: float,
        local: tuple[Any, int],
        cb: ResultCallback,
    ) -> None:
        s = self._new_session(qid, name, a, arg)
        s.direction, s.level_s, s.n_est, s.answer_by = d, level_s, n_est, answer_by
        s.on_done = cb
        s.t0 = self.core.runtime.now()
        s.acc, s.nodes = local
        if s.acc is not None and a.done(arg, s.acc):
            s.early = True
        else:
            self._dispatch(s, b, e, None, self.config.relay_ttl)
        self._settle(s)

    def _pair_done(self, p: Pair, r: MulticastResult) -> None:
        if p.done:
            return
        p.results.append(r)
        if r.early or len(p.results) == 2:
            p.done = True
            if len(p.results) == 1:
                p.cb(r)
                return
            x, y = p.results
            if x.value is None or y.value is None:
                value = y.value if x.value is None else x.value
            else:
                value = p.agg.merge(p.arg, x.value, y.value)
            p.cb(
                MulticastResult(
                    value=value,
                    missing=tuple(intersect(x.missing, y.missing)),
                    depth=max(x.depth, y.depth),
                    elapsed_s=max(x.elapsed_s, y.elapsed_s),
                    nodes=max(x.nodes, y.nodes),
                    early=x.early or y.early,
                    qid=x.qid,
                )
            )

    # ------------------------------------------------------------------ child side
    def _on_query(self, src: NodeHandle, q: McQuery) -> None:
        core = self.core
        send = core.runtime.send
        # plain ints only: the key (and a leaf's cached answer) are then not tracked by the
        # cyclic GC, which otherwise rescans every remembered entry of every node
        key = (int(src.id), q.token, q.slot)
        recent = self._recent
        if recent is None:
            recent = self._recent = {}
        elif key in recent:  # a retransmission: re-send a leaf's answer, or say we are alive
            core.stats["multicast_duplicates"] += 1
            cached = recent[key]
            if cached is not None:
                send(src, McReply(q.token, q.slot, cached[0], cached[1], 0, cached[2], False, 0))
            elif self.config.acks:
                send(src, McAck(q.token, q.slot))
            return
        recent[key] = None
        if len(recent) > self.config.dedupe_window:
            del recent[next(iter(recent))]
        aggs = self._aggs
        a = aggs.get(q.agg) if aggs is not None else None
        if a is None:
            a = BUILTIN_AGGREGATORS.get(q.agg)
            if a is None:  # cannot evaluate here: say so, never drop silently
                core.stats["multicast_unknown_aggregator"] += 1
                lo, hi = region_to_cw(q.direction, q.begin, q.end)
                miss = ((NodeId(lo), NodeId(hi)),)
                recent[key] = (None, miss, 0)
                send(src, McReply(q.token, q.slot, None, miss, 0, 0, False, 0))
                return
        if len(self._sessions) >= self.config.max_sessions:
            # too many queries in progress here: answer "not covered" rather than hold more
            core.stats["multicast_sessions_full"] += 1
            lo, hi = region_to_cw(q.direction, q.begin, q.end)
            miss = ((NodeId(lo), NodeId(hi)),)
            send(src, McReply(q.token, q.slot, None, miss, 0, 0, False, 0))
            return
        d, b, e = q.direction, q.begin, q.end
        me = core.id
        inside = b == me or inside_region(d, me, b, e)
        value: Any = None
        pts: list[NodeHandle] | None = None
        if inside:
            value = a.map(self, q.arg)
            if q.avoid is None and b == me:
                # the common case: a leaf has no known node in its sub-region
                pts = region_members(core, d, b, e)
                if not pts:
                    recent[key] = (value, (), 1)
                    send(src, McReply(q.token, q.slot, value, (), 0, 1, False, 0))
                    return
        # numbers from the wire are clamped to local caps (a NaN compares false everywhere:
        # it would arm no timer and keep the session open for ever)
        cfg = self.config
        budget = q.budget_s
        if not 0.0 <= budget <= cfg.max_budget_s:
            core.stats["multicast_clamped"] += 1
            budget = cfg.max_budget_s if budget > cfg.max_budget_s else 0.0
        level = q.level_s
        if not 0.0 < level <= cfg.max_level_s:
            core.stats["multicast_clamped"] += 1
            level = cfg.max_level_s if level > cfg.max_level_s else cfg.level_s
        # an aggregator may refuse a goal from the wire (raise, dropped and counted by the
        # core): ask before any session exists, so a refused query leaves nothing behind
        early = value is not None and a.done(q.arg, value)
        s = self._new_session(q.qid, q.agg, a, q.arg)
        # ring-size estimates from 4 neighbours are noisy (a few times either way); the larger
        # of ours and the one handed down errs towards longer budgets, never cut subtrees
        n_est = self.estimate_size()
        s.direction, s.level_s, s.n_est = d, level, n_est if n_est > q.n_est else q.n_est
        s.parent, s.p_token, s.p_slot = src, q.token, q.slot
        s.t0 = now = core.runtime.now()
        s.answer_by = now + budget
        if inside:
            s.acc, s.nodes = value, 1
        if early:
            s.early = True
        else:
            self._dispatch(s, b, e, q.avoid, q.ttl, pts)
        if s.pending and not s.early and self.config.acks:
            # only nodes that must wait acknowledge: a leaf's immediate answer is its ack
            send(src, McAck(q.token, q.slot))
        self._settle(s)


# ---------------------------------------------------------------------- receive handlers
# Multicast messages travel as top-level messages (no ``DirectMsg`` wrapper: one allocation and
# two upcall levels less per message). Their handlers are functions of the *core*, installed
# once per core class through ``KbrCore.add_handler`` (which keeps a bound method of the core
# in the class's dispatch table, so 10^6 simulated nodes share one table); each finds this
# node's application by name.
def _app(core: KbrCore) -> Multicast | None:
    a = core.apps.get(MULTICAST_APP)
    if type(a) is Multicast or isinstance(a, Multicast):
        return a
    core.stats["multicast_dropped"] += 1
    return None


def _recv_query(core: KbrCore, src: NodeHandle, msg: McQuery) -> None:
    a = _app(core)
    if a is not None:
        a._on_query(src, msg)


def _recv_ack(core: KbrCore, src: NodeHandle, msg: McAck) -> None:
    a = _app(core)
    if a is not None:
        a._on_ack(src, msg)


def _recv_reply(core: KbrCore, src: NodeHandle, msg: McReply) -> None:
    a = _app(core)
    if a is not None:
        a._on_reply(src, msg)


def _recv_reply_ack(core: KbrCore, src: NodeHandle, msg: McReplyAck) -> None:
    a = _app(core)
    if a is not None:
        a._on_reply_ack(src, msg)


_HANDLERS: tuple[tuple[type[Message], Callable[[KbrCore, NodeHandle, Any], None]], ...] = (
    (McQuery, _recv_query),
    (McAck, _recv_ack),
    (McReply, _recv_reply),
    (McReplyAck, _recv_reply_ack),
)
#: core classes whose dispatch table already holds the handlers above.
_INSTALLED: set[type[KbrCore]] = set()


def _ignore(_r: MulticastResult) -> None:
    return None


def attach(core: KbrCore, config: MulticastConfig | None = None) -> Multicast:
    """Create the multicast application for ``core``, register it as ``MULTICAST_APP`` and
    install the receive handlers of its messages (once per core class)."""
    mc = Multicast(core, config)
    core.register(MULTICAST_APP, mc)
    if type(core) not in _INSTALLED:
        for cls, fn in _HANDLERS:
            core.add_handler(cls, types.MethodType(fn, core))
        _INSTALLED.add(type(core))
    return mc
