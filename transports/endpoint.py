"""What every trio transport shares: the send-side admission check and receive iteration.

Theory of operation (``transports.base.Transport``): ``send_nowait`` has
datagram semantics, so a frame for a closed endpoint or over the size limit is dropped and
counted (``send_closed`` / ``send_oversized``), never raised (:meth:`EndpointMixin._admit`). The
receive side is one async iterator of ``(source address, bytes)``: ``receive()`` raises
``trio.ClosedResourceError`` once the endpoint is closed, which ``async for`` turns into the end
of the iteration. :class:`EndpointMixin` holds both for the memory, UDP and TCP transports
(slot-free, so slotted transports stay slotted). It imports trio, so the eagerly imported part
of the ``transports`` package (codec, auth, base) does not import it.

Queues a transport keeps in user space (the memory inbox, TCP's receive channel and send
queues) are bounded in *bytes* by a :class:`ByteBudget`, not only in frames: a count bound of
4096 frames is 256 MiB of 64 KiB frames, which a peer can fill at will.
"""

from __future__ import annotations

from collections import Counter
from typing import Self

import trio

from transports.codec import MAX_FRAME_BYTES
from transports.errors import TransportConfigError

__all__ = ["ByteBudget", "EndpointMixin"]


class ByteBudget:
    """Bytes held by one bounded queue: :meth:`take` before queueing, :meth:`give` after."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        if limit < MAX_FRAME_BYTES:
            raise TransportConfigError(
                f"a byte budget must hold at least one frame ({MAX_FRAME_BYTES} B)"
            )
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        """Reserve ``n`` bytes; False (nothing reserved) if that would exceed the limit."""
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        """Release ``n`` bytes reserved earlier."""
        self.used = max(0, self.used - n)


class EndpointMixin:
    """Mixin of the transports: ``_admit`` a frame for sending; ``async for src, data in t``."""

    __slots__ = ()

    closed: bool
    stats: Counter[str]

    def _admit(self, data: bytes, limit: int = MAX_FRAME_BYTES) -> bool:
        """True if ``data`` may be sent; otherwise count why not (closed, or over ``limit``)."""
        if self.closed:
            self.stats["send_closed"] += 1
            return False
        if len(data) > limit:
            self.stats["send_oversized"] += 1
            return False
        return True

    async def receive(self) -> tuple[str, bytes]:
        """Overridden by every transport (``transports.base.Transport.receive``)."""
        raise NotImplementedError

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> tuple[str, bytes]:
        try:
            return await self.receive()
        except trio.ClosedResourceError:
            raise StopAsyncIteration from None
