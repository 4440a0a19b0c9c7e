"""NodeId arithmetic against brute-force definitions (hypothesis)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from overlay import InvalidIdError, NodeId, OverlayError
from overlay.ids import (
    RING,
    closer,
    cw_distance,
    digit,
    is_between,
    ring_distance,
    shared_prefix_len,
)

ids = st.integers(min_value=0, max_value=RING - 1)


def _hex(x: int) -> str:
    return f"{x:040x}"


@given(ids, st.integers(min_value=0, max_value=39))
def test_digit_matches_hex_string(x: int, i: int) -> None:
    assert digit(x, i) == int(_hex(x)[i], 16)


@given(ids, ids)
def test_shared_prefix_matches_string_prefix(a: int, b: int) -> None:
    ha, hb = _hex(a), _hex(b)
    n = 0
    while n < 40 and ha[n] == hb[n]:
        n += 1
    assert shared_prefix_len(a, b) == n


@given(ids, ids)
def test_distances(a: int, b: int) -> None:
    assert cw_distance(a, b) + cw_distance(b, a) in (0, RING)
    assert ring_distance(a, b) == ring_distance(b, a) == min(cw_distance(a, b), cw_distance(b, a))
    assert ring_distance(a, b) <= RING // 2


@given(ids, ids, ids)
def test_is_between_is_clockwise_half_open(x: int, b: int, e: int) -> None:
    if b == e:
        assert is_between(x, b, e)
        return
    # walk clockwise from b: x is inside iff reached strictly before e
    assert is_between(x, b, e) == (cw_distance(b, x) < cw_distance(b, e))
    assert is_between(b, b, e)
    assert not is_between(e, b, e)


@given(ids, ids, ids)
def test_closer_is_a_strict_total_preference(k: int, a: int, b: int) -> None:
    if a == b:
        assert not closer(k, a, b)
    else:
        assert closer(k, a, b) != closer(k, b, a)


def test_closer_agrees_with_brute_force_minimum() -> None:
    rng = random.Random(5)
    for _ in range(200):
        pool = [rng.getrandbits(160) for _ in range(20)]
        key = rng.getrandbits(160)
        best = pool[0]
        for c in pool[1:]:
            if closer(key, c, best):
                best = c
        d = min(ring_distance(c, key) for c in pool)
        assert ring_distance(best, key) == d
        assert best == min(c for c in pool if ring_distance(c, key) == d)


def test_nodeid_validation_and_forms() -> None:
    x = NodeId(0xABC)
    assert str(x) == "0" * 37 + "abc"
    assert NodeId.from_hex(str(x)) == x
    assert NodeId.from_bytes_be(x.to_bytes_be()) == x
    assert NodeId.random(random.Random(1)) == NodeId.random(random.Random(1))
    for bad in (-1, RING):
        with pytest.raises(InvalidIdError):
            NodeId(bad)
    with pytest.raises(OverlayError):
        NodeId.from_hex("xyz")
    with pytest.raises(OverlayError):
        NodeId.from_hex("1" * 41)
    with pytest.raises(OverlayError):
        NodeId(True)
    with pytest.raises(OverlayError):
        NodeId("12")  # type: ignore[arg-type]
    assert NodeId.hash_of(b"key") == NodeId.hash_of(b"key")
