"""Addresses on real hosts: a node never advertises a wildcard, answers control requests where
they came from, and a small-world join with no acknowledged link fails.

A socket bound to ``0.0.0.0`` listens everywhere but has no address anyone can send to; a node
that put ``udp://0.0.0.0:P`` into its handles used to end up alone while saying "ready". Here:
the node refuses to start without an address to advertise; with one, every handle peers hold
carries it; a TCP control request is answered over its own connection, never by dialling the
address the client claims. The two-host versions of these tests are in ``test_netns.py``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from overlay.errors import OverlayError
from overlay.identity import Identity
from overlay.ids import NodeId, closer
from overlay.live.control import ControlClient
from overlay.live.node import Node, iter_handles
from overlay.smallworld.messages import LinkAck
from sim_adapter import Network
from transports import open_tcp, open_udp
from transports.address import (
    AddressError,
    WildcardAddressError,
    advertised_address,
    is_wildcard,
)

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ what a node advertises
def test_advertised_address_rules() -> None:
    assert is_wildcard("udp://0.0.0.0:9000") and is_wildcard("tcp://[::]:1")
    assert not is_wildcard("udp://127.0.0.1:9000") and not is_wildcard("mem://3")
    with pytest.raises(WildcardAddressError, match="--advertise"):
        advertised_address("udp://0.0.0.0:9000")
    with pytest.raises(WildcardAddressError):
        advertised_address("tcp://[::]:9000")
    assert advertised_address("udp://127.0.0.1:5") == "udp://127.0.0.1:5"
    assert advertised_address("udp://0.0.0.0:9000", "10.1.2.3") == "udp://10.1.2.3:9000"
    assert advertised_address("udp://0.0.0.0:9000", "udp://10.1.2.3:0") == "udp://10.1.2.3:9000"
    assert advertised_address("tcp://[::]:7", "tcp://[fd00::1]:8") == "tcp://[fd00::1]:8"
    assert advertised_address("tcp://[::]:7", "fd00::1") == "tcp://[fd00::1]:7"
    with pytest.raises(WildcardAddressError):
        advertised_address("udp://0.0.0.0:9000", "0.0.0.0")
    with pytest.raises(AddressError):
        advertised_address("udp://0.0.0.0:9000", "tcp://10.1.2.3:1")
    with pytest.raises(AddressError):
        advertised_address("udp://0.0.0.0:9000", "not-an-ip")
    assert issubclass(WildcardAddressError, OverlayError)


def _open(scheme: str, bind: str, advertise: str | None = None) -> AbstractAsyncContextManager[Any]:
    if scheme == "udp":
        return open_udp(f"udp://{bind}:0", advertise=advertise)
    return open_tcp(f"tcp://{bind}:0", advertise=advertise)


@pytest.mark.parametrize("scheme", ["udp", "tcp"])
async def test_a_node_bound_to_a_wildcard_refuses_to_start(scheme: str) -> None:
    async with _open(scheme, "0.0.0.0") as t:
        with pytest.raises(WildcardAddressError, match="advertise"):
            Node(t, "pastry")
        node = Node(t, "pastry", advertise="127.0.0.1")
        assert node.address == t.address.replace("0.0.0.0", "127.0.0.1")
        assert node.handle.address == node.address
    async with _open(scheme, "0.0.0.0", advertise="127.0.0.1") as t:
        port = t.bound_address.rpartition(":")[2]
        assert t.bound_address == f"{scheme}://0.0.0.0:{port}"
        assert t.address == f"{scheme}://127.0.0.1:{port}" == Node(t, "pastry").address


@asynccontextmanager
async def wildcard_ring(overlay: str, scheme: str, n: int) -> AsyncIterator[list[Node]]:
    """``n`` nodes bound to 0.0.0.0, advertising 127.0.0.1, joined into one ring."""
    nodes: list[Node] = []
    async with AsyncExitStack() as stack:
        for i in range(n):
            t = await stack.enter_async_context(_open(scheme, "0.0.0.0"))
            ident = Identity.from_rng(random.Random(100 + i))
            node = await stack.enter_async_context(
                Node(t, overlay, ident, seed=i, advertise="127.0.0.1")
            )
            await node.join([nodes[0].address] if nodes else [], timeout_s=20)
            nodes.append(node)
        yield nodes


@pytest.mark.parametrize("scheme", ["udp", "tcp"])
@pytest.mark.parametrize("overlay", ["pastry", "smallworld"])
async def test_wildcard_listeners_advertise_a_reachable_address(overlay: str, scheme: str) -> None:
    with trio.fail_after(40):
        async with wildcard_ring(overlay, scheme, 4) as nodes:
            await trio.sleep(0.5)  # let the last joiner's announcements land
            addresses = {n.address for n in nodes}
            assert all(a.startswith(f"{scheme}://127.0.0.1:") for a in addresses)
            for n in nodes:
                held = [*n.leaf_set, *iter_handles(n.routing_table)]
                assert held, f"{n} holds nobody"
                assert {h.address for h in held} <= addresses, held
                assert {h.address: h.id for h in held}.items() <= {
                    m.address: m.id for m in nodes
                }.items()
            rng = random.Random(3)
            for j in range(8):
                key = NodeId.random(rng)
                want = nodes[0].id
                for m in nodes:
                    if closer(key, m.id, want):
                        want = m.id
                assert (await nodes[j % 4].lookup(key)).id == want


def test_cli_refuses_a_wildcard_without_advertise() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "flockring", "node", "--listen", "udp://0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert r.returncode != 0
    assert "--advertise" in r.stderr and "0.0.0.0" in r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------ control answers' way back
@pytest.mark.parametrize("scheme", ["udp", "tcp"])
async def test_control_answers_go_where_the_request_came_from(scheme: str) -> None:
    """The client claims a reply address nobody listens on (port 1), as a client bound to
    0.0.0.0 on another host does in effect. Status and a routed lookup still come back: on UDP
    to the datagram's source, on TCP over the request's own connection; a lookup answered by
    another node is relayed by the entry node, signed by the responsible node itself."""
    with trio.fail_after(40):
        async with wildcard_ring("pastry", scheme, 3) as nodes:
            async with (
                _open(scheme, "127.0.0.1", advertise=f"{scheme}://127.0.0.1:1") as ct,
                ControlClient(ct) as client,
            ):
                assert ct.address == f"{scheme}://127.0.0.1:1"
                st = await client.status(nodes[0].address)
                assert st.handle == nodes[0].handle and len(st.leaf_set) == 2
                rng = random.Random(5)
                answered_by_other = 0
                for j in range(8):
                    key = NodeId.random(rng)
                    want = nodes[0].id
                    for m in nodes:
                        if closer(key, m.id, want):
                            want = m.id
                    entry = nodes[j % 3]
                    r = await client.lookup(entry.address, key)
                    assert r.responsible.id == want and r.entry == entry.handle
                    answered_by_other += want != entry.id
                assert answered_by_other > 0  # the relay through the entry was exercised
                assert client.forged_replies == 0
            relayed = sum(n.stats.get("node.lookups_relayed", 0) for n in nodes)
            assert relayed >= 8


# ------------------------------------------------------------------ small-world joins
def _silent_link_acks(net: Network, victim: int) -> None:
    """Drop every LinkAck addressed to node ``victim`` (its candidates cannot reach it)."""
    orig = net._send

    def spy(src: int, dst: object, msg: object) -> None:
        if isinstance(msg, LinkAck) and dst == victim:
            return
        orig(src, dst, msg)  # type: ignore[arg-type]

    net._send = spy  # type: ignore[method-assign]


def test_a_smallworld_join_with_no_acknowledged_link_fails() -> None:
    net = Network(seed=3, fidelity=True)
    nodes = net.spawn(30, overlay="smallworld", build="oracle")
    net.run(10.0)
    joiner = net._new_node("smallworld", None, None)
    _silent_link_acks(net, joiner.index)
    done: list[bool] = []
    joiner.core.start()
    joiner.core.join([nodes[0].index], done.append)
    net.run(300.0)
    assert done == [False]
    assert not joiner.core.ready
    st = joiner.core.stats
    cfg = joiner.core.config  # type: ignore[attr-defined]
    assert st["join_no_link"] == cfg.join_retries + 1  # every attempt linked nobody
    assert st["joined"] == 0


def test_a_smallworld_join_with_some_links_succeeds() -> None:
    """One candidate acknowledging is enough (the silent ones are suspected and replaced)."""
    net = Network(seed=4, fidelity=True)
    nodes = net.spawn(30, overlay="smallworld", build="oracle")
    net.run(10.0)
    joiner = net._new_node("smallworld", None, None)
    orig = net._send
    acked: list[int] = []

    def spy(src: int, dst: object, msg: object) -> None:
        if isinstance(msg, LinkAck) and dst == joiner.index:
            if acked:
                return
            acked.append(src)
        orig(src, dst, msg)  # type: ignore[arg-type]

    net._send = spy  # type: ignore[method-assign]
    done: list[bool] = []
    joiner.core.start()
    joiner.core.join([nodes[0].index], done.append)
    net.run(60.0)
    assert done == [True] and joiner.core.ready
    assert joiner.core.stats["join_no_link"] == 0


def test_fidelity_network_does_not_count_a_failed_join_as_live() -> None:
    """Through ``Network.spawn``: the join that links nobody fails, the node is not live and
    the oracle does not expect it to own keys; lookups stay oracle-correct."""
    net = Network(seed=5, fidelity=True)
    nodes = net.spawn(20, overlay="smallworld", build="oracle")
    net.run(10.0)
    _silent_link_acks(net, len(net.nodes))  # the next node's index
    (late,) = net.spawn(1, overlay="smallworld", join_timeout_s=300.0)
    assert not late.alive and not late.core.ready
    assert net.fidelity is not None and net.fidelity.stats["failed_joins"] == 1
    rng = random.Random(1)
    keys = [NodeId((int(late.id) + d) % (1 << 160)) for d in (0, 1, -1)]
    keys += [NodeId.random(rng) for _ in range(20)]
    res = net.lookup_many([(nodes[i % 20], k) for i, k in enumerate(keys)])
    assert [r.result for r in res] == [net.closest_live(int(k)) for k in keys]
    assert all(r.result != late.id for r in res)
