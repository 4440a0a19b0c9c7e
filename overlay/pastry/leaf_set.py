"""The Pastry leaf set: the L/2 numerically closest nodes on each side of this node.

Theory of operation (Rowstron & Druschel 2001 §2.1, §2.5; Butt et al. 2006 §2.3 "a leaf set, which
consists of l nodes with nodeIds that are numerically closest to the present node's nodeId, with
l/2 larger and l/2 smaller"):

* Two sides, each sorted by distance from the owner, nearest first: ``cw`` holds the nodes
  *clockwise* (larger ids, walking up the ring), ``ccw`` the nodes counter-clockwise. Only the
  distance of each side's extreme is kept (what the range and fit tests read, so they stay
  allocation-free); an insertion bisects the side on distances computed from the ids. A list of
  160-bit distances per side would cost every node ~1 KB for what an insertion, far rarer than
  a range test, recomputes in a few subtractions. In a ring of fewer than L + 1 nodes a node may
  sit on both sides; the sides then *overlap* and the leaf set covers the whole ring.
* **Range**: a key is in leaf-set range when it lies on the arc from the ccw extreme through the
  owner to the cw extreme (or anywhere, when the sides overlap). For such keys the node
  numerically closest among leaf set ∪ owner is responsible (ties: :func:`overlay.ids.closer`).
  A side that is short because members died simply narrows the range until repair refills it.
* The leaf set is pure state: who probes, heartbeats and repairs it lives in
  ``maintenance.py``; the core decides what enters it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Sequence

from overlay.handle import NodeHandle
from overlay.ids import HALF_RING, RING


class LeafSet:
    """Both halves of the leaf set of the node ``owner`` (``half`` members per side)."""

    __slots__ = (
        "_ccwmax",
        "_cwmax",
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
        #: distance from the owner of the farthest member of each side (0: the side is empty)
        self._cwmax = 0
        self._ccwmax = 0
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
        if len(self.cw) < self.half or d < self._cwmax:
            return True
        return len(self.ccw) < self.half or RING - d < self._ccwmax

    def in_range(self, key: int) -> bool:
        """Is ``key`` on the arc ccw-extreme → owner → cw-extreme?

        The leaf-set range test of Pastry routing (Rowstron & Druschel 2001 §2.2).
        """
        if self.covers_ring:
            return True
        # an empty side's extreme is at distance 0, which no key other than ours is within
        d = (key - self.oid) % RING
        return d == 0 or d <= self._cwmax or RING - d <= self._ccwmax

    def covers_block(self, lo: int, hi: int) -> bool:
        """Is the whole id block ``lo <= id <= hi`` (one that holds the owner: an aligned
        prefix class) within the arc ccw-extreme → owner → cw-extreme?"""
        if self.covers_ring:
            return True
        oid = self.oid
        return lo <= oid <= hi and oid - lo <= self._ccwmax and hi - oid <= self._cwmax

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
        elif d <= self._cwmax:
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
        cw, ccw, oid = self.cw, self.ccw, self.oid
        cwd = [(h.id - oid) % RING for h in cw]
        ccwd = [(oid - h.id) % RING for h in ccw]
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

    def would_keep(
        self, cands: Sequence[NodeHandle], pending: Collection[NodeHandle] = ()
    ) -> list[NodeHandle]:
        """Those of ``cands`` that would be members if every node of ``cands`` and ``pending``
        were inserted: on either side, among the ``half`` nearest of that side's members and
        all of them. A side that is short takes any candidate, so a batch offered to it (a
        repair reply lists a whole leaf set) fits one by one; this is the part of it that
        would still fit once the nearer ones are in."""
        oid = self.oid
        half = self.half
        members = self.members
        pool = [h for h in cands if h.id != oid]
        pool.extend(h for h in pending if h not in members and h.id != oid)
        keep: set[NodeHandle] = set()
        for clockwise, side in ((True, self.cw), (False, self.ccw)):
            if len(side) + len(pool) <= half:
                keep.update(pool)
                continue
            nodes = [*side, *pool]
            dist = [(int(h.id) - oid) % RING for h in nodes]
            if not clockwise:
                dist = [RING - d for d in dist]
            keep.update(nodes[i] for i in sorted(range(len(nodes)), key=dist.__getitem__)[:half])
        return [c for c in cands if c in keep]

    # ------------------------------------------------------------------ updates
    def insert(self, h: NodeHandle) -> bool:
        """Insert ``h`` on every side it belongs to; True if the membership changed."""
        d = (int(h.id) - self.oid) % RING
        if d == 0:
            return False
        changed = self._insert_side(self.cw, self._cwmax, h, d, 1)
        changed = self._insert_side(self.ccw, self._ccwmax, h, RING - d, -1) or changed
        if changed:
            self._refresh()
        return changed

    def _insert_side(
        self, side: list[NodeHandle], dmax: int, h: NodeHandle, d: int, sign: int
    ) -> bool:
        """Insert ``h`` at distance ``d`` into ``side`` (whose farthest member is at ``dmax``);
        ``sign`` = +1 on the clockwise side, -1 on the other (distance = sign * (id - owner))."""
        half = self.half
        if len(side) >= half and d >= dmax:
            return False
        oid = self.oid
        i = bisect_left(side, d, key=lambda m: (sign * (m.id - oid)) % RING)
        if i < len(side) and side[i].id == h.id:
            if side[i] == h:
                return False
            side[i] = h  # same id, new address: the node came back elsewhere
            return True
        if len(side) >= half:
            # the farthest goes first (``i < half`` here): a side never holds ``half + 1``
            # entries, which would grow its list to twice the room it needs
            side.pop()
        side.insert(i, h)
        return True

    def remove(self, h: NodeHandle) -> bool:
        """Remove ``h`` from both sides; True if it was a member."""
        if h not in self.members:
            return False
        for side in (self.cw, self.ccw):
            for i, m in enumerate(side):
                if m == h:
                    del side[i]
                    break
        self._refresh()
        return True

    def install(self, cw: list[NodeHandle], ccw: list[NodeHandle]) -> None:
        """Replace the whole state (oracle build); each side given nearest first."""
        self.cw = list(cw[: self.half])
        self.ccw = list(ccw[: self.half])
        self._refresh()

    def _refresh(self) -> None:
        oid = self.oid
        self._cwmax = (int(self.cw[-1].id) - oid) % RING if self.cw else 0
        self._ccwmax = (oid - int(self.ccw[-1].id)) % RING if self.ccw else 0
        cw_set = set(self.cw)
        overlap = not cw_set.isdisjoint(self.ccw)
        self.members = cw_set.union(self.ccw)
        self.covers_ring = overlap or not self.members
        nodes = list(self.ccw)
        nodes.extend(h for h in self.cw if h not in self.ccw)
        self._nodes = tuple(nodes)
