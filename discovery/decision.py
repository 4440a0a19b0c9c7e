"""The flocking decision: the one immutable value the Flocking Manager produces.

Butt et al. 2006 §4.1: the Flocking Manager periodically compares the local load with the local
capacity and either turns flocking on, with an ordered list of target pools taken from the
willing list (nearest first), or turns it off. The Condor Module turns this value into HTCondor
configuration (``FLOCK_TO`` and friends); submit machines apply the newest one they receive.

``(epoch, seq)`` orders decisions totally: ``epoch`` grows when the manager role moves to
another node (failover), ``seq`` with every decision one manager makes. A receiver applies a
decision only when its ``(epoch, seq)`` is greater than the one it applied last, so a late or
replayed decision never rolls a submit machine back.
"""

from __future__ import annotations

import attrs

__all__ = ["FlockDecision", "FlockTarget"]


@attrs.frozen(slots=True)
class FlockTarget:
    """One pool to flock to, as the willing list knows it."""

    #: the target pool's node id on the overlay, 40 hex digits
    node_id: str
    #: the target pool's central manager as HTCondor names it (``host`` or ``host:port``)
    collector: str
    #: the pool's name (informational; HTCondor identifies pools by their collector)
    pool_name: str = ""
    #: minimum probed round-trip time to the target's node, seconds (None: not yet probed)
    rtt_s: float | None = None
    #: free machines the target announced
    free_machines: int = 0
    #: willing-list row (Pastry routing-table row, or small-world hop count) it was heard on
    row: int = 0


@attrs.frozen(slots=True)
class FlockDecision:
    """Flocking on (with ordered targets, nearest first) or off, decided at ``at_s``."""

    enabled: bool
    targets: tuple[FlockTarget, ...] = ()
    #: runtime time (seconds) of the decision
    at_s: float = 0.0
    #: manager epoch (grows on every manager change, Butt et al. 2006 §3.3)
    epoch: int = 0
    #: decision number within the epoch
    seq: int = 0

    @property
    def version(self) -> tuple[int, int]:
        """``(epoch, seq)``: newer decisions compare greater."""
        return (self.epoch, self.seq)

    def newer_than(self, other: FlockDecision | None) -> bool:
        """True when this decision should replace ``other`` (None: nothing applied yet)."""
        return other is None or self.version > other.version
