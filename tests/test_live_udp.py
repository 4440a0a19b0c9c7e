"""30 Pastry nodes on loopback UDP in one process (real sockets, real clock, port 0).

Every route must reach the node the brute-force oracle picks; garbage datagrams fired at a live
node's port are dropped and counted and do not stop it routing. A small TCP + TLS 1.3 ring runs
the same checks over the stream transport.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import trio

from overlay.identity import Identity
from overlay.ids import NodeId, closer
from overlay.live.node import Node
from transports import open_tcp, open_udp

Ring = list[Node]


@asynccontextmanager
async def live_ring(
    n: int, seed: int, scheme: str = "udp", tls: bool = False
) -> AsyncIterator[Ring]:
    rng = random.Random(seed)
    nodes: Ring = []
    async with AsyncExitStack() as stack:
        nursery = await stack.enter_async_context(trio.open_nursery())
        try:
            for _ in range(n):
                ident = Identity.from_rng(rng)
                if scheme == "udp":
                    t = await stack.enter_async_context(open_udp("udp://127.0.0.1:0"))
                else:
                    key = ident.private_key if tls else None
                    t = await stack.enter_async_context(open_tcp("tcp://127.0.0.1:0", tls_key=key))
                node = await stack.enter_async_context(
                    Node(t, "pastry", ident, seed=rng.getrandbits(32))
                )
                seeds = [rng.choice(nodes).address] if nodes else []
                await node.join(seeds, timeout_s=20)
                nodes.append(node)
            yield nodes
        finally:
            nursery.cancel_scope.cancel()


def oracle(nodes: Ring, key: int) -> NodeId:
    best = nodes[0].id
    for x in nodes:
        if closer(key, x.id, best):
            best = x.id
    return best


async def check_routes(nodes: Ring, rng: random.Random, count: int) -> None:
    name = f"t{rng.random()}"
    apps = {n.id: n.application(name) for n in nodes}
    for j in range(count):
        src = nodes[j % len(nodes)]
        key = NodeId.random(rng)
        await apps[src.id].route(key, j)
        with trio.fail_after(10):
            d = await apps[oracle(nodes, key)].receive()
        assert (d.key, d.payload) == (key, j)
    for a in apps.values():
        a.close()


async def test_thirty_nodes_on_loopback_udp_route_correctly() -> None:
    rng = random.Random(11)
    with trio.fail_after(60):
        async with live_ring(30, seed=11) as nodes:
            assert all(n.ready for n in nodes)
            await check_routes(nodes, rng, 60)
            for j in range(30):  # lookups through the built-in lookup application too
                key = NodeId.random(rng)
                assert (await nodes[j].lookup(key)).id == oracle(nodes, key)
            assert 0 < await nodes[0].probe(nodes[1].handle) < 1.0

            # garbage at a live node's port: dropped, counted, routing unaffected
            victim = nodes[3]
            async with open_udp("udp://127.0.0.1:0") as junk:
                for i in range(300):
                    junk.send_nowait(victim.address, rng.randbytes(rng.randrange(1, 1500)))
                    if i % 20 == 19:
                        await trio.sleep(0.01)  # stay within the socket's receive buffer
                junk.send_nowait(victim.address, b"\x98\x01" + b"\xc0" * 7)  # valid shape, unsigned
                await trio.sleep(0.3)
            assert victim.dropped() >= 300, dict(victim.stats)
            await check_routes(nodes, rng, 30)


async def test_tls_tcp_ring_routes_correctly() -> None:
    rng = random.Random(12)
    with trio.fail_after(60):
        async with live_ring(6, seed=12, scheme="tcp", tls=True) as nodes:
            await check_routes(nodes, rng, 12)
            assert nodes[0].transport.stats["connections_out"] >= 1
            assert nodes[0].stats.get("transport.tls_peer_mismatch", 0) == 0
