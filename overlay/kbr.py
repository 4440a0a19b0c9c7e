"""Key-based routing: the Common API both overlays implement, and the shared routing engine.

Theory of operation (Dabek et al., "Towards a Common API for Structured P2P
Overlays", IPTPS 2003; MSPastry, Castro et al. 2003 §3):

* Applications register by name on a core and get upcalls: ``deliver`` on the node responsible
  for a key, ``forward`` on every node that forwards a message (it may rewrite the next hop or
  stop the message), ``update`` when a neighbour joins or leaves.
* :class:`KbrCore` holds everything the two overlays share: the application registry, message
  dispatch with drop-and-count of unknown or malformed input, the proximity table, and
  **recursive routing with per-hop acknowledgements** (MSPastry §3.2): every forwarded
  :class:`RouteMsg` is acked by the next hop. The first transmission to a measured hop times
  out after ``hop_timeout_srtt_factor`` smoothed RTTs (an unmeasured one after the initial
  RTO, 1 s, about the largest RTT of the transit-stub model); then the hop is *suspected*
  (which starts a liveness probe) and the message goes at once by the overlay's next-best
  choice instead of waiting out a retransmission back-off — a holder that waits is a holder
  that may crash meanwhile. Only when the silent hop is the only way on (the closest node we
  know: delivering here instead would be wrong if it is merely slow, or lossy) is it
  retransmitted with RTO back-off, until it acks or its probe declares it DEAD. Reroutes are
  bounded; a message that exhausts them is dropped and counted, never lost silently. A DEAD
  verdict moves the messages waiting on that hop on at once, and an ALIVE verdict gives a hop
  avoided after a lost ack its messages back (``overlay/kbr_pending.py``, the pending hops).
* **Joining nodes deliver nothing.** A node that is not ``ready`` yet is not responsible for
  any key (MSPastry §3.1: a node becomes *active* once its leaf set confirmed it), but its new
  neighbours may already route to it: a message it would deliver goes back to the previous
  hop, which sees it return (below) and routes on avoiding it (or, with ``hold_unready_s``, is
  held a moment first: the join may end meanwhile, and then it is handled as by a ready node).
  A reroute keeps the previous hop, so a joining node that forwarded a message and lost its
  next hop sends it back too instead of delivering it.
* **Duplicates and loops.** Each node remembers, per (origin, msg_id), the hop count at which it
  last handled a message and the next hops it chose. A copy with no more hops than that is a
  duplicate (a lost ack made the previous hop resend): acked again, not processed twice. A copy
  with *more* hops came back round a routing loop (tables inconsistent during churn): it is
  counted (``route_loops``) and routed again, avoiding the next hops this node already tried,
  so each pass round the loop takes another way out (or, with none left, ends here: every
  closer node it knows led back to it); ``max_hops`` bounds the whole walk. Except a copy that
  does not come back from one of those next hops while all of them were closer to the key than
  this node: that is the other copy of a hop the previous node rerouted after a lost ack, and
  it is sent on as usual (avoiding them delivered it here in the root's place). The node that
  delivered a message remembers that too, so delivery stays at most once however many copies
  arrive.
* **Custody** (``KbrConfig.custody``, ``overlay/kbr_custody.py``): a node keeps a copy of each
  message its next hop acked until that hop sends a :class:`HandedOff` notice (its own next
  hop acked, or it delivered); if the hop is declared DEAD first, the copy is routed again
  avoiding it, so a one-way message survives the crash of the node that held it.
* An overlay subclass supplies the routing state: :meth:`KbrCore.next_hop` (``None`` = this node
  is responsible), the neighbour queries and the join/maintenance protocol.
"""

from __future__ import annotations

import abc
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import attrs

from overlay.errors import (
    DuplicateApplicationError,
    OverlayError,
    UnknownApplicationError,
)
from overlay.handle import Address, NodeHandle
from overlay.ids import NodeId, closer, ring_distance
from overlay.kbr_custody import CustodyEngine
from overlay.kbr_pending import Hop
from overlay.messages import Message, register
from overlay.proximity import Liveness, Ping, Pong, Proximity, ProximityConfig
from overlay.runtime import Runtime

log = logging.getLogger(__name__)

#: what a message handler raises for content its checks refuse (dropped as malformed: the
#: validators raise ``ValueError``, the library's own errors derive from ``OverlayError``); any
#: other exception is a bug the message found (``handler_errors``)
_REFUSED = (ValueError, OverlayError)
#: (message type, exception type) pairs already logged at WARNING, process-wide: a bug is
#: reported once with its traceback, not once per message a peer (or an attacker) sends
_BUGS_LOGGED: set[tuple[type, type]] = set()

#: one frozenset object per distinct set of end-to-end application names, shared by every node
#: of the process: the nodes of a simulation register the same applications, and a set per
#: node would cost ~200 bytes each (10^6 simulated nodes)
_NAME_SETS: dict[frozenset[str], frozenset[str]] = {}


def _shared_names(names: frozenset[str]) -> frozenset[str]:
    """The process's one copy of ``names`` (a set of application names, made by code)."""
    return _NAME_SETS.setdefault(names, names)


# ---------------------------------------------------------------------- messages
@register(1)
@attrs.frozen(slots=True)
class RouteMsg(Message):
    """An application payload routed towards ``key`` (recursively, hop by hop)."""

    key: NodeId
    app: str
    payload: Any
    origin: NodeHandle
    msg_id: int
    hops: int


@register(2)
@attrs.frozen(slots=True)
class RouteAck(Message):
    """Per-hop acknowledgement of a RouteMsg (MSPastry §3.2)."""

    msg_id: int


@register(7)
@attrs.frozen(slots=True)
class HandedOff(Message):
    """The receiver's next hop acked RouteMsg ``msg_id``, or the receiver delivered it: the
    custody copy kept after the receiver's ack can go (``overlay/kbr_custody.py``)."""

    msg_id: int


@register(3)
@attrs.frozen(slots=True)
class DirectMsg(Message):
    """An application payload sent straight to one node (``route`` with key None and a hint)."""

    app: str
    payload: Any
    origin: NodeHandle


@register(4)
@attrs.frozen(slots=True)
class Leave(Message):
    """The sender leaves the overlay for good: drop it now and repair, with no lease wait.

    Only ever about its sender (whose key proves who it is on live nodes), so nobody can use it
    to evict a third node."""


# ---------------------------------------------------------------------- applications
class Application(Protocol):
    """Upcalls an application receives from the core it is registered on."""

    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        """This node is responsible for ``key`` (or ``payload`` was sent here directly)."""

    def forward(self, key: NodeId, payload: Any, next_hop: NodeHandle) -> NodeHandle | None:
        """Called before this node forwards; return the hop to use, or None to stop here."""

    def update(self, handle: NodeHandle, joined: bool) -> None:
        """A neighbour (leaf set / near connection) joined or left."""


class BaseApplication:
    """Convenience base: forward unchanged, ignore updates; subclasses override ``deliver``."""

    #: The sender of this application's routed messages retries end to end (it waits for an
    #: answer, as a lookup or a join does): such messages get no custody copies or
    #: ``HandedOff`` notices (``overlay/kbr_custody.py``), since the retry already recovers a
    #: message lost with a crashed hop (the end-to-end argument, Saltzer, Reed & Clark 1984).
    #: An application without the attribute is one-way (False). It must be the same on
    #: every node, as the application's name is.
    end_to_end: bool = False

    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        """Ignore the payload (subclasses override)."""
        return None

    def forward(self, key: NodeId, payload: Any, next_hop: NodeHandle) -> NodeHandle | None:
        """Forward unchanged along ``next_hop``."""
        return next_hop

    def update(self, handle: NodeHandle, joined: bool) -> None:
        """Ignore neighbour-set changes."""
        return None


# ---------------------------------------------------------------------- config
@attrs.frozen
class KbrConfig:
    """Routing reliability knobs shared by both overlays."""

    #: per-hop acks (MSPastry §3.2). Off = plain datagram forwarding (fewer messages, no reroute).
    hop_acks: bool = True
    #: retransmissions, with RTO back-off, to a silent next hop that is the only way on (it is
    #: the closest node known: delivering here instead would be wrong if it is merely slow or
    #: its datagrams were lost), or once the reroutes are spent. They stop early once the hop's
    #: probe declares it DEAD (3 pings for Pastry: 1 + 2 + 4 RTO); 7 outlast that at any RTO.
    #: A hop with an alternative is not retransmitted: the message goes the other way at once.
    hop_retries: int = 7
    #: alternative next hops tried after suspicion before the message is dropped and counted.
    #: Each reroute avoids one more suspected hop (and makes it a suspect whose probe may end in
    #: a DEAD verdict: across a partition, every try is a verdict that only the peer itself, or
    #: the overlay's partition healing, undoes). Pastry raises it (``PastryConfig``).
    max_reroutes: int = 6
    #: remembered (origin, msg_id) pairs, for duplicate suppression and loop detection.
    dedupe_window: int = 1024
    #: safety net against routing loops (inconsistent state during churn): a message that has
    #: taken more hops is dropped and counted as ``ttl_expired``. Pastry needs ~log16 N hops and
    #: greedy small-world routing O(log^2 N); 128 is far beyond both at 10^6 nodes.
    max_hops: int = 128
    #: a node still joining (not ``ready``) that would deliver a routed message sends it back
    #: to the previous hop, which routes around it (MSPastry §3.1: a node becomes *active*,
    #: i.e. responsible for keys, only once its leaf set confirmed it, while its neighbours
    #: may already route to it). False = deliver at once, as a joined node would.
    bounce_unready: bool = True
    #: the first transmission to a measured next hop times out after this many smoothed RTTs
    #: (+ ``min_rto_s``) when that is below the RFC 6298 RTO. A premature timeout costs only a
    #: second copy by another way and a probe (the copy that arrives twice is acked and
    #: dropped), while every second spent on a crashed hop is a second the holder may crash
    #: in (MSPastry §3.2 reroutes on the first missing ack). 0 = the plain RTO.
    hop_timeout_srtt_factor: float = 1.5
    #: a copy that comes back with more hops while this node's own next hop has not acked yet
    #: waits for that hop's outcome (ack: route it as a loop; timeout: drop it, the reroute
    #: carries the message) instead of being routed at once avoiding the unacked hop — which,
    #: under loss, delivered it here in place of a merely lossy closest node. Ours; Pastry
    #: turns it on (``PastryConfig``), the small-world ring keeps routing such copies at once.
    hold_returning_copies: bool = False
    #: a liveness verdict acts on the messages in flight at once (``overlay/kbr_pending.py``):
    #: those waiting on a hop declared DEAD go on now, and a hop avoided after a lost ack that
    #: answers its probe takes back the messages waiting on a next hop farther from the key.
    #: Ours (traced in ``bench churn``); False = wait for the hop's own timer.
    act_on_verdicts: bool = True
    #: a copy that returns with more hops from a node that is not one of its next hops here,
    #: while every next hop chosen for it was closer to the key than this node, is the other
    #: copy of a rerouted hop, not a loop: it is routed again without exclusions (ours, traced
    #: in ``bench churn``). False = the loop rule (avoid the next hops tried) for every copy.
    parallel_copies: bool = True
    #: a node that would deliver only because a closer node is *suspected* (its probe in
    #: flight) sends the message there instead, retransmitting until it acks or is declared
    #: DEAD, as for a silent hop that is the only way on (ours, traced in ``bench churn``:
    #: under loss the deliverer held a live root suspected). False = deliver here at once.
    wait_for_suspected: bool = True
    #: a node still joining that would deliver a routed message holds it (acked) this long
    #: for its join to end — then it handles it as a ready node — before sending it back
    #: (``bounce_unready``). Traced in ``bench churn``: a joiner sent a lookup back and became
    #: active 0.2 s later, and the previous hop delivered it in its place. Off by default: a
    #: join that fails while the node holds a message loses it (traced too), and 2 s was
    #: shorter than some joins. 0 = send back at once.
    hold_unready_s: float = 0.0
    #: a node that would deliver a message because a closer next hop sent it back offers it
    #: there again after this long, doubling the wait each time, ``retry_bounced_times`` times
    #: (ours, traced in ``bench churn``: the joining roots that sent lookups back became active
    #: 0.05-7 s later, and in a one-hour run three just after the fifth retry, 9.3 s later — a
    #: joiner waits out the probes of a crashed would-be leaf at a 1-s initial RTO; a sixth,
    #: 18.9 s after the bounce, covers them, and only bounced lookups wait). 0 = deliver now.
    #: The same budget serves a reroute that would deliver here while it excludes a live node
    #: closer to the key: that node gets the message once more (``HopEngine._closer_excluded``).
    retry_bounced_s: float = attrs.field(default=0.3, validator=attrs.validators.ge(0.0))
    retry_bounced_times: int = attrs.field(default=6, validator=attrs.validators.ge(0))
    #: at a message's origin, a best next hop not heard from for longer than this gives way
    #: to the next best one heard from within it (``next_hop`` with the stale ones excluded,
    #: so each overlay's own progress rule still holds), if that one is at most
    #: ``fresh_first_hop_factor`` times as far from the key. Custody covers the crash of every
    #: later holder, not the origin's: until the first hop acks, the origin alone holds the
    #: message, and a first hop that crashed unnoticed costs a hop timeout and a reroute, in
    #: which the origin's own crash loses it (traced under 5-minute sessions: the lookups lost
    #: with their source; docs/smallworld.md, "Fresh first hops"). A peer silent for 20 s has
    #: crashed with probability 1 - e^(-20/300) = 6.5 % at 5-minute sessions, one silent for a
    #: shortcut's idle period (120 s) with 33 %. 0 = off.
    fresh_first_hop_s: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    #: see ``fresh_first_hop_s``: how much farther from the key (ring distance, as a factor)
    #: a fresh first hop may leave the message than the stale best one
    fresh_first_hop_factor: float = attrs.field(default=8.0, validator=attrs.validators.ge(1.0))
    #: see ``fresh_first_hop_s``: alternatives examined at most
    fresh_first_hop_tries: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    #: at its origin an application's message also leaves, untracked, by a second first hop:
    #: the next one in the overlay's own order after the hop chosen that was heard from within
    #: ``fresh_first_hop_s`` (needs it > 0), is not suspected, and is at most
    #: ``fresh_first_hop_factor`` times as far from the key. The origin alone holds a message
    #: until its first hop acks, and when that hop crashed unnoticed, the hop timeout and the
    #: reroute are a window in which the origin's own crash loses it; a second copy closes the
    #: window to the spare's round trip. The copies share the message id: a node that meets
    #: both drops the one with no more hops, and the root delivers once (a node that became
    #: the root between the two arrivals delivers the later copy too). Ours, after the hedged
    #: requests of Dean & Barroso ("The Tail at Scale", 2013); docs/smallworld.md, "A spare
    #: first hop". False = one first hop.
    spare_first_hop: bool = False
    #: the previous hop keeps a copy of each message its next hop acked until that hop says
    #: it handed it on (its own next hop acked, or it delivered), and routes the copy again
    #: if the hop is declared DEAD first (``overlay/kbr_custody.py``): a one-way message
    #: survives the crash of the node that held it. On by default: the cost is one small
    #: notice per hop (lookup traffic, like the ack) and a probe per copy whose notice is late;
    #: without it a holder's crash lost the message (``holder_crashed``, the largest cause of
    #: lost one-way lookups in ``bench churn``). Needs ``hop_acks``.
    custody: bool = True
    #: custody copies a node keeps at most (the oldest goes first, counted)
    custody_max: int = attrs.field(default=256, validator=attrs.validators.ge(0))
    #: a copy is dropped (counted) this long after its hop acked, if no notice came and the hop
    #: was not declared DEAD: it is alive and still holds the message (waiting out its own
    #: next hops' probes and retries, 19 s at most for a returned lookup at the defaults
    #: above), or dropped it itself
    custody_max_s: float = attrs.field(default=30.0, validator=attrs.validators.gt(0.0))
    #: the first probe of a hop whose notice has not come, in RTOs of that hop after its ack
    #: (at least the initial RTO); then at doubling intervals. A hop hands a message on within
    #: a round trip to its own next hop, or a timeout and a reroute: four of our RTOs cover that
    #: for the RTTs the hop is likely to have; an early probe costs only a ping and a pong.
    custody_check_rtos: float = attrs.field(default=4.0, validator=attrs.validators.gt(0.0))


Handler = Callable[[NodeHandle, Any], None]


# ---------------------------------------------------------------------- the core base
class KbrCore(CustodyEngine, abc.ABC):
    """Shared machinery of a sans-io overlay core. Subclasses: PastryCore, SmallWorldCore."""

    overlay_name: ClassVar[str] = "?"
    #: the overlay's own routed applications (joins, ring links): never sent by a spare first
    #: hop — a second delivery of a join or a link request would act twice
    overlay_apps: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        runtime: Runtime,
        handle: NodeHandle,
        kbr: KbrConfig | None = None,
        proximity: ProximityConfig | None = None,
    ) -> None:
        self.runtime = runtime
        self.handle = handle
        self.id: NodeId = handle.id
        self.kbr_config = kbr if kbr is not None else KbrConfig()
        self.apps: dict[str, Application] = {}
        self.stats: Counter[str] = Counter()
        #: messages held while joining (``KbrConfig.hold_unready_s``), allocated on first use
        self._unready_held: dict[tuple[int, int], tuple[Any, ...]] | None = None
        self._bounce_retried: OrderedDict[tuple[int, int], int] | None = None
        self._ready = False
        self.stopped = False
        self.prox = Proximity(
            runtime,
            handle,
            proximity if proximity is not None else ProximityConfig(),
            on_dead=self._peer_dead,
            on_alive=self._peer_alive,
        )
        self._pending: dict[int, Hop] = {}
        self._seen: OrderedDict[tuple[int, int], tuple[Any, ...]] | None = (
            None  # allocated on first use
        )
        self._extra_handlers: dict[type[Message], Handler] | None = None

    @property
    def ready(self) -> bool:
        """Joined: responsible for the keys closest to it (MSPastry §3.1: *active*)."""
        return self._ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self._ready = value
        if value and self._unready_held:
            # after the join code that set it has finished (its state and callbacks: the node
            # is active once they ran, MSPastry §3.1), not in the middle of it
            self.runtime.call_later(0.0, self._release_unready)

    # Dispatch lives on the class, not the instance: at 10^6 simulated nodes a per-node dict of
    # bound methods would cost about 600 bytes a node. Subclasses get their own copy.
    _class_handlers: ClassVar[dict[type[Message], Callable[..., None]]] = {}

    #: handlers that are methods of a helper object the core holds in an attribute (Pastry's
    #: ``joiner``, ``maint``, ``tables``): ``message class -> (attribute, function)``, once per
    #: core class for the same reason (the bound methods and their dict cost ~1 KiB a node)
    _class_delegates: ClassVar[dict[type[Message], tuple[str, Callable[..., None]]]] = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        # Copy the parent's table and rebind each entry to this class's method of the same
        # name, so a subclass that overrides e.g. ``_on_route`` is dispatched to its override.
        table = {}
        for msg_cls, func in cls._class_handlers.items():
            own = getattr(cls, func.__name__, None)
            table[msg_cls] = own if callable(own) else func
        cls._class_handlers = table
        cls._class_delegates = dict(cls._class_delegates)

    # ------------------------------------------------------------ driver-facing
    def add_handler(self, cls: type[Message], fn: Handler) -> None:
        """Register a receive handler for message class ``cls``.

        A bound method of this core, or of an object held in one of its attributes, is stored
        once per core *class* (every instance registers the same one); any other callable (a
        plugin's) is stored on this instance only.
        """
        func = getattr(fn, "__func__", None)
        owner = getattr(fn, "__self__", None)
        if func is not None and owner is self:
            type(self)._class_handlers[cls] = func
            return
        if func is not None and owner is not None:
            attr = next((k for k, v in getattr(self, "__dict__", {}).items() if v is owner), None)
            if attr is not None:
                type(self)._class_delegates[cls] = (attr, func)
                return
        if self._extra_handlers is None:
            self._extra_handlers = {}
        self._extra_handlers[cls] = fn

    def receive(self, src: NodeHandle, msg: Message) -> None:
        """Entry point for every message. Never raises: bad input is dropped and counted."""
        if self.stopped:
            return
        t = type(msg)
        f = self._class_handlers.get(t)
        try:
            if f is not None:
                self.prox.heard(src)
                f(self, src, msg)
                return
            d = self._class_delegates.get(t)
            if d is not None:
                self.prox.heard(src)
                d[1](getattr(self, d[0]), src, msg)
                return
            extra = self._extra_handlers
            g = extra.get(t) if extra is not None else None
            if g is None:
                self.stats["dropped_unknown"] += 1
                return
            self.prox.heard(src)
            g(src, msg)
        except _REFUSED:  # malformed content must never crash the node's loop
            self.stats["dropped_malformed"] += 1
            log.debug("dropped malformed %s from %r", t.__name__, src, exc_info=True)
        except Exception as exc:  # nor a bug: counted apart, so that it is seen, not taken
            # for hostile input (a bench's figures, the fuzz campaign's crash count)
            self.stats["handler_errors"] += 1
            first = (t, type(exc)) not in _BUGS_LOGGED
            _BUGS_LOGGED.add((t, type(exc)))
            log.log(
                logging.WARNING if first else logging.DEBUG,
                "handler of %s from %r raised",
                t.__name__,
                src,
                exc_info=True,
            )

    def stop(self) -> None:
        """Stop answering and cancel timers the base owns (subclasses extend)."""
        self.stopped = True
        self.prox.stop()
        for hop in self._pending.values():
            if hop.timer is not None:
                hop.timer.cancel()
        self._pending.clear()
        self._stop_custody()
        self._unready_held = None

    def leave(self) -> None:
        """Leave gracefully: tell every node we know (they hold us as a neighbour or in their
        tables) so they repair at once, then stop. A node that was never ready just stops."""
        if self.stopped:
            return
        if self.ready:
            targets = self.known_nodes()
            msg = Leave()
            for h in targets:
                self.runtime.send(h, msg)
            self.stats["leave_notices_sent"] += len(targets)
        self.stop()

    def peer_left(self, h: NodeHandle) -> None:
        """``h`` told us it is leaving: hold it dead (overlays repair in their dead hook)."""
        self.prox.declare_dead(h)

    def _on_leave(self, src: NodeHandle, msg: Leave) -> None:
        if src.id == self.id:
            return
        self.stats["leaves_heard"] += 1
        self.peer_left(src)

    @abc.abstractmethod
    def start(self) -> None:
        """Arm periodic maintenance timers (called once by the driver)."""

    @abc.abstractmethod
    def join(self, seeds: Sequence[Address], on_done: Callable[[bool], None] | None = None) -> None:
        """Join through any of ``seeds`` (addresses); an empty list starts a new ring.

        ``on_done(True)`` once ready, ``on_done(False)`` if every retry failed.
        """

    # ------------------------------------------------------------ KBR API (abstract part)
    @abc.abstractmethod
    def next_hop(self, key: NodeId, exclude: set[NodeHandle] | None = None) -> NodeHandle | None:
        """The next hop towards ``key`` avoiding ``exclude`` and suspected nodes; None = here."""

    def first_hop(self, key: NodeId, exclude: set[NodeHandle] | None = None) -> NodeHandle | None:
        """The next hop of a message still at its origin: :meth:`next_hop`, but a best hop not
        heard from for ``KbrConfig.fresh_first_hop_s`` gives way to the next best one heard from
        within it, no more than ``fresh_first_hop_factor`` times as far from the key. Custody
        (a hop keeps its copy until the next one hands the message on) covers every later
        holder's crash; nothing covers the origin's while its first hop has not acked."""
        nh = self.next_hop(key, exclude)
        if nh is None or self.kbr_config.fresh_first_hop_s <= 0.0 or not self._origin_hedges():
            return nh
        if self.prox.heard_since(nh, self.runtime.now() - self.kbr_config.fresh_first_hop_s):
            return nh
        alt = self._fresh_after(key, nh, exclude)
        if alt is None:
            return nh
        self.stats["fresh_first_hops"] += 1
        return alt

    def spare_first_hop(
        self, key: NodeId, app: str, first: NodeHandle, exclude: set[NodeHandle] | None = None
    ) -> NodeHandle | None:
        """The second first hop of application ``app``'s message leaving its origin by
        ``first`` (``KbrConfig.spare_first_hop``), or None: off, one of the overlay's own
        applications (:attr:`overlay_apps`), or no fresh hop near enough."""
        cfg = self.kbr_config
        if not cfg.spare_first_hop or cfg.fresh_first_hop_s <= 0.0 or app in self.overlay_apps:
            return None
        if not self._origin_hedges():
            return None
        return self._fresh_after(key, first, exclude)

    def _origin_hedges(self) -> bool:
        """Whether this node applies fresh and spare first hops now (the config permitting).
        Always, here; an overlay that tells short sessions from long ones narrows it (the
        small-world ring: while its near window is widened)."""
        return True

    def _fresh_after(
        self, key: NodeId, nh: NodeHandle, exclude: set[NodeHandle] | None
    ) -> NodeHandle | None:
        """The first node after ``nh`` in :meth:`next_hop`'s order towards ``key`` (at most
        ``fresh_first_hop_tries`` examined) that was heard from within ``fresh_first_hop_s``,
        is not suspected, and is at most ``fresh_first_hop_factor`` times as far from the key
        as ``nh``; None if there is none such."""
        cfg = self.kbr_config
        prox = self.prox
        since = self.runtime.now() - cfg.fresh_first_hop_s
        limit = ring_distance(nh.id, key) * cfg.fresh_first_hop_factor
        skip = set(exclude) if exclude else set()
        cand = nh
        for _ in range(cfg.fresh_first_hop_tries):
            skip.add(cand)
            cand_next = self.next_hop(key, skip)
            if cand_next is None or ring_distance(cand_next.id, key) > limit:
                return None
            cand = cand_next
            # a suspected peer is no fresher than the stale one (an overlay's next_hop may
            # offer one when nothing live is closer)
            if prox.heard_since(cand, since) and cand not in prox.bad:
                return cand
        return None

    @abc.abstractmethod
    def local_lookup(self, key: NodeId, n: int) -> list[NodeHandle]:
        """Up to ``n`` known nodes usable as next hops towards ``key``, best first."""

    @abc.abstractmethod
    def neighbor_set(self, n: int) -> list[NodeHandle]:
        """Up to ``n`` ring neighbours (leaf set / near connections), closest first."""

    @abc.abstractmethod
    def replica_set(self, key: NodeId, k: int) -> list[NodeHandle]:
        """Up to ``k`` known nodes numerically closest to ``key`` (self included), closest first."""

    @abc.abstractmethod
    def known_in_range(self, begin: NodeId, end: NodeId) -> list[NodeHandle]:
        """Every live node this node knows in the clockwise range [begin, end) (self excluded)."""

    @abc.abstractmethod
    def known_nodes(self) -> list[NodeHandle]:
        """Every node in this node's routing state (for status tables and oracles)."""

    @abc.abstractmethod
    def _on_peer_dead(self, h: NodeHandle) -> None:
        """Proximity declared ``h`` DEAD: remove it and repair."""

    def is_joining(self) -> bool:
        """True while this node's join is under way (it is not yet responsible for keys).

        Each overlay overrides this with its own join state machine; a core that never joined
        (a unit test's, an oracle build's) is not joining."""
        return False

    def _on_peer_alive(self, h: NodeHandle) -> None:
        """A suspected/dead peer spoke again (override to re-insert it)."""
        return None

    def _peer_dead(self, h: NodeHandle) -> None:
        # the proximity table's DEAD verdict: the overlay takes it in first (removal, repair —
        # and a join waiting only on ``h`` ends), then the messages waiting on ``h`` go on,
        # routed on the updated state (traced: a joining root rerouted first, sent its lookup
        # back as not yet active, and became active in the same instant)
        self._on_peer_dead(h)
        if self._pending and self.kbr_config.act_on_verdicts:
            self.reroute_waiting_on(h)
        if self._custody:
            self.custody_dead(h)

    def _peer_alive(self, h: NodeHandle) -> None:
        self._on_peer_alive(h)
        if self._pending and self.kbr_config.act_on_verdicts and not self.stopped:
            # After the message that brought the news is handled, not before: when that
            # message is the late ack of a hop that timed out, the message it acks went to
            # ``h`` again first and the ack then matched the fresh copy — an RTT sample of 0 s
            # (traced: h's RTO fell to 50 ms against a 0.5-s RTT, and a later lookup's probe
            # declared the live root DEAD in 0.4 s, "root_suspected").
            self.runtime.call_later(0.0, lambda: self._retry_through_alive(h))

    def _retry_through_alive(self, h: NodeHandle) -> None:
        if self._pending and not self.stopped and self.prox.state(h) is Liveness.ALIVE:
            self.retry_through(h)

    # ------------------------------------------------------------ KBR API (shared part)
    def register(self, name: str, app: Application) -> None:
        """Register an application under ``name`` (unique per node)."""
        if name in self.apps:
            raise DuplicateApplicationError(f"application {name!r} is already registered")
        self.apps[name] = app
        if getattr(app, "end_to_end", False):
            self._end_to_end = _shared_names(self._end_to_end | {name})

    def unregister(self, name: str) -> None:
        """Remove the application registered under ``name``; a no-op if there is none."""
        self.apps.pop(name, None)
        if name in self._end_to_end:
            self._end_to_end = _shared_names(self._end_to_end - {name})

    def route(
        self,
        key: NodeId | None,
        app: str,
        payload: Any,
        hint: NodeHandle | None = None,
    ) -> None:
        """Route ``payload`` for application ``app`` to the node responsible for ``key``.

        With ``key=None`` the payload goes straight to ``hint`` (Common API direct send).
        """
        if app not in self.apps:
            raise UnknownApplicationError(f"no application {app!r} is registered on this node")
        if key is None:
            if hint is None:
                raise OverlayError("route() needs a key or a hint")
            self.send_direct(hint, app, payload)
            return
        if not isinstance(key, NodeId):
            raise OverlayError(f"route() key must be a NodeId, got {type(key).__name__}")
        msg = RouteMsg(key, app, payload, self.handle, self.runtime.rng.getrandbits(62), 0)
        self._visit(msg)
        self._step(msg, None, hint)

    def send_direct(self, dst: NodeHandle, app: str, payload: Any) -> None:
        """Send an application payload to one node without routing (no ack, may be lost)."""
        if dst == self.handle:
            a = self.apps.get(app)
            if a is not None:
                a.deliver(self.id, payload, self.handle)
            return
        self.runtime.send(dst, DirectMsg(app, payload, self.handle))

    def is_responsible(self, key: NodeId) -> bool:
        """Whether this node is the root for ``key`` (routing would stop here)."""
        return self.next_hop(key) is None

    def notify_update(self, h: NodeHandle, joined: bool) -> None:
        """Tell every registered application that ``h`` joined (True) or left (False)."""
        for a in self.apps.values():
            a.update(h, joined)

    # ------------------------------------------------------- proximity (overlay/proximity.py)
    def probe(
        self, handle: NodeHandle, callback: Callable[[float | None], None] | None = None
    ) -> None:
        """Ping ``handle``: ``callback(rtt_s)`` on the pong, ``callback(None)`` once it is
        declared DEAD after the probe retries. One probe per peer in flight; callers share it."""
        self.prox.probe(handle, callback)

    def liveness(self) -> dict[NodeHandle, Liveness]:
        """UNKNOWN/ALIVE/SUSPECTED/DEAD of every peer this node tracks."""
        return self.prox.liveness_table()

    def rtt(self, handle: NodeHandle) -> float | None:
        """Minimum RTT measured to ``handle`` in seconds (the PNS metric); None if never."""
        return self.prox.rtt(handle)

    # ------------------------------------------------------------ routing engine
    def _step(
        self,
        msg: RouteMsg,
        exclude: set[NodeHandle] | None,
        hint: NodeHandle | None = None,
        reroutes: int = 0,
        prev: NodeHandle | None = None,
    ) -> None:
        nh: NodeHandle | None
        at_origin = msg.hops == 0 and msg.origin == self.handle
        if hint is not None and hint != self.handle and hint not in self.prox.bad:
            nh = hint
        elif at_origin:
            nh = self.first_hop(msg.key, exclude)
        else:
            nh = self.next_hop(msg.key, exclude)
        app = self.apps.get(msg.app)
        if app is None:
            self.stats["dropped_unknown_app"] += 1
            return
        if nh is None and not self.ready and self.kbr_config.bounce_unready and self.is_joining():
            if prev is not None and prev not in self.prox.bad:
                # Not active yet: not responsible for any key. Held for a moment (the join may
                # end now), else back to the previous hop, which sees the message return with
                # more hops and routes it on avoiding us (``_on_route``).
                if self._hold_unready(msg, exclude, reroutes, prev):
                    return
                self.stats["bounced_unready"] += 1
                nh = prev
            else:
                # Nobody to send it back to: our own message, or the custody copy of one we
                # sent back to a node that died holding it. Not delivered here either (traced
                # under 5-minute sessions: the active root, retrying the joiner that had sent
                # the lookup back, crashed in between, and the joiner, active 20 s later only,
                # delivered it: "root_excluded"); it goes to the known live node closest to
                # the key, as if we were not in the ring yet.
                nh = self._closest_other(msg.key, exclude)
                if nh is not None:
                    self.stats["unready_passed_on"] += 1
        if nh is None and self.kbr_config.wait_for_suspected:
            nh = self._suspected_closer(msg.key, exclude)
            if nh is not None:
                self.stats["sent_to_suspected"] += 1
        if nh is None and self._hold_delivery(msg, exclude, reroutes, prev):
            return
        if nh is None:
            self._deliver_to(app, msg, prev)
            return
        nh2 = app.forward(msg.key, msg.payload, nh)
        if nh2 is None:
            self.stats["stopped_by_app"] += 1
            return
        if nh2 == self.handle:
            self._deliver_to(app, msg, prev)
            return
        resent = self._tried(msg, nh2)
        self._record(msg, nh2)
        out = RouteMsg(msg.key, msg.app, msg.payload, msg.origin, msg.msg_id, msg.hops + 1)
        self.stats["forwarded"] += 1
        if not self.kbr_config.hop_acks:
            self.runtime.send(nh2, out)
            return
        hop = Hop(out, nh2, exclude, prev)
        hop.reroutes = reroutes
        hop.resent = resent
        old = self._pending.pop(out.msg_id, None)
        if old is not None and old.timer is not None:
            old.timer.cancel()
        self._pending[out.msg_id] = hop
        self._send_hop(hop)
        if at_origin and not resent and hint is None:
            # at its origin, on its first transmission or a reroute there to a hop not tried
            # yet: the origin is again the one node that holds it
            self._send_spare(app, out, nh2, exclude)

    def _send_spare(
        self, app: Application, out: RouteMsg, first: NodeHandle, exclude: set[NodeHandle] | None
    ) -> None:
        """Send ``out``, just sent from its origin to ``first``, by a spare first hop too
        (``KbrConfig.spare_first_hop``), through the application's ``forward`` upcall like
        any hop. Untracked: its ack matches no pending hop and is ignored; should the tracked
        hop time out, a reroute to the spare meets a duplicate there, which acks it."""
        spare = self.spare_first_hop(out.key, out.app, first, exclude)
        if spare is None:
            return
        spare = app.forward(out.key, out.payload, spare)
        if spare is None or spare == self.handle or spare == first:
            return
        self._record(out, spare)
        self.stats["spare_first_hops"] += 1
        self.runtime.send(spare, out)

    def _deliver_to(self, app: Application, msg: RouteMsg, prev: NodeHandle | None) -> None:
        """Deliver ``msg`` here. An application that rejects its payload raises (junk under its
        name); that is counted as malformed and dropped here, because a message held or
        rerouted is stepped again from a timer, where nothing else would catch it."""
        self._record(msg, None)
        self.stats["delivered"] += 1
        self._handed_on(prev, msg)
        try:
            app.deliver(msg.key, msg.payload, msg.origin)
        except Exception:
            self.stats["dropped_malformed"] += 1
            log.debug(
                "application %r rejected a delivery from %r", msg.app, msg.origin, exc_info=True
            )

    def _closest_other(self, key: NodeId, exclude: set[NodeHandle] | None) -> NodeHandle | None:
        """The known node closest to ``key`` other than us, not suspected and not in
        ``exclude`` (None if there is none): where a joining node sends what it cannot deliver."""
        bad = self.prox.bad
        best: NodeHandle | None = None
        for h in self.known_nodes():
            if h == self.handle or h in bad or (exclude and h in exclude):
                continue
            if best is None or closer(key, h.id, best.id):
                best = h
        return best

    def _hold_delivery(
        self,
        msg: RouteMsg,
        exclude: set[NodeHandle] | None,
        reroutes: int,
        prev: NodeHandle | None,
    ) -> bool:
        """Called where this node would deliver ``msg`` (no next hop): True if the overlay
        keeps it to route it again later (an overlay that cannot yet tell it is the root);
        none does here."""
        return False

    def _on_route_ack(self, src: NodeHandle, msg: RouteAck) -> None:
        self._on_hop_acked(src, msg.msg_id)

    def _on_handed_off(self, src: NodeHandle, msg: HandedOff) -> None:
        self.on_handed_off(src, msg.msg_id)

    def _notice(self, mid: int) -> HandedOff:
        return HandedOff(mid)

    def _ack_hop(self, src: NodeHandle, msg: RouteMsg) -> None:
        """Acknowledge a routed message to the hop it came from (MSPastry §3.2)."""
        if self.kbr_config.hop_acks and src != self.handle:
            self.runtime.send(src, RouteAck(msg.msg_id))

    def _on_route(self, src: NodeHandle, msg: RouteMsg) -> None:
        self._ack_hop(src, msg)
        tried = self._visit(msg)
        if tried is None:
            self.stats["duplicates"] += 1
            self._handed_on_before(src, msg)
            return
        self._learn(src)
        if msg.hops > self.kbr_config.max_hops:
            self.stats["ttl_expired"] += 1
            return
        if not tried:
            self._step(msg, None, prev=src)
            return
        self._returning_copy(src, msg)

    def _on_direct(self, src: NodeHandle, msg: DirectMsg) -> None:
        if msg.origin.id != src.id:
            # a direct message travels one hop: its origin is its sender, whose key proves its
            # id on live nodes; a claimed origin that differs would let anyone speak for anyone
            self.stats["direct_origin_forged"] += 1
            return
        app = self.apps.get(msg.app)
        if app is None:
            self.stats["dropped_unknown_app"] += 1
            return
        app.deliver(self.id, msg.payload, src)

    def _on_ping(self, src: NodeHandle, msg: Ping) -> None:
        self.prox.on_ping(src, msg)

    def _on_pong(self, src: NodeHandle, msg: Pong) -> None:
        self.prox.on_pong(src, msg)

    def _learn(self, h: NodeHandle) -> None:
        """A node we heard from; overlays may use it to fill their tables (opportunistic)."""
        return None


KbrCore._class_handlers = {
    RouteMsg: KbrCore._on_route,
    RouteAck: KbrCore._on_route_ack,
    HandedOff: KbrCore._on_handed_off,
    DirectMsg: KbrCore._on_direct,
    Ping: KbrCore._on_ping,
    Pong: KbrCore._on_pong,
    Leave: KbrCore._on_leave,
}
