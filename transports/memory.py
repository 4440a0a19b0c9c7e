"""In-process datagram network for tests and in-memory swarms (docs/transports.md).

Theory of operation: a :class:`MemoryNetwork` is a dictionary of endpoints keyed by
``mem://N`` addresses. ``send_nowait`` applies the configured loss (a seeded
``random.Random``) and one-way latency, then pushes ``(deliver_at, seq, src, data)`` onto the
destination's inbox heap. ``receive`` pops the earliest datagram whose time has come and
otherwise sleeps with ``trio.move_on_at(deadline)`` on an event, so the only clock involved is
``trio.current_time()``: under ``trio.testing.MockClock(autojump_threshold=0)`` a swarm runs in
virtual time with no timer tasks of its own. Inboxes are bounded in datagrams *and* in bytes
(``inbox_bytes``: 100 000 datagrams of 64 KiB would be 6 GiB); overflow is dropped and counted,
like a full socket buffer. ``partition()``/``heal()`` cut and restore reachability between sets of
addresses for failure tests.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable
from types import TracebackType

import trio

from transports.codec import MAX_FRAME_BYTES
from transports.endpoint import ByteBudget, EndpointMixin
from transports.errors import TransportConfigError

__all__ = ["LatencyFn", "MemoryNetwork", "MemoryTransport"]

#: ``latency(src, dst, rng) -> one-way seconds``
LatencyFn = Callable[[str, str, random.Random], float]


def _latency_fn(latency: float | tuple[float, float] | LatencyFn | None) -> LatencyFn:
    if latency is None:
        return lambda s, d, r: 0.0
    if callable(latency):
        return latency
    if isinstance(latency, tuple):
        lo, hi = float(latency[0]), float(latency[1])
        if not 0 <= lo <= hi:
            raise TransportConfigError(f"latency range must satisfy 0 <= lo <= hi, got {latency!r}")
        return lambda s, d, r: r.uniform(lo, hi)
    v = float(latency)
    if v < 0 or not math.isfinite(v):
        raise TransportConfigError(f"latency must be a finite number >= 0, got {latency!r}")
    return lambda s, d, r: v


class MemoryNetwork:
    """A set of in-process endpoints with optional latency and loss.

    ``latency``: seconds (one way), a ``(lo, hi)`` uniform range, or a function
    ``(src, dst, rng) -> seconds``. ``loss``: probability in [0, 1) that a datagram vanishes.
    """

    def __init__(
        self,
        *,
        latency: float | tuple[float, float] | LatencyFn | None = None,
        loss: float = 0.0,
        seed: int = 0,
        inbox_limit: int = 100_000,
        inbox_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        if not 0.0 <= loss < 1.0:
            raise TransportConfigError(f"loss must be in [0, 1), got {loss!r}")
        self.latency = _latency_fn(latency)
        self.loss = loss
        self.rng = random.Random(seed)
        self.inbox_limit = inbox_limit
        if inbox_bytes < MAX_FRAME_BYTES:
            raise TransportConfigError(f"inbox_bytes must be >= {MAX_FRAME_BYTES}")
        self.inbox_bytes = inbox_bytes
        self.endpoints: dict[str, MemoryTransport] = {}
        self._names = itertools.count(1)
        self._seq = itertools.count()
        self._blocked: set[tuple[str, str]] = set()
        self.stats: Counter[str] = Counter()

    def endpoint(self, address: str | None = None) -> MemoryTransport:
        """Create (bind) an endpoint; ``address`` defaults to the next free ``mem://N``."""
        if address is None:
            address = f"mem://{next(self._names)}"
            while address in self.endpoints:
                address = f"mem://{next(self._names)}"
        if not address.startswith("mem://") or len(address) <= 6:
            raise TransportConfigError(f"not a memory address: {address!r}")
        if address in self.endpoints:
            raise TransportConfigError(f"address {address} is already bound")
        t = MemoryTransport(self, address)
        self.endpoints[address] = t
        return t

    def partition(self, side_a: Iterable[str], side_b: Iterable[str]) -> None:
        """Drop every datagram between the two address sets (both directions)."""
        b = list(side_b)
        for x in side_a:
            for y in b:
                self._blocked.add((x, y))
                self._blocked.add((y, x))

    def heal(self) -> None:
        """Remove every partition."""
        self._blocked.clear()

    def _deliver(self, src: str, dst: str, data: bytes) -> None:
        ep = self.endpoints.get(dst)
        if ep is None or ep.closed:
            self.stats["no_route"] += 1
            return
        if self._blocked and (src, dst) in self._blocked:
            self.stats["partitioned"] += 1
            return
        if self.loss and self.rng.random() < self.loss:
            self.stats["lost"] += 1
            return
        delay = self.latency(src, dst, self.rng)
        ep._push(trio.current_time() + max(0.0, delay), next(self._seq), src, data)


class MemoryTransport(EndpointMixin):
    """One endpoint of a :class:`MemoryNetwork` (implements ``transports.base.Transport``)."""

    def __init__(self, network: MemoryNetwork, address: str) -> None:
        self.network = network
        self._address = address
        self._inbox: list[tuple[float, int, str, bytes]] = []
        self._budget = ByteBudget(network.inbox_bytes)
        self._wakeup = trio.Event()
        self.closed = False
        self.stats: Counter[str] = Counter()

    @property
    def address(self) -> str:
        """This endpoint's ``mem://`` address."""
        return self._address

    @property
    def queued_bytes(self) -> int:
        """Bytes waiting in the inbox."""
        return self._budget.used

    def send_nowait(self, address: str, data: bytes, peer_id: bytes | None = None) -> None:
        """Queue ``data`` for ``address`` (unknown or full: dropped and counted)."""
        if not self._admit(data):
            return
        self.stats["sent"] += 1
        self.stats["bytes_sent"] += len(data)
        self.network._deliver(self._address, address, bytes(data))

    def _push(self, at: float, seq: int, src: str, data: bytes) -> None:
        if len(self._inbox) >= self.network.inbox_limit or not self._budget.take(len(data)):
            self.stats["inbox_full"] += 1
            return
        heapq.heappush(self._inbox, (at, seq, src, data))
        self._wakeup.set()

    async def receive(self) -> tuple[str, bytes]:
        """The next ``(source address, datagram)``."""
        while True:
            if self.closed:
                raise trio.ClosedResourceError("memory transport is closed")
            inbox = self._inbox
            if inbox and inbox[0][0] <= trio.current_time():
                _, _, src, data = heapq.heappop(inbox)
                self._budget.give(len(data))
                self.stats["received"] += 1
                self.stats["bytes_received"] += len(data)
                return src, data
            deadline = inbox[0][0] if inbox else math.inf
            self._wakeup = trio.Event()
            with trio.move_on_at(deadline):
                await self._wakeup.wait()

    async def aclose(self) -> None:
        """Leave the network; a pending ``receive`` ends."""
        if self.closed:
            return
        self.closed = True
        self._inbox.clear()
        self._budget.used = 0
        self._wakeup.set()
        if self.network.endpoints.get(self._address) is self:
            del self.network.endpoints[self._address]
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> MemoryTransport:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with trio.CancelScope(shield=True):
            await self.aclose()
