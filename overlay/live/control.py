"""The read-only control protocol of live nodes: status and lookup requests (tags 16–19).

Theory of operation (docs/live.md; split from :mod:`overlay.live.node`, which answers these
requests): an operator or the CLI (``flockring status`` / ``route``) sends a signed
:class:`StatusRequest` or :class:`LookupRequest` to a running node without joining the overlay. A
status request is answered at once with a :class:`StatusReply`; a lookup is routed through the
overlay to the node responsible for the key, which sends a :class:`LookupReply` straight back to the
asker. Replies are matched to their request by a random nonce; requests are datagrams, so the asker
retries a few times within its timeout (:func:`await_reply`). :class:`ControlClient` is the asking
side.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from types import TracebackType
from typing import Any

import attrs
import trio

from overlay.errors import OverlayError
from overlay.handle import NodeHandle
from overlay.identity import Identity
from overlay.ids import NodeId
from overlay.live.runtime import exit_nursery
from overlay.messages import Message, register
from overlay.wire import Wire, encode_message
from transports.auth import Signer, Verifier
from transports.base import Transport

__all__ = [
    "ControlClient",
    "CookieReply",
    "LookupReply",
    "LookupRequest",
    "Proven",
    "StatusReply",
    "StatusRequest",
    "await_reply",
]

#: tries of a control request within its timeout (datagrams may be lost)
_TRIES = 3


@register(16)
@attrs.frozen(slots=True)
class StatusRequest(Message):
    """Ask a node to describe itself (answered with :class:`StatusReply`)."""

    nonce: int


@register(17)
@attrs.frozen(slots=True)
class StatusReply(Message):
    """A node's self-description: what ``flockring status`` prints."""

    nonce: int
    handle: NodeHandle
    overlay: str
    ready: bool
    uptime_s: float
    leaf_set: tuple[NodeHandle, ...]
    routing_rows: tuple[int, ...]  # filled entries per routing-table row (Pastry)
    known: int
    stats: tuple[tuple[str, int], ...]


@register(18)
@attrs.frozen(slots=True)
class LookupRequest(Message):
    """Ask a node to route a lookup for ``key``; the responsible node answers the asker."""

    nonce: int
    key: NodeId


@register(19)
@attrs.frozen(slots=True)
class LookupReply(Message):
    """Sent by the node responsible for ``key`` straight to whoever asked."""

    nonce: int
    key: NodeId
    responsible: NodeHandle
    entry: NodeHandle


#: cookie field of a request sent before the node gave us a cookie (padding, see gate.py)
_PAD = bytes(48)


@register(5)
@attrs.frozen(slots=True)
class CookieReply(Message):
    """Answer to a control request from a source that has not proven its address: a cookie
    to echo in :class:`Proven` (no larger than the request; see :mod:`overlay.live.gate`)."""

    nonce: int
    cookie: bytes


@register(6)
@attrs.frozen(slots=True)
class Proven(Message):
    """A control request with the cookie its sender received at its address (or, before it
    has one, padding that makes the request at least as large as the cookie answer)."""

    cookie: bytes
    request: Message


async def await_reply(
    waiters: dict[int, Callable[[Message], None]],
    nonce: int,
    send: Callable[[], None],
    timeout_s: float,
) -> Message | None:
    """Register a waiter for ``nonce`` in ``waiters``, call ``send()`` up to three times within
    ``timeout_s`` (datagrams may be lost: retry) and return the first reply, or None."""
    done = trio.Event()
    out: list[Message] = []

    def waiter(reply: Message) -> None:
        out.append(reply)
        done.set()

    waiters[nonce] = waiter
    try:
        for _ in range(_TRIES):
            send()
            with trio.move_on_after(timeout_s / _TRIES):
                await done.wait()
            if out:
                return out[0]
    finally:
        waiters.pop(nonce, None)
    return None


def _from_subject(msg: Message | None, sender_hash: bytes) -> bool:
    """A status reply must be signed by the node it describes, a lookup reply by the node it
    names responsible; other replies carry no such claim."""
    if isinstance(msg, StatusReply):
        return msg.handle.id.to_bytes_be() == sender_hash
    if isinstance(msg, LookupReply):
        return msg.responsible.id.to_bytes_be() == sender_hash
    return True


class ControlClient:
    """Talks the read-only control protocol to running nodes without joining (the CLI uses it).

    ``async with ControlClient(transport) as c: await c.status(addr); await c.lookup(addr, key)``
    """

    def __init__(
        self, transport: Transport, identity: Identity | None = None, *, signing: bool = True
    ) -> None:
        self.transport = transport
        self.identity = identity if identity is not None else Identity.generate()
        self._signer = (
            Signer(self.identity.private_key)
            if signing
            else Signer(None, claimed_id=self.identity.id.to_bytes_be())
        )
        self._verifier = Verifier(require_signatures=signing, own_id=self.identity.id.to_bytes_be())
        self._wire = Wire()
        self._waiters: dict[int, Callable[[Message], None]] = {}
        self._rng = random.Random()
        #: replies that named another node than the one whose key signed them (dropped)
        self.forged_replies = 0
        #: return-routability cookies the nodes gave us, by node address
        self._cookies: dict[str, bytes] = {}
        self._nursery_cm: Any = None
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> ControlClient:
        self._nursery_cm = trio.open_nursery()
        nursery = await self._nursery_cm.__aenter__()
        self._nursery = nursery
        nursery.start_soon(self._receive_loop)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        return await exit_nursery(self._nursery_cm, exc_type, exc, tb)

    async def _receive_loop(self) -> None:
        while True:
            try:
                _, data = await self.transport.receive()
            except trio.ClosedResourceError:
                return
            opened = self._verifier.open(data)
            if opened is None:
                continue
            msg = self._wire.decode(opened.body)
            if not _from_subject(msg, opened.sender_hash):
                self.forged_replies += 1
                continue
            nonce = getattr(msg, "nonce", None)
            if msg is not None and isinstance(nonce, int):
                w = self._waiters.pop(nonce, None)
                if w is not None:
                    w(msg)

    async def _ask(self, address: str, msg: Message, nonce: int, timeout_s: float) -> Message:
        # A node answers a source it has not seen prove its address with a cookie only
        # (overlay.live.gate); the request then goes again with the cookie. Cookies are kept
        # per address for the next requests.
        deadline = trio.current_time() + timeout_s
        for _ in range(2):
            # without a cookie the request is padded, so that the node's cookie answer can be
            # no larger than it (QUIC pads its first datagram for the same reason)
            cookie = self._cookies.get(address, _PAD)
            body = encode_message(Proven(cookie, msg))

            def send(body: bytes = body) -> None:
                self.transport.send_nowait(address, self._signer.seal(self.transport.address, body))

            left = max(0.05, deadline - trio.current_time())
            reply = await await_reply(self._waiters, nonce, send, left)
            if reply is None:
                break
            if isinstance(reply, CookieReply):
                self._cookies[address] = reply.cookie
                continue
            return reply
        raise OverlayError(f"no answer from {address} within {timeout_s:g}s")

    def new_nonce(self) -> int:
        """A fresh request nonce (62 random bits)."""
        return self._rng.getrandbits(62)

    async def request(self, address: str, msg: Message, timeout_s: float = 5.0) -> Message:
        """Send a control request (any message with an int ``nonce`` field) to the node at
        ``address`` and return the first message that comes back with the same nonce.

        Retried up to three times within ``timeout_s``; :class:`OverlayError` if none came.
        """
        nonce = getattr(msg, "nonce", None)
        if not isinstance(nonce, int):
            raise OverlayError(f"{type(msg).__name__} has no int nonce field")
        return await self._ask(address, msg, nonce, timeout_s)

    async def status(self, address: str, timeout_s: float = 3.0) -> StatusReply:
        """The :class:`StatusReply` of the node at ``address``."""
        nonce = self._rng.getrandbits(62)
        r = await self._ask(address, StatusRequest(nonce), nonce, timeout_s)
        assert isinstance(r, StatusReply)
        return r

    async def lookup(self, address: str, key: NodeId, timeout_s: float = 5.0) -> LookupReply:
        """Ask the node at ``address`` to route a lookup for ``key``; who answered, and via whom."""
        nonce = self._rng.getrandbits(62)
        r = await self._ask(address, LookupRequest(nonce, key), nonce, timeout_s)
        assert isinstance(r, LookupReply)
        return r
