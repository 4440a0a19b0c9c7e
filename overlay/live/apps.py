"""Application endpoints of ``overlay.Node``: the trio side of the KBR application upcalls.

Theory of operation (docs/live.md; split from :mod:`overlay.live.node`, which uses it): a core
calls its applications synchronously (``deliver`` / ``forward`` / ``update``). An
:class:`Endpoint` turns ``deliver`` into an async iterator of :class:`Delivery` through a bounded
trio memory channel (full: dropped and counted, never blocking the core) and offers ``route`` /
``send`` as awaitables. :class:`LookupApp` is the built-in application behind the control
protocol's lookups (``overlay.live.control``): the node responsible for a key answers the asker
(or, for a control client's lookup, the entry node that relays to the client).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.live.control import LookupReply

if TYPE_CHECKING:
    from overlay.live.host import NodeHost

__all__ = ["LOOKUP_APP", "Delivery", "Endpoint", "LookupApp"]

#: the name the built-in lookup application is registered under on every live node.
LOOKUP_APP = "flockring.lookup"


@attrs.frozen(slots=True)
class Delivery:
    """One payload delivered to an application endpoint."""

    key: NodeId
    payload: Any
    src: NodeHandle


class Endpoint:
    """A named application on a node: ``await route(key, payload)``; ``async for d in endpoint``.

    Deliveries queue up to ``buffer`` items; beyond that they are dropped and counted
    (``stats["app_queue_full"]``) — the core's callbacks never block.
    """

    def __init__(
        self,
        node: NodeHost,
        name: str,
        buffer: int,
        forward: Callable[[NodeId, Any, NodeHandle], NodeHandle | None] | None,
        update: Callable[[NodeHandle, bool], None] | None,
    ) -> None:
        self.node = node
        self.name = name
        self._forward = forward
        self._update = update
        self._send, self._recv = trio.open_memory_channel[Delivery](buffer)

    # upcalls from the core (Application protocol)
    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        """Queue the delivery for ``async for`` readers (a full queue drops and counts it)."""
        try:
            self._send.send_nowait(Delivery(key, payload, src))
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            self.node.counters["app_queue_full"] += 1

    def forward(self, key: NodeId, payload: Any, next_hop: NodeHandle) -> NodeHandle | None:
        """The application's forward hook, or pass the message on unchanged."""
        if self._forward is None:
            return next_hop
        return self._forward(key, payload, next_hop)

    def update(self, handle: NodeHandle, joined: bool) -> None:
        """The application's neighbour-change hook, if it gave one."""
        if self._update is not None:
            self._update(handle, joined)

    # the async side
    async def route(self, key: NodeId, payload: Any, hint: NodeHandle | None = None) -> None:
        """Route ``payload`` to the node responsible for ``key`` (datagram semantics)."""
        core = self.node.require_ready()
        core.route(key, self.name, payload, hint)
        await trio.lowlevel.checkpoint()

    async def send(self, handle: NodeHandle, payload: Any) -> None:
        """Send ``payload`` straight to one node's endpoint of the same name (no routing)."""
        core = self.node.require_core()
        core.send_direct(handle, self.name, payload)
        await trio.lowlevel.checkpoint()

    async def receive(self) -> Delivery:
        """The next delivery (waits)."""
        return await self._recv.receive()

    def __aiter__(self) -> Endpoint:
        return self

    async def __anext__(self) -> Delivery:
        try:
            return await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Unregister; a pending ``async for`` ends."""
        core = self.node.running_core
        if core is not None and core.apps.get(self.name) is self:
            core.unregister(self.name)
        self._send.close()


class LookupApp:
    """Built-in application answering ``LookupRequest``s on the responsible node."""

    #: the asker waits for the answer and tries again (``Node.lookup``): no custody copies or
    #: notices on the way (``overlay/kbr_custody.py``)
    end_to_end = True

    def __init__(self, node: NodeHost) -> None:
        self.node = node

    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        """Answer a lookup that reached the responsible node: reply to the asker."""
        if (
            not isinstance(payload, tuple)
            or len(payload) != 3
            or type(payload[0]) is not int
            or not isinstance(payload[1], NodeHandle)
            or not isinstance(payload[2], NodeHandle)
        ):
            self.node.counters["bad_lookup"] += 1
            return
        nonce, asker, entry = payload
        node = self.node
        reply = LookupReply(nonce, key, node.handle, entry)
        if asker.id != entry.id and asker.address == entry.address:
            # a control client's lookup, relayed by the entry node (overlay.live.node): the
            # entry forwards our signed answer as it is, so it is bound to no receiver
            if entry.id == node.id:
                node.relay_reply(reply)
            else:
                node.send_unbound(entry.address, reply, entry.id)
        elif asker.id == node.id:
            node.deliver_reply(reply)
        else:
            node.send_message(asker.address, reply, asker.id)

    def forward(self, key: NodeId, payload: Any, next_hop: NodeHandle) -> NodeHandle | None:
        """Lookups are routed unchanged."""
        return next_hop

    def update(self, handle: NodeHandle, joined: bool) -> None:
        """Neighbour changes do not concern lookups."""
        return None
