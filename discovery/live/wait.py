"""Plugin operations as awaitables: a completion callback, fired inside the node's tasks, that
a trio task waits for (see :mod:`discovery.live`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

from overlay.errors import OverlayError

__all__ = ["DiscoveryTimeout", "wait_for"]

T = TypeVar("T")


class DiscoveryTimeout(OverlayError):
    """A discovery operation did not complete in time."""


async def wait_for(start: Callable[[Callable[[T], None]], object], timeout_s: float) -> T:
    """Start a plugin operation with a completion callback and await its result.

    ``start(cb)`` must arrange for ``cb(result)`` to be called once (possibly before it
    returns). Raises :class:`DiscoveryTimeout` after ``timeout_s``.
    """
    done = trio.Event()
    out: list[T] = []

    def cb(result: T) -> None:
        if not out:
            out.append(result)
            done.set()

    start(cb)
    with trio.move_on_after(timeout_s):
        await done.wait()
    if not out:
        raise DiscoveryTimeout(f"no result within {timeout_s:g} s")
    return out[0]
