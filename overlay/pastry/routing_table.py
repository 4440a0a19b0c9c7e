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
"""

from __future__ import annotations

from collections.abc import Iterator

from overlay.handle import NodeHandle
from overlay.ids import ID_BITS

Row = list[NodeHandle | None]


class RoutingTable:
    """Prefix routing table of the node with id ``oid`` (``b`` bits per digit)."""

    __slots__ = ("_n", "b", "cols", "mask", "members", "nrows", "oid", "rows")

    def __init__(self, oid: int, b: int = 4) -> None:
        self.oid = int(oid)
        self.b = b
        self.cols = 1 << b
        self.mask = self.cols - 1
        self.nrows = ID_BITS // b
        self.rows: list[Row | None] = [None] * self.nrows
        self._n = 0  # filled entries
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
    def put(self, row: int, col: int, h: NodeHandle) -> NodeHandle | None:
        """Place ``h`` at (row, col); returns the entry it replaced (or None)."""
        r = self.rows[row]
        if r is None:
            r = self.rows[row] = [None] * self.cols
        old = r[col]
        r[col] = h
        if old is None:
            self._n += 1
        return old

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
        return slot

    def install_row(self, row: int, entries: Row) -> None:
        """Replace a whole row (oracle build)."""
        old = self.rows[row]
        if old is not None:
            self._n -= sum(h is not None for h in old)
        if not any(e is not None for e in entries):
            self.rows[row] = None
            return
        self.rows[row] = list(entries)
        self._n += sum(h is not None for h in entries)
