"""The trio side of ``overlay.Node``: the Runtime its core sees, and nursery plumbing.

Theory of operation (docs/design.md, "The sans-io rule"; split from :mod:`overlay.live.node`, which
uses it):

* :class:`TrioRuntime` implements :class:`overlay.runtime.Runtime` for one node: ``now()`` is
  ``trio.current_time()`` (so ``trio.testing.MockClock`` drives a whole swarm in virtual time),
  ``call_later`` pushes onto *one* heap served by *one* timer task (:meth:`TrioRuntime.run`),
  and ``send`` hands the message to the node, which encodes, signs and transmits it.
* :func:`exit_nursery` closes a nursery owned by an ``async with`` object (a ``Node``, a
  ``ControlClient``) without wrapping the body's own exception in an ``ExceptionGroup``.
"""

from __future__ import annotations

import heapq
import logging
import math
import random
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import trio

from overlay.handle import Address, NodeHandle
from overlay.messages import Message

if TYPE_CHECKING:
    from overlay.live.host import NodeHost

__all__ = ["HeapTimer", "TrioRuntime", "exit_nursery"]

log = logging.getLogger("overlay.live.node")


async def exit_nursery(
    cm: Any,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> bool | None:
    """Close a nursery owned by an async context manager without wrapping the body's exception.

    trio wraps whatever leaves a nursery in an ExceptionGroup; the caller of ``async with node``
    should see its own ``JoinError`` (or assertion) unwrapped, as if no nursery were involved.
    """
    try:
        result: bool | None = await cm.__aexit__(exc_type, exc, tb)
    except BaseExceptionGroup as eg:
        if exc is not None and _only(eg, exc):
            return False
        raise
    return result


def _only(eg: BaseExceptionGroup[BaseException], exc: BaseException) -> bool:
    """True if ``eg`` holds ``exc`` and otherwise only cancellations (outer scope cancelled)."""
    found = False
    stack: list[BaseException] = [eg]
    while stack:
        e = stack.pop()
        if e is exc:
            found = True
        elif isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
        elif not isinstance(e, trio.Cancelled):
            return False
    return found


class TrioRuntime:
    """The Runtime a core sees: trio clock, one timer heap, signed sends.

    A timer is a plain mutable heap entry ``[when, seq, fn]``; ``cancel()`` clears ``fn``
    (:class:`HeapTimer` is that list, so no extra object per timer). The timer task sleeps until
    the earliest deadline; a new earlier timer wakes it.
    """

    __slots__ = ("_heap", "_n_cancelled", "_node", "_rng", "_seq", "_sleeping", "_wakeup")

    def __init__(self, node: NodeHost, rng: random.Random) -> None:
        self._node = node
        self._rng = rng
        self._heap: list[HeapTimer] = []
        self._seq = 0
        self._wakeup: trio.Event | None = None
        self._sleeping = math.inf  # the deadline the timer task sleeps until
        self._n_cancelled = 0

    @property
    def rng(self) -> random.Random:
        """The node's seeded random generator."""
        return self._rng

    def now(self) -> float:
        """trio's clock (so ``MockClock`` drives the node in tests)."""
        return trio.current_time()

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> HeapTimer:
        """Run ``fn`` after ``delay_s`` seconds from the node's one timer task."""
        if not delay_s >= 0:  # negative or NaN
            delay_s = 0.0
        when = trio.current_time() + delay_s
        self._seq += 1
        t = HeapTimer((when, self._seq, fn, self))
        heap = self._heap
        heapq.heappush(heap, t)
        if when < self._sleeping and self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None
        # cancelled entries wait for their deadline in the heap; once they are the majority
        # the heap is rebuilt (amortised O(1); keeps ~1 KiB of dead timers off each node)
        if self._n_cancelled > 8 and self._n_cancelled > len(heap) // 2:
            self._heap = [e for e in heap if e[2] is not None]
            heapq.heapify(self._heap)
            self._n_cancelled = 0
        return t

    def send(self, dst: NodeHandle, msg: Message) -> None:
        """Authenticate and send ``msg`` to the member ``dst`` (a pair frame when its key is
        known, else a signed envelope; a session record when one is held)."""
        self._node.send_to_member(dst.address, msg, dst.id)

    def send_address(self, address: Address, msg: Message) -> None:
        """Sign and send ``msg`` to a bare address (bootstrap: the peer's id is unknown)."""
        self._node.send_message(address, msg, None)

    async def run(self) -> None:
        """The timer task: fire due timers, sleep until the next deadline."""
        node = self._node
        while not node.closed:
            now = trio.current_time()
            heap = self._heap
            while heap and heap[0][0] <= now:
                t = heapq.heappop(heap)
                fn = t[2]
                if fn is None:
                    self._n_cancelled -= 1
                    continue
                t[2] = None  # fired: a later cancel() is a no-op
                try:
                    fn()
                except Exception:
                    node.counters["timer_errors"] += 1
                    log.exception("timer callback failed on %r", node.handle)
            deadline = heap[0][0] if heap else math.inf
            if deadline <= trio.current_time():
                await trio.lowlevel.checkpoint()  # timers fell due while firing: yield, go on
                continue
            wakeup = self._wakeup = trio.Event()
            self._sleeping = deadline
            with trio.move_on_at(deadline):
                await wakeup.wait()
            self._sleeping = -math.inf  # awake: call_later need not wake us
            self._wakeup = None


class HeapTimer(list[Any]):
    """A heap entry ``[when, seq, fn | None, runtime]`` that is also the Timer handle.

    A list subclass without ``__lt__``: heapq compares entries in C (``when``, then the unique
    ``seq``), and the entry needs no separate handle object.
    """

    __slots__ = ()

    def cancel(self) -> None:
        """Cancel the timer (a no-op once it fired)."""
        if self[2] is not None:
            self[2] = None
            self[3]._n_cancelled += 1
