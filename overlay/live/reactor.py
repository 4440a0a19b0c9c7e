"""One timer heap and one socket poller per trio run, shared by every live node of the process.

Theory of operation (docs/transports.md, "Memory"): a process may run one node (``flockring
node``) or hundreds (``flockring bench live``, the test rings). A trio task per node for its
timers and another for its socket cost ~3 KiB a node in tasks, coroutine frames, cancel scopes,
events and trio's per-fd wait records — more than its routing table. So the process has one of
each, made on first use and kept in a :class:`trio.lowlevel.RunVar` (one per ``trio.run``), run
as trio *system* tasks (they live as long as the run and are cancelled when its main task ends):

* **Timers.** :meth:`Reactor.call_later` pushes a :class:`HeapTimer` ``[when, seq, fn, owner]``
  onto one binary heap ordered by deadline, then by a process-wide sequence number (so timers
  due together fire in the order they were set, as they did on one node's heap). The timer task
  sleeps until the earliest deadline; an earlier new timer wakes it. A due timer whose owner has
  closed is dropped unfired (a node's timers stop with it). ``cancel()`` clears ``fn``; the
  heap is rebuilt once cancelled entries are the majority.
* **Sockets** (Linux ``epoll`` only): a transport that offers ``fileno()`` and
  ``receive_nowait()`` (UDP) is registered, level-triggered, in one ``select.epoll`` object whose
  own descriptor trio waits on (an epoll descriptor is readable when any descriptor it watches
  is). Each wake-up calls the reader of every ready socket, which drains a bounded burst of
  datagrams; whatever is left keeps the socket ready for the next round, so one busy node cannot
  starve the others. Elsewhere :meth:`Reactor.add_reader` returns False and the node keeps a
  receive task of its own.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import math
import select
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import trio

__all__ = ["HeapTimer", "Reactor", "TimerOwner", "reactor"]

log = logging.getLogger("overlay.live.node")

#: callbacks fired per wake-up of the timer task before it yields to the scheduler
_TIMER_BURST = 256
#: ready sockets served per wake-up of the poller
_MAX_EVENTS = 256


class TimerOwner(Protocol):
    """What the reactor needs from whoever sets a timer (a node's runtime)."""

    @property
    def closed(self) -> bool:
        """True once the owner's timers must no longer fire."""

    @property
    def counters(self) -> Counter[str]:
        """Where ``timer_errors`` are counted."""

    @property
    def reactor(self) -> Reactor:
        """The reactor its timers are on."""


class HeapTimer(list[Any]):
    """A heap entry ``[when, seq, fn | None, owner]`` that is also the Timer handle.

    A list subclass without ``__lt__``: heapq compares entries in C (``when``, then the unique
    ``seq``), and the entry needs no separate handle object.
    """

    __slots__ = ()

    def cancel(self) -> None:
        """Cancel the timer (a no-op once it fired)."""
        if self[2] is not None:
            self[2] = None
            self[3].reactor.n_cancelled += 1


class Reactor:
    """The process's (trio run's) timer heap and socket poller; see the module docstring."""

    __slots__ = (
        "_ep", "_heap", "_readers", "_seq", "_sleeping", "_timer_task", "_wakeup",
        "n_cancelled",
    )  # fmt: skip

    def __init__(self) -> None:
        self._heap: list[HeapTimer] = []
        self._seq = 0
        self._wakeup: trio.Event | None = None
        self._sleeping = math.inf  # the deadline the timer task sleeps until
        self._timer_task = False
        #: cancelled entries still in the heap
        self.n_cancelled = 0
        self._ep: Any = None
        self._readers: dict[int, Callable[[], None]] = {}

    # ------------------------------------------------------------------ timers
    def call_later(self, delay_s: float, fn: Callable[[], None], owner: TimerOwner) -> HeapTimer:
        """Run ``fn`` after ``delay_s`` seconds (negative or NaN: at once), unless ``owner``
        has closed by then."""
        if not delay_s >= 0:
            delay_s = 0.0
        when = trio.current_time() + delay_s
        self._seq += 1
        t = HeapTimer((when, self._seq, fn, owner))
        heap = self._heap
        heapq.heappush(heap, t)
        if not self._timer_task:
            self._timer_task = True
            trio.lowlevel.spawn_system_task(self._run_timers, name="flockring timers")
        if when < self._sleeping and self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None
        # cancelled entries wait for their deadline in the heap; once they are the majority
        # the heap is rebuilt (amortised O(1))
        if self.n_cancelled > 8 and self.n_cancelled > len(heap) // 2:
            live = [e for e in heap if e[2] is not None]
            heapq.heapify(live)
            self._heap = live
            self.n_cancelled = 0
        return t

    def pending(self) -> int:
        """Timers in the heap (cancelled ones included until they are purged)."""
        return len(self._heap)

    async def _run_timers(self) -> None:
        while True:
            now = trio.current_time()
            heap = self._heap
            fired = 0
            while heap and heap[0][0] <= now and fired < _TIMER_BURST:
                t = heapq.heappop(heap)
                fn = t[2]
                if fn is None:
                    self.n_cancelled -= 1
                    continue
                t[2] = None  # fired (or dropped): a later cancel() is a no-op
                owner: TimerOwner = t[3]
                if owner.closed:
                    continue
                fired += 1
                try:
                    fn()
                except Exception:
                    owner.counters["timer_errors"] += 1
                    log.exception("timer callback failed on %r", owner)
                heap = self._heap  # a callback may have rebuilt it
            deadline = heap[0][0] if heap else math.inf
            if deadline <= trio.current_time():
                await trio.lowlevel.checkpoint()  # more fell due while firing: yield, go on
                continue
            wakeup = self._wakeup = trio.Event()
            self._sleeping = deadline
            with trio.move_on_at(deadline):
                await wakeup.wait()
            self._sleeping = -math.inf  # awake: call_later need not wake us
            self._wakeup = None

    # ------------------------------------------------------------------ sockets
    def add_reader(self, fd: int, on_readable: Callable[[], None]) -> bool:
        """Call ``on_readable()`` from the poller whenever ``fd`` has input; False where epoll
        is unavailable (the caller then reads from a task of its own)."""
        if self._ep is None:
            make = getattr(select, "epoll", None)
            if make is None:
                return False
            self._ep = make()
            trio.lowlevel.spawn_system_task(self._run_poller, name="flockring sockets")
        self._ep.register(fd, select.EPOLLIN)
        self._readers[fd] = on_readable
        return True

    def remove_reader(self, fd: int, on_readable: Callable[[], None]) -> None:
        """Stop watching ``fd`` if ``on_readable`` is still its reader (the number of a closed
        socket may already belong to another node's)."""
        if self._readers.get(fd) is not on_readable:
            return
        del self._readers[fd]
        # a closed socket was already dropped from the set by the kernel
        with contextlib.suppress(OSError, ValueError):
            self._ep.unregister(fd)

    async def _run_poller(self) -> None:
        ep = self._ep
        readers = self._readers
        while True:
            await trio.lowlevel.wait_readable(ep.fileno())
            for fd, _ in ep.poll(0, _MAX_EVENTS):
                cb = readers.get(fd)
                if cb is None:
                    continue
                try:
                    cb()
                except Exception:  # a reader guards its own datagrams; this is a last resort
                    log.exception("socket reader failed")
            await trio.lowlevel.cancel_shielded_checkpoint()


_REACTOR: trio.lowlevel.RunVar[Reactor] = trio.lowlevel.RunVar("flockring_reactor")


def reactor() -> Reactor:
    """The reactor of the current trio run (made on first use)."""
    try:
        return _REACTOR.get()
    except LookupError:
        r = Reactor()
        _REACTOR.set(r)
        return r
