"""Resources stay bounded whatever peers send: TCP connections and buffers, the memory
transport's inboxes, the wire's intern caches, and Pastry's proximity table under churn.

Each test measures the resource itself (sockets held, bytes queued, memory allocated, table
entries against the routing state), so it fails on a transport or cache that is bounded only in
entries, or not at all.
"""

from __future__ import annotations

import random
import tracemalloc
from collections import defaultdict

import msgpack
import trio

from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.proximity import Liveness, Proximity, ProximityConfig
from overlay.runtime import ManualRuntime
from overlay.wire import EXT_HANDLE, Wire, memo_bytes
from sim_adapter import Network
from transports import MemoryNetwork, open_tcp
from transports.address import AddressError, parse_address

FRAME = 60_000


async def _raw_connect(port: int, source_ip: str) -> trio.SocketStream:
    """A TCP connection from ``source_ip`` (another loopback address: another "host")."""
    sock = trio.socket.socket()
    await sock.bind((source_ip, 0))
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


# ------------------------------------------------------------------------------ TCP
async def test_idle_sockets_from_one_source_do_not_lock_honest_peers_out() -> None:
    """Eight idle sockets used to fill a cap of 8 and keep every honest peer out. Now one
    source holds at most ``max_per_source`` and a new connection replaces its own oldest."""
    async with open_tcp(max_connections=8, max_per_source=4) as server:
        port = parse_address(server.address)[2]
        idle = [await _raw_connect(port, "127.0.0.9") for _ in range(8)]
        delivered = 0
        with trio.fail_after(30):
            for i in range(20):
                async with open_tcp() as honest:
                    honest.send_nowait(server.address, b"honest %d" % i)
                    with trio.move_on_after(5):
                        _, data = await server.receive()
                        delivered += data == b"honest %d" % i
        assert delivered == 20
        assert server.connections[1] <= 8
        assert server.stats["inbound_evicted_source"] >= 4
        for s in idle:
            await s.aclose()


async def test_a_silent_connection_is_closed_after_the_first_frame_deadline() -> None:
    """A connection that never sends a frame holds its slot for ``connect_timeout_s``, not for
    the idle timeout (which used to be four minutes for inbound connections)."""
    async with open_tcp(connect_timeout_s=0.3, idle_timeout_s=60.0) as server:
        port = parse_address(server.address)[2]
        s = await _raw_connect(port, "127.0.0.1")
        with trio.fail_after(10):
            assert await s.receive_some(10) == b""  # the server hung up
        assert server.stats["first_frame_timeout"] == 1
        await s.aclose()


async def test_the_receive_queue_is_bounded_in_bytes() -> None:
    """100 frames of 60 kB to a node that does not read: at most ``recv_buffer_bytes`` (4 MiB by
    default) wait in user space, not 100 x 60 kB (the queue used to take 4096 frames)."""
    async with open_tcp() as server, open_tcp() as client:
        for _ in range(100):
            client.send_nowait(server.address, b"x" * FRAME)
        with trio.fail_after(20):
            while server.stats["received"] + server.stats["recv_queue_full"] < 100:
                await trio.sleep(0.02)
        queued = server._recv_recv.statistics().current_buffer_used
        assert queued * FRAME <= 4 * 1024 * 1024
        assert server.stats["recv_queue_full"] >= 100 - (4 * 1024 * 1024) // FRAME


async def test_send_queues_are_bounded_in_bytes() -> None:
    """Frames for a peer that accepts but never reads pile up in the sender: at most
    ``send_buffer_bytes`` (8 MiB), not ``queue_len`` frames per connection (256 x 60 kB)."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    async with open_tcp() as client:
        dst = f"tcp://127.0.0.1:{port}"
        for _ in range(256):
            client.send_nowait(dst, b"y" * FRAME)
        await trio.sleep(0.5)  # let the writer fill the kernel buffers
        conn = client._out[dst]
        assert conn.recv is not None
        held = conn.recv.statistics().current_buffer_used * (FRAME + 4)
        assert held <= 8 * 1024 * 1024
        assert client.stats["send_buffer_full"] > 0
    listener.close()


async def test_memory_inboxes_are_bounded_in_bytes() -> None:
    net = MemoryNetwork()
    a, b = net.endpoint(), net.endpoint()
    for _ in range(1000):
        a.send_nowait(b.address, b"z" * FRAME)
    assert len(b._inbox) * FRAME <= 16 * 1024 * 1024
    assert b.stats["inbox_full"] >= 1000 - (16 * 1024 * 1024) // FRAME
    await a.aclose()
    await b.aclose()


# ------------------------------------------------------------------------------ wire caches
def _frame_of_handles(rng: random.Random, n: int, addr_len: int) -> bytes:
    """A well-formed Heartbeat (tag 36) whose leaf list is ``n`` never-seen handles."""
    hs = []
    for _ in range(n):
        inner = msgpack.packb([rng.randbytes(20), "x" * addr_len], use_bin_type=True)
        hs.append(msgpack.ExtType(EXT_HANDLE, inner))
    return msgpack.packb([36, hs, []], use_bin_type=True)  # type: ignore[no-any-return]


def test_intern_caches_are_bounded_in_bytes() -> None:
    """Frames under 64 KiB full of fresh 300-character handles used to grow the process without
    bound (every handle kept by two intern tables of 200,000 entries each: ~250 MiB); 600
    frames of 100 handles grow it by ~80 MiB without the byte budgets."""
    import overlay.pastry.messages  # noqa: F401  (registers tag 36)

    rng = random.Random(7)
    wire = Wire()
    frames = [_frame_of_handles(rng, 100, 300) for _ in range(600)]
    assert all(len(f) < 64 * 1024 for f in frames)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for f in frames:
            assert wire.decode(f) is not None
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert wire.counters["decoded"] == 600
    assert grown < 40 * 1024 * 1024, grown  # the budgets (~32 MiB estimated) and slack
    assert memo_bytes() <= 32 * 1024 * 1024


def test_overlong_addresses_never_reach_the_parse_cache() -> None:
    long = "udp://" + "1" * 300 + ":1"
    try:
        parse_address(long)
    except AddressError as exc:
        assert "characters" in str(exc)
    else:
        raise AssertionError("an overlong address was parsed")


# ------------------------------------------------------------------------------ proximity
def test_proximity_forgets_peers_no_table_references() -> None:
    rt = ManualRuntime(seed=1)
    me = NodeHandle(NodeId(1), "me")
    prox = Proximity(rt, me, ProximityConfig(forget_unreferenced_s=600.0), lambda h: None)
    a, b, c, d = (NodeHandle(NodeId(i), f"n{i}") for i in (2, 3, 4, 5))
    for h in (a, b, c):
        prox.sample(h, 0.05)
    prox.declare_dead(d)
    assert prox.forget_unreferenced({a}) == 0  # b and c are unreferenced from now on
    rt.advance(300.0)
    prox.probe(c)  # a probe in flight keeps c
    assert prox.forget_unreferenced({a}) == 0
    rt.advance(301.0)
    assert prox.forget_unreferenced({a}) == 1  # b: unreferenced for 601 s
    assert set(prox.peers) == {a, c, d}  # the DEAD verdict expires on its own (expire_dead)
    assert prox.state(d) is Liveness.DEAD


def test_pastry_proximity_tables_track_the_routing_state_under_churn() -> None:
    """95 min of churn (10 % of 30 nodes replaced every 5 min). Observed once a minute, no node
    holds proximity state for a live peer that none of its tables has referenced for longer than
    the stated time (600 s) plus two maintenance sweeps (300 s each: one to notice, one to act)
    and the sampling step (an entry forgotten and measured again in between starts afresh)."""
    net = Network(seed=3)
    net.spawn(30, overlay="pastry", join_interval_s=2.0)
    rng = random.Random(3)
    #: (node, peer) -> (first seen unreferenced, the entry then: a re-created entry is a new
    #: measurement and starts a new period)
    first_unref: dict[tuple[int, NodeHandle], tuple[float, object]] = {}
    worst: defaultdict[str, float] = defaultdict(float)
    sizes: list[float] = []
    for minute in range(95):
        net.run(60.0)
        if minute % 5 == 4:
            live = net.live_nodes()
            gone = rng.sample(live, len(live) // 10)
            net.crash(gone)
            net.spawn(len(gone), overlay="pastry", join_interval_s=2.0)
        now = net.now
        seen: set[tuple[int, NodeHandle]] = set()
        for x in net.live_nodes():
            core = x.core
            ref = {*core.leaf.members, *core.table.entries()}  # type: ignore[attr-defined]
            for h, p in core.prox.peers.items():
                if h in ref or p.state is Liveness.DEAD or h in core.prox._probes:
                    continue
                k = (x.index, h)
                seen.add(k)
                t0, entry = first_unref.setdefault(k, (now, p))
                if entry is not p:
                    first_unref[k] = (t0, entry) = (now, p)
                worst["age"] = max(worst["age"], now - t0)
        for k in [k for k in first_unref if k not in seen]:
            del first_unref[k]
        live = net.live_nodes()
        sizes.append(sum(len(x.core.prox.peers) for x in live) / len(live))
    assert worst["age"] <= 600.0 + 2 * 300.0 + 60.0, worst
    assert max(sizes[-30:]) <= 40, sizes[-30:]
