"""Pair frames (static-static X25519 + a keyed-BLAKE2s tag) and the shared replay table.

Oracles: the X25519 key libsodium's conversion gives must equal the public key of the private
key derived independently from the seed; a frame must equal the one built from the documented
construction with OpenSSL's X25519 (``cryptography``); replay decisions must equal a brute-force
set of every accepted ``(sender, seq)``; every tampered byte of a frame must be refused.
"""

from __future__ import annotations

import hashlib
import random

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from transports import pair as pair_module
from transports import replay
from transports.auth import Signer, Verifier, key_hash, public_bytes
from transports.pair import (
    PAIR,
    PairKeys,
    is_pair_frame,
    known_key,
    learn_key,
    x25519_public_from_ed25519,
)
from transports.replay import ReplayCache

T0 = 1_700_000_000_000_000  # µs


class Clock:
    def __init__(self) -> None:
        self.us = T0

    def __call__(self) -> int:
        return self.us


def _key(i: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"pair%d" % i).digest())


class Party:
    def __init__(self, i: int, clock: Clock) -> None:
        self.key = _key(i)
        self.pub = public_bytes(self.key)
        self.id = key_hash(self.pub)
        self.signer = Signer(self.key, clock_us=clock)
        self.pair = PairKeys(self.key, self.pub, cache=2)
        self.verifier = Verifier(clock_us=clock, own_id=self.id)

    def seal_to(self, other: Party, body: bytes, to: bytes | None = None) -> bytes:
        f = self.pair.seal(
            other.pub, other.id if to is None else to, self.signer.next_seq(), "udp://1:1", body
        )
        assert f is not None
        return f

    def open(self, frame: bytes) -> bytes | None:
        o = self.verifier.open_pair(frame, self.pair)
        return None if o is None else o.body


def test_conversion_matches_the_independently_derived_x25519_key() -> None:
    rng = random.Random(1)
    for _ in range(50):
        seed = rng.randbytes(32)
        ed = Ed25519PrivateKey.from_private_bytes(seed)
        x = X25519PrivateKey.from_private_bytes(hashlib.sha512(seed).digest()[:32])
        assert x25519_public_from_ed25519(public_bytes(ed)) == x.public_key().public_bytes_raw()
    # y >= p and y == 1 (the point where the map is undefined) are refused
    assert x25519_public_from_ed25519(b"\xff" * 31 + b"\x7f") is None
    assert x25519_public_from_ed25519((1).to_bytes(32, "little")) is None


def test_a_small_order_peer_key_gets_no_pair_frame_and_opens_none() -> None:
    # y = -1 encodes the Ed25519 point of order 2, whose Montgomery form is u = 0: X25519 with
    # it gives the all-zero secret, which libsodium refuses (as OpenSSL did): no frame is
    # sealed to it, and a frame claiming it as sender is refused as forged
    bad = ((1 << 255) - 20).to_bytes(32, "little")
    assert x25519_public_from_ed25519(bad) == bytes(32)
    clock = Clock()
    a = Party(90, clock)
    assert a.pair.seal(bad, key_hash(bad), a.signer.next_seq(), "udp://1:1", b"x") is None
    assert a.pair.derivations == 0
    frame = bytearray(Party(91, clock).seal_to(a, b"y"))
    frame[1:33] = bad  # the sender key the frame names
    assert a.open(bytes(frame)) is None
    assert a.verifier.counters["forged"] == 1


def test_a_frame_opens_once_at_its_receiver_only() -> None:
    clock = Clock()
    a, b, c = Party(1, clock), Party(2, clock), Party(3, clock)
    f = a.seal_to(b, b"hello")
    # authenticated, not encrypted: the body travels as it is, before the 16-byte tag
    assert is_pair_frame(f) and f[0] == PAIR and f[-21:-16] == b"hello"
    o = b.verifier.open_pair(f, b.pair)
    assert o is not None and o.body == b"hello" and o.sender_hash == a.id and o.to == b.id
    assert o.sender_key == a.pub
    # replayed to the same node: refused by the replay table, before any key is derived
    d = b.pair.derivations
    assert b.open(f) is None and b.verifier.counters["replayed"] == 1
    assert b.pair.derivations == d
    # replayed to another node: it names b, so c refuses it; re-addressed to c, the tag fails
    assert c.open(f) is None and c.verifier.counters["misdirected"] == 1
    readdressed = f[:33] + c.id + f[53:]
    assert c.open(readdressed) is None and c.verifier.counters["forged"] == 1
    # the other direction works too (one key per pair; the header names sender and receiver)
    g = b.seal_to(a, b"back")
    assert a.open(g) == b"back"
    assert b.verifier.counters["accepted"] == 1 and a.verifier.counters["accepted"] == 1


def test_every_tampered_byte_is_refused_and_counted() -> None:
    clock = Clock()
    a, b = Party(4, clock), Party(5, clock)
    f = a.seal_to(b, b"payload bytes")
    for i in range(len(f)):
        bad = f[:i] + bytes([f[i] ^ 0x01]) + f[i + 1 :]
        fresh = Verifier(clock_us=clock, own_id=b.id)
        assert fresh.open_pair(bad, b.pair) is None, i
        assert sum(fresh.counters.values()) == 1  # one reason, counted once
        assert fresh.counters["accepted"] == 0
    for n in (0, 1, 40, 66, len(f) - 1):  # truncated
        fresh = Verifier(clock_us=clock, own_id=b.id)
        assert fresh.open_pair(f[:n], b.pair) is None
    assert b.open(f) == b"payload bytes"  # the original still opens


def test_a_forged_sender_key_and_a_stale_frame_are_refused() -> None:
    clock = Clock()
    a, b = Party(6, clock), Party(7, clock)
    f = a.seal_to(b, b"x")
    # the frame claims another sender: its key does not open the tag
    c = Party(8, clock)
    assert b.open(f[:1] + c.pub + f[33:]) is None and b.verifier.counters["forged"] == 1
    # a key that is no curve point
    assert b.open(f[:1] + b"\xff" * 31 + b"\x7f" + f[33:]) is None
    assert b.verifier.counters["forged"] == 2
    # captured an hour ago: outside the clock window
    old = Signer(a.key, clock_us=lambda: T0 - 3_600_000_000)
    g = a.pair.seal(b.pub, b.id, old.next_seq(), "udp://1:1", b"old")
    assert g is not None and b.open(g) is None and b.verifier.counters["stale"] == 1


def test_a_receiver_with_a_new_key_refuses_old_frames() -> None:
    # A node that comes back under a new identity (or a frame sealed for a key it never held)
    # derives another pair key: a captured frame fails its tag there.
    clock = Clock()
    a, b = Party(9, clock), Party(10, clock)
    f = a.seal_to(b, b"x")
    b2 = Party(11, clock)
    assert b2.verifier.open_pair(f[:33] + b2.id + f[53:], b2.pair) is None
    assert b2.verifier.counters["forged"] == 1


def test_known_keys_are_learned_only_from_verified_frames() -> None:
    clock = Clock()
    a, b = Party(12, clock), Party(13, clock)
    assert known_key(a.id) is None or known_key(a.id) == a.pub
    learn_key(b"\x00" * 20, b"\x01" * 32)
    assert known_key(b"\x00" * 20) == b"\x01" * 32
    assert b.verifier.open(a.signer.seal("udp://1:1", b"hi", b.id)) is not None
    assert known_key(a.id) == a.pub


@pytest.mark.parametrize("sorted_max", [None, 0, 16])
def test_replay_decisions_match_a_brute_force_set(
    sorted_max: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a bucket is a sorted array up to _SORTED_MAX entries, then a hash table: both, and the
    # conversion, at the default and with the hash table at once or after a few entries
    if sorted_max is not None:
        monkeypatch.setattr(replay, "_SORTED_MAX", sorted_max)
    rng = random.Random(2)
    skew = 600_000_000
    cache = ReplayCache(skew, max_entries=1 << 20, bucket_us=120_000_000)
    seen: set[tuple[bytes, int]] = set()
    senders = [bytes([i]) * 32 for i in range(7)]
    now = T0
    sent: list[tuple[bytes, int]] = []
    for _ in range(20_000):
        now += rng.randrange(0, 200_000_000) if rng.random() < 0.01 else rng.randrange(1000)
        if sent and rng.random() < 0.3:
            s, q = rng.choice(sent)  # a replay (or a late copy) of something sent earlier
        else:
            s, q = rng.choice(senders), now + rng.randrange(-skew - 10**6, skew + 10**6)
            sent.append((s, q))
        expect = None
        if abs(q - now) > skew:
            expect = "stale"
        elif (s, q) in seen:
            expect = "replayed"
        got = cache.check(s, q, now)
        assert got == expect
        if got is None:
            seen.add((s, q))
    # what is remembered is exactly what could still pass the clock check (plus one bucket)
    assert len(cache) <= sum(1 for _, q in seen if q >= now - skew - 120_000_000)


@pytest.mark.parametrize("cache", [0, 1, 16])
def test_the_key_cache_size_does_not_change_what_opens(cache: int) -> None:
    clock = Clock()
    parties = [Party(20 + i, clock) for i in range(5)]
    rx = Party(30, clock)
    rx.pair = PairKeys(rx.key, rx.pub, cache=cache, clock=lambda: 0.0)  # one generation
    for i in range(40):
        p = parties[i % 5]
        assert rx.open(p.seal_to(rx, b"%d" % i)) == b"%d" % i
    assert rx.verifier.counters["accepted"] == 40
    # kept: none; the first peer's key only (8 uses, 1 derivation); all five
    assert rx.pair.derivations == {0: 40, 1: 33, 16: 5}[cache]


def test_keys_unused_for_two_periods_are_dropped() -> None:
    clock = Clock()
    t = [0.0]
    a, b = Party(40, clock), Party(41, clock)
    b.pair = PairKeys(b.key, b.pub, period_s=2.0, clock=lambda: t[0])
    for step in (0.0, 1.0, 2.5, 4.4):  # used in every generation: derived once
        t[0] = step
        assert b.open(a.seal_to(b, b"x")) == b"x"
    assert b.pair.derivations == 1 and b.pair.held() == 1
    t[0] = 9.0  # two periods without use: forgotten, and derived again when needed
    assert b.open(a.seal_to(b, b"y")) == b"y"
    assert b.pair.derivations == 2 and b.pair.held() == 1


def test_expire_lets_unused_keys_go_without_waiting_for_a_use() -> None:
    # generations turned over only when a key was used: a node that went quiet kept every key
    # of its last exchanges (up to 2 x cache) until its next pair frame; expire() is what its
    # owner calls every period instead
    clock = Clock()
    t = [0.0]
    parties = [Party(50 + i, clock) for i in range(3)]
    b = Party(53, clock)
    b.pair = PairKeys(b.key, b.pub, period_s=0.5, clock=lambda: t[0])
    for p in parties:
        assert b.open(p.seal_to(b, b"x")) == b"x"
    assert b.pair.held() == 3 and b.pair.expire() == 3
    t[0] = 0.6  # a period later: the keys are the old generation, still held
    assert b.pair.expire() == 3
    assert b.open(parties[0].seal_to(b, b"y")) == b"y"  # one used again: carried over
    t[0] = 1.2  # two periods without use for the others
    assert b.pair.expire() == 1
    t[0] = 2.5
    assert b.pair.expire() == 0 and b.pair.derivations == 3
    # what is derived again opens as before
    assert b.open(parties[1].seal_to(b, b"z")) == b"z" and b.pair.derivations == 4


@pytest.mark.parametrize("cache", [1, 3, 16])
def test_slots_survive_turnovers_and_promotions(cache: int) -> None:
    # the derived keys live in one slab per node, compacted at each turnover: whatever the
    # order of uses, turnovers and promotions, every frame opens, and a key unused for two
    # periods is derived again (at most one derivation per peer and two periods when cached)
    clock = Clock()
    t = [0.0]
    rng = random.Random(cache)
    parties = [Party(60 + i, clock) for i in range(6)]
    b = Party(70, clock)
    b.pair = PairKeys(b.key, b.pub, cache=cache, period_s=1.0, clock=lambda: t[0])
    for i in range(300):
        t[0] += rng.choice((0.0, 0.0, 0.1, 0.4, 1.1))
        p = rng.choice(parties)
        body = b"%d" % i
        assert b.open(p.seal_to(b, body)) == body
        assert p.open(b.seal_to(p, body)) == body
        assert b.pair.held() <= 2 * cache
        assert len(b.pair._slab) <= pair_module._SLOT * 2 * cache
    assert b.verifier.counters["accepted"] == 300


def _frame_by_the_spec(
    sender: Ed25519PrivateKey, receiver: Ed25519PrivateKey, seq: int, reply_to: str, body: bytes
) -> bytes:
    """A pair frame built from docs/security.md's construction with OpenSSL's X25519, both
    X25519 keys taken from the Ed25519 seeds independently of ``transports.pair``."""

    def x25519(k: Ed25519PrivateKey) -> X25519PrivateKey:
        return X25519PrivateKey.from_private_bytes(
            hashlib.sha512(k.private_bytes_raw()).digest()[:32]
        )

    x = x25519(sender)
    ps, pr = public_bytes(sender), public_bytes(receiver)
    xr = x25519(receiver).public_key()
    lo, hi = sorted((ps, pr))
    mac_key = hashlib.blake2s(b"flockring/pair/v2\x00" + x.exchange(xr) + lo + hi).digest()
    addr = reply_to.encode()
    frame = b"\xf7" + ps + key_hash(pr) + seq.to_bytes(8, "big") + bytes([len(addr)]) + addr + body
    return frame + hashlib.blake2s(frame, key=mac_key, digest_size=16).digest()


def test_pair_frames_are_the_documented_construction() -> None:
    # both directions, from the lower and from the higher key, against an independent build;
    # and each opens at its receiver
    clock = Clock()
    for i in range(6):
        a, b = Party(80 + 2 * i, clock), Party(81 + 2 * i, clock)
        for s, r in ((a, b), (b, a)):
            body = b"body %d" % i
            seq = s.signer.next_seq()
            f = s.pair.seal(r.pub, r.id, seq, "udp://10.0.0.1:4000", body)
            assert f == _frame_by_the_spec(s.key, r.key, seq, "udp://10.0.0.1:4000", body)
            assert r.open(f) == body


def test_a_frame_of_the_earlier_encrypted_layout_is_no_pair_frame() -> None:
    # 0xF6 was the ChaCha20-Poly1305 layout: a node of this version does not read it as a
    # (forged) pair frame
    clock = Clock()
    a, b = Party(70, clock), Party(71, clock)
    f = a.seal_to(b, b"x")
    old = b"\xf6" + f[1:]
    assert not is_pair_frame(old)
    assert b.open(old) is None and b.verifier.counters["forged"] == 0
    # the receive path hands a frame that is no pair frame to the envelope decoder: malformed
    assert b.verifier.open(old) is None and b.verifier.counters["malformed"] == 2


def test_derived_keys_of_every_node_share_one_copy_of_a_peer_key() -> None:
    # a peer key read from a datagram is a fresh object each time: the nodes' caches of derived
    # keys hold the process's one copy instead (and still find it by value)
    a, b = PairKeys(_key(11), public_bytes(_key(11))), PairKeys(_key(12), public_bytes(_key(12)))
    peer = public_bytes(_key(13))
    for node in (a, b):
        fresh = bytes(bytearray(peer))  # as parsed from a frame
        assert fresh is not peer
        assert node._keys(fresh) is not None
    ka, kb = next(iter(a._young)), next(iter(b._young))
    assert ka is kb and ka == peer
    # an entry carried from the old generation into the young one keeps that copy too
    a._old, a._young = a._young, {}
    derived = a.derivations
    assert a._keys(bytes(bytearray(peer))) is not None and next(iter(a._young)) is ka
    assert a.derivations == derived
