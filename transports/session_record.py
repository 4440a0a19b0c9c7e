"""What one session of :mod:`transports.session` is on the wire and in memory: the frame types
and sizes, the identity payload of the handshake, the timers and bounds (:class:`SessionConfig`),
and the record state of one end of a session (keys, send counter, sliding replay window). The
handshake itself and the session table are :class:`transports.session.Sessions`, which
re-exports this module's public names.

* **Frames** are told from envelopes (msgpack arrays, ``0x98``) by their first byte: HELLO
  ``F1``, REPLY ``F2``, CONFIRM ``F3``, DATA ``F4``, UNKNOWN ``F5`` (layouts: docs/transports.md,
  "Sessions"). Indices are random 32-bit numbers each side picks for its end of a session
  (WireGuard's receiver index): DATA names the receiver's session, whose key must open it. HELLO
  is padded to the largest REPLY, so a handshake answered to a spoofed address sends no more
  bytes than arrived (as QUIC pads its first datagram, RFC 9000 §8.1); UNKNOWN (5 bytes) is
  smaller than any DATA frame (>= 29).
* **Records** use the ``Split()`` keys with the counter sent in the clear (Noise §11.4; the
  ChaChaPoly nonce is the counter, §12.3) and the 13-byte header as associated data. The receiver
  keeps the highest counter and a bitmap of the ``window`` below it (RFC 4303 §3.4.3, RFC 6479):
  exact replays and anything older are dropped, reordering inside is fine; checked before
  decryption, updated after the tag verified. The responder sends an empty record after message
  3 and the initiator sends on a session only once a record arrived on it, so no record
  overtakes the handshake.
* **Identity.** Each node signs its static X25519 key once with its identity key:
  ``sig = Ed25519(STATIC_DOMAIN || static)``. Handshake messages 2 and 3 carry ``identity
  public key (32) || sig (64) || advertised address (<= 128 bytes)``, encrypted by Noise. Noise
  proves the peer holds the static key it sent (``es`` / ``se``); the signature proves the
  identity key vouches for it; NodeId = SHA-1(identity key). This is the identity binding of
  libp2p's Noise handshake (``identity_key`` + ``identity_sig`` over
  ``"noise-libp2p-static-key:" || static``) with our own domain string.

The underscored names (:class:`_Session`, :class:`_Pending`, the sizes, the identity payload
and its cache of verified signatures) are shared with :mod:`transports.session` only.
"""

from __future__ import annotations

import sys

import attrs
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from transports.address import MAX_ADDRESS_LEN
from transports.auth import public_bytes, public_key_entry, signature_valid
from transports.errors import TransportConfigError
from transports.noise import DHLEN, TAGLEN, XXHandshake, decrypt, encrypt

__all__ = [
    "CONFIRM",
    "DATA",
    "DATA_OVERHEAD",
    "HELLO",
    "HELLO_BYTES",
    "REPLY",
    "STATIC_DOMAIN",
    "UNKNOWN",
    "SessionConfig",
    "is_session_frame",
]

HELLO, REPLY, CONFIRM, DATA, UNKNOWN = 0xF1, 0xF2, 0xF3, 0xF4, 0xF5
STATIC_DOMAIN = b"flockring/noise-static/v1\x00"
_IDENT = 32 + 64  # Ed25519 public key + signature over the static key
_REPLY_MAX = 1 + 4 + 4 + DHLEN + (DHLEN + TAGLEN) + (_IDENT + MAX_ADDRESS_LEN + TAGLEN)
#: a HELLO is exactly as large as the largest REPLY it can draw (no amplification)
HELLO_BYTES = _REPLY_MAX
_HELLO_PAD = bytes(HELLO_BYTES - 1 - 4 - DHLEN)
_DATA_HEADER = 13
#: bytes a DATA frame adds to its body (header + Poly1305 tag)
DATA_OVERHEAD = _DATA_HEADER + TAGLEN
_CONFIRM_MIN = 1 + 4 + (DHLEN + TAGLEN) + _IDENT + TAGLEN
_REPLY_MIN = 1 + 4 + 4 + DHLEN + (DHLEN + TAGLEN) + _IDENT + TAGLEN


def is_session_frame(data: bytes) -> bool:
    """True if ``data`` is one of the session frames (by its first byte)."""
    return bool(data) and HELLO <= data[0] <= UNKNOWN


def _u32(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 4], "big")


#: verified (identity key || static key) -> signature, shared by every node of the process
#: (public data): a rekey with a known peer costs no Ed25519 verification (~120 µs).
_VERIFIED: dict[bytes, bytes] = {}
_VERIFIED_MAX = 65536


def _identity_payload(identity: Ed25519PrivateKey, static_pub: bytes, address: bytes) -> bytes:
    """The payload of handshake messages 2 and 3: ``identity``'s public key, its signature
    vouching for the static key ``static_pub``, and our advertised ``address``."""
    sig = identity.sign(STATIC_DOMAIN + static_pub)
    return public_bytes(identity) + sig + address


def _read_identity(payload: bytes, static: bytes) -> tuple[bytes, str] | None:
    """``(peer id, address)`` if ``payload`` is an identity key vouching for ``static``, else
    None (a forgery)."""
    if not _IDENT <= len(payload) <= _IDENT + MAX_ADDRESS_LEN:
        return None
    entry = public_key_entry(payload[:32])
    if entry is None:
        return None
    sig = payload[32:_IDENT]
    key = entry[1] + static
    if _VERIFIED.get(key) != sig:
        if not signature_valid(entry[1], sig, STATIC_DOMAIN + static):
            return None
        if len(_VERIFIED) >= _VERIFIED_MAX:
            del _VERIFIED[next(iter(_VERIFIED))]
        _VERIFIED[key] = sig
    try:
        # one string object per address in the process, not one per session
        address = sys.intern(payload[_IDENT:].decode("utf-8"))
    except UnicodeDecodeError:
        return None
    return entry[0], address


@attrs.frozen(slots=True)
class SessionConfig:
    """Timers and bounds of :class:`~transports.session.Sessions` (defaults: WireGuard's, NDSS
    2017 §6)."""

    #: the initiator starts a new handshake when it sends on an older session (REKEY_AFTER_TIME)
    rekey_after_s: float = 120.0
    #: a session is refused this long after it was made (REJECT_AFTER_TIME)
    expire_after_s: float = 180.0
    #: a sender stops using a session this long before expiry (covers the one-RTT head start of
    #: the initiator's copy over the responder's, with room for slow links)
    send_margin_s: float = 10.0
    #: a handshake not finished within this is abandoned (REKEY_TIMEOUT)
    handshake_timeout_s: float = 5.0
    #: an unanswered handshake to a peer is not retried sooner (signed frames flow meanwhile)
    retry_after_s: float = 30.0
    #: signed frames a peer must have sent us within the replay window (30 s) before we start a
    #: handshake with it. A first handshake costs the CPU of ~6 signed datagrams, a rekey ~3
    #: (``benchmarks/session_cost.py``), and join traffic comes in bursts of ~4 datagrams per
    #: pair: sessions pay for sustained traffic only (docs/security.md, "Sessions")
    handshake_after_frames: int = 6
    #: the same for pair frames (``transports/pair.py``), which cost a receiver a quarter of a
    #: signed frame or less (one X25519 per peer and ~5 µs a frame, against ~150 µs): a session
    #: pays after ~4x as many. None: 4 x ``handshake_after_frames``
    handshake_after_pair_frames: int | None = None
    #: sessions held at once (then new ones are refused and traffic stays signed)
    max_sessions: int = 4096
    #: handshakes in progress, each way (the oldest answered HELLO is forgotten when full)
    max_pending: int = 256
    #: replay window in counters (RFC 4303 §3.4.3 suggests 64 at least; 128 tolerates bursts)
    window: int = 128
    #: records per session before it must be replaced (REKEY_AFTER_MESSAGES)
    max_messages: int = 1 << 60
    #: frames to a peer whose identity key this process has verified, with no session, go as
    #: pair frames (static-static X25519 + a keyed-BLAKE2s tag, ``transports/pair.py``) instead of
    #: Ed25519-signed envelopes: ~4x cheaper per datagram, no handshake (docs/security.md)
    pair_frames: bool = True
    #: derived pair keys a node keeps per generation (``transports.pair.PairKeys``: keys unused
    #: for two periods of 2 s are dropped; ~150 bytes each; a miss costs one X25519)
    pair_cache: int = 128

    def __attrs_post_init__(self) -> None:
        if not 0 < self.rekey_after_s < self.expire_after_s - self.send_margin_s:
            raise TransportConfigError(
                "session timers need 0 < rekey_after_s < expire_after_s - send_margin_s"
            )
        if not 0 < self.handshake_timeout_s <= self.retry_after_s:
            raise TransportConfigError("need 0 < handshake_timeout_s <= retry_after_s")
        if self.window < 1 or self.max_sessions < 1 or self.max_pending < 1:
            raise TransportConfigError("window, max_sessions and max_pending must be >= 1")


class _Session:
    """One established session (one end of it)."""

    __slots__ = (
        "address",
        "confirmed",
        "created",
        "hi",
        "idx",
        "initiator",
        "keys",
        "n_send",
        "peer",
        "prev_idx",
        "remote_idx",
        "seen",
    )

    def __init__(
        self,
        idx: int,
        remote_idx: int,
        peer: bytes,
        address: str,
        keys: bytes,
        created: float,
        initiator: bool,
    ) -> None:
        self.idx = idx
        self.remote_idx = remote_idx
        self.peer = peer  # 20-byte id (a process-wide shared bytes object)
        self.address = address
        self.keys = keys  # send key || receive key (one 64-byte object instead of two)
        self.created = created
        self.initiator = initiator
        #: the peer holds this session too: always for the responder (it got message 3); for
        #: the initiator once a record arrived on it (the responder's confirmation record)
        self.confirmed = not initiator
        self.n_send = 0
        self.hi = -1  # highest counter received
        self.seen = 0  # bit i: counter hi - i was received
        self.prev_idx = 0  # this peer's previous session, still valid for receiving (0: none)

    def seal(self, body: bytes) -> bytes:
        """A DATA frame carrying ``body`` under the next send counter."""
        n = self.n_send
        self.n_send = n + 1
        header = b"\xf4" + self.remote_idx.to_bytes(4, "big") + n.to_bytes(8, "big")
        return header + encrypt(self.keys[:32], n, header, body)

    def open(self, n: int, data: bytes, window: int) -> bytes | None:
        """The body of the DATA frame ``data`` with counter ``n``, or None for a replay or a
        counter older than the ``window``; raises :class:`~transports.noise.NoiseError` if the
        tag does not verify. Only a verified record moves the window (a forgery cannot)."""
        hi = self.hi
        if n <= hi:
            d = hi - n
            if d >= window or (self.seen >> d) & 1:
                return None
        body = decrypt(self.keys[32:], n, data[:_DATA_HEADER], data[_DATA_HEADER:])
        if n > hi:
            self.seen = ((self.seen << (n - hi)) | 1) & ((1 << window) - 1)
            self.hi = n
        else:
            self.seen |= 1 << (hi - n)
        return body


class _Pending:
    """A handshake in progress (``peer``/``address``: whom we called, for the initiator;
    ``remote_idx``: the initiator's index, for the responder)."""

    __slots__ = ("address", "hs", "peer", "remote_idx", "started")

    def __init__(
        self, hs: XXHandshake, peer: bytes, address: str, remote_idx: int, started: float
    ) -> None:
        self.hs: XXHandshake | None = hs
        self.peer = peer
        self.address = address
        self.remote_idx = remote_idx
        self.started = started
