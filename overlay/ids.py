"""NodeId arithmetic on the 160-bit identifier ring (docs/design.md, "Identifiers").

Theory of operation: ids are points on a ring of 2**160 (the SHA-1 size used by FreePastry and
Brunet). Pastry reads an id as 40 digits of b = 4 bits, most significant first (Rowstron &
Druschel 2001 §2.1); the small-world ring and multicast use clockwise distance and half-open
clockwise ranges (PonD §2.3). ``NodeId`` subclasses ``int`` so that comparisons, hashing and
sorting run at C speed in the simulator's hot paths; the module-level functions take plain ints
for the same reason and are what the cores call.
"""

from __future__ import annotations

import hashlib
import random

from overlay.errors import InvalidIdError

ID_BITS = 160
RING = 1 << ID_BITS
HALF_RING = RING >> 1
MAX_ID = RING - 1


def digit(value: int, i: int, b: int = 4) -> int:
    """The i-th base-2**b digit of ``value``, counted from the most significant (i = 0)."""
    return (value >> (ID_BITS - (i + 1) * b)) & ((1 << b) - 1)


def shared_prefix_len(a: int, c: int, b: int = 4) -> int:
    """Number of leading base-2**b digits that ``a`` and ``c`` share (40 when equal, b = 4)."""
    x = a ^ c
    if x == 0:
        return ID_BITS // b
    return (ID_BITS - x.bit_length()) // b


def cw_distance(a: int, c: int) -> int:
    """Clockwise distance from ``a`` to ``c``: how far to walk in increasing id order."""
    return (c - a) % RING


def ring_distance(a: int, c: int) -> int:
    """Distance the shorter way round (what Pastry calls numerical closeness on the ring)."""
    d = (c - a) % RING
    return d if d <= HALF_RING else RING - d


def is_between(x: int, begin: int, end: int) -> bool:
    """True if ``x`` lies in the clockwise half-open range [begin, end).

    ``begin == end`` denotes the whole ring (the region a multicast root starts with).
    """
    if begin == end:
        return True
    return (x - begin) % RING < (end - begin) % RING


def closer(key: int, a: int, c: int) -> bool:
    """True if ``a`` is strictly numerically closer to ``key`` than ``c``.

    Ties (equidistant on both sides) are broken towards the smaller id, so that every node and
    every oracle agree on one responsible node for any key.
    """
    da = ring_distance(a, key)
    dc = ring_distance(c, key)
    if da != dc:
        return da < dc
    return a < c


class NodeId(int):
    """An identifier on the 2**160 ring. ``str()`` is 40 lower-case hex digits."""

    __slots__ = ()

    def __new__(cls, value: int) -> NodeId:
        """Check that ``value`` is an int in [0, 2**160); raise InvalidIdError otherwise."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidIdError(f"NodeId needs an int, got {type(value).__name__}")
        if not 0 <= value < RING:
            raise InvalidIdError(f"NodeId {value:#x} is outside [0, 2**160)")
        return super().__new__(cls, value)

    @classmethod
    def random(cls, rng: random.Random) -> NodeId:
        """A uniformly drawn id from a seeded generator (simulations; live ids hash a key)."""
        return cls(rng.getrandbits(ID_BITS))

    @classmethod
    def from_hex(cls, text: str) -> NodeId:
        """Parse 1–40 hex digits (an optional ``0x`` prefix is accepted)."""
        t = text.strip().lower()
        if t.startswith("0x"):
            t = t[2:]
        if not 1 <= len(t) <= ID_BITS // 4 or any(ch not in "0123456789abcdef" for ch in t):
            raise InvalidIdError(f"not a 160-bit hex id: {text!r}")
        return cls(int(t, 16))

    @classmethod
    def from_bytes_be(cls, data: bytes) -> NodeId:
        """From 20 big-endian bytes (the wire form)."""
        if len(data) != ID_BITS // 8:
            raise InvalidIdError(f"NodeId needs {ID_BITS // 8} bytes, got {len(data)}")
        return cls(int.from_bytes(data, "big"))

    @classmethod
    def hash_of(cls, data: bytes) -> NodeId:
        """SHA-1 of ``data`` as an id (live ids are SHA-1 of the Ed25519 public key)."""
        return cls(int.from_bytes(hashlib.sha1(data).digest(), "big"))

    def to_bytes_be(self) -> bytes:
        """The id as 20 big-endian bytes."""
        return int(self).to_bytes(ID_BITS // 8, "big")

    def digit(self, i: int, b: int = 4) -> int:
        """Digit ``i`` (most significant first) of the id written in base ``2**b``."""
        return digit(self, i, b)

    def shared_prefix_len(self, other: int, b: int = 4) -> int:
        """Number of leading base-``2**b`` digits this id shares with ``other``."""
        return shared_prefix_len(self, other, b)

    def cw_distance(self, other: int) -> int:
        """Clockwise distance from this id to ``other`` on the ring."""
        return cw_distance(self, other)

    def ring_distance(self, other: int) -> int:
        """Shorter of the two ring distances between this id and ``other``."""
        return ring_distance(self, other)

    def is_between(self, begin: int, end: int) -> bool:
        """Whether this id lies in the clockwise range [begin, end) (the whole ring if equal)."""
        return is_between(self, begin, end)

    def short(self) -> str:
        """First 8 hex digits, for logs and status tables."""
        return f"{int(self):040x}"[:8]

    def __str__(self) -> str:
        return f"{int(self):040x}"

    def __repr__(self) -> str:
        return f"NodeId(0x{int(self):040x})"

    def __reduce__(self) -> tuple[type[NodeId], tuple[int]]:
        return (NodeId, (int(self),))
