"""Envelope codec and message wire mapping: round trips, limits, and a fuzzed decoder.

The decoder is the trust boundary (docs/transports.md): whatever arrives — random bytes,
truncations, wrong field types, absurd declared lengths, deep nesting — it returns None and counts
why.
"""

from __future__ import annotations

import enum
import struct
from typing import Any

import attrs
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.kbr import RouteAck, RouteMsg
from overlay.messages import Message, register
from overlay.proximity import Ping
from overlay.wire import Wire, WireError, encode_message
from transports.auth import Signer, Verifier
from transports.codec import FLAG_SIGNED, MAX_FRAME_BYTES, Codec, Envelope, Limits, pack_envelope


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@attrs.frozen(slots=True)
class Point:
    x: int
    y: float


@register(231)
@attrs.frozen(slots=True)
class Kitchen(Message):
    """A message exercising every field shape the wire maps."""

    key: NodeId
    peers: tuple[NodeHandle, ...]
    maybe: NodeHandle | None
    names: list[str]
    table: dict[str, int]
    tags: frozenset[int]
    color: Color
    point: Point
    inner: Message | None
    big: int
    anything: Any
    ratio: float
    flag: bool
    blob: bytes


@register(232)
@attrs.frozen(slots=True)
class Positive(Message):
    n: int = attrs.field(validator=attrs.validators.gt(0))


H1 = NodeHandle(NodeId(0xABC), "udp://127.0.0.1:9000")
H2 = NodeHandle(NodeId((1 << 160) - 1), "udp://[::1]:1")


def kitchen(**kw: Any) -> Kitchen:
    base: dict[str, Any] = dict(
        key=NodeId(12345),
        peers=(H1, H2),
        maybe=None,
        names=["a", "b"],
        table={"x": 1},
        tags=frozenset({1, 2, 3}),
        color=Color.BLUE,
        point=Point(3, 2.5),
        inner=Ping(7, 1.25),
        big=-(1 << 100),
        anything=({"k": (1, 2.0, None, b"z")}, H1, NodeId(5), frozenset({"s"})),
        ratio=0.5,
        flag=True,
        blob=b"\x00\xff",
    )
    base.update(kw)
    return Kitchen(**base)


def test_round_trip_every_field_shape() -> None:
    w = Wire()
    for m in (kitchen(), kitchen(maybe=H1, inner=None, anything=[1, [2]], ratio=3)):
        out = w.decode(encode_message(m))
        assert out is not None
        assert isinstance(out, Kitchen)
        assert out.names == list(m.names) and isinstance(out.names, list)
        assert out.color is m.color and out.point == m.point
        assert out.ratio == float(m.ratio) and isinstance(out.ratio, float)
    assert w.counters["decoded"] == 2


def test_core_messages_round_trip() -> None:
    w = Wire()
    msgs: list[Message] = [
        RouteMsg(NodeId(1), "app", ("payload", 3), H1, (1 << 62) - 1, 4),
        RouteAck(99),
        Ping(1, 0.0),
    ]
    for m in msgs:
        assert w.decode(encode_message(m)) == m


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ([1], "bad_message"),  # wrong arity
        (["k"], "bad_message"),  # wrong type
        ([True], "bad_message"),  # bool is not an int
        ([0], "bad_message"),  # the class's own validator refuses it
    ],
)
def test_field_validation(fields: list[Any], why: str) -> None:
    w = Wire()
    data = msgpack.packb([232, 1, 2]) if fields == [1] else msgpack.packb([232, *fields])
    assert w.decode(data) is None
    assert w.counters[why] == 1
    assert w.decode(msgpack.packb([232, 5])) == Positive(5)


def test_wrong_nested_types_are_refused() -> None:
    w = Wire()
    good = msgpack.unpackb(encode_message(kitchen()), raw=False, strict_map_key=False)
    for i, bad in [(2, [1, 2]), (3, "x"), (4, "notalist"), (7, "green"), (8, [1]), (12, "x")]:
        arr = list(good)
        arr[i] = bad
        assert w.decode(msgpack.packb(arr, use_bin_type=True)) is None
    assert w.counters["bad_message"] == 6
    assert w.counters["decoded"] == 0


def test_unknown_tag_and_ext_and_depth() -> None:
    w = Wire()
    assert w.decode(msgpack.packb([253, 1])) is None
    assert w.counters["unknown_tag"] == 1
    assert w.decode(msgpack.packb([20, msgpack.ExtType(99, b"x"), 1.0])) is None
    assert w.decode(msgpack.packb([20, msgpack.ExtType(1, b"short"), 1.0])) is None
    deep: Any = 1
    for _ in range(100):
        deep = [deep]
    assert w.decode(msgpack.packb([3, "app", deep, msgpack.ExtType(2, b"")])) is None
    payload: Any = "x"
    for _ in range(40):
        payload = (payload,)
    nested = encode_message(RouteMsg(NodeId(1), "a", payload, H1, 1, 0))
    assert w.decode(nested) is None
    assert w.counters["too_deep"] >= 1
    assert w.counters["decoded"] == 0


def test_unencodable_content_is_a_clear_error() -> None:
    with pytest.raises(WireError):
        encode_message(RouteMsg(NodeId(1), "a", object(), H1, 1, 0))


def test_envelope_limits_and_versions() -> None:
    c = Codec()
    env = Envelope(b"k" * 32, 5, "udp://127.0.0.1:1", b"t" * 20, b"body", b"s" * 64)
    assert c.unpack_envelope(env.pack()) == env
    assert c.unpack_envelope(b"\x00" * (MAX_FRAME_BYTES + 1)) is None
    assert c.counters["oversized"] == 1
    assert c.unpack_envelope(msgpack.packb([2, 0, b"x" * 20, 1, "", None, b"", None])) is None
    assert c.counters["bad_version"] == 1
    assert c.unpack_envelope(msgpack.packb([1, 0, b"x" * 19, 1, "", None, b"", None])) is None
    assert c.unpack_envelope(msgpack.packb([1, 1, b"x" * 32, 1, "", None, b"", None])) is None
    assert c.unpack_envelope(msgpack.packb([1, 0, b"x" * 20, -1, "", None, b"", None])) is None
    assert c.unpack_envelope(msgpack.packb([1, 0, b"x" * 20, 1, "", b"short", b"", None])) is None
    assert c.unpack_envelope(msgpack.packb([1, 0, b"x" * 20, 1, "", None, b""])) is None
    assert c.counters["bad_envelope"] == 5
    # declared lengths far beyond the data: refused before any allocation
    for head in (b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff"):
        assert c.unpack_envelope(head + b"abc") is None
    assert c.counters["malformed"] == 3
    small = Codec(Limits(max_frame_bytes=100))
    assert small.unpack_envelope(pack_envelope(b"k" * 20, 1, "", None, b"x" * 200, None)) is None
    assert small.counters["oversized"] == 1


# ------------------------------------------------------------------------------ fuzzing
def _valid_frames() -> list[bytes]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.from_private_bytes(b"\x01" * 32)
    s = Signer(key, clock_us=lambda: 1_000_000)
    return [
        s.seal("udp://127.0.0.1:1", encode_message(kitchen())),
        s.seal("udp://127.0.0.1:1", encode_message(RouteMsg(NodeId(1), "a", 1, H1, 1, 0))),
    ]


FRAMES = _valid_frames()
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _verifier() -> Verifier:
    return Verifier(max_skew_s=None, clock_us=lambda: 1_000_000)


@FUZZ
@given(st.binary(max_size=2048))
def test_fuzz_random_bytes_never_raise(data: bytes) -> None:
    v, w = _verifier(), Wire()
    opened = v.open(data)
    if opened is not None:  # astronomically unlikely: a valid signature
        w.decode(opened.body)
    n0 = sum(w.counters.values())
    msg = w.decode(data)
    # random bytes either decode to a valid message or are dropped, and either way counted once
    assert msg is None or isinstance(msg, Message)
    assert sum(w.counters.values()) == n0 + 1
    assert sum(v.counters.values()) == 1


@FUZZ
@given(st.sampled_from(FRAMES), st.integers(min_value=0, max_value=4000))
def test_fuzz_truncations_are_dropped(frame: bytes, cut: int) -> None:
    cut = min(cut, len(frame) - 1)
    v, w = _verifier(), Wire()
    assert v.open(frame[:cut]) is None
    assert sum(v.counters.values()) == 1
    opened = _verifier().open(frame)
    assert opened is not None
    assert w.decode(opened.body[: min(cut, len(opened.body) - 1)]) is None
    assert sum(w.counters.values()) == 1


@FUZZ
@given(st.sampled_from(FRAMES), st.integers(min_value=0), st.integers(min_value=0, max_value=255))
def test_fuzz_bit_flips_are_forgeries(frame: bytes, pos: int, byte: int) -> None:
    pos %= len(frame)
    if frame[pos] == byte:
        return
    bad = frame[:pos] + bytes([byte]) + frame[pos + 1 :]
    v = _verifier()
    assert v.open(bad) is None
    assert v.counters["accepted"] == 0
    assert sum(v.counters.values()) == 1


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children, max_size=5)
    ),
    max_leaves=30,
)


@FUZZ
@given(st.sampled_from([1, 2, 3, 20, 21, 231, 232]), st.lists(msgpack_values, max_size=15))
def test_fuzz_wrong_types_never_raise(tag: int, fields: list[Any]) -> None:
    w = Wire()
    out = w.decode(msgpack.packb([tag, *fields], use_bin_type=True))
    assert sum(w.counters.values()) == 1
    if out is not None:  # whatever got through is well-typed: re-encoding works
        assert w.decode(encode_message(out)) == out


@FUZZ
@given(st.integers(min_value=0xC4, max_value=0xDF), st.binary(max_size=64))
def test_fuzz_huge_declared_lengths(head: int, tail: bytes) -> None:
    data = bytes([head]) + struct.pack(">I", 0xFFFFFFF0) + tail
    c, w = Codec(), Wire()
    assert c.unpack_envelope(data) is None
    assert w.decode(data) is None
    assert sum(c.counters.values()) == 1 and sum(w.counters.values()) == 1


def test_unknown_flag_bits_are_dropped() -> None:
    """``flags`` is outside the signature: only 0 (unsigned) and 1 (signed) are accepted."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    good = Signer(key).seal("udp://127.0.0.1:1", b"body")
    assert good[2] == FLAG_SIGNED  # [0x98, version, flags, ...]
    for flags in (0, 2, 3, 0x7F):
        bad = good[:2] + bytes([flags]) + good[3:]
        v = Verifier()
        assert v.open(bad) is None
        assert v.counters["bad_envelope"] == 1 and v.counters["accepted"] == 0
