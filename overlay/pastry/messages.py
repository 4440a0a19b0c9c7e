"""Pastry wire messages (tags 30–59, see ``overlay/messages.py``).

Theory of operation: every message is a frozen, slotted attrs class. Handle lists travel as
tuples of :class:`~overlay.handle.NodeHandle` (never the sender itself: the driver hands the
receiver the sender's handle with every message). The join request's routed leg rides on the
KBR :class:`~overlay.kbr.RouteMsg` with :class:`JoinPayload` as its payload, so it inherits the
per-hop acks and reroutes of MSPastry (Castro et al. 2003 §3.2).

=====  ================  ================================================================
tag    message           role (paper section)
=====  ================  ================================================================
30     JoinRequest       joiner → seed (first contact) or healer → gone node (FreePastry
                         PartitionHandler): "route a join for my id" (R&D 2001 §2.4)
31     JoinPayload       payload of the routed join
32     JoinRows          each hop on the join path → joiner: its rows 0..l (R&D §2.4)
33     JoinReply         numerically closest node → joiner: its leaf set and rows
34     LeafSetRequest    "send me your leaf set" (+ "insert me": consistent join, MSPastry
                         §3.1; repair: ask the extreme live member, R&D §2.5)
35     LeafSetReply      the leaf set
36     Heartbeat         to each immediate neighbour every 20 s, carrying our leaf set
                         and recent failures (FreePastry PeriodicLeafSetProtocol and
                         ConsistentJoinProtocol's failed set; MSPastry §3.2)
37     LeafFailed        "this member failed", spread to the leaf set on detection
38     RowRequest        routing-table repair (one slot) / periodic row exchange (a row,
                         carrying the asker's own row: FreePastry ``StandardRouteSetProtocol``
                         swaps rows; Castro et al. 2003 constrained gossiping)
39     RowReply          the requested entries (R&D §2.5; MSPastry §3.3)
40     TableAnnounce     a newly ready node → its routing-table entries, with the RTT it
                         measured and its row the receiver sits in (FreePastry
                         ``StandardJoinProtocol.broadcastRows``; MSPastry §3.1)
41     NearbyRequest     joiner → seed / closer node before joining: "your leaf set
                         (row -1) or routing row r" — nearby-node discovery (Castro et
                         al. 2002 §4; FreePastry ``PNSApplication.getNearest``)
42     NearbyReply       the leaf set or row, for the joiner to probe
=====  ================  ================================================================

**RTT hints.** Every message that lists routing candidates may carry, per entry, the sender's
own measured minimum RTT to it (``rtts``, seconds; ``-1`` when unknown; empty = no hints). With
its own RTT ``a`` to the sender, a receiver bounds a candidate's RTT by the triangle inequality,
``|a - h| <= rtt <= a + h``, and probes only candidates whose lower bound beats the entry they
would replace, most promising first (Castro et al. 2003 note that probing dominates the cost of
PNS). An entry the sender installed unprobed, on an upper bound ``u`` of its own (the table
keeps it: ``routing_table.py``), goes as ``-u`` (``0 < u < 1`` s): the receiver's bound is then
``0 <= rtt <= a + u``. A hint only decides *whether to measure*: a slot changes hands on our own
measurements alone, so a lying hint costs at most a bounded number of probes, never a slot —
except that an empty slot takes an unprobed candidate whose bound is within "near enough",
and keeps it, unprobed, until traffic to it (a route ack, a row swap) measures it; a lying
bound can hold such a slot that long.
"""

from __future__ import annotations

import math

import attrs

from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.messages import Message, register

Handles = tuple[NodeHandle, ...]
#: per-entry RTT hints in seconds (-1 = unknown; -u, 0 < u < 1: at most u, not measured)
Hints = tuple[float, ...]

#: hints above this are clamped (no RTT on Earth is longer; a hint is only a probing priority)
MAX_HINT_S = 10.0


@register(30)
@attrs.frozen(slots=True)
class JoinRequest(Message):
    """Joiner → seed (or healer → gone node): route a join for my id (R&D 2001 §2.4)."""

    nonce: int
    rejoin: bool = False
    #: a ready node's row walk: the join route's rows without the leaf set, to refine its
    #: routing table from a near node (see ``join.py``, "row walks")
    walk: bool = False


@register(31)
@attrs.frozen(slots=True)
class JoinPayload(Message):
    """The payload of the routed join, carrying the joiner's handle to each hop."""

    joiner: NodeHandle
    nonce: int
    rejoin: bool = False
    walk: bool = False


@register(32)
@attrs.frozen(slots=True)
class JoinRows(Message):
    """A hop on the join route → joiner: its routing rows for the joiner's table."""

    nonce: int
    entries: Handles
    rtts: Hints = ()  # the hop's RTT to each entry (hints, see the module doc)


@register(33)
@attrs.frozen(slots=True)
class JoinReply(Message):
    """Numerically closest node → joiner: its leaf set and routing row."""

    nonce: int
    leaves: Handles
    entries: Handles
    rtts: Hints = ()  # the root's RTT to each of ``entries`` (hints)


@register(34)
@attrs.frozen(slots=True)
class LeafSetRequest(Message):
    """Any node → leaf-set member: send me your leaf set (``insert_me``: consistent join)."""

    nonce: int
    insert_me: bool = False


@register(35)
@attrs.frozen(slots=True)
class LeafSetReply(Message):
    """Leaf-set member → asker: my leaf set."""

    nonce: int
    leaves: Handles


@register(36)
@attrs.frozen(slots=True)
class Heartbeat(Message):
    """Node → immediate neighbours every period: my leaf set and recent failures."""

    leaves: Handles
    #: recently found dead, as (node, seconds since it was found dead) — FreePastry CJP's
    #: "failed set". The age lets a receiver that heard from the node since ignore the report.
    failed: tuple[tuple[NodeHandle, float], ...] = ()


@register(37)
@attrs.frozen(slots=True)
class LeafFailed(Message):
    """Node → its leaf set on detecting a member failed."""

    dead: NodeHandle
    ago_s: float = 0.0  # how long ago it was found dead


@register(38)
@attrs.frozen(slots=True)
class RowRequest(Message):
    """Node → routing-table entry: send me a slot (repair) or a whole row (periodic exchange).

    A row exchange also carries the asker's own row ``row`` (with RTT hints) and the asker's
    measured RTT to the receiver (a hint, < 0 when unknown): both sides learn from one round
    trip (FreePastry ``StandardRouteSetProtocol.maintainRouteSet`` sends its row with the
    request)."""

    row: int
    col: int  # -1 = the whole row
    entries: Handles = ()
    rtts: Hints = ()
    rtt_s: float = -1.0


@register(39)
@attrs.frozen(slots=True)
class RowReply(Message):
    """Routing-table entry → asker: the requested row entries."""

    row: int
    entries: Handles
    rtts: Hints = ()  # the replier's RTT to each entry (hints)


@register(40)
@attrs.frozen(slots=True)
class TableAnnounce(Message):
    """Newly ready node → its routing-table entries: I exist, here is the RTT I measured."""

    rtt_s: float  # measured by the sender; < 0 when unknown
    #: the sender's routing row that the receiver belongs to, with RTT hints: candidates for
    #: the receiver's own table (FreePastry ``broadcastRows``: a joiner sends row i to row i)
    entries: Handles = ()
    rtts: Hints = ()


@register(41)
@attrs.frozen(slots=True)
class NearbyRequest(Message):
    """Joiner → seed or closer node: your leaf set or a routing row, for nearby-node discovery."""

    nonce: int
    row: int  # -1 = the leaf set


@register(42)
@attrs.frozen(slots=True)
class NearbyReply(Message):
    """Seed or closer node → joiner: the leaf set or row asked for, to probe."""

    nonce: int
    row: int
    entries: Handles
    rtts: Hints = ()  # the replier's RTT to each entry (hints)
    #: routing rows the replier holds (highest populated row + 1): where the walk starts
    depth: int = 0


def check_handles(items: object) -> tuple[NodeHandle, ...]:
    """Validate a handle list from the network (malformed → ValueError → dropped and counted)."""
    if not isinstance(items, tuple | list):
        raise ValueError(f"expected a tuple of handles, got {type(items).__name__}")
    for h in items:
        if type(h) is not NodeHandle or not isinstance(h.id, NodeId):
            raise ValueError(f"not a NodeHandle: {h!r}")
    return tuple(items)


def check_hints(rtts: object, n: int) -> tuple[float, ...]:
    """Validate the RTT hints of ``n`` entries from the network: empty (no hints) or one number
    per entry. A value in (-1, 0) is an upper bound, negated (module doc); NaN and values <= -1
    read as unknown (-1), large ones are clamped to :data:`MAX_HINT_S` (numbers from the wire
    are clamped). Malformed → ValueError."""
    if not isinstance(rtts, tuple | list):
        raise ValueError(f"expected a tuple of RTT hints, got {type(rtts).__name__}")
    if not rtts:
        return ()
    if len(rtts) != n:
        raise ValueError(f"{len(rtts)} RTT hints for {n} entries")
    out = []
    for v in rtts:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"not an RTT hint: {v!r}")
        f = float(v)
        out.append(-1.0 if math.isnan(f) or f <= -1.0 else f if f < 0.0 else min(f, MAX_HINT_S))
    return tuple(out)
