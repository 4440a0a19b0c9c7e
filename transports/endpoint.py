"""What every trio transport shares: the send-side admission check and receive iteration.

Theory of operation (``transports.base.Transport``): ``send_nowait`` has
datagram semantics, so a frame for a closed endpoint or over the size limit is dropped and
counted (``send_closed`` / ``send_oversized``), never raised (:meth:`EndpointMixin._admit`). The
receive side is one async iterator of ``(source address, bytes)``: ``receive()`` raises
``trio.ClosedResourceError`` once the endpoint is closed, which ``async for`` turns into the end
of the iteration. :class:`EndpointMixin` holds both for the memory, UDP and TCP transports
(slot-free, so slotted transports stay slotted). It imports trio, so the eagerly imported part
of the ``transports`` package (codec, auth, base) does not import it.
"""

from __future__ import annotations

from collections import Counter
from typing import Self

import trio

from transports.codec import MAX_FRAME_BYTES

__all__ = ["EndpointMixin"]


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
