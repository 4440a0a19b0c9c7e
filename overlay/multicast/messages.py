"""Wire messages of recursive-partition multicast and aggregation (tags 90–109).

They travel as the payload of the KBR ``DirectMsg`` (``KbrCore.send_direct``), parent to child
and child to parent; nothing is routed. Every field is an int, float, str, id, tuple or the
aggregator's own value, so the codec can map them without pickling. Sizes are O(1) per edge for
a fixed aggregator value size, plus one pair of ids per missing range (PonD §4.1).

``token``/``slot`` name the parent's session and the child's place in it: the parent picks them,
the child echoes them in its :class:`McAck` and :class:`McReply`, so a parent finds the record of
the answering child in O(1) without trusting the source address, and a late answer to a session
that already finished is recognised and ignored.
"""

from __future__ import annotations

from typing import Any

import attrs

from overlay.ids import NodeId
from overlay.messages import Message, register

#: a missing range is a clockwise half-open ``[begin, end)`` on the ring (``begin == end`` would
#: be the whole ring, which no single child ever holds).
Range = tuple[NodeId, NodeId]


@register(90)
@attrs.frozen(slots=True)
class McQuery(Message):
    """Cover a region for aggregation ``agg``: map locally, partition, reduce, answer once."""

    qid: int  #: the query's id (chosen by the root; shared by both redundant trees)
    agg: str  #: name of the aggregator registered on every node
    arg: Any  #: the aggregator's argument (e.g. a ClassAd requirement and k)
    direction: int  #: +1 clockwise tree, -1 counter-clockwise tree
    begin: NodeId  #: region start, in tree direction
    end: NodeId  #: region end (exclusive), in tree direction; begin == end = whole ring
    budget_s: float  #: answer at the latest this long after receipt
    level_s: float  #: allowance for one tree level (query down + answer up)
    n_est: int  #: the root's estimate of the ring size (sizes sub-regions)
    ttl: int  #: relay hops left for entering a region from outside
    avoid: NodeId | None  #: a node presumed dead, never to be chosen as a relay
    token: int  #: parent's session token (echoed)
    slot: int  #: child's slot in that session (echoed)


@register(91)
@attrs.frozen(slots=True)
class McAck(Message):
    """Immediate receipt of an :class:`McQuery` (lets the parent detect a dead child in one RTO)."""

    token: int
    slot: int


@register(92)
@attrs.frozen(slots=True)
class McReply(Message):
    """A child's one answer: the reduction of its sub-region and what it could not cover."""

    token: int
    slot: int
    value: Any  #: reduced value, or None when the sub-region held no node that mapped
    missing: tuple[Range, ...]  #: clockwise ranges whose nodes were not counted
    depth: int  #: height of the child's subtree (0 for a leaf)
    nodes: int  #: number of nodes that mapped in the child's subtree
    early: bool  #: the reduction declared itself done (First-Fit) before every child answered
    #: the child's own session token when it wants a :class:`McReplyAck` (it retransmits the
    #: reply until acknowledged); 0 for a leaf, which re-sends its reply when the parent
    #: retransmits the query instead
    ctoken: int


@register(93)
@attrs.frozen(slots=True)
class McReplyAck(Message):
    """Receipt of an :class:`McReply` that asked for one (``ctoken`` != 0)."""

    token: int  #: the child's ``ctoken``
