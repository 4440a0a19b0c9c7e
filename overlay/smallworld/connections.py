"""The connection table of one small-world node: near connections and shortcuts.

Theory of operation (PonD §2.2; Brunet ``ConnectionTable`` and the near/shortcut overlords):

* A node keeps **near connections** to its ``near_per_side`` closest nodes on each side of the
  ring and **shortcuts** to far nodes. Connections are bidirectional, like Brunet edges: a
  shortcut appears as *out* on the node that drew it and as *in* on the node it reached, and
  greedy routing uses both ends.
* Which connections are near is not stored: the table keeps every connection in one tuple
  sorted clockwise from the owner, so the near window is simply the first ``near_per_side``
  entries (right side) and the last ``near_per_side`` entries (left side). A shortcut that
  happens to fall inside the window counts as near, not as a shortcut (Brunet's NeedShortcut
  does the same). A connection that is neither in the window nor an out/in shortcut is
  *surplus* and gets trimmed.
* **Suspected nodes hold no slot.** Under churn a crashed neighbour stays in the table until
  its probe ends (tens of seconds at 5-minute sessions). Counted as a member, it would keep the
  live node next in line out: a live node offered then is refused and a live connection
  there is trimmed, so when the crash is confirmed its keys go to the wrong node until a
  repair relearns the neighbour. Given the suspected set, :meth:`ConnectionTable.fits_near`,
  :meth:`~ConnectionTable.surplus` and :meth:`~ConnectionTable.needed` count only live
  connections, keeping the live window (``near_per_side`` live ones per side) as reserve
  behind the suspected ones (measured: docs/smallworld.md, "Short sessions").
* Memory is the constraint at 10^6 simulated nodes, so the table is three tuples of shared
  :class:`NodeHandle` references (8 bytes per connection) plus the cached size estimate; no
  per-connection objects, dicts or sets. Tuples are rebuilt on change: changes are rare
  (joins, failures, maintenance) while routing reads the table on every hop.
"""

from __future__ import annotations

import bisect
from collections.abc import Set as AbstractSet

from overlay.handle import NodeHandle
from overlay.ids import HALF_RING, RING
from overlay.smallworld.estimate import estimate_size

_EMPTY: tuple[NodeHandle, ...] = ()
_NO_BAD: frozenset[NodeHandle] = frozenset()


class ConnectionTable:
    """All connections of one node, sorted clockwise from ``me``."""

    __slots__ = ("all", "inc", "me", "n_hat", "near", "out")

    def __init__(self, me: int, near_per_side: int) -> None:
        self.me = me
        self.near = near_per_side
        self.all: tuple[NodeHandle, ...] = _EMPTY
        self.out: tuple[NodeHandle, ...] = _EMPTY
        self.inc: tuple[NodeHandle, ...] = _EMPTY
        self.n_hat = 1.0

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.all)

    def __contains__(self, h: object) -> bool:
        return h in self.all

    def cw(self, x: int) -> int:
        """Clockwise distance from the owner to id ``x``."""
        return (x - self.me) % RING

    def near_nodes(self) -> tuple[NodeHandle, ...]:
        """The near window: right side (closest first) then left side (farthest first)."""
        a = self.all
        k = self.near
        if len(a) <= 2 * k:
            return a
        return a[:k] + a[-k:]

    def right(self) -> tuple[NodeHandle, ...]:
        """Near connections clockwise, closest first."""
        a = self.all
        if len(a) <= 2 * self.near:
            return tuple(h for h in a if self.cw(h.id) <= HALF_RING)
        return a[: self.near]

    def left(self) -> tuple[NodeHandle, ...]:
        """Near connections counter-clockwise, closest first."""
        a = self.all
        if len(a) <= 2 * self.near:
            return tuple(h for h in reversed(a) if self.cw(h.id) > HALF_RING)
        return tuple(reversed(a[-self.near :]))

    def is_near(self, h: NodeHandle) -> bool:
        """Whether ``h`` is a connection inside the near window (every connection is near when there
        are at most ``2 * near`` of them)."""
        a = self.all
        try:
            i = a.index(h)
        except ValueError:
            return False
        n = len(a)
        k = self.near
        return n <= 2 * k or i < k or i >= n - k

    def fits_near(self, x: int, bad: AbstractSet[NodeHandle] = _NO_BAD) -> bool:
        """Would a node with id ``x`` (not yet connected) enter the near window? Connections in
        ``bad`` (suspected or dead) hold no slot: ``x`` fits if it is closer than the
        ``near_per_side``-th live connection on its side."""
        a = self.all
        n = len(a)
        k = self.near
        d = (x - self.me) % RING
        if bad and any(h in bad for h in a):
            live = [h for h in a if h not in bad]
            if len(live) < 2 * k:
                return d != 0
            a, n = tuple(live), len(live)
        if n < 2 * k:
            return True
        if d == 0:
            return False
        return d < (a[k - 1].id - self.me) % RING or d > (a[n - k].id - self.me) % RING

    def live_window(self, bad: AbstractSet[NodeHandle]) -> set[NodeHandle]:
        """The ``near_per_side`` closest connections on each side that are not in ``bad``."""
        k = self.near
        a = self.all
        out: set[NodeHandle] = set()
        for seq in (a, a[::-1]):
            got = 0
            for h in seq:
                if got >= k:
                    break
                if h not in bad:
                    out.add(h)
                    got += 1
        return out

    def effective_out(self) -> list[NodeHandle]:
        """Own shortcuts that are not inside the near window (the ones that count)."""
        if not self.out:
            return []
        near = self.near_nodes()
        return [h for h in self.out if h not in near]

    def surplus(self, bad: AbstractSet[NodeHandle] = _NO_BAD) -> list[NodeHandle]:
        """Connections outside the near window that no shortcut (out or in) justifies — nor the
        live window, when ``bad`` connections sit inside the near window."""
        a = self.all
        k = self.near
        if len(a) <= 2 * k:
            return []
        keep_out, keep_in = self.out, self.inc
        extra = [h for h in a[k:-k] if h not in keep_out and h not in keep_in]
        if extra and bad and any(h in bad for h in self.near_nodes()):
            live = self.live_window(bad)
            extra = [h for h in extra if h not in live]
        return extra

    def in_range(self, begin: int, end: int, bad: AbstractSet[NodeHandle]) -> list[NodeHandle]:
        """Connections in the clockwise half-open range [begin, end), clockwise from the owner."""
        span = (end - begin) % RING
        if span == 0:  # the whole ring
            return [h for h in self.all if h not in bad]
        return [h for h in self.all if (h.id - begin) % RING < span and h not in bad]

    def next_hop(
        self, key: int, bad: AbstractSet[NodeHandle], exclude: AbstractSet[NodeHandle] | None
    ) -> NodeHandle | None:
        """The connection strictly closer to ``key`` than the owner and closest of all.

        Ring distance, ties to the smaller id: exactly :func:`overlay.ids.closer`. Suspected
        or dead connections and ``exclude`` are skipped; None means "deliver here".
        """
        bid = self.me
        bd = (bid - key) % RING
        if bd > HALF_RING:
            bd = RING - bd
        best: NodeHandle | None = None
        for h in self.all:
            i = h.id
            x = (i - key) % RING
            if x > HALF_RING:
                x = RING - x
            if x < bd or (x == bd and i < bid):
                if (bad and h in bad) or (exclude and h in exclude):
                    continue
                best = h
                bd = x
                bid = i
        return best

    # ------------------------------------------------------------------ updates
    def _set_all(self, a: tuple[NodeHandle, ...]) -> None:
        self.all = a
        self.n_hat = estimate_size(self.me, a, self.near)

    def add(self, h: NodeHandle) -> bool:
        """Insert ``h`` in clockwise order; False if it was already there (or is the owner)."""
        if h.id == self.me or h in self.all:
            return False
        me = self.me
        a = self.all
        i = bisect.bisect(a, (h.id - me) % RING, key=lambda c: (c.id - me) % RING)
        self._set_all((*a[:i], h, *a[i:]))
        return True

    def add_out(self, h: NodeHandle) -> None:
        """Record ``h`` as a connection we opened (outgoing) and add it to the table."""
        if h.id == self.me:
            return
        if h not in self.out:
            self.out = (*self.out, h)
        self.add(h)

    def add_in(self, h: NodeHandle) -> None:
        """Record ``h`` as a connection a peer opened to us (incoming) and add it to the table."""
        if h.id == self.me:
            return
        if h not in self.inc:
            self.inc = (*self.inc, h)
        self.add(h)

    def discard_out(self, h: NodeHandle) -> None:
        """Forget that we opened the connection to ``h`` (the table entry stays)."""
        if h in self.out:
            self.out = tuple(x for x in self.out if x != h)

    def discard_in(self, h: NodeHandle) -> None:
        """Forget that ``h`` opened a connection to us (the table entry stays)."""
        if h in self.inc:
            self.inc = tuple(x for x in self.inc if x != h)

    def remove(self, h: NodeHandle) -> bool:
        """Drop ``h`` entirely (all roles). False if it was not connected."""
        self.discard_out(h)
        self.discard_in(h)
        if h not in self.all:
            return False
        self._set_all(tuple(x for x in self.all if x != h))
        return True

    def needed(self, h: NodeHandle, bad: AbstractSet[NodeHandle] = _NO_BAD) -> bool:
        """Is ``h`` near, an own shortcut, someone's shortcut to us, or (given the suspected
        connections ``bad``) in the live window?"""
        if h in self.out or h in self.inc or self.is_near(h):
            return True
        return bool(bad) and h in self.live_window(bad)

    def set_near(self, k: int) -> None:
        """Keep ``k`` near connections a side from now on (the owner's churn estimate, see
        ``churn.py``); the size estimate is taken again over the new window."""
        self.near = k
        self._set_all(self.all)

    def load(
        self,
        all_cw: tuple[NodeHandle, ...],
        out: tuple[NodeHandle, ...],
        inc: tuple[NodeHandle, ...],
    ) -> None:
        """Install a complete table at once (the oracle build); ``all_cw`` already sorted."""
        self.out = out if out else _EMPTY
        self.inc = inc if inc else _EMPTY
        self._set_all(all_cw)
