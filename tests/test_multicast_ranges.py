"""Ring-range arithmetic of the multicast layer, checked against brute-force membership."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.ids import RING, NodeId
from overlay.multicast.messages import McAck, McQuery, McReply, McReplyAck
from overlay.multicast.ranges import (
    CCW,
    CW,
    contains,
    in_region,
    intersect,
    normalize,
    region_to_cw,
    region_width,
)
from overlay.wire import decode_message, encode_message

ids = st.integers(min_value=0, max_value=RING - 1)
# ranges near a few anchors so that overlaps and wraps actually happen
anchors = st.sampled_from([0, 5, RING // 2, RING - 5])
near = st.builds(lambda a, d: (a + d) % RING, anchors, st.integers(-8, 8))
points = st.one_of(ids, near)
ranges = st.lists(st.tuples(points, points).filter(lambda r: r[0] != r[1]), max_size=5)


def probes(*lists: list[tuple[int, int]]) -> set[int]:
    out = {0, 1, RING - 1, RING // 2}
    for rs in lists:
        for lo, hi in rs:
            for x in (lo, hi):
                out.update({(x - 1) % RING, x, (x + 1) % RING})
    return out


@settings(max_examples=300, deadline=None)
@given(ranges)
def test_normalize_keeps_membership(rs: list[tuple[int, int]]) -> None:
    norm = normalize(rs)
    for x in probes(rs):
        assert contains(norm, x) == contains(rs, x)
    # coalesced: sorted, no two ranges touch
    assert len(norm) == len(normalize(norm))


@settings(max_examples=300, deadline=None)
@given(ranges, ranges)
def test_intersect_is_membership_and(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> None:
    both = intersect(a, b)
    for x in probes(a, b):
        assert contains(both, x) == (contains(a, x) and contains(b, x))


@settings(max_examples=300, deadline=None)
@given(points, points, points)
def test_regions_in_both_directions(b: int, e: int, x: int) -> None:
    for d in (CW, CCW):
        lo, hi = region_to_cw(d, b, e)
        assert in_region(d, x, b, e) == contains([(lo, hi)], x)
        w = region_width(d, b, e)
        assert w == ((hi - lo) % RING or RING)
    # the counter-clockwise region from e-1 down to (not incl.) b-1 is the clockwise [b, e)
    if b != e:
        cb, ce = (e - 1) % RING, (b - 1) % RING
        assert in_region(CCW, x, cb, ce) == in_region(CW, x, b, e)


def test_whole_ring() -> None:
    assert normalize([(7, 7)]) == [(NodeId(0), NodeId(0))]
    assert intersect([(7, 7)], [(3, 9)]) == [(NodeId(3), NodeId(9))]
    assert normalize([(RING - 2, 3), (3, RING - 2)]) == [(NodeId(0), NodeId(0))]
    assert normalize([(RING - 2, 3)]) == [(NodeId(RING - 2), NodeId(3))]


def test_messages_round_trip_through_the_codec() -> None:
    msgs = [
        McQuery(1, "count", 5, -1, NodeId(3), NodeId(RING - 1), 1.5, 2.0, 10**6, 32, None, 7, 3),
        McQuery(2, "ids", None, 1, NodeId(0), NodeId(0), 0.0, 2.0, 1, 1, NodeId(9), 1, 0),
        McAck(7, 3),
        McReply(7, 3, 12, ((NodeId(1), NodeId(RING // 3)),), 4, 12, False, 99),
        McReplyAck(99),
    ]
    for m in msgs:
        assert (m.TAG, decode_message(encode_message(m))) == (m.TAG, m)
    assert {type(m).TAG for m in msgs} <= set(range(90, 110))
