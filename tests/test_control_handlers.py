"""Control requests beyond status/lookup: a tool registers a handler on a live node and a
``ControlClient`` gets the answer by nonce; a failing handler is counted, never fatal."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
import trio

from overlay.errors import OverlayError
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.live.control import ControlClient, LookupReply, Proven, StatusRequest
from overlay.live.node import Node
from overlay.messages import Message, register
from transports import open_udp


@register(221)
@attrs.frozen(slots=True)
class EchoRequest(Message):
    nonce: int
    text: str


@register(222)
@attrs.frozen(slots=True)
class EchoReply(Message):
    nonce: int
    text: str
    answered_by: NodeHandle


async def test_handler_answers_now_and_later_and_failures_are_counted() -> None:
    async with open_udp("udp://127.0.0.1:0") as t, Node(t, "pastry", seed=1) as node:
        await node.join([])
        later: list[Callable[[], None]] = []

        def echo(src: NodeHandle, msg: Message, reply: Callable[[Message], None]) -> None:
            assert isinstance(msg, EchoRequest)
            if msg.text == "boom":
                raise RuntimeError("handler bug")
            answer = EchoReply(msg.nonce, msg.text.upper(), node.handle)
            if msg.text == "later":  # answered from a timer, as a discovery query would
                later.append(lambda: reply(answer))
                node.core.runtime.call_later(0.05, later[-1])
            else:
                reply(answer)

        node.add_control_handler(EchoRequest, echo)
        with pytest.raises(OverlayError):
            node.add_control_handler(EchoRequest, echo)
        with pytest.raises(OverlayError):
            node.add_control_handler(StatusRequest, echo)
        async with open_udp("udp://127.0.0.1:0") as ct, ControlClient(ct) as client:
            r = await client.request(node.address, EchoRequest(client.new_nonce(), "hi"))
            assert isinstance(r, EchoReply) and r.text == "HI" and r.answered_by == node.handle
            r = await client.request(node.address, EchoRequest(client.new_nonce(), "later"))
            assert isinstance(r, EchoReply) and r.text == "LATER"
            with pytest.raises(OverlayError):
                await client.request(node.address, EchoRequest(client.new_nonce(), "boom"), 0.6)
            assert node.stats["node.control_errors"] == 3  # one per retry of the failing request
            # the node still serves after the failures
            st = await client.status(node.address)
            assert st.handle == node.handle
        await trio.sleep(0)


async def test_lookup_reply_only_from_the_node_it_names() -> None:
    """A LookupReply that names another node than its signer is dropped and counted: an echo of
    the nonce must not redirect a lookup."""
    async with (
        open_udp("udp://127.0.0.1:0") as ta,
        open_udp("udp://127.0.0.1:0") as tb,
        Node(ta, "pastry", seed=1) as a,
        Node(tb, "pastry", seed=2) as b,
    ):
        await a.join([])
        await b.join([a.address])
        got: list[Message] = []
        a._ctl_waiters[4242] = got.append  # a lookup of ours waiting for nonce 4242
        fake = NodeHandle(NodeId(12345), "udp://127.0.0.1:9")
        b.send_message(a.address, LookupReply(4242, NodeId(1), fake, b.handle), a.id)
        b.send_message(a.address, LookupReply(4242, NodeId(1), b.handle, b.handle), a.id)
        with trio.fail_after(5):
            while not got:
                await trio.sleep(0.01)
        assert a.stats["node.lookup_reply_forged"] == 1
        assert isinstance(got[0], LookupReply) and got[0].responsible == b.handle


async def test_no_amplification_towards_an_unproven_source() -> None:
    """A signed StatusRequest from a self-made key gets only a cookie, no larger than the
    request; the full answer needs the cookie echoed from the same address. Requests beyond
    the per-source rate are dropped and counted."""
    from overlay.identity import Identity
    from overlay.wire import encode_message
    from transports.auth import Signer

    async with open_udp("udp://127.0.0.1:0") as t, Node(t, "pastry", seed=1) as node:
        await node.join([])
        for _ in range(50):  # let the node's own stats fill, as an attacker would wait for
            await trio.sleep(0)
        async with open_udp("udp://127.0.0.1:0") as raw:
            signer = Signer(Identity.generate().private_key)
            bare = signer.seal(raw.address, encode_message(StatusRequest(77)))
            raw.send_nowait(node.address, bare)  # too small to answer even with a cookie
            padded = signer.seal(raw.address, encode_message(Proven(bytes(48), StatusRequest(7))))
            raw.send_nowait(node.address, padded)
            with trio.fail_after(5):
                _, answer = await raw.receive()
            assert len(answer) <= len(padded)
            assert node.stats["node.control_unpadded"] == 1
            assert node.stats["node.control_cookies_sent"] == 1
            for _ in range(200):  # a flood from one source
                raw.send_nowait(
                    node.address, signer.seal(raw.address, encode_message(StatusRequest(78)))
                )
            # the node reads the flood at its own pace (slower on a loaded machine): wait for it
            with trio.move_on_after(10):
                while node.stats.get("node.control_rate_limited", 0) <= 100:
                    await trio.sleep(0.05)
            assert node.stats["node.control_rate_limited"] > 100
        async with open_udp("udp://127.0.0.1:0") as ct, ControlClient(ct) as client:
            st = await client.status(node.address)  # the client echoes the cookie by itself
            assert st.handle == node.handle
