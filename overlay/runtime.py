"""The Runtime protocol: the only way a protocol core reaches the world.

Theory of operation (docs/design.md, "The sans-io rule"): cores are plain synchronous objects (like
h11 / aioquic). They read the clock with ``now()``, schedule work with ``call_later()``, emit
datagrams with ``send()`` and draw randomness from ``rng`` (a seeded ``random.Random``). Incoming
datagrams enter through ``core.receive(src, msg)``. Two drivers implement this: the trio
``overlay.Node`` (real clock) and the discrete-event simulator (virtual clock).
:class:`ManualRuntime` below is a third, tiny one for synchronous unit tests: explicit time, every
sent message recorded.

``send`` has datagram semantics: it never blocks, never raises for network reasons, and the
message may be lost. ``send_address`` exists only for bootstrap, when the joiner knows a seed's
address but not yet its id.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from typing import Protocol

from overlay.handle import Address, NodeHandle
from overlay.messages import Message


class Timer(Protocol):
    """A scheduled callback; ``cancel()`` is idempotent and safe after it fired."""

    def cancel(self) -> None:
        """Stop the callback from running; a no-op once fired or cancelled."""


class Runtime(Protocol):
    """What a core may use: a clock, timers, a datagram send and a seeded generator.

    Optional: ``timing_noise_s``, how much of an RTT the driver measures may be time spent
    waiting in event loops (a live node measures it; cores read it with ``getattr(..., 0.0)``).
    """

    @property
    def rng(self) -> random.Random:
        """The seeded generator every random choice of the core draws from."""

    def now(self) -> float:
        """Current time in seconds (virtual under the simulator, monotonic on a live node)."""

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        """Run ``fn`` once, ``delay_s`` seconds from now; the returned Timer cancels it."""

    def send(self, dst: NodeHandle, msg: Message) -> None:
        """Send ``msg`` to ``dst`` as a datagram: never blocks, never raises, may be lost."""

    def send_address(self, address: Address, msg: Message) -> None:
        """Send ``msg`` to a bare address (bootstrap only, before the peer's id is known)."""


class ManualTimer:
    """A Timer as a plain record: ``fn`` to run, ``cancelled`` once cancelled (the test pumps
    of :class:`ManualRuntime` and of the overlays' unit tests fire it themselves)."""

    __slots__ = ("cancelled", "fn")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        """Mark the timer cancelled; :meth:`ManualRuntime.advance` then skips it."""
        self.cancelled = True


class ManualRuntime:
    """A synchronous Runtime for unit tests: time moves only when the test says so.

    Sent messages are appended to ``sent`` as ``(dst, msg)`` (``dst`` is a NodeHandle or, for
    ``send_address``, the bare address); the test delivers them by hand.
    """

    #: the manual clock measures no waiting (see ``TrioRuntime.timing_noise_s``)
    timing_noise_s = 0.0

    def __init__(self, seed: int = 0, start_s: float = 0.0) -> None:
        self._now = start_s
        self._heap: list[tuple[float, int, ManualTimer]] = []
        self._seq = itertools.count()
        self._rng = random.Random(seed)
        self.sent: list[tuple[NodeHandle | Address, Message]] = []

    @property
    def rng(self) -> random.Random:
        """The generator seeded at construction."""
        return self._rng

    def now(self) -> float:
        """The manual clock: moves only in :meth:`advance`."""
        return self._now

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        """Queue ``fn`` at ``now() + max(0, delay_s)``; it fires during a later :meth:`advance`."""
        t = ManualTimer(fn)
        heapq.heappush(self._heap, (self._now + max(0.0, delay_s), next(self._seq), t))
        return t

    def send(self, dst: NodeHandle, msg: Message) -> None:
        """Record ``(dst, msg)`` in ``sent``; nothing is delivered."""
        self.sent.append((dst, msg))

    def send_address(self, address: Address, msg: Message) -> None:
        """Record ``(address, msg)`` in ``sent``; nothing is delivered."""
        self.sent.append((address, msg))

    def advance(self, seconds: float) -> None:
        """Move the clock forward, firing every timer that falls due, in order."""
        end = self._now + seconds
        while self._heap and self._heap[0][0] <= end:
            when, _, t = heapq.heappop(self._heap)
            self._now = when
            if not t.cancelled:
                t.fn()
        self._now = end

    def take_sent(self) -> list[tuple[NodeHandle | Address, Message]]:
        """Return the messages recorded since the last call and clear ``sent``."""
        out, self.sent = self.sent, []
        return out
