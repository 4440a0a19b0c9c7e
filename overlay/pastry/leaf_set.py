"""The Pastry leaf set: the L/2 numerically closest nodes on each side of this node.

Theory of operation (Rowstron & Druschel 2001 §2.1, §2.5; Butt et al. 2006 §2.3 "a leaf set, which
consists of l nodes with nodeIds that are numerically closest to the present node's nodeId, with
l/2 larger and l/2 smaller"):

* Two sides, each sorted by distance from the owner, nearest first: ``cw`` holds the nodes
  *clockwise* (larger ids, walking up the ring), ``ccw`` the nodes counter-clockwise. A parallel
  list of integer distances per side makes insertion a ``bisect`` and keeps every query
  allocation-free. In a ring of fewer than L + 1 nodes a node may sit on both sides; the sides
  then *overlap* and the leaf set covers the whole ring.
* **Range**: a key is in leaf-set range when it lies on the arc from the ccw extreme through the
  owner to the cw extreme (or anywhere, when the sides overlap). For such keys the node
  numerically closest among leaf set ∪ owner is responsible (ties: :func:`overlay.ids.closer`).
  A side that is short because members died simply narrows the range until repair refills it.
* The leaf set is pure state: who probes, heartbeats and repairs it lives in
  ``maintenance.py``; the core decides what enters it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection

from overlay.handle import NodeHandle
from overlay.ids import HALF_RING, RING


class LeafSet:
    """Both halves of the leaf set of the node ``owner`` (``half`` members per side)."""

    __slots__ = (
        "_ccwd",
        "_cwd",
        "_nodes",
        "ccw",
        "covers_ring",
        "cw",
        "half",
        "members",
        "oid",
        "owner",
    )

    def __init__(self, owner: NodeHandle, half: int) -> None:
        self.owner = owner
        self.oid: int = int(owner.id)
        self.half = half
        self.cw: list[NodeHandle] = []
        self.ccw: list[NodeHandle] = []
        self._cwd: list[int] = []
        self._ccwd: list[int] = []
        self.members: set[NodeHandle] = set()
        self.covers_ring = True
        self._nodes: tuple[NodeHandle, ...] = ()

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, h: object) -> bool:
        return h in self.members

    def nodes(self) -> tuple[NodeHandle, ...]:
        """Every member once: ccw side nearest first, then the cw side (cached, immutable)."""
        return self._nodes

    def fits(self, node_id: int) -> bool:
        """Would a node with this id enter either side (ignoring whether it is already in)?"""
        d = (node_id - self.oid) % RING
        if d == 0:
            return False
        if len(self.cw) < self.half or d < self._cwd[-1]:
            return True
        e = RING - d
        return len(self.ccw) < self.half or e < self._ccwd[-1]

    def in_range(self, key: int) -> bool:
        """Is ``key`` on the arc ccw-extreme → owner → cw-extreme?

        The leaf-set range test of Pastry routing (Rowstron & Druschel 2001 §2.2).
        """
        if self.covers_ring:
            return True
        d = (key - self.oid) % RING
        if d == 0 or (self.cw and d <= self._cwd[-1]):
            return True
        return bool(self.ccw) and RING - d <= self._ccwd[-1]

    def closest(
        self, key: int, bad: Collection[NodeHandle], exclude: Collection[NodeHandle] | None
    ) -> NodeHandle | None:
        """The member numerically closest to ``key`` if closer than the owner, else None.

        Skips ``bad`` and ``exclude``. Call only for keys :meth:`in_range`.
        """
        oid = self.oid
        d = (key - oid) % RING
        bd = d if d <= HALF_RING else RING - d
        bid = oid
        best: NodeHandle | None = None
        if self.covers_ring:
            sides: tuple[list[NodeHandle], ...] = (self.cw, self.ccw)
        elif self.cw and d <= self._cwd[-1]:
            sides = (self.cw,)
        else:
            sides = (self.ccw,)
        for side in sides:
            for h in side:
                if bad and h in bad:
                    continue
                if exclude and h in exclude:
                    continue
                hid = h.id
                x = (key - hid) % RING
                if x > HALF_RING:
                    x = RING - x
                if x < bd or (x == bd and hid < bid):
                    best, bd, bid = h, x, hid
        return best

    def cw_extreme(self) -> NodeHandle | None:
        """The farthest clockwise member, or None if that side is empty."""
        return self.cw[-1] if self.cw else None

    def ccw_extreme(self) -> NodeHandle | None:
        """The farthest counter-clockwise member, or None if that side is empty."""
        return self.ccw[-1] if self.ccw else None

    def neighbors(self) -> tuple[NodeHandle | None, NodeHandle | None]:
        """The immediate neighbours (ccw, cw)."""
        return (self.ccw[0] if self.ccw else None, self.cw[0] if self.cw else None)

    def is_full(self) -> bool:
        """Whether both sides hold their full ``half`` members."""
        return len(self.cw) >= self.half and len(self.ccw) >= self.half

    def short_sides(self) -> tuple[bool, bool]:
        """(ccw short, cw short) — only meaningful when the sides do not overlap."""
        return (len(self.ccw) < self.half, len(self.cw) < self.half)

    def ordered_by_distance(self) -> list[NodeHandle]:
        """Members interleaved from both sides, nearest first (the KBR ``neighbor_set``)."""
        out: list[NodeHandle] = []
        seen: set[NodeHandle] = set()
        i = j = 0
        cw, ccw, cwd, ccwd = self.cw, self.ccw, self._cwd, self._ccwd
        while i < len(cw) or j < len(ccw):
            if j >= len(ccw) or (i < len(cw) and cwd[i] <= ccwd[j]):
                h = cw[i]
                i += 1
            else:
                h = ccw[j]
                j += 1
            if h not in seen:
                seen.add(h)
                out.append(h)
        return out

    # ------------------------------------------------------------------ updates
    def insert(self, h: NodeHandle) -> bool:
        """Insert ``h`` on every side it belongs to; True if the membership changed."""
        d = (int(h.id) - self.oid) % RING
        if d == 0:
            return False
        changed = self._insert_side(self.cw, self._cwd, h, d)
        changed = self._insert_side(self.ccw, self._ccwd, h, RING - d) or changed
        if changed:
            self._refresh()
        return changed

    def _insert_side(self, side: list[NodeHandle], dist: list[int], h: NodeHandle, d: int) -> bool:
        half = self.half
        if len(side) >= half and d >= dist[-1]:
            return False
        i = bisect_left(dist, d)
        if i < len(dist) and dist[i] == d:
            if side[i] == h:
                return False
            side[i] = h  # same id, new address: the node came back elsewhere
            return True
        side.insert(i, h)
        dist.insert(i, d)
        if len(side) > half:
            side.pop()
            dist.pop()
        return True

    def remove(self, h: NodeHandle) -> bool:
        """Remove ``h`` from both sides; True if it was a member."""
        if h not in self.members:
            return False
        for side, dist in ((self.cw, self._cwd), (self.ccw, self._ccwd)):
            for i, m in enumerate(side):
                if m == h:
                    del side[i]
                    del dist[i]
                    break
        self._refresh()
        return True

    def install(self, cw: list[NodeHandle], ccw: list[NodeHandle]) -> None:
        """Replace the whole state (oracle build); each side given nearest first."""
        oid = self.oid
        self.cw = list(cw[: self.half])
        self.ccw = list(ccw[: self.half])
        self._cwd = [(int(h.id) - oid) % RING for h in self.cw]
        self._ccwd = [(oid - int(h.id)) % RING for h in self.ccw]
        self._refresh()

    def _refresh(self) -> None:
        cw_set = set(self.cw)
        overlap = not cw_set.isdisjoint(self.ccw)
        self.members = cw_set.union(self.ccw)
        self.covers_ring = overlap or not self.members
        nodes = list(self.ccw)
        nodes.extend(h for h in self.cw if h not in self.ccw)
        self._nodes = tuple(nodes)
