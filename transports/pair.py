"""Pair frames: datagrams authenticated under a key two nodes derive from their identity keys.

Theory of operation (docs/security.md, "Pair frames"):

* **Why.** An Ed25519 signature costs its sender one signing and every receiver one
  verification (~50 + ~150 µs through ``cryptography``), and a Pastry join exchanges only one or
  two datagrams with most of the ~100 peers it meets — too few for a Noise handshake (3
  messages, ~460 µs) to pay. A *pair key* needs no message at all: it is NaCl's ``crypto_box``
  (Bernstein, Lange, Schwabe, "The security impact of a new cryptographic library", 2012:
  X25519 between the two long-term keys, then an AEAD keyed by the result), with each node's
  X25519 key being its Ed25519 identity key in Montgomery form — libsodium's
  ``crypto_sign_ed25519_pk_to_curve25519`` / ``_sk_to_curve25519``, whose joint use for
  signatures and Diffie-Hellman is analysed by Thormarker, "On using the same key pair for
  Ed25519 and an X25519 based KEM" (2021). So a sender that knows the receiver's identity key
  (learned from any frame it verified from it, in this process) seals with one X25519 and a
  ChaCha20-Poly1305 record; the receiver opens with one X25519 and the tag check.
* **Keys.** ``dh = X25519(own, peer)``; one key per direction, as Noise's ``Split()``:
  ``k_lo = BLAKE2s(key=dh, DOMAIN || lo || hi || 1)`` and ``k_hi`` likewise with ``2``, ``lo`` /
  ``hi`` the two Ed25519 keys in byte order (keyed BLAKE2s is a PRF, RFC 7693 §2.9). A node
  keeps the derived keys of the peers it used in the last 2–4 s (two generations of 64-byte
  entries, not OpenSSL contexts, which cost ~2.5 KiB each).
* **Frame**: ``0xF6 | sender Ed25519 key (32) | receiver id (20) | nonce prefix (4) | seq (8) |
  address length (1) | reply-to address | ChaCha20-Poly1305(body), tag (16)``, everything
  before the ciphertext as associated data. The nonce is the sender's per-process random prefix
  and its sequence number (wall-clock microseconds, strictly increasing; the same numbers the
  replay window of :mod:`transports.auth` reads), so a key and nonce never repeat even if the
  clock steps back across a restart (2^-32 per restart).
* **Process-wide tables** (public data only): the X25519 form of each Ed25519 key seen, and the
  Ed25519 key of each id whose frame some node of the process verified (an id is SHA-1 of its
  key, so an entry cannot be poisoned). Derived keys stay with the node that derived them.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from transports.noise import TAGLEN

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

#: first byte of a pair frame (envelopes start with 0x98, session frames with 0xF1–0xF5)
PAIR = 0xF6
_DOMAIN = b"flockring/pair/v1\x00"
_HEAD = struct.Struct(">B32s20s4sQB")
_HEAD_LEN = _HEAD.size  # 66
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
#: ``(sender key, receiver id, nonce prefix, seq, reply_to, end of the header)``
PairHead = tuple[bytes, bytes, bytes, int, str, int]
_X_MAX = 16384


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


def _x_private(key: Ed25519PrivateKey) -> X25519PrivateKey:
    """libsodium's ``crypto_sign_ed25519_sk_to_curve25519``: the first half of SHA-512 of the
    seed (X25519 clamps it as Ed25519 does its scalar), so both keys share one scalar."""
    seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return X25519PrivateKey.from_private_bytes(hashlib.sha512(seed).digest()[:32])


class PairKeys:
    """One node's side of pair frames: seals to peers whose key is known, opens what it got.

    Derived keys are kept in two generations (``young``, ``old``) that turn over every
    ``period_s`` (a key used in a generation is carried into the next; one unused for two
    periods is dropped), at most ``cache`` per generation: a node holds the keys of the peers it
    is talking to now — ~100 during its own join, none once quiet — and a miss costs one
    X25519 (~40 µs), still a quarter of an Ed25519 verification.
    """

    __slots__ = (
        "_cache_max", "_clock", "_ed", "_old", "_period", "_prefix", "_turn_at", "_x", "_young",
        "derivations",
    )  # fmt: skip

    def __init__(
        self,
        key: Ed25519PrivateKey,
        public: bytes,
        *,
        cache: int = 128,
        period_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._x = _x_private(key)
        self._ed = public
        self._prefix = os.urandom(4)
        #: peer key -> (key we send with || key we receive with), this generation and the last
        self._young: dict[bytes, bytes] = {}
        self._old: dict[bytes, bytes] = {}
        self._cache_max = cache
        self._period = period_s
        self._clock = clock
        self._turn_at = clock() + period_s
        #: X25519 computations made (cache misses)
        self.derivations = 0

    def held(self) -> int:
        """Derived keys currently kept."""
        return len(self._young) + len(self._old)

    def _keys(self, peer: bytes) -> bytes | None:
        """``key we send with || key we receive with`` for the peer with Ed25519 key ``peer``."""
        now = self._clock()
        if now >= self._turn_at:
            self._old = self._young if now < self._turn_at + self._period else {}
            self._young = {}
            self._turn_at = now + self._period
        young = self._young
        k = young.get(peer)
        if k is not None:
            return k
        k = self._old.pop(peer, None)
        if k is not None:
            e = _X.get(peer)
            if e is not None:
                peer = e[0]
        else:
            peer, xp = _x_public(peer)
            if xp is None:
                return None
            try:
                dh = self._x.exchange(X25519PublicKey.from_public_bytes(xp))
            except ValueError:  # small-order point: an all-zero shared secret
                return None
            self.derivations += 1
            # one key per direction: keyed BLAKE2s (a PRF, RFC 7693 §2.9) over the domain and
            # both keys in byte order, as Noise's Split() derives two keys from one secret
            lo, hi = (self._ed, peer) if self._ed < peer else (peer, self._ed)
            info = _DOMAIN + lo + hi
            k_lo = hashlib.blake2s(info + b"\x01", key=dh).digest()
            k_hi = hashlib.blake2s(info + b"\x02", key=dh).digest()
            k = k_lo + k_hi if lo is self._ed else k_hi + k_lo
        if len(young) < self._cache_max:
            young[peer] = k
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
        head = _HEAD.pack(PAIR, self._ed, to, self._prefix, seq, len(addr)) + addr
        nonce = self._prefix + seq.to_bytes(8, "big")
        return head + ChaCha20Poly1305(k[:32]).encrypt(nonce, body, head)

    def open(self, head: PairHead, data: bytes) -> bytes | None:
        """The body of the frame ``data`` whose header :func:`parse_head` returned as ``head``,
        or None if its tag does not verify under our key with its sender (``forged``)."""
        k = self._keys(head[0])
        if k is None:
            return None
        try:
            return ChaCha20Poly1305(k[32:]).decrypt(
                head[2] + head[3].to_bytes(8, "big"), data[head[5] :], data[: head[5]]
            )
        except InvalidTag:
            return None


def parse_head(data: bytes) -> PairHead | None:
    """The header of a pair frame, or None if it is too short or its address is not UTF-8."""
    if len(data) < _HEAD_LEN + TAGLEN:
        return None
    kind, sender, to, prefix, seq, alen = _HEAD.unpack_from(data)
    if kind != PAIR:
        return None
    end = _HEAD_LEN + alen
    if len(data) < end + TAGLEN:
        return None
    try:
        reply_to = data[_HEAD_LEN:end].decode()
    except UnicodeDecodeError:
        return None
    return sender, to, prefix, seq, reply_to, end
