"""Ring-range arithmetic for multicast regions and missing ranges.

A *region* handed down a tree is expressed in the tree's own direction: for the clockwise tree
``[begin, end)`` is the usual clockwise half-open range; for the counter-clockwise tree it is the
range that starts at ``begin`` and walks counter-clockwise up to (not including) ``end``, i.e. the
clockwise range ``(end, begin]``. ``begin == end`` is the whole ring in both directions.

Every range reported to a user (missing ranges) is a clockwise half-open ``(lo, hi)`` pair of
NodeIds; ``hi`` may be smaller than ``lo`` (the range wraps through 0). The helpers here turn
tree regions into clockwise ranges, normalise lists of them (sort, coalesce) and intersect two
lists (the redundant trees' "missing only if missing in both", PonD §3.1.4).
"""

from __future__ import annotations

from collections.abc import Iterable

from overlay.ids import RING, NodeId

Range = tuple[NodeId, NodeId]

CW = 1
CCW = -1


def region_to_cw(direction: int, begin: int, end: int) -> tuple[int, int]:
    """The clockwise ``[lo, hi)`` covering the same ids as a tree region (ints, mod 2**160)."""
    if direction > 0:
        return begin, end
    return (end + 1) % RING, (begin + 1) % RING


def region_width(direction: int, begin: int, end: int) -> int:
    """Number of ids in a tree region (``RING`` for the whole ring)."""
    w = (end - begin) % RING if direction > 0 else (begin - end) % RING
    return w if w else RING


def in_region(direction: int, x: int, begin: int, end: int) -> bool:
    """True if id ``x`` lies in the tree region starting at ``begin`` and ending before ``end``."""
    if begin == end:
        return True
    if direction > 0:
        return (x - begin) % RING < (end - begin) % RING
    return (begin - x) % RING < (begin - end) % RING


def _pieces(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Split wrapping ranges at 0 into plain ``[lo, hi)`` intervals of ``[0, RING]``; sorted,
    overlapping or touching intervals merged."""
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        lo, hi = int(lo) % RING, int(hi) % RING
        if lo == hi:  # whole ring
            out.append((0, RING))
        elif lo < hi:
            out.append((lo, hi))
        else:
            out.append((lo, RING))
            if hi:
                out.append((0, hi))
    out.sort()
    merged: list[tuple[int, int]] = []
    for lo, hi in out:
        if merged and lo <= merged[-1][1]:
            if hi > merged[-1][1]:
                merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return merged


def _join(pieces: list[tuple[int, int]]) -> list[Range]:
    """Back from intervals to clockwise ranges, re-joining the piece that wraps through 0."""
    if not pieces:
        return []
    if pieces[0] == (0, RING):
        return [(NodeId(0), NodeId(0))]
    if len(pieces) > 1 and pieces[0][0] == 0 and pieces[-1][1] == RING:
        first = pieces.pop(0)
        last = pieces.pop()
        pieces.append((last[0], first[1] + RING))
    return [(NodeId(lo % RING), NodeId(hi % RING)) for lo, hi in pieces]


def normalize(ranges: Iterable[tuple[int, int]]) -> list[Range]:
    """Sorted, coalesced clockwise ranges covering exactly the ids of ``ranges``."""
    return _join(_pieces(ranges))


def intersect(a: Iterable[tuple[int, int]], b: Iterable[tuple[int, int]]) -> list[Range]:
    """Clockwise ranges covering the ids present in both ``a`` and ``b``."""
    pa, pb = _pieces(a), _pieces(b)
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < len(pa) and j < len(pb):
        lo = max(pa[i][0], pb[j][0])
        hi = min(pa[i][1], pb[j][1])
        if lo < hi:
            out.append((lo, hi))
        if pa[i][1] < pb[j][1]:
            i += 1
        else:
            j += 1
    return _join(out)


def contains(ranges: Iterable[tuple[int, int]], x: int) -> bool:
    """True if id ``x`` lies in one of the clockwise ranges."""
    return any(lo == hi or (x - lo) % RING < (hi - lo) % RING for lo, hi in ranges)
