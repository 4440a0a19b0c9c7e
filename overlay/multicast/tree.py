"""The recursive partition of a multicast region: one pure function, shared by the protocol and
the simulator's analytic mode.

Theory of operation (PonD, Lee et al. HPDC 2012, §2.3, §3.1.4; DeeToo): a node
responsible for a region takes the live nodes it knows there, sorted from the region's start in
the tree's direction, n1..ni, and gives n_j the sub-region [n_j, n_{j+1}) and n_i [n_i, end);
the node itself takes its own place in that order when it lies inside the region, and the node
before it ends at it. The first node also covers the stretch between the region's start and
itself (a node always knows its ring neighbours, so nobody the parent could have named lives
there). The counter-clockwise tree mirrors it: regions are written in the tree's direction
(``overlay.multicast.ranges``), so the same code serves both trees.

:func:`region_members` asks the overlay (``KbrCore.known_in_range``, the KBR API) and
:func:`partition` turns the answer into children. :class:`overlay.multicast.Multicast` sends
each child its sub-region; ``sim_adapter.fastquery`` recurses over the very same two functions
without sending anything (PondSim's method on our overlay state). Neither keeps state or does
I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from overlay.handle import NodeHandle
from overlay.ids import RING, NodeId

if TYPE_CHECKING:
    from overlay.kbr import KbrCore

__all__ = ["Child", "inside_region", "partition", "region_members"]

#: a child of a partition: the node and its sub-region ``(begin, end)`` in tree direction.
Child = tuple[NodeHandle, NodeId, NodeId]


def inside_region(d: int, x: int, b: int, e: int) -> bool:
    """True if ``x`` lies in the tree region starting at ``b`` before ``e`` (``b == e``: all).

    The same predicate as ``multicast_ranges.in_region``, with the common ``x == b`` first.
    """
    if x == b or b == e:
        return True
    if d > 0:
        return (x - b) % RING < (e - b) % RING
    return (b - x) % RING < (b - e) % RING


def region_members(
    core: KbrCore, d: int, b: NodeId, e: NodeId, avoid: NodeId | None = None
) -> list[NodeHandle]:
    """Every live node ``core`` knows in the tree region (``b``, ``e``) of direction ``d``,
    self excluded, in no particular order; ``avoid`` (a node presumed dead) and the peers the
    core's proximity table suspects are left out."""
    if d > 0:
        pts = core.known_in_range(b, e)
    else:  # the counter-clockwise region from b down to (not including) e is (e, b]
        pts = core.known_in_range(NodeId((e + 1) % RING), NodeId((b + 1) % RING))
    if pts:
        bad = core.prox.bad
        if avoid is not None or bad:
            pts = [h for h in pts if h.id != avoid and h not in bad]
    return pts


def partition(me: NodeId, d: int, b: NodeId, e: NodeId, pts: list[NodeHandle]) -> list[Child]:
    """Split the tree region (``b``, ``e``) of direction ``d`` among ``pts`` (the members other
    than ``me``, any order, distinct ids) and ``me``: the children, in tree order, each with
    its sub-region. ``me`` keeps its own segment when it lies inside the region; otherwise the
    first member also takes the stretch from ``b``.
    """
    if d > 0:
        keyed = sorted([((h.id - b) % RING, h) for h in pts])
        my = (me - b) % RING
        inside = my == 0 or b == e or my < (e - b) % RING
    else:
        keyed = sorted([((b - h.id) % RING, h) for h in pts])
        my = (b - me) % RING
        inside = my == 0 or b == e or my < (b - e) % RING
    n = len(keyed)
    if inside and my == 0:  # the common case: the region starts at this node
        out = [(h, h.id, keyed[j + 1][1].id) for j, (_, h) in enumerate(keyed[:-1])]
        if n:
            h = keyed[-1][1]
            out.append((h, h.id, e))
        return out
    # k members precede this node in tree order (all of them when it lies outside)
    k = n
    if inside:
        k = 0
        while k < n and keyed[k][0] < my:
            k += 1
    out = []
    for j in range(n):
        h = keyed[j][1]
        sb = b if j == 0 and k > 0 else h.id
        if j + 1 == k and inside:
            se = me
        elif j + 1 < n:
            se = keyed[j + 1][1].id
        else:
            se = e
        out.append((h, sb, se))
    return out
