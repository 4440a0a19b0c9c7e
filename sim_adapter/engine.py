"""The discrete-event engine: one heapq loop, virtual time, no trio (docs/simulator.md).

Theory of operation: every event is a tuple ``(time, seq, fn, args)`` on one binary heap; the
``seq`` counter makes the order of simultaneous events deterministic (FIFO), so a seeded run is
reproducible bit for bit. Message deliveries are pushed as plain tuples (no closure, no object
per message) because they are the bulk of the events; timers get a tiny cancellable object.
``stop()`` ends the current ``run`` after the running event, which is how the Network waits for
"this join finished" or "every lookup answered" without testing a predicate after every event.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, Protocol


class Owner(Protocol):
    """Whatever owns a timer: its callback runs only while ``alive`` is true."""

    alive: bool


class EngineTimer:
    """A cancellable scheduled callback (the simulator's ``Timer``).

    ``owner`` (a simulated node) is checked when the timer fires, so a crashed node's timers
    fall silent without anyone having to cancel them; storing the owner object rather than a
    guard closure keeps a timer to one small allocation.
    """

    __slots__ = ("cancelled", "fn", "owner")

    def __init__(self, fn: Callable[[], None], owner: Owner | None) -> None:
        self.fn = fn
        self.owner = owner
        self.cancelled = False

    def cancel(self) -> None:
        """Mark the timer cancelled; its heap entry then does nothing when it comes due."""
        self.cancelled = True

    def fire(self) -> None:
        """Run the callback once, unless cancelled or the owner is no longer alive."""
        if self.cancelled:
            return
        self.cancelled = True
        owner = self.owner
        if owner is None or owner.alive:
            self.fn()


class Engine:
    """Virtual clock + event heap."""

    __slots__ = ("_heap", "_seq", "_stop", "after_event", "events", "now")

    def __init__(self) -> None:
        self.now = 0.0
        #: called after every event when set: invariant observers check state at each step
        #: (the loop reads it once per run, so set it between runs)
        self.after_event: Callable[[], None] | None = None
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self._stop = False
        self.events = 0

    def push(self, when: float, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        """Schedule ``fn(*args)`` at absolute virtual time ``when`` (hot path: no allocation)."""
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, fn, args))

    def call_later(
        self, delay_s: float, fn: Callable[[], None], owner: Owner | None = None
    ) -> EngineTimer:
        """Schedule ``fn`` ``max(0, delay_s)`` virtual seconds from now; it runs only while
        ``owner`` (if any) is alive."""
        t = EngineTimer(fn, owner)
        self._seq += 1
        heapq.heappush(self._heap, (self.now + max(0.0, delay_s), self._seq, t.fire, ()))
        return t

    def stop(self) -> None:
        """Make the current :meth:`run_until` return after the event being processed."""
        self._stop = True

    @property
    def pending(self) -> int:
        """Number of events on the heap (cancelled timers included)."""
        return len(self._heap)

    def run_until(self, end_s: float) -> bool:
        """Process events up to virtual time ``end_s``; False if stopped early by ``stop()``."""
        heap = self._heap
        pop = heapq.heappop
        self._stop = False
        n = 0
        after = self.after_event
        try:
            while heap:
                if heap[0][0] > end_s:
                    break
                when, _, fn, args = pop(heap)
                self.now = when
                n += 1
                fn(*args)
                if after is not None:
                    after()
                if self._stop:
                    self._stop = False
                    return False
        finally:
            self.events += n
        if self.now < end_s:
            self.now = end_s
        return True
