"""Pair frames: datagrams authenticated under a key two nodes derive from their identity keys.

Theory of operation (docs/security.md, "Pair frames"):

* **Why.** An Ed25519 signature costs its sender one signing and every receiver one
  verification (~50 + ~150 µs through ``cryptography``), and a Pastry join exchanges only one or
  two datagrams with most of the ~100 peers it meets — too few for a Noise handshake (3
  messages, ~460 µs) to pay. A *pair key* needs no message at all: as NaCl's ``crypto_box``
  (Bernstein, Lange, Schwabe, "The security impact of a new cryptographic library", 2012:
  X25519 between the two long-term keys, then a key derived from the result), with each node's
  X25519 key being its Ed25519 identity key in Montgomery form — libsodium's
  ``crypto_sign_ed25519_pk_to_curve25519`` / ``_sk_to_curve25519``, whose joint use for
  signatures and Diffie-Hellman is analysed by Thormarker, "On using the same key pair for
  Ed25519 and an X25519 based KEM" (2021). So a sender that knows the receiver's identity key
  (learned from any frame it verified from it, in this process) tags a frame with one X25519
  and one keyed BLAKE2s; the receiver checks it with one X25519 and one BLAKE2s.
* **Key.** ``dh = X25519(own, peer)``; the pair's MAC key is ``BLAKE2s(DOMAIN || dh || lo ||
  hi)``, ``lo`` / ``hi`` the two Ed25519 keys in byte order — a hash of the shared secret and
  both public keys, as libsodium's ``crypto_kx`` derives its session keys from
  ``BLAKE2b(q || client_pk || server_pk)``. A node keeps that key for the peers it used in the
  last 0.5–1 s (two generations of 32-byte slots): three quarters of the reuses of a key come
  within 50 ms of its last use (a request and its reply), and the rest seconds later, which a
  longer period would catch only at the cost of holding every key of the last seconds.
* **Frame**: ``0xF7 | sender Ed25519 key (32) | receiver id (20) | seq (8) | address length (1)
  | reply-to address | body | tag (16)``, the tag ``BLAKE2s-128(key = MAC key, everything
  before it)`` — keyed BLAKE2s as a MAC (RFC 7693 §2.9 and §3.3; WireGuard's ``mac1`` is the
  same primitive). Authenticated, not encrypted, like the signed envelopes pair frames replace
  (Noise sessions encrypt): a ChaCha20-Poly1305 record cost ~4 µs more per frame on each side
  in a microbenchmark and ~15 µs each in a running swarm (an OpenSSL context made per frame),
  ~12 % of a signed bring-up, for a confidentiality the overlay does not otherwise offer. The
  header names the sender and the receiver, so a frame cannot be reflected or re-addressed;
  ``seq`` (wall-clock microseconds, strictly increasing) is what the replay window of
  :mod:`transports.auth` reads. The first byte was ``0xF6`` for the earlier encrypted layout:
  a node of either layout counts the other's frames as malformed, not as forged.
* **Process-wide tables** (public data only): the X25519 form of each Ed25519 key seen, and the
  Ed25519 key of each id whose frame some node of the process verified (an id is SHA-1 of its
  key, so an entry cannot be poisoned). Derived keys stay with the node that derived them.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import time
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from nacl.bindings import crypto_scalarmult
from nacl.exceptions import CryptoError

__all__ = [
    "PAIR",
    "PAIR_OVERHEAD",
    "PairHead",
    "PairKeys",
    "is_pair_frame",
    "known_key",
    "learn_key",
    "parse_head",
    "x25519_public_from_ed25519",
]

#: first byte of a pair frame (envelopes start with 0x98, session frames with 0xF1–0xF5; 0xF6
#: was the encrypted layout before this one)
PAIR = 0xF7
_DOMAIN = b"flockring/pair/v2\x00"
_HEAD = struct.Struct(">B32s20sQB")
_HEAD_LEN = _HEAD.size  # 62
#: bytes of the tag (BLAKE2s-128)
TAGLEN = 16
#: bytes a pair frame adds to its body and reply-to address
PAIR_OVERHEAD = _HEAD_LEN + TAGLEN
_P = 2**255 - 19

#: Ed25519 key -> (the process's one copy of that key, its X25519 form or None: not
#: convertible), process-wide; bytes, not key objects (an OpenSSL key object costs ~0.5 KiB),
#: and the conversion costs ~10 µs (a modular inverse). The copy is what every node's cache of
#: derived keys is keyed by: a key read from a datagram is a fresh 80-byte object, which each
#: node holding it would otherwise keep one of for the life of its cache entry.
_X: dict[bytes, tuple[bytes, bytes | None]] = {}
#: id (SHA-1 of the key) -> Ed25519 key, for ids some node of this process verified a frame of
_BY_ID: dict[bytes, bytes] = {}
_TABLE_MAX = 65536
#: ``(sender key, receiver id, seq, reply_to, end of the header)``
PairHead = tuple[bytes, bytes, int, str, int]
_X_MAX = 16384
#: bytes of one slot of a node's slab: the MAC key shared with one peer
_SLOT = 32


def is_pair_frame(data: bytes) -> bool:
    """True if ``data`` is a pair frame (by its first byte)."""
    return bool(data) and data[0] == PAIR


def learn_key(node_id: bytes, key: bytes) -> None:
    """Remember that ``node_id`` is SHA-1 of the Ed25519 key ``key`` (from a verified frame)."""
    if node_id not in _BY_ID:
        if len(_BY_ID) >= _TABLE_MAX:
            del _BY_ID[next(iter(_BY_ID))]
        _BY_ID[node_id] = key


def known_key(node_id: bytes) -> bytes | None:
    """The Ed25519 key of ``node_id`` if a frame of it was verified in this process."""
    return _BY_ID.get(node_id)


def x25519_public_from_ed25519(ed: bytes) -> bytes | None:
    """The Montgomery u-coordinate of an Ed25519 public key (libsodium's
    ``crypto_sign_ed25519_pk_to_curve25519``: ``u = (1 + y) / (1 - y)``), or None when ``ed``
    encodes no curve point's y (``y >= p``) or the point at which the map is undefined."""
    y = int.from_bytes(ed, "little") & ((1 << 255) - 1)
    if y >= _P or y == 1:
        return None
    u = (1 + y) * pow(1 - y, -1, _P) % _P
    return u.to_bytes(32, "little")


def _x_public(ed: bytes) -> tuple[bytes, bytes | None]:
    """``(the process's copy of ed, its X25519 form or None)``."""
    try:
        return _X[ed]
    except KeyError:
        pass
    e = (ed, x25519_public_from_ed25519(ed))
    if len(_X) >= _X_MAX:
        del _X[next(iter(_X))]
    _X[ed] = e
    return e


def _x_private(key: Ed25519PrivateKey) -> bytes:
    """libsodium's ``crypto_sign_ed25519_sk_to_curve25519``: the first half of SHA-512 of the
    seed (X25519 clamps it as Ed25519 does its scalar), so both keys share one scalar.

    Raw bytes, not an OpenSSL key object: making ``X25519PrivateKey`` costs ~36 µs (it
    computes the public key, which pair frames never use) and ~0.4 KiB, and a node makes its
    pair keys again each time it starts talking after a quiet second — during a bring-up of
    1,000 nodes, 5.5 times per join; of 3,000, 15.6."""
    seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return hashlib.sha512(seed).digest()[:32]


class PairKeys:
    """One node's side of pair frames: seals to peers whose key is known, opens what it got.

    Derived keys are kept in two generations (``young``, ``old``) that turn over every
    ``period_s`` (a key used in a generation is carried into the next; one unused for two
    periods is dropped), at most ``cache`` per generation: a node holds the keys of the peers it
    is talking to now — ~100 during its own join, none once quiet — and a miss costs one
    X25519 (~31 µs), still a quarter of an Ed25519 verification.

    Memory: each generation maps a peer key (the process's one copy) to a slot of one
    ``bytearray`` holding the 32-byte MAC key shared with that peer, compacted to the
    surviving generation at each turnover. A ``bytes`` value of both directions' keys per peer
    cost 97 bytes plus allocator rounding; a slot costs 32, and slot numbers below 257 are
    CPython's shared small ints, so no object is made per key (a joining node holds ~100).
    """

    __slots__ = (
        "_cache_max", "_clock", "_ed", "_old", "_period", "_slab", "_turn_at", "_x", "_young",
        "derivations",
    )  # fmt: skip

    def __init__(
        self,
        key: Ed25519PrivateKey,
        public: bytes,
        *,
        cache: int = 128,
        period_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._x = _x_private(key)
        self._ed = public
        #: peer key -> slot of ``_slab`` (the MAC key shared with that peer at
        #: ``_SLOT * slot``), this generation and the last
        self._young: dict[bytes, int] = {}
        self._old: dict[bytes, int] = {}
        self._slab = bytearray()
        self._cache_max = cache
        self._period = period_s
        self._clock = clock
        self._turn_at = clock() + period_s
        #: X25519 computations made (cache misses)
        self.derivations = 0

    @property
    def period_s(self) -> float:
        """How long a generation lasts (a key unused for two is dropped)."""
        return self._period

    def held(self) -> int:
        """Derived keys currently kept."""
        return len(self._young) + len(self._old)

    def expire(self) -> int:
        """Turn the generations over if one is due, as a use would, and return the keys still
        held: the owner of a node that has stopped talking calls it every period, so that
        keys unused for two periods go without waiting for the next use (0: none is left, and
        the object itself can go)."""
        now = self._clock()
        if now >= self._turn_at:
            self._turn(now)
        return self.held()

    def _turn(self, now: float) -> None:
        """Start a generation: the young one becomes the old one (dropped instead if it too is
        more than a period old), and the slab keeps only the slots the old one names."""
        keep = self._young if now < self._turn_at + self._period else {}
        slab = memoryview(self._slab)
        new = bytearray(_SLOT * len(keep))
        for j, (peer, i) in enumerate(keep.items()):
            # a value set during the iteration over its own keys: no resize, allowed
            new[_SLOT * j : _SLOT * (j + 1)] = slab[_SLOT * i : _SLOT * (i + 1)]
            keep[peer] = j
        slab.release()
        self._slab = new
        self._old = keep
        self._young = {}
        self._turn_at = now + self._period

    def _keys(self, peer: bytes) -> bytes | None:
        """The MAC key shared with the peer whose Ed25519 key is ``peer`` (None: no usable
        key)."""
        now = self._clock()
        if now >= self._turn_at:
            self._turn(now)
        young = self._young
        i = young.get(peer)
        if i is not None:
            return bytes(self._slab[_SLOT * i : _SLOT * (i + 1)])
        i = self._old.pop(peer, None)
        if i is not None:
            # the slot stays where it is: it moves to the young generation by its number
            k = bytes(self._slab[_SLOT * i : _SLOT * (i + 1)])
            e = _X.get(peer)
            if e is not None:
                peer = e[0]
        else:
            peer, xp = _x_public(peer)
            if xp is None:
                return None
            try:
                # libsodium's X25519 on raw bytes (~31 µs, as OpenSSL's), without the ~7 µs of
                # making a public-key object per peer that ``cryptography`` requires
                dh = crypto_scalarmult(self._x, xp)
            except CryptoError:  # small-order point: an all-zero shared secret
                return None
            self.derivations += 1
            # the shared secret hashed with both public keys (crypto_kx's construction): a
            # uniform key bound to this pair, whichever side computed it
            ed = self._ed
            lo, hi = (ed, peer) if ed < peer else (peer, ed)
            k = hashlib.blake2s(_DOMAIN + dh + lo + hi).digest()
            if len(young) >= self._cache_max:
                return k
            i = len(self._slab) // _SLOT
            self._slab += k
        if len(young) < self._cache_max:
            young[peer] = i
        return k

    def seal(self, peer: bytes, to: bytes, seq: int, reply_to: str, body: bytes) -> bytes | None:
        """A pair frame carrying ``body`` to the node with Ed25519 key ``peer`` and id ``to``
        (None if ``peer`` is no usable key or the address is too long)."""
        addr = reply_to.encode()
        if len(addr) > 255:
            return None
        k = self._keys(peer)
        if k is None:
            return None
        frame = _HEAD.pack(PAIR, self._ed, to, seq, len(addr)) + addr + body
        return frame + hashlib.blake2s(frame, key=k, digest_size=TAGLEN).digest()

    def open(self, head: PairHead, data: bytes) -> bytes | None:
        """The body of the frame ``data`` whose header :func:`parse_head` returned as ``head``,
        or None if its tag does not verify under our key with its sender (``forged``)."""
        k = self._keys(head[0])
        if k is None:
            return None
        signed = memoryview(data)[:-TAGLEN]
        tag = hashlib.blake2s(signed, key=k, digest_size=TAGLEN).digest()
        if not hmac.compare_digest(tag, data[-TAGLEN:]):
            return None
        return data[head[4] : -TAGLEN]


def parse_head(data: bytes) -> PairHead | None:
    """The header of a pair frame, or None if it is too short or its address is not UTF-8."""
    if len(data) < _HEAD_LEN + TAGLEN:
        return None
    kind, sender, to, seq, alen = _HEAD.unpack_from(data)
    if kind != PAIR:
        return None
    end = _HEAD_LEN + alen
    if len(data) < end + TAGLEN:
        return None
    try:
        reply_to = data[_HEAD_LEN:end].decode()
    except UnicodeDecodeError:
        return None
    return sender, to, seq, reply_to, end
