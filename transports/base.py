"""The Transport protocol every transport implements (memory, UDP, TCP).

Theory of operation: a transport moves opaque byte strings between addresses and knows nothing of
overlays (docs/design.md, "Floors"). Sending has *datagram semantics* so that the synchronous,
sans-io cores can emit messages from inside a callback: :meth:`Transport.send_nowait` never blocks
and never raises for network reasons — a full buffer, an unreachable peer or an oversized frame is
dropped and counted in ``stats``. Receiving is one async iterator of ``(source address, bytes)``.
Authentication (``transports/auth.py``) is applied by the layer above, on the bytes.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol, runtime_checkable

__all__ = ["Transport"]


@runtime_checkable
class Transport(Protocol):
    """What ``overlay.Node`` needs from a transport."""

    #: counters: ``sent``, ``received``, ``bytes_sent``, ``bytes_received`` and drop reasons.
    stats: Counter[str]

    @property
    def address(self) -> str:
        """This endpoint's own address (after binding: a real port even if 0 was asked)."""
        ...

    def send_nowait(self, address: str, data: bytes, peer_id: bytes | None = None) -> None:
        """Queue ``data`` for ``address``; never blocks, never raises for network reasons.

        ``peer_id`` (20 bytes, SHA-1 of the peer's public key), when known, lets a transport
        that authenticates channels (TCP with TLS) check whom it reached.
        """
        ...

    async def receive(self) -> tuple[str, bytes]:
        """Wait for the next datagram/frame; raises ``trio.ClosedResourceError`` once closed."""
        ...

    async def aclose(self) -> None:
        """Close the endpoint (idempotent)."""
        ...
