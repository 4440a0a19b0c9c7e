"""A receiver's memory of the frames it accepted: one compact table, not one window per sender.

Theory of operation (docs/security.md, "Replay"): every authenticated frame carries its sender's
sequence number, wall-clock microseconds forced strictly increasing (``transports/auth.py``), so
a frame is identified by ``(sender key, seq)``. A receiver accepts a frame only if ``seq`` is
within ``skew`` of its own clock and it has not accepted that pair before. It remembers a 64-bit
digest of every pair it accepted for as long as the pair's ``seq`` could still pass the clock
check (it is then refused as stale anyway), in arrays of unboxed 64-bit ints (``array('Q')``),
one per ``bucket`` of sequence numbers, so that a whole bucket is forgotten at once when its
numbers leave the window: a sorted array while it holds at most 1,024 (8 bytes an entry, binary
search), then an open-addressing table (11–21 bytes an entry, O(1) at any size). This is the
sliding window of IPsec (RFC 4303 §3.4.3) with time for the counter, kept for all senders
together: a node that hears one or two frames from each of a hundred peers during a join pays
~8 bytes per frame, where a window per sender cost ~190 bytes per peer.

Bounded: beyond ``max_entries`` remembered frames the oldest bucket is forgotten and every number
at or below it is refused from then on (``floor``), so forgetting never re-admits a frame.
Digests come from Python's keyed string hash (SipHash with a per-process random key): two
different frames share one with probability ~2^-64, which costs an honest frame a drop, never a
replay its acceptance (equal frames always have equal digests).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left

__all__ = ["ReplayCache"]

_M64 = (1 << 64) - 1


#: entries up to which a bucket is a sorted array (8 bytes an entry, no empty slot; an insertion
#: moves at most 8 KiB); past it, open addressing (8-11 bytes an entry, O(1) at any size)
_SORTED_MAX = 1024


class _Sorted:
    """Nonzero 64-bit digests in ascending order (binary search): a quiet node's bucket holds
    ~100, which the hash table keeps in 256 slots (2 KiB) and this in ~0.9 KiB."""

    __slots__ = ("digests",)

    def __init__(self) -> None:
        self.digests = array("Q")

    @property
    def n(self) -> int:
        return len(self.digests)

    def find(self, d: int) -> bool:
        a = self.digests
        i = bisect_left(a, d)
        return i < len(a) and a[i] == d

    def add(self, d: int) -> bool:
        """Insert ``d``; False if it was there already."""
        a = self.digests
        i = bisect_left(a, d)
        if i < len(a) and a[i] == d:
            return False
        a.insert(i, d)
        return True


class _Table:
    """Open addressing (linear probing) over nonzero 64-bit digests."""

    __slots__ = ("n", "slots")

    def __init__(self, size: int = 8) -> None:
        self.slots = array("Q", bytes(8 * size))
        self.n = 0

    @classmethod
    def of(cls, digests: array[int]) -> _Table:
        """A table holding ``digests`` (distinct), at most half full."""
        size = 8
        while size < 2 * len(digests):
            size *= 2
        t = cls(size)
        for d in digests:
            t.add(d)
        return t

    def _slot(self, d: int) -> int:
        """Where ``d`` is, or the empty slot where it would go (linear probing)."""
        t = self.slots
        mask = len(t) - 1
        i = d & mask
        while True:
            x = t[i]
            if x == d or x == 0:
                return i
            i = (i + 1) & mask

    def find(self, d: int) -> bool:
        return self.slots[self._slot(d)] == d

    def add(self, d: int) -> bool:
        """Insert ``d``; False if it was there already."""
        i = self._slot(d)
        if self.slots[i] == d:
            return False
        self.slots[i] = d
        self.n += 1
        if self.n * 4 > len(self.slots) * 3:
            self._grow()
        return True

    def _grow(self) -> None:
        old = self.slots
        self.slots = array("Q", bytes(16 * len(old)))
        self.n = 0
        for x in old:
            if x:
                self.add(x)


class ReplayCache:
    """The frames one receiver accepted, by ``(sender, seq)``; see the module docstring."""

    __slots__ = (
        "_buckets", "_count", "_max", "_next_expiry", "_skew", "_width", "evicted", "floor",
    )  # fmt: skip

    def __init__(self, skew_us: int | None, *, max_entries: int, bucket_us: int) -> None:
        self._skew = skew_us
        self._max = max_entries
        self._width = bucket_us
        self._buckets: dict[int, _Sorted | _Table] = {}
        self._count = 0
        self._next_expiry = 0
        #: numbers at or below this are refused (raised only when the table overflowed)
        self.floor = -1
        #: buckets forgotten early because the table was full
        self.evicted = 0

    def __len__(self) -> int:
        return self._count

    @staticmethod
    def digest(sender: bytes, seq: int) -> int:
        """The nonzero 64-bit digest of one frame."""
        return (hash((sender, seq)) & _M64) | 1

    def seen(self, sender: bytes, seq: int) -> bool:
        """True if ``(sender, seq)`` was accepted and is still remembered (read-only)."""
        t = self._buckets.get(seq // self._width)
        return t is not None and t.find(self.digest(sender, seq))

    def check(self, sender: bytes, seq: int, now_us: int) -> str | None:
        """Admit ``(sender, seq)`` once: None if accepted (and now remembered), else why not
        (``stale``: outside the clock window or below the floor; ``replayed``)."""
        skew = self._skew
        if seq <= self.floor or (skew is not None and abs(seq - now_us) > skew):
            return "stale"
        if skew is not None and now_us >= self._next_expiry:
            self._expire(now_us - skew)
        b = seq // self._width
        t = self._buckets.get(b)
        if t is None:
            t = self._buckets[b] = _Sorted()
        if not t.add(self.digest(sender, seq)):
            return "replayed"
        if isinstance(t, _Sorted) and t.n > _SORTED_MAX:
            self._buckets[b] = _Table.of(t.digests)
        self._count += 1
        if self._count > self._max:
            self._evict()
        return None

    def _expire(self, oldest_us: int) -> None:
        # numbers below ``oldest_us`` fail the clock check: their buckets can go
        w = self._width
        for b in [b for b in self._buckets if (b + 1) * w <= oldest_us]:
            self._count -= self._buckets.pop(b).n
        self._next_expiry = oldest_us + (self._skew or 0) + w // 4

    def _evict(self) -> None:
        while self._count > self._max and self._buckets:
            b = min(self._buckets)
            self._count -= self._buckets.pop(b).n
            self.floor = max(self.floor, (b + 1) * self._width - 1)
            self.evicted += 1
