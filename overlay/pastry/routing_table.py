"""The Pastry routing table: 160/b rows of 2**b columns, rows allocated lazily.

Theory of operation (Rowstron & Druschel 2001 §2.1; Butt et al. 2006 §2.3): row ``l`` holds nodes
that share exactly ``l`` leading digits with this node; column ``c`` of that row holds a node whose
digit ``l`` is ``c``. The column equal to our own digit stays empty (we are that entry). With N
nodes only about log_{2^b} N rows are populated, so rows are ``None`` until the first entry arrives
(rows are allocated lazily) — a 10^5-node simulation keeps ~5 rows per node.

Which node fills a slot is decided by the core's proximity neighbour selection (PNS, Castro et
al. 2002; docs/pastry.md: a candidate replaces an entry only if its measured minimum RTT is lower);
this module only stores entries and answers structural questions quickly.
"""

from __future__ import annotations

from collections.abc import Iterator

from overlay.handle import NodeHandle
from overlay.ids import ID_BITS

Row = list[NodeHandle | None]


class RoutingTable:
    """Prefix routing table of the node with id ``oid`` (``b`` bits per digit)."""

    __slots__ = ("b", "cols", "mask", "members", "nrows", "oid", "rows")

    def __init__(self, oid: int, b: int = 4) -> None:
        self.oid = int(oid)
        self.b = b
        self.cols = 1 << b
        self.mask = self.cols - 1
        self.nrows = ID_BITS // b
        self.rows: list[Row | None] = [None] * self.nrows
        self.members: set[NodeHandle] = set()

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
        return len(self.members)

    def __contains__(self, h: object) -> bool:
        return h in self.members

    # ------------------------------------------------------------------ updates
    def put(self, row: int, col: int, h: NodeHandle) -> NodeHandle | None:
        """Place ``h`` at (row, col); returns the entry it replaced (or None)."""
        r = self.rows[row]
        if r is None:
            r = self.rows[row] = [None] * self.cols
        old = r[col]
        r[col] = h
        if old is not None:
            self.members.discard(old)
        self.members.add(h)
        return old

    def remove(self, h: NodeHandle) -> tuple[int, int] | None:
        """Remove ``h`` if present; returns the (row, col) it occupied."""
        if h not in self.members:
            return None
        slot = self.slot_of(h.id)
        if slot is None:
            return None
        row, col = slot
        r = self.rows[row]
        if r is None or r[col] != h:
            return None
        r[col] = None
        self.members.discard(h)
        return slot

    def install_row(self, row: int, entries: Row) -> None:
        """Replace a whole row (oracle build)."""
        old = self.rows[row]
        if old is not None:
            for h in old:
                if h is not None:
                    self.members.discard(h)
        if not any(e is not None for e in entries):
            self.rows[row] = None
            return
        self.rows[row] = list(entries)
        self.members.update(h for h in entries if h is not None)
