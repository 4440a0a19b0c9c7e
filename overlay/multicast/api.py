"""Public types of the multicast application: config, aggregator plug-ins, results, errors.

Split from :mod:`overlay.multicast.app` to keep modules small; the package re-exports
everything here. See :mod:`overlay.multicast.app` for the theory of operation (PonD §3.1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from overlay.errors import OverlayError
from overlay.ids import NodeId
from overlay.multicast.messages import Range
from overlay.validators import non_negative, positive

if TYPE_CHECKING:
    from overlay.kbr import KbrCore


class MulticastHost(Protocol):
    """What an aggregator's ``map`` sees of the local multicast application.

    A narrow interface (the local core and the dissemination listeners) so that plug-ins and
    this module do not depend on the application class itself.
    """

    @property
    def core(self) -> KbrCore:
        """The KBR core of the local node."""

    @property
    def listeners(self) -> Sequence[Callable[[Any], None]]:
        """Callbacks run with the payload of each broadcast that reaches this node."""


class UnknownAggregatorError(OverlayError, KeyError):
    """``aggregate`` named an aggregator that is not registered on this node."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown aggregator"


@attrs.frozen
class MulticastConfig:
    """Knobs of the multicast application (per node; the root's values travel in the query)."""

    #: allowance for one tree level: query down + answer up + processing. PonD's WAN model has
    #: one-way edges of 200–600 ms, so an RTT up to 1.2 s; 2 s leaves room for a retransmission.
    level_s: float = attrs.field(default=2.0, validator=positive)
    #: local caps on what a query from the wire may ask of this node: its answer budget and its
    #: per-level allowance are clamped to these (a NaN, negative or huge value would arm no
    #: timer and pin the session open for ever). 3600 s covers a 10^6-node ring at the
    #: default level_s with room to spare (depth ~2·log2 N levels).
    max_budget_s: float = attrs.field(default=3600.0, validator=positive)
    max_level_s: float = attrs.field(default=60.0, validator=positive)
    #: expected depth of a partition tree over s nodes is depth_factor · log2(s + 1) levels
    #: (PonD §4.1: depth O(log N); tests/test_multicast.py checks depth ≤ 2·log2 N).
    depth_factor: float = attrs.field(default=2.0, validator=positive)
    #: extra levels of budget per child, so estimation error does not cut healthy subtrees.
    slack_levels: float = attrs.field(default=3.0, validator=non_negative)
    #: acknowledge queries so that a dead child is found in about one RTO, not one deadline.
    acks: bool = True
    #: retransmissions of an unacknowledged query before the child is presumed dead: 1 finds a
    #: dead child in 1+2 RTOs (3 s before any RTT sample), early enough to repair its region
    #: within the parent's budget. Each try has two legs that can be lost, so at 0.25 % loss
    #: about 2.5e-5 of live children are presumed dead: each costs that one node (reported as
    #: missing; its sub-region is repaired). 2 makes that 1e-7 but detection takes 7 s.
    ack_retries: int = attrs.field(default=1, validator=non_negative)
    #: retransmissions of an unacknowledged reply (internal nodes; a leaf re-sends its cached
    #: reply when the parent retransmits the query). Needs ``acks``.
    reply_retries: int = attrs.field(default=3, validator=non_negative)
    #: re-dispatch the sub-region of a child presumed dead (its own id is reported missing).
    repair: bool = True
    #: relay hops allowed to enter a region from outside before it is reported missing.
    relay_ttl: int = attrs.field(default=32, validator=positive)
    #: remembered (parent, token, slot) of recent queries, to ignore retransmitted duplicates.
    dedupe_window: int = attrs.field(default=32, validator=positive)
    #: queries this node takes part in as an internal node at once (ours: aggregation queries
    #: are rare — PonD issues one per job cluster — so 128 leaves ample room); beyond it a
    #: query's region is answered as missing at once, which bounds the state that a flood of
    #: queries can pin for up to ``max_budget_s``.
    max_sessions: int = attrs.field(default=128, validator=positive)
    #: children one session may send to, repairs included (ours: a node knows ~60 nodes of a
    #: region, and a repair round re-dispatches at most what failed); past it the sub-region is
    #: reported missing.
    max_children: int = attrs.field(default=256, validator=positive)
    #: nearest ring neighbours used to estimate the ring size at the root (from their spread;
    #: 4 = the small-world near connections, 2 per side as in Brunet).
    estimate_neighbors: int = attrs.field(default=4, validator=positive)


# ---------------------------------------------------------------------- aggregation plug-ins
class Aggregator(Protocol):
    """A pluggable map-reduce. Registered by name on every node (builtins are everywhere).

    Values must be wire-encodable (ints, floats, strings, ids, tuples). ``None`` is reserved for
    "no value" (a relay, an empty region) and is never passed to ``reduce`` or ``merge``.
    """

    def map(self, mc: MulticastHost, arg: Any) -> Any:
        """This node's own contribution (``mc.core`` is the local core: id, state, ...)."""

    def reduce(self, arg: Any, acc: Any, child: Any) -> Any:
        """Merge one child's reduction into the accumulated value."""

    def done(self, arg: Any, acc: Any) -> bool:
        """True when ``acc`` already answers the query (First-Fit): answer without waiting."""

    def merge(self, arg: Any, a: Any, b: Any) -> Any:
        """Merge the results of the clockwise and counter-clockwise trees (dedupe by node id)."""


class Count:
    """Number of nodes. ``arg=k`` makes it First-Fit: done as soon as k nodes were counted.

    The two redundant trees' counts cannot be deduplicated by id, so ``merge`` keeps the larger
    (PondSim's ``combineResults``): a lower bound of the union, exact when one tree's missing
    ranges hold no live node the other tree missed (e.g. only crashed nodes, after repair).
    """

    def map(self, mc: MulticastHost, arg: Any) -> int:
        """Each node counts itself once."""
        return 1

    def reduce(self, arg: Any, acc: int, child: int) -> int:
        """Add a child subtree's count."""
        return acc + child

    def done(self, arg: Any, acc: int) -> bool:
        """First-Fit: done once ``arg`` nodes were counted (never when ``arg`` is None)."""
        return arg is not None and acc >= arg

    def merge(self, arg: Any, a: int, b: int) -> int:
        """Keep the larger of the two trees' counts."""
        return max(a, b)


class CollectIds:
    """The sorted tuple of the ids of every node reached (O(N) bytes: tests and small rings).

    ``arg=k`` makes it First-Fit (done once k ids are collected). ``merge`` is the union: the
    exact "dedupe by node id" of the redundant trees.
    """

    def map(self, mc: MulticastHost, arg: Any) -> tuple[NodeId, ...]:
        """This node's id, alone."""
        return (mc.core.id,)

    def reduce(self, arg: Any, acc: tuple[NodeId, ...], child: tuple[NodeId, ...]) -> Any:
        """Append a child subtree's ids."""
        return acc + child

    def done(self, arg: Any, acc: tuple[NodeId, ...]) -> bool:
        """First-Fit: done once ``arg`` ids were collected (never when ``arg`` is None)."""
        return arg is not None and len(acc) >= arg

    def merge(self, arg: Any, a: tuple[NodeId, ...], b: tuple[NodeId, ...]) -> Any:
        """Union of the two trees' ids, sorted."""
        return tuple(sorted(set(a) | set(b)))


class _Deliver(Count):
    """Dissemination: hand the payload to the node's listeners, count the nodes reached."""

    def map(self, mc: MulticastHost, arg: Any) -> int:
        for fn in mc.listeners:
            fn(arg)
        return 1

    def done(self, arg: Any, acc: int) -> bool:
        return False


BUILTIN_AGGREGATORS: dict[str, Aggregator] = {
    "count": Count(),
    "ids": CollectIds(),
    "deliver": _Deliver(),
}


@attrs.frozen(slots=True)
class MulticastResult:
    """What the root learns: the reduced value and exactly what it does not cover."""

    value: Any  #: reduction over every node that answered (None if none did)
    missing: tuple[Range, ...]  #: clockwise [lo, hi) ranges whose nodes were not counted
    depth: int  #: height of the tree (edges on the longest root-to-leaf path that answered)
    elapsed_s: float  #: from the call to the answer, on the runtime's clock
    #: number of nodes that mapped and were reduced into ``value`` (redundant trees: the larger
    #: of the two trees' numbers, a lower bound of the union when values dedupe by id)
    nodes: int
    early: bool  #: First-Fit: the reduction declared itself done before everything answered
    qid: int = 0

    @property
    def complete(self) -> bool:
        """Every node of the region answered (nothing missing, no early finish)."""
        return not self.missing and not self.early


ResultCallback = Callable[[MulticastResult], None]

# child states
