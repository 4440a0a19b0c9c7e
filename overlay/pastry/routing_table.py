"""The Pastry routing table: 160/b rows of 2**b columns, rows allocated lazily.

Theory of operation (Rowstron & Druschel 2001 §2.1; Butt et al. 2006 §2.3): row ``l`` holds nodes
that share exactly ``l`` leading digits with this node; column ``c`` of that row holds a node whose
digit ``l`` is ``c``. The column equal to our own digit stays empty (we are that entry). With N
nodes only about log_{2^b} N rows are populated, so rows are ``None`` until the first entry arrives
(rows are allocated lazily) — a 10^5-node simulation keeps ~5 rows per node.

Which node fills a slot is decided by the core's proximity neighbour selection (PNS, Castro et
al. 2002; docs/pastry.md: a candidate replaces an entry only if its measured minimum RTT is lower);
this module only stores entries and answers structural questions quickly.

Membership (``h in table``, also spelt ``h in table.members``) is answered from the slot ``h``'s
id belongs to — an entry only ever sits in the slot of its id — instead of from a set of the
entries: a set of a few dozen handles is a hash table of 64–128 slots, ~1–2 KiB on every node,
to answer in ~40 ns what two integer operations and a list index answer in ~200 ns.

**RTT bounds.** PNS installs a candidate in an empty slot without a probe when the triangle
inequality already bounds its RTT within "near enough" (``PastryCore.offer_hinted``). The table
keeps that upper bound with the slot (:meth:`RoutingTable.bound`) until the slot changes hands:
without it, the entry would read as "never measured", so the next candidate for the slot would
probe it, and the rows we send would carry no hint for it, so every receiver would probe it too
(in a 1,000-node swarm in one process, where every node is near enough, that was 11 of a join's
17 PNS pings). A bound is one byte per slot, in steps of :data:`BOUND_STEP_S` rounded up (so it
stays an upper bound), for rows up to the deepest one allocated.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from overlay.handle import NodeHandle
from overlay.ids import ID_BITS

Row = list[NodeHandle | None]

#: the unit of a slot's RTT bound (one byte: bounds up to 255 steps, 63.75 ms, are kept; a
#: larger one is not worth keeping, as no "near enough" cutoff is that wide)
BOUND_STEP_S = 0.25e-3
_BOUND_MAX = 255


class RoutingTable:
    """Prefix routing table of the node with id ``oid`` (``b`` bits per digit)."""

    __slots__ = ("_bounds", "_n", "b", "cols", "mask", "members", "nrows", "oid", "rows")

    def __init__(self, oid: int, b: int = 4) -> None:
        self.oid = int(oid)
        self.b = b
        self.cols = 1 << b
        self.mask = self.cols - 1
        self.nrows = ID_BITS // b
        self.rows: list[Row | None] = [None] * self.nrows
        self._n = 0  # filled entries
        #: RTT bound codes per slot, row-major, grown to the deepest row that got one
        #: (0 = none; see the module doc); None until the first bound (a simulated node on a
        #: network with no two hosts that near never makes one)
        self._bounds: bytearray | None = None
        #: the entries as a container (``h in table.members``): the table itself, held in a
        #: slot rather than returned by a property, which would cost a call on every hop
        self.members: RoutingTable = self

    # ------------------------------------------------------------------ geometry
    def slot_of(self, node_id: int) -> tuple[int, int] | None:
        """(row, column) where a node with this id belongs; None for our own id."""
        x = self.oid ^ int(node_id)
        if x == 0:
            return None
        row = (ID_BITS - x.bit_length()) // self.b
        col = (int(node_id) >> (ID_BITS - (row + 1) * self.b)) & self.mask
        return row, col

    # ------------------------------------------------------------------ queries
    def get(self, row: int, col: int) -> NodeHandle | None:
        """The entry at (row, col), or None when empty."""
        r = self.rows[row]
        return None if r is None else r[col]

    def bound(self, row: int, col: int) -> float | None:
        """The upper bound on our RTT to the entry at (row, col) that it was installed with,
        unprobed (None: no bound kept — the entry was measured or installed without one)."""
        b = self._bounds
        if b is None:
            return None
        i = row * self.cols + col
        code = b[i] if i < len(b) else 0
        return code * BOUND_STEP_S if code else None

    def bound_of(self, h: NodeHandle) -> float | None:
        """:meth:`bound` of ``h``'s slot, if ``h`` is the entry there; else None."""
        if self._bounds is None:
            return None
        slot = self.slot_of(h.id)
        if slot is None or self.get(*slot) != h:
            return None
        return self.bound(*slot)

    def row(self, row: int) -> list[NodeHandle]:
        """The filled entries of ``row`` (empty list when the row was never allocated)."""
        r = self.rows[row] if 0 <= row < self.nrows else None
        return [] if r is None else [h for h in r if h is not None]

    def entries(self) -> Iterator[NodeHandle]:
        """Every filled entry, row by row."""
        for r in self.rows:
            if r is not None:
                for h in r:
                    if h is not None:
                        yield h

    def rows_upto(self, last: int) -> tuple[NodeHandle, ...]:
        """Every entry of rows 0..last (what a hop contributes to a joiner, R&D §2.4)."""
        out: list[NodeHandle] = []
        for r in self.rows[: last + 1]:
            if r is not None:
                out.extend(h for h in r if h is not None)
        return tuple(out)

    def rows_between(self, first: int, last: int) -> tuple[NodeHandle, ...]:
        """Every entry of rows first..last (inclusive; empty when first > last)."""
        out: list[NodeHandle] = []
        for r in self.rows[max(0, first) : last + 1]:
            if r is not None:
                out.extend(h for h in r if h is not None)
        return tuple(out)

    def populated_rows(self) -> list[int]:
        """Indices of the rows that hold at least one entry."""
        return [i for i, r in enumerate(self.rows) if r is not None and any(r)]

    def __len__(self) -> int:
        return self._n

    def __contains__(self, h: object) -> bool:
        # O(1): the one slot ``h`` can occupy (what ``slot_of`` computes, inlined: this runs on
        # every routed hop, for its previous hop)
        try:
            nid = h.id  # type: ignore[attr-defined]
            x = self.oid ^ nid
        except (AttributeError, TypeError):  # not a handle
            return False
        if not x:
            return False
        row = (ID_BITS - x.bit_length()) // self.b
        r = self.rows[row]
        return r is not None and r[(nid >> (ID_BITS - (row + 1) * self.b)) & self.mask] == h

    # ------------------------------------------------------------------ updates
    def put(
        self, row: int, col: int, h: NodeHandle, bound_s: float | None = None
    ) -> NodeHandle | None:
        """Place ``h`` at (row, col); returns the entry it replaced (or None). ``bound_s``: an
        upper bound on our RTT to ``h``, kept with the slot while ``h`` holds it (rounded up
        to :data:`BOUND_STEP_S`; one above 255 steps is not kept)."""
        r = self.rows[row]
        if r is None:
            r = self.rows[row] = [None] * self.cols
        old = r[col]
        r[col] = h
        if old is None:
            self._n += 1
        self._set_bound(row * self.cols + col, bound_s)
        return old

    def _set_bound(self, i: int, bound_s: float | None) -> None:
        code = 0
        if bound_s is not None and bound_s >= 0.0:
            code = max(1, math.ceil(bound_s / BOUND_STEP_S))
            if code > _BOUND_MAX:
                code = 0
        b = self._bounds
        if b is None:
            if not code:
                return
            b = self._bounds = bytearray()
        if i >= len(b):
            if not code:
                return
            b.extend(bytes((i // self.cols + 1) * self.cols - len(b)))
        b[i] = code

    def remove(self, h: NodeHandle) -> tuple[int, int] | None:
        """Remove ``h`` if present; returns the (row, col) it occupied."""
        slot = self.slot_of(h.id)
        if slot is None:
            return None
        row, col = slot
        r = self.rows[row]
        if r is None or r[col] != h:
            return None
        r[col] = None
        self._n -= 1
        self._set_bound(row * self.cols + col, None)
        return slot

    def install_row(self, row: int, entries: Row) -> None:
        """Replace a whole row (oracle build)."""
        old = self.rows[row]
        if old is not None:
            self._n -= sum(h is not None for h in old)
        for col in range(self.cols):
            self._set_bound(row * self.cols + col, None)
        if not any(e is not None for e in entries):
            self.rows[row] = None
            return
        self.rows[row] = list(entries)
        self._n += sum(h is not None for h in entries)
