"""Transports (memory, UDP, TCP/TLS) and envelope authentication (signatures, replay window).

Real sockets on 127.0.0.1 with port 0 only; virtual time for the memory network.
"""

from __future__ import annotations

import hashlib

import pytest
import trio
import trio.testing
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from transports import MemoryNetwork, open_tcp, open_udp
from transports.address import AddressError, parse_address, resolve
from transports.auth import Signer, Verifier, key_hash, public_bytes
from transports.codec import MAX_FRAME_BYTES

KEY_A = Ed25519PrivateKey.from_private_bytes(b"\x0a" * 32)
KEY_B = Ed25519PrivateKey.from_private_bytes(b"\x0b" * 32)


# ------------------------------------------------------------------------------ addresses
def test_addresses() -> None:
    assert parse_address("udp://127.0.0.1:9000") == ("udp", "127.0.0.1", 9000)
    assert parse_address("tcp://[::1]:1") == ("tcp", "::1", 1)
    assert parse_address("mem://7") == ("mem", "7", 0)
    for bad in ("127.0.0.1:9", "udp://127.0.0.1", "udp://host:1", "udp://1.2.3.4:99999", "udp://x"):
        with pytest.raises(AddressError):
            parse_address(bad)
    with pytest.raises(AddressError):
        parse_address("tcp://127.0.0.1:1", "udp")
    assert resolve("udp://localhost:5") in ("udp://127.0.0.1:5", "udp://[::1]:5")


# ------------------------------------------------------------------------------ auth
class Clock:
    def __init__(self) -> None:
        self.us = 1_000_000_000

    def __call__(self) -> int:
        return self.us


def test_signed_frames_verify_and_replays_are_dropped() -> None:
    clock = Clock()
    s = Signer(KEY_A, clock_us=clock)
    v = Verifier(clock_us=clock)
    f1, f2 = s.seal("udp://127.0.0.1:1", b"one"), s.seal("udp://127.0.0.1:1", b"two")
    o2 = v.open(f2)
    assert o2 is not None and o2.body == b"two"
    assert o2.sender_hash == hashlib.sha1(public_bytes(KEY_A)).digest() == s.sender_hash
    o1 = v.open(f1)  # reordered but inside the window: accepted once
    assert o1 is not None and o1.body == b"one"
    assert v.open(f1) is None and v.open(f2) is None
    assert v.counters["replayed"] == 2
    clock.us += 60_000_000  # a minute later, far outside the 30 s window
    late = s.seal("udp://127.0.0.1:1", b"three")
    assert v.open(late) is not None
    assert v.open(f1) is None  # below the floor now
    assert v.counters["replayed"] == 3


def test_forged_unsigned_and_stale_frames_are_dropped() -> None:
    clock = Clock()
    v = Verifier(clock_us=clock)
    frame = Signer(KEY_A, clock_us=clock).seal("udp://127.0.0.1:1", b"body")
    tampered = frame.replace(b"body", b"bodz")
    assert v.open(tampered) is None and v.counters["forged"] == 1
    unsigned = Signer(None, claimed_id=key_hash(public_bytes(KEY_A))).seal("x", b"b")
    assert v.open(unsigned) is None and v.counters["unsigned"] == 1
    old = Signer(KEY_B, clock_us=lambda: clock.us - 3_600_000_000).seal("x", b"b")
    assert v.open(old) is None and v.counters["stale"] == 1
    assert v.counters["accepted"] == 0
    # signing off is an explicit choice on the receiving side too
    lax = Verifier(require_signatures=False, clock_us=clock)
    got = lax.open(unsigned)
    assert got is not None and got.sender_key is None
    assert lax.open(frame) is not None  # signed frames are still verified and accepted


def test_replay_table_is_bounded() -> None:
    clock = Clock()
    v = Verifier(clock_us=clock, max_entries=150)
    signers = [Signer(Ed25519PrivateKey.generate(), clock_us=clock) for _ in range(10)]
    frames = []
    for s in signers:  # 40 frames per sender, a minute apart per sender: 5 table buckets
        frames += [s.seal("x", b"b") for _ in range(40)]
        clock.us += 60_000_000
    clock.us -= 60_000_000
    assert all(v.open(f) is not None for f in frames)
    assert len(v.replay) <= 150 and v.replay.evicted > 0
    # every replay is refused: remembered ones as replays, forgotten ones below the floor
    assert all(v.open(f) is None for f in frames)
    assert v.counters["replayed"] > 0 and v.counters["stale"] > 0
    assert v.counters["replayed"] + v.counters["stale"] == len(frames)
    assert v.open(signers[0].seal("x", b"fresh")) is not None  # honest traffic still passes


def test_frames_signed_for_another_node_are_refused() -> None:
    clock = Clock()
    me, other = key_hash(public_bytes(KEY_A)), key_hash(public_bytes(KEY_B))
    v = Verifier(clock_us=clock, own_id=me)
    s = Signer(KEY_B, clock_us=clock)
    assert v.open(s.seal("x", b"for me", to=me)) is not None
    assert v.open(s.seal("x", b"bootstrap", to=None)) is not None
    assert v.open(s.seal("x", b"for someone else", to=other)) is None
    assert v.counters["misdirected"] == 1


# ------------------------------------------------------------------------------ memory
async def test_memory_latency_loss_partition(autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(latency=0.25, seed=1)
    a, b = net.endpoint(), net.endpoint()
    t0 = trio.current_time()
    a.send_nowait(b.address, b"hello")
    src, data = await b.receive()
    assert (src, data) == (a.address, b"hello")
    assert trio.current_time() - t0 == pytest.approx(0.25)
    net.partition([a.address], [b.address])
    a.send_nowait(b.address, b"cut")
    with trio.move_on_after(5):
        await b.receive()
        pytest.fail("partitioned datagram arrived")
    net.heal()
    a.send_nowait("mem://nobody", b"x")
    a.send_nowait(b.address, b"x" * (MAX_FRAME_BYTES + 1))
    assert net.stats["partitioned"] == 1 and net.stats["no_route"] == 1
    assert a.stats["send_oversized"] == 1
    lossy = MemoryNetwork(loss=0.5, seed=2)
    c, d = lossy.endpoint(), lossy.endpoint()
    for _ in range(200):
        c.send_nowait(d.address, b"x")
    assert 60 < lossy.stats["lost"] < 140
    await a.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await a.receive()


async def test_memory_receive_wakes_for_earlier_datagram(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork(latency=lambda s, d, r: 5.0 if s.endswith("1") else 1.0)
    a, b, c = net.endpoint(), net.endpoint(), net.endpoint()
    got: list[bytes] = []

    async def reader() -> None:
        for _ in range(2):
            got.append((await c.receive())[1])

    async with trio.open_nursery() as n:
        n.start_soon(reader)
        await trio.sleep(0.1)
        a.send_nowait(c.address, b"slow")
        b.send_nowait(c.address, b"fast")
    assert got == [b"fast", b"slow"]


# ------------------------------------------------------------------------------ UDP
async def test_udp_port0_round_trip_and_drops() -> None:
    async with open_udp("udp://127.0.0.1:0") as a, open_udp("udp://127.0.0.1:0") as b:
        assert a.address.startswith("udp://127.0.0.1:") and not a.address.endswith(":0")
        a.send_nowait(b.address, b"ping")
        with trio.fail_after(5):
            src, data = await b.receive()
        assert (src, data) == (a.address, b"ping")
        a.send_nowait("udp://not-an-ip:1", b"x")
        a.send_nowait("tcp://127.0.0.1:1", b"x")
        a.send_nowait(b.address, b"x" * 65508)
        assert a.stats["send_bad_address"] == 2 and a.stats["send_oversized"] == 1
        big = b"y" * 60000
        a.send_nowait(b.address, big)
        with trio.fail_after(5):
            assert (await b.receive())[1] == big
    with pytest.raises(AddressError):
        async with open_udp("udp://127.0.0.1"):
            pass


# ------------------------------------------------------------------------------ TCP
async def test_tcp_frames_reuse_one_connection() -> None:
    async with open_tcp() as a, open_tcp() as b:
        for i in range(50):
            a.send_nowait(b.address, b"frame%d" % i)
        with trio.fail_after(10):
            got = [(await b.receive())[1] for _ in range(50)]
        assert got == [b"frame%d" % i for i in range(50)]
        assert a.stats["connections_out"] == 1 and b.stats["connections_in"] == 1
        a.send_nowait(b.address, b"z" * 60000)
        with trio.fail_after(10):
            assert (await b.receive())[1] == b"z" * 60000


async def test_tcp_refuses_oversized_declared_frame() -> None:
    async with open_tcp() as b:
        _, host, port = parse_address(b.address)
        s = await trio.open_tcp_stream(host, port)
        await s.send_all((MAX_FRAME_BYTES + 1).to_bytes(4, "big") + b"x" * 100)
        with trio.fail_after(5):
            while b.stats["recv_oversized"] == 0:
                await trio.sleep(0.01)
            assert await s.receive_some(10) == b""  # the server hung up
        await s.aclose()


async def test_tcp_unreachable_peer_is_counted_not_raised() -> None:
    async with open_udp() as u:  # a bound UDP port: nobody listens on the same TCP port, probably
        port = parse_address(u.address)[2]
    async with open_tcp(connect_timeout_s=2) as a:
        a.send_nowait(f"tcp://127.0.0.1:{port}", b"x")
        with trio.fail_after(5):
            while a.stats["connect_failed"] + a.stats["connect_timeout"] == 0:
                await trio.sleep(0.01)


async def test_tls13_checks_the_peer_key() -> None:
    id_b = key_hash(public_bytes(KEY_B))
    async with open_tcp(tls_key=KEY_A) as a, open_tcp(tls_key=KEY_B) as b:
        a.send_nowait(b.address, b"secret", peer_id=id_b)
        with trio.fail_after(10):
            assert (await b.receive())[1] == b"secret"
        assert a.stats["connections_out"] == 1
        async with open_tcp(tls_key=KEY_A) as c:
            c.send_nowait(b.address, b"to the wrong id", peer_id=b"\x00" * 20)
            with trio.fail_after(10):
                while c.stats["tls_peer_mismatch"] == 0:
                    await trio.sleep(0.01)
            assert c.stats["connections_out"] == 0
