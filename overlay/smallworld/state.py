"""Per-join progress and what the join, exchange and maintenance parts see of a small-world node.

The core (:mod:`overlay.smallworld.core`) dispatches messages and timers to the join
(:mod:`~overlay.smallworld.join`), exchange (:mod:`~overlay.smallworld.exchange`), linking
(:mod:`~overlay.smallworld.linking`) and maintenance (:mod:`~overlay.smallworld.maintenance`)
functions; those read and change the node's
connection table and join progress through the core's mutators (``link``, ``drop``,
``consider_near``, ``send_connect``) so the invariants of the ring (Brunet: two near connections
per side, shortcuts at log-uniform distances) are kept in one place. They type against
:class:`SmallWorldHost` rather than the core class, so imports point one way only: core → join →
maintenance → exchange → state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

from overlay.handle import Address, NodeHandle
from overlay.ids import NodeId
from overlay.kbr import RouteMsg
from overlay.proximity import Proximity
from overlay.runtime import Runtime, Timer
from overlay.smallworld.config import SmallWorldConfig
from overlay.smallworld.connections import ConnectionTable

__all__ = ["JoinState", "Offers", "SmallWorldHost"]

#: shortcut candidates sent a ``Link(SHORTCUT, token)``, awaiting its LinkAck: the token, the
#: deadline and the nodes next to the candidate (its replacements once it is a shortcut)
Offers = dict[NodeHandle, tuple[int, float, tuple[NodeHandle, ...]]]


class JoinState:
    """Progress of one join (allocated only while joining)."""

    __slots__ = (
        "ack_rtt_max",
        "attempt",
        "held",
        "inherit",
        "link_deadline",
        "linked_at",
        "linking",
        "offset",
        "on_done",
        "pending",
        "probe",
        "seeds",
        "timer",
        "token",
    )

    def __init__(
        self,
        seeds: tuple[Address, ...],
        on_done: Callable[[bool], None] | None,
        offset: int = 0,
    ) -> None:
        self.seeds = seeds
        self.on_done = on_done
        self.offset = offset  # index of the first seed tried: rejoins start at a random one
        self.attempt = 0
        #: a partition-healing probe of a ready node (one try, ends quietly unanswered)
        self.probe = False
        self.token = 0
        self.linking = False
        self.pending: set[NodeHandle] = set()
        self.timer: Timer | None = None
        #: routed messages that reached us while our links were being acknowledged, handled
        #: once the join ends (created on first use)
        self.held: list[tuple[NodeHandle, RouteMsg]] | None = None
        #: the JOIN responder's own shortcuts, offered a Link once we are ready (offers.py)
        self.inherit: tuple[NodeHandle, ...] = ()
        #: when this attempt's Links went, when its wait for their acks ends, and the largest
        #: round trip of the acks that came (the link wait's scale, join.py)
        self.linked_at = 0.0
        self.link_deadline = 0.0
        self.ack_rtt_max = 0.0


class SmallWorldHost(Protocol):
    """The state and mutators of a small-world node, as join and maintenance use them."""

    runtime: Runtime
    handle: NodeHandle
    id: NodeId
    config: SmallWorldConfig
    stats: Counter[str]
    ready: bool
    stopped: bool
    prox: Proximity
    table: ConnectionTable
    #: progress of the join under way (None when not joining)
    join_state: JoinState | None
    #: the seeds of the last join, for rejoining after isolation
    seeds: tuple[Address, ...]
    #: connections declared dead and when (partition healing; None until one dies)
    gone: dict[NodeHandle, float] | None
    #: shortcut connection requests in flight, and when the current batch times out
    shortcut_pending: int
    shortcut_deadline: float
    #: tokens of our own shortcut requests awaiting a reply (None: none yet)
    shortcut_tokens: set[int] | None
    #: when the node (re)started, when the next stabilization walk and the next periodic
    #: near-list exchange are due
    started_at: float
    next_stabilize: float
    next_exchange: float
    #: hearsay candidates we sent a Link and wait to hear a LinkAck from: token and deadline
    proposed: dict[NodeHandle, tuple[int, float]] | None
    #: per connection, the last NearList stamp it sent us and when it arrived (to echo it)
    list_stamps: dict[NodeHandle, tuple[float, float]] | None
    #: shortcut candidates offered a Link (:data:`Offers`)
    shortcut_offers: Offers | None
    #: per own shortcut, the neighbours its reply named: its replacements should it fail
    shortcut_alts: dict[NodeHandle, tuple[NodeHandle, ...]] | None
    #: per side (True: clockwise), when a message that found no live way on last asked past
    #: the gap (``exchange.ask_past_gap``)
    gap_asked: dict[bool, float] | None

    def next_token(self) -> int:
        """A fresh token to match connection replies to requests."""

    def next_hop(self, key: NodeId, exclude: set[NodeHandle] | None = None) -> NodeHandle | None:
        """The live connection greedy routing would take towards ``key`` (None: deliver here)."""

    def link(self, h: NodeHandle, kind: int, token: int = 0) -> bool:
        """Add a connection of ``kind`` to ``h``; True if added."""

    def drop(self, h: NodeHandle, kind: int) -> None:
        """Remove a connection of ``kind`` to ``h``."""

    def consider_near(self, cands: Sequence[NodeHandle], token: int = 0) -> list[NodeHandle]:
        """Offer near-connection candidates; returns those newly linked."""

    def closest_known(
        self, target: int, k: int, exclude_id: int, with_self: bool = True
    ) -> tuple[NodeHandle, ...]:
        """Up to ``k`` live known nodes closest to ``target``."""

    def send_connect(
        self,
        target: int,
        kind: int,
        token: int,
        origin: NodeHandle | None = None,
        hint: NodeHandle | None = None,
    ) -> None:
        """Route a connection request towards ``target``."""

    def rejoin(self) -> None:
        """Join again through the last seeds (isolated node)."""

    def probe_partition(self, address: Address) -> None:
        """Ask the node at ``address`` (one we declared dead) where we belong (healing)."""

    def adopt_near(self, k: int) -> None:
        """Take the JOIN responder's wider window while our own churn estimate cannot decide."""

    def release_held(self, held: list[tuple[NodeHandle, RouteMsg]]) -> None:
        """Route the messages held while the join was linking, now that it ended."""


#: signature of a join completion callback
JoinDone = Callable[[bool], None]
