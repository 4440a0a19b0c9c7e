"""Analytic full-ring query: PondSim's method on our overlay state (no events, no messages).

Theory of operation. PonD's simulator (PondSim, ``kyungyonglee/PondSim``:
``deetoomessage.cpp`` ``DeetooMessage::visit``, ``MapReduceTask.cpp`` ``GetElapsedTime``) never
sends a message: it walks the query tree by recursion and computes the answer's latency as the
critical path — a leaf answers at once, and a parent answers ``max`` over its children of
(exchange cost + the child's latency). An exchange costs a round trip ``2·edge``; with
probability ``p`` (0.5 %) it is lost and costs another ``2·edge`` plus a back-off of
``edge·ceil(U·2^k)`` (k-th loss in a row, back-off capped at 10 s), again and again until it
gets through; a failed child costs five such resends and its sub-region is missing.

This module does exactly that over *our* tree: at every node it asks the node's own core for
the members of its region (:func:`overlay.multicast.tree.region_members`, the KBR API's
``known_in_range``) and splits it with :func:`overlay.multicast.tree.partition` — the two
functions the event-driven protocol (:mod:`overlay.multicast`) calls when it dispatches a
query, so both paths build the same tree from the same routing state. What it leaves out is
everything the protocol does to *survive* in the network: acks, RFC 6298 timers, reply
retransmission, deadlines, repair. Without loss the two agree exactly on count, depth and
latency (``tests/test_fastquery.py``); with loss they differ only in how a lost exchange is
charged (PondSim's closed-form back-off here, the protocol's RTO timers there).

Edge latencies (``edges``):

* ``"model"`` — the network's latency model: an exchange parent→child costs
  ``one_way(parent, child) + one_way(child, parent)``, the back-off unit is
  ``one_way(parent, child)``. Under ``sim_adapter.latency.PondSim`` that is the parent's edge
  plus the child's edge, fixed per node: the same numbers the event-driven run uses.
* ``"redraw"`` — PondSim verbatim: every visited node draws ``edge = 200 + U·400`` ms (whole
  ms) afresh for each query and charges each child ``2·edge``.

Nothing here mutates the network or its random stream: a query uses its own seeded
``random.Random``.
"""

from __future__ import annotations

import math
import random
from array import array
from typing import NamedTuple

from overlay.errors import ConfigError, OverlayError
from overlay.ids import RING, NodeId
from overlay.multicast.ranges import CCW, CW, intersect, normalize, region_to_cw
from overlay.multicast.tree import inside_region, partition, region_members
from sim_adapter.simnode import NetworkView, SimNode

__all__ = ["AnalyticResult", "Timeline", "count_analytic", "query_timeline"]

#: PondSim: ``reschedule_time > 10000 ? 10000 : reschedule_time`` (MapReduceTask.cpp).
BACKOFF_CAP_S = 10.0
#: PondSim: ``_max_resends = 5`` (resends to a failed child before it is given up).
MAX_RESENDS = 5
#: relay hops allowed to enter a region from outside (the protocol's ``relay_ttl``).
RELAY_TTL = 32


class AnalyticResult(NamedTuple):
    """Outcome of :func:`count_analytic` (the first four fields are ``Network.Aggregate``'s)."""

    value: int  #: nodes counted (redundant trees: the larger tree's count, as the protocol)
    missing: list[tuple[NodeId, NodeId]]  #: clockwise ranges under a failed child
    depth: int  #: tree height in edges
    latency_s: float  #: critical path of the recursion
    exchanges: int  #: parent-child exchanges (tree edges, both trees)
    lost: int  #: lost exchanges that were retransmitted


class _Walk:
    """One tree walk: the network, the cost model and counters (kept off the hot path's
    argument lists)."""

    __slots__ = ("edges", "exchanges", "lat", "lost", "missing", "nodes", "p", "rand")

    def __init__(self, net: NetworkView, edges: str, p: float, rng: random.Random) -> None:
        self.nodes = net.nodes
        self.lat = net.latency
        self.edges = edges
        self.p = p
        self.rand = rng.random
        self.exchanges = 0
        self.lost = 0
        self.missing: list[tuple[int, int]] = []

    def edge_s(self, x: SimNode) -> float:
        """PondSim's per-visit draw (``redraw``): ``200 + U·400`` ms, whole milliseconds."""
        return int(200 + self.rand() * 400) / 1000.0

    def cost(self, x: SimNode, y: SimNode, edge: float, dead: bool) -> float:
        """Time from ``x`` sending the query to ``y`` until ``x`` has ``y``'s answer, not
        counting ``y``'s own subtree (PondSim ``GetElapsedTime``)."""
        if edge:
            one, rtt = edge, 2.0 * edge
        else:
            one = self.lat.one_way_s(x.index, y.index)
            rtt = one + self.lat.one_way_s(y.index, x.index)
        self.exchanges += 1
        total = rtt
        rand = self.rand
        if dead:
            for k in range(1, MAX_RESENDS + 1):
                total += rtt + min(one * math.ceil(rand() * (1 << k)), BACKOFF_CAP_S)
            return total
        p = self.p
        if p and rand() < p:
            k = 0
            while True:
                k += 1
                self.lost += 1
                total += rtt + min(one * math.ceil(rand() * (1 << min(k, 62))), BACKOFF_CAP_S)
                if rand() >= p:
                    break
        return total

    def visit(self, x: SimNode, d: int, b: NodeId, e: NodeId, ttl: int) -> tuple[int, int, float]:
        """(nodes counted, height, latency) of the subtree rooted at ``x`` for region (b, e)."""
        core = x.core
        me = core.id
        inside = inside_region(d, me, b, e)
        pts = region_members(core, d, b, e)
        if not pts:
            if inside:
                return 1, 0, 0.0  # a leaf
            return self._relay(x, d, b, e, ttl)
        nodes = self.nodes
        edge = self.edge_s(x) if self.edges == "redraw" else 0.0
        count = 1 if inside else 0
        height = 0
        lat = 0.0
        visit = self.visit
        cost = self.cost
        for h, sb, se in partition(me, d, b, e, pts):
            y = nodes[h.address]  # type: ignore[call-overload]  # sim addresses are indices
            if not y.alive:
                lo, hi = region_to_cw(d, sb, se)
                self.missing.append((lo, hi))
                t = cost(x, y, edge, True)
                if t > lat:
                    lat = t
                continue
            c, hgt, cl = visit(y, d, sb, se, RELAY_TTL)
            t = cost(x, y, edge, False) + cl
            count += c
            if hgt >= height:
                height = hgt + 1
            if t > lat:
                lat = t
        return count, height, lat

    def _relay(self, x: SimNode, d: int, b: NodeId, e: NodeId, ttl: int) -> tuple[int, int, float]:
        """``x`` lies outside the region and knows nobody inside: hand it to the overlay's next
        hop towards its start, as the protocol's relay does."""
        if ttl <= 0:
            self.missing.append(region_to_cw(d, b, e))
            return 0, 0, 0.0
        nh = x.core.next_hop(b)
        if nh is None or nh == x.handle:
            return 0, 0, 0.0  # nobody closer knows of the region: it holds no node
        y = self.nodes[nh.address]  # type: ignore[call-overload]  # sim addresses are indices
        edge = self.edge_s(x) if self.edges == "redraw" else 0.0
        if not y.alive:
            self.missing.append(region_to_cw(d, b, e))
            return 0, 1, self.cost(x, y, edge, True)
        c, hgt, cl = self.visit(y, d, b, e, ttl - 1)
        return c, hgt + 1, self.cost(x, y, edge, False) + cl


def count_analytic(
    net: NetworkView,
    src: SimNode,
    redundant: bool = False,
    *,
    begin: NodeId | None = None,
    end: NodeId | None = None,
    edges: str = "model",
    loss: float | None = None,
    rng: random.Random | None = None,
) -> AnalyticResult:
    """Count the nodes of the ring (or of the clockwise region [begin, end)) from ``src`` by
    PondSim's critical-path recursion over the tree the protocol would build.

    ``loss`` is the probability that one parent-child exchange is lost (PondSim's
    ``p_drop_prob``); by default the network's per-message loss applied to both legs,
    ``1 - (1 - net.loss)^2``. ``rng`` draws losses, back-offs and (``edges="redraw"``) edge
    latencies; by default ``random.Random(net.seed)``.
    """
    if not src.alive:
        raise OverlayError(f"count_analytic from crashed node {src!r}")
    if edges not in ("model", "redraw"):
        raise ConfigError(f"edges must be 'model' or 'redraw', got {edges!r}")
    if (begin is None) != (end is None):
        raise ConfigError("give both begin and end, or neither (whole ring)")
    p = 1.0 - (1.0 - net.loss) ** 2 if loss is None else float(loss)
    if not 0.0 <= p < 1.0:
        raise ConfigError(f"loss must be in [0, 1), got {p!r}")
    w = _Walk(net, edges, p, rng if rng is not None else random.Random(net.seed))
    me = src.id
    b = me if begin is None else begin
    e = me if end is None else end
    # the same ids seen counter-clockwise: start at end-1, stop before begin-1 (as the protocol)
    ccw = (b, e) if b == e else (NodeId((e - 1) % RING), NodeId((b - 1) % RING))
    trees = ((CW, b, e), (CCW, *ccw)) if redundant else ((CW, b, e),)
    results = []
    missing: list[list[tuple[int, int]]] = []
    for d, rb, re_ in trees:
        w.missing = []
        results.append(w.visit(src, d, rb, re_, RELAY_TTL))
        missing.append(w.missing)
    miss = normalize(missing[0]) if len(missing) == 1 else intersect(missing[0], missing[1])
    return AnalyticResult(
        value=max(r[0] for r in results),
        missing=miss,
        depth=max(r[1] for r in results),
        latency_s=max(r[2] for r in results),
        exchanges=w.exchanges,
        lost=w.lost,
    )


# ---------------------------------------------------------------------- per-node timeline
class Timeline(NamedTuple):
    """Outcome of :func:`query_timeline`: when the query reached each node, and when the root
    had the answer (lossless, no processing time)."""

    arrival_s: array[float]  #: by node index: when the query reached it (NaN: never)
    latency_s: float  #: when the root had the whole answer (critical path, as count_analytic)
    visited: int  #: nodes that evaluated the query
    depth: int  #: tree height in edges


class _TimelineWalk(_Walk):
    """The lossless walk of :class:`_Walk` that also records each node's arrival time."""

    __slots__ = ("arrival",)

    def __init__(self, net: NetworkView) -> None:
        super().__init__(net, "model", 0.0, random.Random(0))
        self.arrival = array("d", [math.nan]) * len(net.nodes)

    def at(
        self, x: SimNode, t: float, d: int, b: NodeId, e: NodeId, ttl: int
    ) -> tuple[int, int, float]:
        """(nodes counted, height, latency from ``t``) of the subtree at ``x``, which the query
        reaches at time ``t``; records the arrival time of every node that evaluates it."""
        core = x.core
        me = core.id
        inside = inside_region(d, me, b, e)
        if inside and math.isnan(self.arrival[x.index]):
            self.arrival[x.index] = t
        pts = region_members(core, d, b, e)
        if not pts:
            if inside:
                return 1, 0, 0.0
            return self._relay_at(x, t, d, b, e, ttl)
        nodes = self.nodes
        lat = self.lat
        count = 1 if inside else 0
        height = 0
        worst = 0.0
        for h, sb, se in partition(me, d, b, e, pts):
            y = nodes[h.address]  # type: ignore[call-overload]  # sim addresses are indices
            if not y.alive:
                self.missing.append(region_to_cw(d, sb, se))
                continue
            down = lat.one_way_s(x.index, y.index)
            c, hgt, cl = self.at(y, t + down, d, sb, se, RELAY_TTL)
            self.exchanges += 1
            total = down + lat.one_way_s(y.index, x.index) + cl
            count += c
            if hgt >= height:
                height = hgt + 1
            if total > worst:
                worst = total
        return count, height, worst

    def _relay_at(
        self, x: SimNode, t: float, d: int, b: NodeId, e: NodeId, ttl: int
    ) -> tuple[int, int, float]:
        if ttl <= 0:
            self.missing.append(region_to_cw(d, b, e))
            return 0, 0, 0.0
        nh = x.core.next_hop(b)
        if nh is None or nh == x.handle:
            return 0, 0, 0.0
        y = self.nodes[nh.address]  # type: ignore[call-overload]  # sim addresses are indices
        if not y.alive:
            self.missing.append(region_to_cw(d, b, e))
            return 0, 0, 0.0
        down = self.lat.one_way_s(x.index, y.index)
        c, hgt, cl = self.at(y, t + down, d, b, e, ttl - 1)
        return c, hgt + 1, down + self.lat.one_way_s(y.index, x.index) + cl


def query_timeline(net: NetworkView, src: SimNode) -> Timeline:
    """When a lossless clockwise query from ``src`` reaches every node, and when ``src`` has
    the answer: the walk of :func:`count_analytic` (same tree, same latency model) keeping
    each node's arrival time. A ClassAd query evaluates a node's ad on arrival
    (:mod:`discovery.query`), so ``latency_s - arrival_s[i]`` is how old node ``i``'s answer
    is when the root has it — what the staleness of a match depends on (PonD §4.2.2).
    Crashed children are skipped (their regions are missing, as in the protocol without
    repair)."""
    if not src.alive:
        raise OverlayError(f"query_timeline from crashed node {src!r}")
    w = _TimelineWalk(net)
    me = src.id
    count, depth, lat = w.at(src, 0.0, CW, me, me, RELAY_TTL)
    return Timeline(w.arrival, lat, count, depth)
