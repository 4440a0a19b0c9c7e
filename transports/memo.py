"""A process-wide memo bounded in bytes (interned ids and handles, parsed addresses).

Theory of operation: caches keyed by what peers send (handles, addresses) must not grow with
what peers send. A :class:`Memo` holds a dict and an estimate of the bytes its entries hold; an
insert that would exceed the budget first drops the older half of the entries (dicts keep
insertion order). Rebuilding the dict at once keeps eviction amortised O(1) per insert, where
popping the oldest key one at a time would rescan the holes a dict leaves at its front.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Memo"]


class Memo:
    """A process-wide memo bounded in bytes; when full, the older half is dropped.

    ``cost`` passed to :meth:`put` estimates the bytes an entry holds (key, value, dict slot).
    Dropping half at once (rebuilding the dict) keeps eviction amortised O(1) per insert; popping
    the oldest key one at a time would rescan the holes a dict leaves at its front.
    """

    __slots__ = ("data", "evictions", "max_bytes", "used")

    def __init__(self, max_bytes: int) -> None:
        self.data: dict[Any, Any] = {}
        self.max_bytes = max_bytes
        self.used = 0
        self.evictions = 0

    def put(self, key: Any, value: Any, cost: int) -> None:
        """Remember ``key -> value``; ``cost`` bytes (evicts the older half when over budget)."""
        if self.used + cost > self.max_bytes:
            self._shrink()
        self.data[key] = value
        self.used += cost

    def _shrink(self) -> None:
        items = list(self.data.items())
        keep = items[len(items) // 2 :]
        self.data = dict(keep)
        self.used = self.used * len(keep) // max(1, len(items))  # costs are near-uniform
        self.evictions += 1

    def clear(self) -> None:
        """Forget everything."""
        self.data = {}
        self.used = 0
