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
  bounded; a message that exhausts them is dropped and counted, never lost silently.
* **Joining nodes deliver nothing.** A node that is not ``ready`` yet is not responsible for
  any key (MSPastry §3.1: a node becomes *active* once its leaf set confirmed it), but its new
  neighbours may already route to it: a message it would deliver goes back to the previous
  hop, which sees it return (below) and routes on avoiding it.
* **Duplicates and loops.** Each node remembers, per (origin, msg_id), the hop count at which it
  last handled a message and the next hops it chose. A copy with no more hops than that is a
  duplicate (a lost ack made the previous hop resend): acked again, not processed twice. A copy
  with *more* hops came back round a routing loop (tables inconsistent during churn): it is
  counted (``route_loops``) and routed again, avoiding the next hops this node already tried,
  so each pass round the loop takes another way out (or, with none left, ends here: every
  closer node it knows led back to it); ``max_hops`` bounds the whole walk. The node that
  delivered a message remembers that too, so delivery stays at most once however many copies
  arrive.
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
from overlay.ids import NodeId
from overlay.messages import Message, register
from overlay.proximity import Liveness, Ping, Pong, Proximity, ProximityConfig
from overlay.runtime import Runtime, Timer

log = logging.getLogger(__name__)


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


class _Hop:
    __slots__ = ("attempt", "exclude", "held", "msg", "nh", "reroutes", "sent_at", "timer")

    def __init__(self, msg: RouteMsg, nh: NodeHandle, exclude: set[NodeHandle] | None) -> None:
        self.msg = msg
        self.nh = nh
        self.exclude = exclude
        self.attempt = 0
        self.reroutes = 0
        self.sent_at = 0.0
        self.timer: Timer | None = None
        #: a copy that came back with more hops before this hop was acked: (from, message)
        self.held: tuple[NodeHandle, RouteMsg] | None = None


Handler = Callable[[NodeHandle, Any], None]

#: what a node remembers of a routed message: the hop count at which it last handled it, then
#: the next hops it forwarded it to (oldest first); ``(_DELIVERED,)`` once delivered here.
_Seen = tuple[Any, ...]
_DELIVERED = -1
#: next hops remembered per message (a loop that outlasts this many exits reuses the last ones)
_MAX_TRIED = 8


# ---------------------------------------------------------------------- the core base
class KbrCore(abc.ABC):
    """Shared machinery of a sans-io overlay core. Subclasses: PastryCore, SmallWorldCore."""

    overlay_name: ClassVar[str] = "?"

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
        self.ready = False
        self.stopped = False
        self.prox = Proximity(
            runtime,
            handle,
            proximity if proximity is not None else ProximityConfig(),
            on_dead=self._on_peer_dead,
            on_alive=self._on_peer_alive,
        )
        self._pending: dict[int, _Hop] = {}
        self._seen: OrderedDict[tuple[int, int], _Seen] | None = None  # allocated on first use
        self._extra_handlers: dict[type[Message], Handler] | None = None

    # Dispatch lives on the class, not the instance: at 10^6 simulated nodes a per-node dict of
    # bound methods would cost about 600 bytes a node. Subclasses get their own copy.
    _class_handlers: ClassVar[dict[type[Message], Callable[..., None]]] = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        # Copy the parent's table and rebind each entry to this class's method of the same
        # name, so a subclass that overrides e.g. ``_on_route`` is dispatched to its override.
        table = {}
        for msg_cls, func in cls._class_handlers.items():
            own = getattr(cls, func.__name__, None)
            table[msg_cls] = own if callable(own) else func
        cls._class_handlers = table

    # ------------------------------------------------------------ driver-facing
    def add_handler(self, cls: type[Message], fn: Handler) -> None:
        """Register a receive handler for message class ``cls``.

        A bound method of this core is stored once per core *class* (every instance registers
        the same one); any other callable (a plugin's) is stored on this instance only.
        """
        func = getattr(fn, "__func__", None)
        if func is not None and getattr(fn, "__self__", None) is self:
            type(self)._class_handlers[cls] = func
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
            extra = self._extra_handlers
            g = extra.get(t) if extra is not None else None
            if g is None:
                self.stats["dropped_unknown"] += 1
                return
            self.prox.heard(src)
            g(src, msg)
        except Exception:  # malformed content must never crash the node's loop
            self.stats["dropped_malformed"] += 1
            log.debug("dropped malformed %s from %r", t.__name__, src, exc_info=True)

    def stop(self) -> None:
        """Stop answering and cancel timers the base owns (subclasses extend)."""
        self.stopped = True
        self.prox.stop()
        for hop in self._pending.values():
            if hop.timer is not None:
                hop.timer.cancel()
        self._pending.clear()

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

    # ------------------------------------------------------------ KBR API (shared part)
    def register(self, name: str, app: Application) -> None:
        """Register an application under ``name`` (unique per node)."""
        if name in self.apps:
            raise DuplicateApplicationError(f"application {name!r} is already registered")
        self.apps[name] = app

    def unregister(self, name: str) -> None:
        """Remove the application registered under ``name``; a no-op if there is none."""
        self.apps.pop(name, None)

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
    def _visit(self, msg: RouteMsg) -> tuple[NodeHandle, ...] | None:
        """Record that ``msg`` is being handled here at its hop count.

        Returns None for a duplicate (already delivered here, or handled at as many hops or
        more: a retransmission), else the next hops already tried for it (empty on a first
        visit; not empty when it came back round a loop).
        """
        k = (msg.origin.id, msg.msg_id)
        seen = self._seen
        if seen is None:
            seen = self._seen = OrderedDict()
        prev = seen.get(k)
        if prev is None:
            seen[k] = (msg.hops,)
            if len(seen) > self.kbr_config.dedupe_window:
                seen.popitem(last=False)
            return ()
        if prev[0] == _DELIVERED or msg.hops <= prev[0]:
            return None
        seen[k] = (msg.hops, *prev[1:])
        seen.move_to_end(k)
        return prev[1:]

    def _record(self, msg: RouteMsg, nh: NodeHandle | None) -> None:
        """Remember the next hop ``msg`` left by (None: it was delivered here)."""
        seen = self._seen
        if seen is None:
            return
        k = (msg.origin.id, msg.msg_id)
        prev = seen.get(k)
        if prev is None:
            return  # aged out of the window meanwhile: nothing to add to
        if nh is None:
            seen[k] = (_DELIVERED,)
        elif nh not in prev[1:]:
            tried = prev[1:] if len(prev) <= _MAX_TRIED else prev[2:]
            seen[k] = (prev[0], *tried, nh)

    def _step(
        self,
        msg: RouteMsg,
        exclude: set[NodeHandle] | None,
        hint: NodeHandle | None = None,
        reroutes: int = 0,
        prev: NodeHandle | None = None,
    ) -> None:
        nh: NodeHandle | None
        if hint is not None and hint != self.handle and hint not in self.prox.bad:
            nh = hint
        else:
            nh = self.next_hop(msg.key, exclude)
        app = self.apps.get(msg.app)
        if app is None:
            self.stats["dropped_unknown_app"] += 1
            return
        if (
            nh is None
            and prev is not None
            and not self.ready
            and self.kbr_config.bounce_unready
            and self.is_joining()
        ):
            # Not active yet: not responsible for any key. Back to the previous hop, which sees
            # the message return with more hops and routes it on avoiding us (``_on_route``).
            self.stats["bounced_unready"] += 1
            nh = prev
        if nh is None:
            self._record(msg, None)
            self.stats["delivered"] += 1
            app.deliver(msg.key, msg.payload, msg.origin)
            return
        nh2 = app.forward(msg.key, msg.payload, nh)
        if nh2 is None:
            self.stats["stopped_by_app"] += 1
            return
        if nh2 == self.handle:
            self._record(msg, None)
            self.stats["delivered"] += 1
            app.deliver(msg.key, msg.payload, msg.origin)
            return
        self._record(msg, nh2)
        out = RouteMsg(msg.key, msg.app, msg.payload, msg.origin, msg.msg_id, msg.hops + 1)
        self.stats["forwarded"] += 1
        if not self.kbr_config.hop_acks:
            self.runtime.send(nh2, out)
            return
        hop = _Hop(out, nh2, exclude)
        hop.reroutes = reroutes
        old = self._pending.pop(out.msg_id, None)
        if old is not None and old.timer is not None:
            old.timer.cancel()
        self._pending[out.msg_id] = hop
        self._send_hop(hop)

    def _send_hop(self, hop: _Hop) -> None:
        rt = self.runtime
        hop.sent_at = rt.now()
        prox = self.prox
        timeout = min(prox.config.max_rto_s, prox.rto(hop.nh) * (2**hop.attempt))
        factor = self.kbr_config.hop_timeout_srtt_factor
        if hop.attempt == 0 and factor > 0:
            srtt = prox.srtt(hop.nh)
            if srtt is not None:
                timeout = min(timeout, factor * srtt + prox.config.min_rto_s)
        mid = hop.msg.msg_id
        hop.timer = rt.call_later(timeout, lambda: self._hop_timeout(mid, hop))
        rt.send(hop.nh, hop.msg)

    def _hop_timeout(self, mid: int, hop: _Hop) -> None:
        """No ack from the next hop within its RTO (MSPastry §3.2).

        The hop is suspected at once (which starts a liveness probe) and, when the overlay
        knows another next hop, the message goes that way now instead of waiting for
        retransmissions to back off: a retransmission to a crashed node only delays, and a
        holder that waits 1 + 2 + 4 s is a holder that may crash meanwhile. If the silent hop
        is the only way on (no other next hop: delivering here instead would be wrong if it is
        alive), the message is retransmitted to it with back-off until it acks or its probe
        declares it DEAD (``hop_retries`` at most).
        """
        if self._pending.get(mid) is not hop or self.stopped:
            return
        cfg = self.kbr_config
        prox = self.prox
        prox.suspect(hop.nh)
        exclude = set(hop.exclude) if hop.exclude else set()
        exclude.add(hop.nh)
        if (
            hop.attempt < cfg.hop_retries
            and prox.state(hop.nh) is not Liveness.DEAD
            and (hop.reroutes >= cfg.max_reroutes or self.next_hop(hop.msg.key, exclude) is None)
        ):
            hop.attempt += 1
            self.stats["hop_retransmits"] += 1
            self._send_hop(hop)
            return
        del self._pending[mid]
        if hop.held is not None:
            self.stats["route_copies_dropped"] += 1  # the reroute below carries the message
        if hop.reroutes >= cfg.max_reroutes:
            self.stats["route_dropped"] += 1
            log.debug("route %x dropped after %d reroutes", mid, hop.reroutes)
            return
        self.stats["reroutes"] += 1
        prev = hop.msg
        back = RouteMsg(prev.key, prev.app, prev.payload, prev.origin, prev.msg_id, prev.hops - 1)
        self._step(back, exclude, None, hop.reroutes + 1)

    def _on_route_ack(self, src: NodeHandle, msg: RouteAck) -> None:
        hop = self._pending.get(msg.msg_id)
        if hop is None or hop.nh != src:
            return
        del self._pending[msg.msg_id]
        if hop.timer is not None:
            hop.timer.cancel()
        if hop.attempt == 0:  # Karn's rule: only unambiguous samples
            self.prox.sample(src, self.runtime.now() - hop.sent_at)
        if hop.held is not None:  # the next hop took it on: the copy that came back looped
            self._route_loop(hop.held[1], hop.held[0])

    def _ack_hop(self, src: NodeHandle, msg: RouteMsg) -> None:
        """Acknowledge a routed message to the hop it came from (MSPastry §3.2)."""
        if self.kbr_config.hop_acks and src != self.handle:
            self.runtime.send(src, RouteAck(msg.msg_id))

    def _on_route(self, src: NodeHandle, msg: RouteMsg) -> None:
        self._ack_hop(src, msg)
        tried = self._visit(msg)
        if tried is None:
            self.stats["duplicates"] += 1
            return
        self._learn(src)
        if msg.hops > self.kbr_config.max_hops:
            self.stats["ttl_expired"] += 1
            return
        if not tried:
            self._step(msg, None, prev=src)
            return
        hop = self._pending.get(msg.msg_id) if self.kbr_config.hold_returning_copies else None
        if hop is not None and hop.msg.origin.id == msg.origin.id:
            # A copy came back while our own next hop has not acknowledged yet. Under loss that
            # is mostly the previous hop's reroute (our ack to it was lost), not a loop: routing
            # it on *avoiding* the unacknowledged hop delivered it here in place of a closest
            # node that was merely lossy (the ``root_excluded`` incorrect deliveries of
            # ``bench churn`` at 1-5 % loss). So it waits: the hop's ack shows the next hop
            # took the message on, and the copy is then routed as a loop; a timeout hands the
            # message to the retransmission or reroute, and the copy is dropped.
            self.stats["route_copies_held"] += 1
            hop.held = (src, msg)
            return
        self._route_loop(msg, src)

    def _route_loop(self, msg: RouteMsg, src: NodeHandle) -> None:
        """``msg`` came back with more hops and no hop of ours is pending for it."""
        seen = self._seen
        prev = seen.get((msg.origin.id, msg.msg_id)) if seen is not None else None
        if prev is None or prev[0] == _DELIVERED:
            return
        tried = prev[1:]
        # Back round a loop: leave by a next hop not tried yet. When every closer node this node
        # knows has been tried and led back here, this node is the closest one reachable and
        # delivers (as when every closer node is suspected); max_hops bounds the whole walk.
        self.stats["route_loops"] += 1
        self._step(msg, set(tried), prev=src)

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
    DirectMsg: KbrCore._on_direct,
    Ping: KbrCore._on_ping,
    Pong: KbrCore._on_pong,
    Leave: KbrCore._on_leave,
}
