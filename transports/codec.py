"""Versioned msgpack envelope with hard size, length and depth limits (docs/transports.md).

Theory of operation: every datagram (UDP, memory) and every TCP frame is one *envelope*, a
msgpack array of exactly eight items::

    [version, flags, sender, seq, reply_to, to, body, signature]

``version`` is :data:`VERSION` (anything else is dropped as ``bad_version``); ``flags`` bit 0 says
whether the envelope is signed; ``sender`` is the 32-byte Ed25519 public key of a signed envelope
or the 20-byte claimed id of an unsigned one; ``seq`` is the sender's monotonic sequence number
(the replay window of ``transports/auth.py`` reads it); ``reply_to`` is the sender's listening
address; ``to`` is the 20-byte id of the intended receiver, or nil when the sender knows only an
address (bootstrap) — it is signed, so a frame captured on its way to one node cannot be replayed
to another; ``body`` is the opaque payload (msgpack produced by ``overlay/wire.py``);
``signature`` is 64 bytes or nil. The signature covers :meth:`Envelope.signed_bytes`, a
canonical byte string built from the fields, so it never depends on msgpack's layout choices.

Limits are enforced *before* allocation: the frame length first (64 KiB, the UDP datagram bound),
then msgpack's own ``max_*_len`` guards, then an explicit nesting-depth walk. Decoding never
raises: malformed input returns ``None`` and bumps a named counter in ``Codec.counters``.
The layout follows the tagged-envelope practice of QUIC / WireGuard packets (version first, so
a later version can change everything after it) but uses msgpack instead of a bespoke layout.
"""

from __future__ import annotations

import struct
from collections import Counter
from typing import Any

import attrs
import msgpack

__all__ = [
    "FLAG_SIGNED",
    "MAX_FRAME_BYTES",
    "VERSION",
    "Codec",
    "DecodeError",
    "Envelope",
    "Limits",
    "check_depth",
    "safe_unpackb",
]

VERSION = 1
FLAG_SIGNED = 0x01
#: about the largest UDP datagram (16-bit length field); TCP frames obey the same limit.
MAX_FRAME_BYTES = 64 * 1024
_DOMAIN = b"flockring/envelope/v1\x00"


class DecodeError(ValueError):
    """Internal: raised by the limited decoders and always caught by their callers."""


@attrs.frozen(slots=True)
class Limits:
    """Resource limits applied to every untrusted input."""

    max_frame_bytes: int = MAX_FRAME_BYTES
    max_depth: int = 24
    max_str_len: int = 16 * 1024
    max_bin_len: int = MAX_FRAME_BYTES
    max_array_len: int = 4096
    max_map_len: int = 1024
    max_ext_len: int = MAX_FRAME_BYTES


DEFAULT_LIMITS = Limits()


@attrs.frozen(slots=True)
class Envelope:
    """One decoded (not yet verified) envelope."""

    sender: bytes
    seq: int
    reply_to: str
    to: bytes | None
    body: bytes
    signature: bytes | None = None
    version: int = VERSION

    @property
    def signed(self) -> bool:
        """True if the envelope carries a key and a signature."""
        return self.signature is not None

    def signed_bytes(self) -> bytes:
        """The canonical byte string a signature covers (domain-separated, length-prefixed)."""
        return signed_bytes(self.sender, self.seq, self.reply_to, self.to, self.body)

    def pack(self) -> bytes:
        """The envelope as msgpack bytes."""
        flags = FLAG_SIGNED if self.signature is not None else 0
        return pack_envelope(
            self.sender, self.seq, self.reply_to, self.to, self.body, self.signature, flags
        )


def signed_bytes(sender: bytes, seq: int, reply_to: str, to: bytes | None, body: bytes) -> bytes:
    addr = reply_to.encode("utf-8")
    dst = to if to is not None else b""
    return b"".join(
        (
            _DOMAIN,
            struct.pack(">BQHB", len(sender), seq, len(addr), len(dst)),
            sender,
            addr,
            dst,
            body,
        )
    )


def pack_envelope(
    sender: bytes,
    seq: int,
    reply_to: str,
    to: bytes | None,
    body: bytes,
    signature: bytes | None,
    flags: int | None = None,
) -> bytes:
    """Encode an envelope (no size check: the sender checks ``len`` against its limit)."""
    if flags is None:
        flags = FLAG_SIGNED if signature is not None else 0
    out: bytes = msgpack.packb(
        [VERSION, flags, sender, seq, reply_to, to, body, signature], use_bin_type=True
    )
    return out


_UNPACK_KW: dict[Limits, dict[str, Any]] = {}


def _unpack_kw(limits: Limits) -> dict[str, Any]:
    kw = _UNPACK_KW.get(limits)
    if kw is None:
        kw = _UNPACK_KW[limits] = {
            "raw": False,
            "use_list": False,
            "strict_map_key": False,
            "max_str_len": limits.max_str_len,
            "max_bin_len": limits.max_bin_len,
            "max_array_len": limits.max_array_len,
            "max_map_len": limits.max_map_len,
            "max_ext_len": limits.max_ext_len,
        }
    return kw


_LAST_KW: tuple[Limits, dict[str, Any]] = (DEFAULT_LIMITS, _unpack_kw(DEFAULT_LIMITS))


def safe_unpackb(data: bytes, limits: Limits = DEFAULT_LIMITS, ext_hook: Any = None) -> Any:
    """msgpack-decode ``data`` under ``limits``; raises :class:`DecodeError` on anything wrong.

    Arrays come back as tuples (immutable, hashable); map keys may be any hashable value.
    """
    if len(data) > limits.max_frame_bytes:
        raise DecodeError("oversized")
    global _LAST_KW
    if _LAST_KW[0] is limits:
        kw = _LAST_KW[1]
    else:
        kw = _unpack_kw(limits)
        _LAST_KW = (limits, kw)
    try:
        if ext_hook is None:
            value = msgpack.unpackb(data, **kw)
        else:
            value = msgpack.unpackb(data, ext_hook=ext_hook, **kw)
    except DecodeError:
        raise
    except (RecursionError, msgpack.StackError):
        raise DecodeError("too deep") from None
    except Exception as exc:  # msgpack raises ValueError, ExtraData, StackError, TypeError…
        raise DecodeError(f"malformed: {type(exc).__name__}") from None
    return value


def check_depth(value: Any, max_depth: int) -> None:
    """Raise :class:`DecodeError` if containers nest deeper than ``max_depth`` (iterative).

    Only what msgpack itself builds is walked — exact ``tuple``/``list``/``dict`` — so leaves
    and objects an ``ext_hook`` returned (checked when they were built) cost nothing.
    """
    tv = type(value)
    if tv is not tuple and tv is not dict and tv is not list:
        return
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if d >= max_depth:
            raise DecodeError("too deep")
        d += 1
        items = v if type(v) is not dict else (*v.keys(), *v.values())
        for x in items:
            tx = type(x)
            if tx is tuple or tx is dict or tx is list:
                stack.append((x, d))


class Codec:
    """Envelope decoder that never raises; every rejection is counted by reason.

    Counters: ``oversized``, ``malformed``, ``bad_version``, ``bad_envelope``.
    """

    __slots__ = ("_kw", "counters", "limits")

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self.counters: Counter[str] = Counter()
        self._kw = _unpack_kw(limits)

    def unpack_envelope(self, data: bytes) -> Envelope | None:
        """Parse one frame, or count why not and return None."""
        f = self.unpack_fields(data)
        if f is None:
            return None
        return Envelope(f[1], f[2], f[3], f[4], f[5], f[6])

    def unpack_fields(
        self, data: bytes
    ) -> tuple[int, bytes, int, str, bytes | None, bytes, bytes | None] | None:
        """Like :meth:`unpack_envelope` but returns the checked fields as a plain tuple
        ``(flags, sender, seq, reply_to, to, body, signature)`` (the receive hot path)."""
        lim = self.limits
        if len(data) > lim.max_frame_bytes:
            self.counters["oversized"] += 1
            return None
        try:
            raw = msgpack.unpackb(data, **self._kw)
        except Exception:  # msgpack raises ValueError, ExtraData, StackError, TypeError…
            self.counters["malformed"] += 1
            return None
        if type(raw) is not tuple or len(raw) < 1:
            self.counters["malformed"] += 1
            return None
        if raw[0] != VERSION or type(raw[0]) is not int:
            self.counters["bad_version"] += 1
            return None
        if len(raw) != 8:
            self.counters["bad_envelope"] += 1
            return None
        _, flags, sender, seq, reply_to, to, body, sig = raw
        if (
            type(flags) is not int
            or type(sender) is not bytes
            or len(sender) not in (20, 32)
            or type(seq) is not int
            or not 0 <= seq < 1 << 64
            or type(reply_to) is not str
            or len(reply_to) > 512
            or not (to is None or (type(to) is bytes and len(to) == 20))
            or type(body) is not bytes
        ):
            self.counters["bad_envelope"] += 1
            return None
        # flags are not covered by the signature, so no bit but FLAG_SIGNED may be set, and it
        # must say exactly whether a signature follows (a flipped bit is a drop, not a pass)
        if flags == FLAG_SIGNED:
            if type(sig) is not bytes or len(sig) != 64 or len(sender) != 32:
                self.counters["bad_envelope"] += 1
                return None
        elif flags != 0 or sig is not None:
            self.counters["bad_envelope"] += 1
            return None
        # Only the canonical encoding of these fields is accepted: msgpack can spell one value
        # several ways (uint32 vs int32, …), and a frame that re-encodes a signed one must not
        # pass for it (no malleability; every changed byte is a drop).
        if pack_envelope(sender, seq, reply_to, to, body, sig, flags) != data:
            self.counters["non_canonical"] += 1
            return None
        return flags, sender, seq, reply_to, to, body, sig
