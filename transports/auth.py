"""Sign and verify envelopes with Ed25519; refuse replays (docs/transports.md, docs/security.md).

Theory of operation:

* **Signing.** A :class:`Signer` holds one Ed25519 private key (``cryptography``) and stamps each
  outgoing envelope with its 32-byte public key, a sequence number and an Ed25519 signature over
  :meth:`transports.codec.Envelope.signed_bytes`. The receiver derives the sender's identity from
  the key it verified (``sender_hash`` = SHA-1 of the raw public key, the self-certifying NodeId
  of ``overlay.identity``), so a peer cannot speak under an id it holds no key for.
* **Replay.** Sequence numbers are microseconds of wall-clock time, forced strictly increasing
  per signer (like the TAI64N timestamps of WireGuard's handshake). A :class:`Verifier` accepts
  a frame only if its number is within ``max_skew_s`` of our clock and ``(sender, seq)`` was not
  accepted before: :class:`transports.replay.ReplayCache` remembers a 64-bit digest of each
  accepted pair until its number leaves the clock window (a time-based IPsec sliding window,
  RFC 4303 §3.4.3, kept for all senders in one table), so reordering is fine and every exact
  replay is refused.
* **Pair frames** (:mod:`transports.pair`) pass the same checks (:meth:`Verifier.open_pair`),
  with a keyed-BLAKE2s tag under a static-static X25519 key in place of the signature.
* **Signing off.** ``Signer(None, claimed_id=...)`` produces unsigned envelopes carrying a claimed
  20-byte id; a ``Verifier(require_signatures=True)`` (the default) drops them as ``unsigned``.
  Turning signatures off is an explicit choice on both ends (it exists for the comparison with
  kademlia, which authenticates nothing).

* **Destination binding.** The signed envelope names the receiver's id when the sender knows it;
  a Verifier given ``own_id`` drops frames signed for someone else (``misdirected``), so a frame
  captured on its way to one node cannot be replayed to another.

Counters: ``unsigned``, ``forged``, ``replayed``, ``stale``, ``misdirected``, ``accepted``
(+ the codec's).
"""

from __future__ import annotations

import hashlib
import time
from array import array
from collections import Counter
from collections.abc import Callable

import attrs
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from transports.codec import DEFAULT_LIMITS, Codec, Limits, pack_envelope, signed_bytes
from transports.errors import TransportConfigError
from transports.pair import PairKeys, learn_key, parse_head
from transports.replay import ReplayCache

#: sequence numbers (µs) per replay-table bucket: a bucket is forgotten as a whole
_BUCKET_US = 120_000_000

__all__ = [
    "Opened",
    "Signer",
    "Verifier",
    "key_hash",
    "public_bytes",
    "public_key_entry",
    "signature_valid",
]


def _wall_us() -> int:
    return time.time_ns() // 1000


def public_bytes(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """The raw 32-byte Ed25519 public key."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_hash(public: bytes) -> bytes:
    """SHA-1 of a raw public key: the 20-byte self-certifying id."""
    return hashlib.sha1(public).digest()


@attrs.frozen(slots=True)
class Opened:
    """A verified (or, with signatures off, accepted) envelope."""

    sender_hash: bytes  # 20 bytes: SHA-1(public key), or the claimed id when unsigned
    sender_key: bytes | None  # 32-byte public key when signed
    seq: int
    reply_to: str
    to: bytes | None  # the receiver id the sender meant (checked by the Verifier), or None
    body: bytes


class Signer:
    """Seals outgoing envelopes with one key (or, with ``key=None``, leaves them unsigned)."""

    # slots: one Signer, Verifier and Codec per live node (an instance dict is ~50 bytes more)
    __slots__ = ("_clock", "_key", "_seq", "sender", "sender_hash")

    def __init__(
        self,
        key: Ed25519PrivateKey | None,
        *,
        claimed_id: bytes | None = None,
        clock_us: Callable[[], int] = _wall_us,
    ) -> None:
        self._key = key
        self._clock = clock_us
        if key is not None:
            self.sender = public_bytes(key)
            self.sender_hash = key_hash(self.sender)
        else:
            if claimed_id is None or len(claimed_id) != 20:
                raise TransportConfigError("an unsigned Signer needs claimed_id (20 bytes)")
            self.sender = claimed_id
            self.sender_hash = claimed_id
        self._seq = 0

    @property
    def signing(self) -> bool:
        """True when envelopes are signed (False: the explicit unsigned mode)."""
        return self._key is not None

    def next_seq(self) -> int:
        """The next replay-window sequence number (wall-clock microseconds, increasing)."""
        s = max(self._seq + 1, self._clock())
        self._seq = s
        return s

    def seal(self, reply_to: str, body: bytes, to: bytes | None = None) -> bytes:
        """One envelope carrying ``body`` for receiver id ``to`` (None: unknown), signed."""
        seq = self.next_seq()
        sig = None
        if self._key is not None:
            sig = self._key.sign(signed_bytes(self.sender, seq, reply_to, to, body))
        return pack_envelope(self.sender, seq, reply_to, to, body, sig)


#: SHA-1 ids of raw Ed25519 public keys, and the process's one copy of each key, shared by every
#: Verifier in the process (public data: hashing per datagram costs ~0.3 µs, and one copy of a
#: key per (node, peer) pair would cost 65 bytes each). No key *objects*: an OpenSSL key costs
#: ~0.37 KiB outside Python's heap — one per peer heard, which at 65,536 entries would be 24 MiB
#: — and parsing one again costs ~1 µs, 1 % of the verification it is made for.
_KEYS: dict[bytes, tuple[bytes, bytes]] = {}
_KEYS_MAX = 65536


def public_key_entry(raw: bytes) -> tuple[bytes, bytes] | None:
    """``(SHA-1 id, the shared copy of raw)`` for a raw Ed25519 public key, or None if it is no
    valid key — receivers key their replay state (and sessions their peers) by those shared
    bytes objects rather than each keeping a copy."""
    k = _KEYS.get(raw)
    if k is not None:
        return k
    try:
        Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return None
    if len(_KEYS) >= _KEYS_MAX:
        _KEYS.pop(next(iter(_KEYS)))  # oldest first (insertion order)
    k = _KEYS[raw] = (key_hash(raw), raw)
    return k


def signature_valid(raw: bytes, sig: bytes, data: bytes) -> bool:
    """True if ``sig`` is the Ed25519 signature of ``data`` under the raw public key ``raw``
    (one that :func:`public_key_entry` accepted)."""
    try:
        Ed25519PublicKey.from_public_bytes(raw).verify(sig, data)
    except (InvalidSignature, ValueError):
        return False
    return True


class Verifier:
    """Opens incoming envelopes: limits, signature, replay window. Never raises."""

    __slots__ = (
        "_clock", "_freq", "_freq_decay", "_window_us", "codec", "counters", "last_recent",
        "own_id", "replay", "require_signatures",
    )  # fmt: skip

    def __init__(
        self,
        *,
        require_signatures: bool = True,
        window_s: float = 30.0,
        max_skew_s: float | None = 600.0,
        max_entries: int = 1 << 20,
        own_id: bytes | None = None,
        limits: Limits = DEFAULT_LIMITS,
        clock_us: Callable[[], int] = _wall_us,
    ) -> None:
        self.require_signatures = require_signatures
        self.codec = Codec(limits)
        self.counters: Counter[str] = self.codec.counters
        self._window_us = int(window_s * 1e6)
        self._clock = clock_us
        self.own_id = own_id
        skew = None if max_skew_s is None else int(max_skew_s * 1e6)
        #: every accepted (sender, seq), while its seq is within the clock window
        self.replay = ReplayCache(skew, max_entries=max_entries, bucket_us=_BUCKET_US)
        #: frames accepted per sender within ~``window_s`` (halved every ``window_s``), as a
        #: count-min sketch (Cormode & Muthukrishnan 2005) of two rows of 256 one-byte counters:
        #: sustained traffic from one peer, which is when a session pays off. It overcounts
        #: only when a sender collides in both rows (a handshake comes early), never undercounts
        #: (made at the first signed frame: a verifier that accepts only unsigned ones never
        #: needs it)
        self._freq: array[int] | None = None
        self._freq_decay = 0
        #: that count for the sender of the last accepted frame
        self.last_recent = 0

    def _replay_ok(self, sender: bytes, seq: int) -> bool:
        now = self._clock()
        why = self.replay.check(sender, seq, now)
        if why is not None:
            self.counters[why] += 1
            return False
        freq = self._freq
        if now >= self._freq_decay or freq is None:
            freq = self._freq = (
                array("B", bytes(512)) if freq is None else array("B", [x >> 1 for x in freq])
            )
            self._freq_decay = now + self._window_us
        h = hash(sender)
        i, j = h & 255, 256 + ((h >> 8) & 255)
        a, b = freq[i], freq[j]
        if a < 255:
            freq[i] = a = a + 1
        if b < 255:
            freq[j] = b = b + 1
        c = min(a, b)
        self.last_recent = c
        return True

    def _replayed(self, sender: bytes, seq: int) -> bool:
        """Read-only pre-check, before the (costly) signature check: a known replay."""
        return self.replay.seen(sender, seq)

    def open(self, data: bytes) -> Opened | None:
        """Return the verified contents of one frame, or None (and a counter says why)."""
        f = self.codec.unpack_fields(data)
        if f is None:
            return None
        _, sender, seq, reply_to, to, body, sig = f
        if sig is None:
            if self.require_signatures:
                self.counters["unsigned"] += 1
                return None
            if len(sender) != 20:
                self.counters["bad_envelope"] += 1
                return None
            self.counters["accepted"] += 1
            return Opened(sender, None, seq, reply_to, to, body)
        if to is not None and self.own_id is not None and to != self.own_id:
            self.counters["misdirected"] += 1
            return None
        if self._replayed(sender, seq):  # no signature check for a frame we would refuse
            self.counters["replayed"] += 1
            return None
        k = public_key_entry(sender)
        if k is None or not signature_valid(
            k[1], sig, signed_bytes(sender, seq, reply_to, to, body)
        ):
            self.counters["forged"] += 1
            return None
        if not self._replay_ok(k[1], seq):
            return None
        self.counters["accepted"] += 1
        learn_key(k[0], k[1])
        return Opened(k[0], k[1], seq, reply_to, to, body)

    def open_pair(self, data: bytes, keys: PairKeys) -> Opened | None:
        """Open a pair frame (:mod:`transports.pair`): header, receiver id, replay pre-check,
        tag, replay window — the checks of :meth:`open`, with the pair key in place of the
        signature. Counted under the same names (``malformed``, ``misdirected``, ``replayed``,
        ``stale``, ``forged``, ``accepted``)."""
        if len(data) > self.codec.limits.max_frame_bytes:
            self.counters["oversized"] += 1
            return None
        head = parse_head(data)
        if head is None:
            self.counters["malformed"] += 1
            return None
        sender, to, seq, reply_to, _ = head
        if to != self.own_id:
            self.counters["misdirected"] += 1
            return None
        if self._replayed(sender, seq):
            self.counters["replayed"] += 1
            return None
        k = public_key_entry(sender)
        body = None if k is None else keys.open(head, data)
        if k is None or body is None:
            self.counters["forged"] += 1
            return None
        if not self._replay_ok(k[1], seq):
            return None
        self.counters["accepted"] += 1
        return Opened(k[0], k[1], seq, reply_to, to, body)
