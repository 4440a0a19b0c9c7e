"""Sessions on live ``overlay.Node`` swarms (memory network in virtual time; loopback UDP; TLS).

* A swarm whose nodes handshake with every peer they hear from routes every key to the oracle's
  node, carries its traffic on session records and drops nothing.
* Records captured on the wire are refused when replayed to their receiver (same session), to
  another node, and after the session was replaced by a new one; so are pair frames (replayed,
  misdirected, re-addressed, tampered).
* Sessions that expire and rekey every few seconds under steady traffic lose no routed message
  and no lookup.
* A peer that restarts with the same identity (new process state, same address) is handshaken
  with again, and routing through it works.
* A node that stops talking lets its derived pair keys go.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

import trio
import trio.testing
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from overlay.identity import Identity
from overlay.ids import NodeId, closer
from overlay.live.node import Endpoint, Node
from overlay.testing import Swarm, open_swarm
from transports import MemoryNetwork, Transport, open_tcp, open_udp
from transports.memory import MemoryTransport
from transports.pair import PAIR
from transports.session import DATA, SessionConfig, Sessions

#: a handshake with every peer heard from, whether its frames were signed or pair frames
EAGER = SessionConfig(handshake_after_frames=1, handshake_after_pair_frames=1)
#: lifetimes of a few seconds, so a minute of traffic crosses many rekeys and expiries
SHORT = SessionConfig(
    handshake_after_frames=1,
    handshake_after_pair_frames=1,
    rekey_after_s=3.0,
    expire_after_s=6.0,
    send_margin_s=1.0,
    handshake_timeout_s=0.5,
    retry_after_s=1.0,
)
LATENCY = (0.005, 0.05)  # random per datagram: frames overtake each other
SESSION_DROPS = ("malformed", "early", "unknown_session", "expired", "replayed", "forged")


def totals(nodes: Sequence[Node], prefix: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for n in nodes:
        for k, v in n.stats.items():
            if k.startswith(prefix):
                out[k[len(prefix) :]] += v
    return out


async def route_and_check(sw: Swarm, apps: dict[NodeId, Endpoint], rounds: int, tag: str) -> None:
    """Route keys from live nodes; each arrives once, at the oracle's node, without retries."""
    live = sw.live
    for j in range(rounds):
        src = live[(j * 7) % len(live)]
        key = sw.random_key()
        want = sw.closest_live(key)
        await apps[src.id].route(key, (tag, j))
        with trio.fail_after(30):
            d = await apps[want.id].receive()
        assert d.key == key and d.payload == (tag, j), f"{tag} route {j} went astray"


async def test_a_swarm_on_sessions_routes_correctly_and_drops_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_swarm(30, seed=21, latency=LATENCY, sessions=EAGER) as sw:
        apps = {n.id: n.application("t") for n in sw.nodes}
        await route_and_check(sw, apps, 40, "a")
        for j in range(20):
            key = sw.random_key()
            assert (await sw.nodes[j].lookup(key)).id == sw.closest_live(key).id
        await sw.settle(60)
        before = totals(sw.nodes, "session.")["accepted"]
        signed_before = totals(sw.nodes, "auth.")["accepted"]
        await route_and_check(sw, apps, 40, "b")
        s, a = totals(sw.nodes, "session."), totals(sw.nodes, "auth.")
        assert s["established"] > 30 and s["held"] > 30
        # once warm, routed traffic rides on sessions, not on signatures
        assert s["accepted"] - before > 3 * (a["accepted"] - signed_before)
        assert sum(n.dropped() for n in sw.nodes) == 0
        assert not any(s[k] for k in SESSION_DROPS), s


class Tap:
    """A memory transport that also remembers every frame it sends."""

    def __init__(self, inner: MemoryTransport) -> None:
        self.inner = inner
        self.stats = inner.stats
        self.sent: list[tuple[str, bytes]] = []

    @property
    def address(self) -> str:
        return self.inner.address

    def send_nowait(self, address: str, data: bytes, peer_id: bytes | None = None) -> None:
        self.sent.append((address, data))
        self.inner.send_nowait(address, data, peer_id)

    async def receive(self) -> tuple[str, bytes]:
        return await self.inner.receive()

    async def aclose(self) -> None:
        await self.inner.aclose()


@asynccontextmanager
async def three_nodes(
    config: SessionConfig, seed: int
) -> AsyncIterator[tuple[MemoryNetwork, Tap, list[Node]]]:
    rng = random.Random(seed)
    net = MemoryNetwork(latency=LATENCY, seed=seed)
    tap = Tap(net.endpoint())
    async with AsyncExitStack() as stack:
        nodes: list[Node] = []
        for i in range(3):
            t = tap if i == 0 else net.endpoint()
            node = Node(t, identity=Identity.from_rng(rng), seed=i, sessions=config)
            await stack.enter_async_context(node)
            await node.join([nodes[0].address] if nodes else [])
            nodes.append(node)
        yield net, tap, nodes


async def exchange(a: Endpoint, b: Endpoint, node_b: Node, n: int, tag: str) -> None:
    for i in range(n):
        await a.send(node_b.handle, (tag, i))
        with trio.fail_after(5):
            d = await b.receive()
        assert d.payload == (tag, i)


async def test_replayed_records_are_refused_in_the_same_session_elsewhere_and_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cfg = SessionConfig(
        handshake_after_frames=1,
        rekey_after_s=20.0,
        expire_after_s=40.0,
        send_margin_s=5.0,
        handshake_timeout_s=2.0,
        retry_after_s=2.0,
    )
    async with three_nodes(cfg, seed=5) as (net, tap, (a, b, c)):
        ea, eb, ec = a.application("x"), b.application("x"), c.application("x")
        await exchange(ea, eb, b, 10, "warm")
        tap.sent.clear()
        await exchange(ea, eb, b, 10, "capture")
        captured = [f for addr, f in tap.sent if addr == b.address and f[0] == DATA]
        assert len(captured) >= 10  # the direct messages went as session records
        attacker = net.endpoint()

        async def replay(to: Node) -> Counter[str]:
            before = Counter(to.sessions.counters if to.sessions else {})
            for f in captured:
                attacker.send_nowait(to.address, f)
            await trio.sleep(1)
            return Counter(to.sessions.counters if to.sessions else {}) - before

        async def nothing_delivered() -> None:
            for ep in (eb, ec):
                with trio.move_on_after(1):
                    d = await ep.receive()
                    raise AssertionError(f"a replayed record was delivered: {d}")

        # 1. in the same session: every one refused by the replay window
        got = await replay(b)
        assert got["replayed"] == len(captured)
        await nothing_delivered()
        # 2. at another node: it holds no session with those indices (or the key is wrong)
        got = await replay(c)
        assert got["unknown_session"] + got["forged"] == len(captured)
        await nothing_delivered()
        # tampered: a flipped bit in the counter makes a fresh counter, which passes the window
        # and then fails the tag (a flipped bit elsewhere is refused as a replay before that)
        tampered = []
        for k, f in enumerate(captured):
            bad = bytearray(f)
            bad[5 + k % 4] ^= 0x10
            tampered.append(bytes(bad))
        before = Counter(b.sessions.counters if b.sessions else {})
        for f in tampered:
            attacker.send_nowait(b.address, f)
        await trio.sleep(1)
        got = Counter(b.sessions.counters if b.sessions else {}) - before
        assert got["forged"] == len(tampered)
        await nothing_delivered()
        # 3. after the session was replaced (rekey) and the old one expired
        est = b.stats["session.established"]
        for r in range(12):
            await exchange(ea, eb, b, 2, f"later{r}")
            await trio.sleep(5)
        assert b.stats["session.established"] >= est + 1
        got = await replay(b)
        assert got["unknown_session"] + got["expired"] + got["replayed"] == len(captured)
        await nothing_delivered()


async def test_replayed_pair_frames_are_refused_by_their_receiver_and_elsewhere(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # no sessions: traffic between members rides on pair frames once their keys are known
    cfg = SessionConfig(handshake_after_frames=10**6)
    async with three_nodes(cfg, seed=6) as (net, tap, (a, b, c)):
        ea, eb, ec = a.application("x"), b.application("x"), c.application("x")
        await exchange(ea, eb, b, 3, "warm")
        tap.sent.clear()
        await exchange(ea, eb, b, 10, "capture")
        captured = [f for addr, f in tap.sent if addr == b.address and f[0] == PAIR]
        assert len(captured) >= 10  # the direct messages went as pair frames
        assert b.stats.get("session.held", 0) == 0
        attacker = net.endpoint()

        async def replay(to: Node, frames: list[bytes]) -> Counter[str]:
            before = totals([to], "auth.")
            for f in frames:
                attacker.send_nowait(to.address, f)
            await trio.sleep(1)
            return totals([to], "auth.") - before

        async def nothing_delivered() -> None:
            for ep in (eb, ec):
                with trio.move_on_after(1):
                    d = await ep.receive()
                    raise AssertionError(f"a replayed frame was delivered: {d}")

        got = await replay(b, captured)  # to its receiver: the replay table
        assert got == Counter({"replayed": len(captured)})
        await nothing_delivered()
        got = await replay(c, captured)  # to another node: it names b
        assert got == Counter({"misdirected": len(captured)})
        # re-addressed to c: the tag was made under a's key with b
        readdressed = [f[:33] + c.id.to_bytes_be() + f[53:] for f in captured]
        got = await replay(c, readdressed)
        assert got == Counter({"forged": len(captured)})
        # a flipped bit in the sequence number passes the replay table, then fails the tag
        tampered = [f[:60] + bytes([f[60] ^ 1]) + f[61:] for f in captured]
        got = await replay(b, tampered)
        assert got == Counter({"forged": len(captured)})
        await nothing_delivered()


async def test_a_node_that_stops_talking_lets_its_pair_keys_go(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A node's derived pair keys turned over only when it used one: a node that went quiet
    # kept those of its last exchanges (~75 each after a 300-node bring-up) until its next pair
    # frame. Now each is dropped two periods after its last use, and a node holding none drops
    # its X25519 key too; what it derives again for the swarm's maintenance goes as well.
    cfg = SessionConfig(handshake_after_frames=10**6)
    async with three_nodes(cfg, seed=7) as (_, _, nodes):
        a, b, _ = nodes
        await exchange(a.application("x"), b.application("x"), b, 3, "warm")
        assert b.stats["node.pair_keys_held"] >= 1
        derived = sum(n.stats["node.pair_derivations"] for n in nodes)
        quiet = {n.address: 0 for n in nodes}
        for _ in range(240):  # two minutes, maintenance included
            await trio.sleep(0.5)
            for n in nodes:
                if n.stats.get("node.pair_keys_held", 0) == 0:
                    quiet[n.address] += 1
        # most of the time every node holds none (maintenance uses a key for a moment)
        assert all(q > 200 for q in quiet.values()), quiet
        # and the count of derivations survives the objects that made them
        assert sum(n.stats["node.pair_derivations"] for n in nodes) >= derived


async def test_sessions_expiring_mid_traffic_lose_no_lookup(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_swarm(10, seed=22, latency=LATENCY, sessions=SHORT) as sw:
        apps = {n.id: n.application("t") for n in sw.nodes}
        rng = random.Random(22)
        t_end = trio.current_time() + 60
        lookups = 0
        while trio.current_time() < t_end:
            await route_and_check(sw, apps, 2, f"r{lookups}")
            src = rng.choice(sw.nodes)
            key = sw.random_key()
            with trio.fail_after(5):
                assert (await src.lookup(key, timeout_s=4.5)).id == sw.closest_live(key).id
            lookups += 1
            await trio.sleep(0.2)
        s = totals(sw.nodes, "session.")
        assert lookups >= 100
        assert s["established"] >= 10 * 10  # every node rekeyed many times over
        assert not any(s[k] for k in SESSION_DROPS), s
        assert sum(n.dropped() for n in sw.nodes) == 0


async def test_a_restarted_peer_rehandshakes_and_routes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_swarm(12, seed=23, latency=LATENCY, sessions=EAGER) as sw:
        apps = {n.id: n.application("t") for n in sw.nodes}
        await route_and_check(sw, apps, 20, "warm")
        victim = sw.nodes[5]
        peers = [n for n in sw.nodes if n.sessions and victim.sessions]
        holders = [
            n
            for n in peers
            if n is not victim and n.sessions and n.sessions.has_session(victim.id.to_bytes_be())
        ]
        assert holders
        before = {n.id: n.stats.get("session.established", 0) for n in holders}
        ident, address = victim.identity, victim.address
        await sw.crash(victim)
        # the same identity at the same address, in a fresh process state
        reborn = Node(sw.network.endpoint(address), identity=ident, seed=99, sessions=EAGER)
        await sw._nursery.start(sw._host, reborn)
        sw.nodes[5] = reborn
        await reborn.join([sw.nodes[0].address])
        apps[reborn.id] = reborn.application("t")
        await sw.settle(30)
        await route_and_check(sw, apps, 30, "after")
        for j in range(10):
            key = sw.random_key()
            assert (await sw.nodes[j].lookup(key)).id == sw.closest_live(key).id
        assert reborn.sessions is not None and len(reborn.sessions) > 0
        again = [
            n
            for n in holders
            if n.stats.get("session.established", 0) > before[n.id]
            and n.sessions is not None
            and n.sessions.has_session(reborn.id.to_bytes_be())
        ]
        assert again, "no old peer handshook with the restarted node"


async def test_a_hello_flood_is_rate_limited_and_costs_no_message(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_swarm(6, seed=24, latency=LATENCY, sessions=EAGER) as sw:
        apps = {n.id: n.application("t") for n in sw.nodes}
        victim = sw.nodes[2]
        # HELLOs made by throwaway Sessions objects, sent from one spoofing endpoint
        frames: list[bytes] = []
        for _ in range(60):
            s = Sessions(Ed25519PrivateKey.generate(), "mem://x", lambda a, f, p: frames.append(f))
            s.consider(victim.id.to_bytes_be(), victim.address, 99, 0.0)
        attacker = sw.network.endpoint()
        before = Counter(victim.sessions.counters if victim.sessions else {})
        for _ in range(10):
            for f in frames:
                attacker.send_nowait(victim.address, f)
        await trio.sleep(1)
        assert victim.sessions is not None
        got = Counter(victim.sessions.counters) - before
        assert got["rate_limited"] >= 600 - 200 - 100  # burst 200, then 100 a second
        assert got["handshakes_answered"] <= 200 + 100 * 2
        assert len(victim.sessions._responding) <= victim.sessions.config.max_pending
        await route_and_check(sw, apps, 20, "under-flood")


@asynccontextmanager
async def live_ring(n: int, seed: int, scheme: str, tls: bool = False) -> AsyncIterator[list[Node]]:
    rng = random.Random(seed)
    nodes: list[Node] = []
    async with AsyncExitStack() as stack:
        nursery = await stack.enter_async_context(trio.open_nursery())
        try:
            for _ in range(n):
                ident = Identity.from_rng(rng)
                t: Transport
                if scheme == "udp":
                    t = await stack.enter_async_context(open_udp("udp://127.0.0.1:0"))
                else:
                    key = ident.private_key if tls else None
                    t = await stack.enter_async_context(open_tcp("tcp://127.0.0.1:0", tls_key=key))
                node = await stack.enter_async_context(
                    Node(t, "pastry", ident, seed=rng.getrandbits(32), sessions=EAGER)
                )
                await node.join([rng.choice(nodes).address] if nodes else [], timeout_s=20)
                nodes.append(node)
            yield nodes
        finally:
            nursery.cancel_scope.cancel()


def oracle(nodes: Sequence[Node], key: int) -> NodeId:
    best = nodes[0].id
    for x in nodes:
        if closer(key, x.id, best):
            best = x.id
    return best


async def check_ring(nodes: list[Node], seed: int) -> None:
    rng = random.Random(seed)
    apps = {n.id: n.application("s") for n in nodes}
    for j in range(3 * len(nodes)):
        key = NodeId.random(rng)
        await apps[nodes[j % len(nodes)].id].route(key, j)
        with trio.fail_after(10):
            d = await apps[oracle(nodes, key)].receive()
        assert (d.key, d.payload) == (key, j)
    s = totals(nodes, "session.")
    assert s["established"] > 0 and s["accepted"] > 0, s
    assert sum(n.dropped() for n in nodes) == 0


async def test_sessions_on_loopback_udp() -> None:
    with trio.fail_after(60):
        async with live_ring(10, 31, "udp") as nodes:
            await check_ring(nodes, 31)


async def test_sessions_on_tcp_with_tls() -> None:
    with trio.fail_after(60):
        async with live_ring(5, 32, "tcp", tls=True) as nodes:
            await check_ring(nodes, 32)
            assert nodes[0].stats.get("transport.tls_peer_mismatch", 0) == 0
