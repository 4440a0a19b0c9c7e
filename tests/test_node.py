"""The trio facade ``overlay.Node`` over the memory transport, in virtual time (autojump_clock).

50-node Pastry swarms: join, route (checked against the brute-force oracle), clean leave, crash of
10 nodes with repair, probe; API misuse raises clear ``OverlayError``s; junk never stops a node.
"""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from overlay.errors import (
    ConfigError,
    DuplicateApplicationError,
    JoinError,
    NotReadyError,
    OverlayError,
)
from overlay.identity import Identity
from overlay.ids import NodeId
from overlay.live.node import LIVE_NETWORK_RTO_SAMPLES, Endpoint, Node, ProbeError
from overlay.pastry import PastryConfig
from overlay.testing import Swarm, open_swarm
from transports import MemoryNetwork
from transports.auth import Signer

LATENCY = (0.005, 0.05)


async def route_and_check(sw: Swarm, apps: dict[NodeId, Endpoint], rounds: int, tag: str) -> None:
    """Route ``rounds`` random keys from random live nodes; each lands on the oracle node."""
    live = sw.live
    for j in range(rounds):
        src = live[(j * 7) % len(live)]
        key = sw.random_key()
        want = sw.closest_live(key)
        await apps[src.id].route(key, (tag, j))
        with trio.fail_after(60):
            d = await apps[want.id].receive()
        assert d.key == key and d.payload == (tag, j), f"{tag} route {j} went astray"


async def test_swarm_joins_routes_and_probes(autojump_clock: trio.testing.MockClock) -> None:
    async with open_swarm(50, overlay="pastry", seed=1, latency=LATENCY) as sw:
        assert all(n.ready for n in sw.nodes)
        assert len({n.id for n in sw.nodes}) == 50
        apps = {n.id: n.application("test") for n in sw.nodes}
        await route_and_check(sw, apps, 60, "a")
        n0 = sw.nodes[0]
        assert n0.leaf_set and n0.routing_table and n0.routing_table[0]
        assert all(isinstance(h.address, str) for row in n0.routing_table for h in row)
        assert n0.stats["auth.accepted"] > 0 and n0.dropped() == 0
        rtt = await n0.probe(sw.nodes[1].handle)
        assert 2 * LATENCY[0] <= rtt <= 2 * LATENCY[1]
        # the lookup helper agrees with the oracle as well
        for j in range(10):
            key = sw.random_key()
            assert (await sw.nodes[j].lookup(key)).id == sw.closest_live(key).id
        # nodes given no config share one default (frozen) config object: the overlay's own,
        # with a live node's scaling of a never-measured peer's RTO
        cores = [n.running_core for n in sw.nodes]
        assert all(c is not None and c.config is cores[0].config for c in cores)  # type: ignore[union-attr,attr-defined]
        base = PastryConfig()
        live = attrs.evolve(
            base,
            proximity=attrs.evolve(base.proximity, network_rto_samples=LIVE_NETWORK_RTO_SAMPLES),
        )
        assert cores[0].config == live  # type: ignore[union-attr]


async def test_leave_and_crash_are_repaired(autojump_clock: trio.testing.MockClock) -> None:
    async with open_swarm(50, overlay="pastry", seed=2, latency=LATENCY) as sw:
        apps = {n.id: n.application("test") for n in sw.nodes}
        for n in sw.nodes[:3]:
            await sw.leave(n)
        await trio.sleep(5)
        await route_and_check(sw, apps, 20, "after-leave")
        for n in sw.nodes[3:13]:
            await sw.crash(n)
        assert len(sw.live) == 37
        await trio.sleep(90)  # lease (30 s) + probes + repair, in virtual time
        await route_and_check(sw, apps, 50, "after-crash")
        with pytest.raises(ProbeError):
            await sw.live[0].probe(sw.nodes[5].handle)


async def test_api_misuse_raises_clear_errors(autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(latency=0.01)
    with pytest.raises(ConfigError, match="unknown overlay"):
        Node(net.endpoint(), overlay="chord")
    node = Node(net.endpoint(), identity=Identity.from_seed(b"\x01" * 32))
    with pytest.raises(NotReadyError):
        node.application("x")
    async with node:
        app = node.application("x")
        with pytest.raises(DuplicateApplicationError):
            node.application("x")
        with pytest.raises(NotReadyError, match="join"):
            await app.route(NodeId(1), "too early")
        with pytest.raises(ConfigError, match="bad seed"):
            await node.join(["udp://127.0.0.1:9"])
        with pytest.raises(JoinError) as ei:
            await node.join(["mem://nobody"], timeout_s=20)
        assert ei.value.tried == ("mem://nobody",)
    # an exception raised inside `async with node` comes out unwrapped
    with pytest.raises(JoinError):
        async with Node(net.endpoint()) as other:
            await other.join(["mem://nobody"], timeout_s=5)


async def test_junk_and_unsigned_traffic_is_dropped(autojump_clock: trio.testing.MockClock) -> None:
    async with open_swarm(8, overlay="pastry", seed=3, latency=LATENCY) as sw:
        victim = sw.nodes[0]
        attacker = sw.network.endpoint()
        body_signer = Signer(None, claimed_id=sw.nodes[1].id.to_bytes_be())
        for i in range(200):
            attacker.send_nowait(victim.address, bytes([i]) * (i + 1))
        attacker.send_nowait(victim.address, body_signer.seal(attacker.address, b"\x91\x02"))
        await trio.sleep(1)
        s = victim.stats
        assert s["auth.malformed"] + s.get("auth.bad_version", 0) >= 190
        assert s["auth.unsigned"] == 1
        apps = {n.id: n.application("t") for n in sw.nodes}
        await route_and_check(sw, apps, 10, "after-junk")


async def test_unsigned_swarm_works_and_cannot_join_a_signed_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_swarm(10, overlay="pastry", seed=4, latency=LATENCY, signing=False) as sw:
        apps = {n.id: n.application("t") for n in sw.nodes}
        await route_and_check(sw, apps, 10, "unsigned")
        assert sw.nodes[0].stats["auth.accepted"] > 0
    net = MemoryNetwork(latency=0.01)
    async with Node(net.endpoint()) as signed:
        await signed.join([])
        async with Node(net.endpoint(), signing=False) as lax:
            with pytest.raises(JoinError):
                await lax.join([signed.address], timeout_s=10)
        assert signed.stats["auth.unsigned"] > 0


async def test_swarm_smallworld_if_available(autojump_clock: trio.testing.MockClock) -> None:
    try:
        import overlay.smallworld.core  # noqa: F401
    except ImportError:
        pytest.skip("the small-world core is not in this checkout yet")
    async with open_swarm(20, overlay="smallworld", seed=5, latency=LATENCY) as sw:
        apps = {n.id: n.application("t") for n in sw.nodes}
        await trio.sleep(30)
        await route_and_check(sw, apps, 20, "sw")


def test_errors_are_overlay_errors() -> None:
    assert issubclass(ProbeError, OverlayError)
