"""The trio side of ``overlay.Node``: the Runtime its core sees, and nursery plumbing.

Theory of operation (docs/design.md, "The sans-io rule"; split from :mod:`overlay.live.node`, which
uses it):

* :class:`TrioRuntime` implements :class:`overlay.runtime.Runtime` for one node: ``now()`` is
  ``trio.current_time()`` (so ``trio.testing.MockClock`` drives a whole swarm in virtual time),
  ``call_later`` pushes onto the one heap of the process, served by one timer task
  (:mod:`overlay.live.reactor`), and ``send`` hands the message to the node, which encodes,
  signs and transmits it.
* :func:`exit_nursery` closes a nursery owned by an ``async with`` object (a ``Node``, a
  ``ControlClient``) without wrapping the body's own exception in an ``ExceptionGroup``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import trio

from overlay.handle import Address, NodeHandle
from overlay.live.reactor import HeapTimer, Reactor, reactor
from overlay.messages import Message
from transports.lag import RECEIVE_LAG

if TYPE_CHECKING:
    from overlay.live.host import NodeHost

__all__ = ["HeapTimer", "TrioRuntime", "exit_nursery"]


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
    """The Runtime a core sees: trio clock, timers on the process's one heap, signed sends.

    Timers go to the :class:`~overlay.live.reactor.Reactor` of the trio run (one heap and one
    timer task for every node of the process); a timer due after the node closed never fires.
    """

    __slots__ = ("_node", "_reactor", "_rng")

    def __init__(self, node: NodeHost, rng: random.Random) -> None:
        self._node = node
        self._rng = rng
        self._reactor = reactor()

    @property
    def rng(self) -> random.Random:
        """The node's seeded random generator."""
        return self._rng

    @property
    def reactor(self) -> Reactor:
        """The process's timer heap and socket poller (one per trio run)."""
        return self._reactor

    @property
    def closed(self) -> bool:
        """True once the node closed (its pending timers are dropped)."""
        return self._node.closed

    @property
    def counters(self) -> Counter[str]:
        """The node's counters (``timer_errors``)."""
        return self._node.counters

    def now(self) -> float:
        """trio's clock (so ``MockClock`` drives the node in tests)."""
        return trio.current_time()

    @property
    def timing_noise_s(self) -> float:
        """How much of an RTT measured here may be waiting in event loops rather than network:
        twice this process's receive-lag bound (``transports.lag``: the ping waits at the peer
        as the pong waits here). The Pastry core adds it to ``pns_near_enough_s``."""
        return 2.0 * RECEIVE_LAG.noise_s()

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> HeapTimer:
        """Run ``fn`` after ``delay_s`` seconds from the process's timer task."""
        return self._reactor.call_later(delay_s, fn, self)

    def send(self, dst: NodeHandle, msg: Message) -> None:
        """Authenticate and send ``msg`` to the member ``dst`` (a pair frame when its key is
        known, else a signed envelope; a session record when one is held)."""
        self._node.send_to_member(dst.address, msg, dst.id)

    def send_address(self, address: Address, msg: Message) -> None:
        """Sign and send ``msg`` to a bare address (bootstrap: the peer's id is unknown)."""
        self._node.send_message(address, msg, None)

    def __repr__(self) -> str:
        return repr(self._node)
