"""The willing list: pools willing to share with us, by sublist, nearest first.

Theory of operation (Butt et al. 2006 §3.2.1, §3.2.2, §4.1): the willing list is "an array of
sublists, with the ith sublist containing [the pools] whose ith row of the routing table contains
[us]" (on the small-world ring: pools i forwarding hops away). Within a sublist the pools are
ordered by one total order, the key

    (RTT rounded down to the tolerance, more free machines first, a seeded random number)

* RTT is the minimum probed round-trip time (the proximity metric Pastry's PNS uses); pools not
  yet probed sort after every measured one. Rounding to a tolerance (default 5 ms) makes "the
  same proximity metric" of the paper meaningful for measured, never exactly equal RTTs:
  differences below it are measurement noise.
* §4.1: "if the proximity is the same for multiple pools, the number of free resources ... is
  taken into consideration, with the pool with more resources given precedence".
* §3.2.1: "if several resource pools in a sublist share the same proximity metric, the order of
  these pools is randomized", so that needy pools that discover the same free pools at once do
  not all pick the same one. The key reconciles the two: free machines break RTT ties first
  (§4.1), and the random draw orders only what is still tied — pools equally near *and* equally
  free, which no information distinguishes (§3.2.1). The number is drawn once per (receiver,
  origin) from the node's seeded generator when the origin enters the list, so different
  receivers order ties differently while one receiver's order, and so its ``FLOCK_TO``, does
  not flap from one period to the next.

Entries expire at the time the origin's offer stops being valid; reading the list drops them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import attrs

from overlay.handle import NodeHandle
from overlay.ids import NodeId

__all__ = ["WillingEntry", "WillingList", "order_key"]

_UNMEASURED = 1 << 62  # bucket of pools not yet probed: after every measured one


def order_key(
    rtt_s: float | None, free_machines: int, tiebreak: float, tolerance_s: float
) -> tuple[int, int, float]:
    """The total order of a sublist (smaller first): RTT bucket, more free first, random."""
    bucket = _UNMEASURED if rtt_s is None else math.floor(rtt_s / tolerance_s)
    return (bucket, -free_machines, tiebreak)


@attrs.frozen(slots=True)
class WillingEntry:
    """One pool on the willing list (a read-only snapshot)."""

    origin: NodeHandle
    collector: str
    pool_name: str
    free_machines: int
    idle_jobs: int
    utilization: float
    #: sublist index: the origin's routing-table row (Pastry) or forwarding hops (small world)
    row: int
    #: minimum probed RTT, seconds (None: probe pending)
    rtt_s: float | None
    #: when the offer expires, on the receiving Flock's clock
    expires_at_s: float
    #: origin sequence number of the announcement this entry reflects
    seq: int
    #: the seeded random tie-breaker of this entry
    tiebreak: float

    @property
    def node_id(self) -> NodeId:
        """The origin's node id (the key of the list)."""
        return self.origin.id


class _Slot:
    """Mutable record behind an entry (the receiver updates it on every announcement)."""

    __slots__ = (
        "collector",
        "expires_at_s",
        "free_machines",
        "idle_jobs",
        "origin",
        "pool_name",
        "row",
        "rtt_s",
        "seq",
        "tailored_seq",
        "tiebreak",
        "utilization",
    )

    def __init__(self, origin: NodeHandle, tiebreak: float) -> None:
        self.origin = origin
        self.tiebreak = tiebreak
        self.collector = ""
        self.pool_name = ""
        self.free_machines = 0
        self.idle_jobs = 0
        self.utilization = 0.0
        self.row = 0
        self.rtt_s: float | None = None
        self.expires_at_s = 0.0
        self.seq = -1
        self.tailored_seq = -1

    def snapshot(self) -> WillingEntry:
        return WillingEntry(
            self.origin,
            self.collector,
            self.pool_name,
            self.free_machines,
            self.idle_jobs,
            self.utilization,
            self.row,
            self.rtt_s,
            self.expires_at_s,
            self.seq,
            self.tiebreak,
        )


class WillingList:
    """Entries by origin id, with a cached sorted view (rebuilt after a change)."""

    def __init__(self, rtt_tolerance_s: float) -> None:
        if not rtt_tolerance_s > 0:
            raise ValueError("rtt_tolerance_s must be > 0")
        self.tolerance_s = rtt_tolerance_s
        self._slots: dict[NodeId, _Slot] = {}
        self._view: tuple[tuple[WillingEntry, ...], ...] | None = None
        self._next_expiry = math.inf

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, oid: object) -> bool:
        return oid in self._slots

    def __iter__(self) -> Iterator[NodeId]:
        return iter(self._slots)

    def slot(self, oid: NodeId) -> _Slot | None:
        """The slot of origin ``oid``, or None."""
        return self._slots.get(oid)

    def add(self, origin: NodeHandle, tiebreak: float) -> _Slot:
        """The slot of ``origin``, created with ``tiebreak`` if new (call :meth:`changed` after
        filling it)."""
        s = self._slots.get(origin.id)
        if s is None:
            s = self._slots[origin.id] = _Slot(origin, tiebreak)
        return s

    def changed(self, s: _Slot) -> None:
        """Call after mutating a slot: invalidates the sorted view."""
        self._view = None
        if s.expires_at_s < self._next_expiry:
            self._next_expiry = s.expires_at_s

    def remove(self, oid: NodeId) -> bool:
        """Drop origin ``oid``'s entry; False if there was none."""
        if self._slots.pop(oid, None) is None:
            return False
        self._view = None
        return True

    def prune(self, now_s: float) -> list[NodeId]:
        """Drop entries whose offer expired at or before ``now_s``; returns their ids."""
        if now_s < self._next_expiry:
            return []
        gone = [oid for oid, s in self._slots.items() if s.expires_at_s <= now_s]
        for oid in gone:
            del self._slots[oid]
        self._next_expiry = min((s.expires_at_s for s in self._slots.values()), default=math.inf)
        if gone:
            self._view = None
        return gone

    def sublists(self, now_s: float) -> tuple[tuple[WillingEntry, ...], ...]:
        """The sorted sublists (index = row; empty rows in between are empty tuples)."""
        self.prune(now_s)
        if self._view is None:
            rows: dict[int, list[_Slot]] = {}
            for s in self._slots.values():
                rows.setdefault(s.row, []).append(s)
            tol = self.tolerance_s
            floor = math.floor

            def key(s: _Slot) -> tuple[int, int, float]:
                # order_key, inlined (called for every entry of every rebuilt view)
                rtt = s.rtt_s
                return (
                    _UNMEASURED if rtt is None else floor(rtt / tol),
                    -s.free_machines,
                    s.tiebreak,
                )

            out: list[tuple[WillingEntry, ...]] = []
            for r in range(max(rows) + 1 if rows else 0):
                lst = rows.get(r)
                if lst is None:
                    out.append(())
                    continue
                lst.sort(key=key)
                out.append(tuple([s.snapshot() for s in lst]))
            self._view = tuple(out)
        return self._view

    def flat(self, now_s: float) -> list[WillingEntry]:
        """Every entry, sublist 0 first, each sublist in its order (nearest first)."""
        return [e for sub in self.sublists(now_s) for e in sub]
