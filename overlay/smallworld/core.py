"""SmallWorldCore: the Brunet/Symphony small-world ring behind the common KBR API.

Theory of operation (PonD §2.2; Kleinberg 2000; Symphony, Manku et al. 2003;
Brunet's StructuredNode with its near and shortcut connection overlords):

* **State.** A :class:`~overlay.smallworld.connections.ConnectionTable`: ``near_per_side`` near
  connections on each side of the ring plus ``ceil(0.5·log2 N̂)`` own shortcuts (and whatever
  shortcuts other nodes made to us — connections are bidirectional, as Brunet edges are).
  N̂ is estimated from the spread of the near connections (``estimate.py``).
* **Routing** is greedy and recursive: forward to the connection strictly closest to the key
  (ring distance, ties to the smaller id — :func:`overlay.ids.closer`), deliver when no live
  connection is closer than this node. The shared :class:`~overlay.kbr.KbrCore` engine acks
  every hop, retransmits, suspects a silent next hop and reroutes through the next-best
  connection, so a dead link is routed around, never silently dropped. Each node enforces the
  TTL (ln N̂)^3 on the ``hops`` count of every routed message it receives.
* **Linking** (``messages.py``, ``linking.py``): connect requests are KBR-routed payloads of
  the internal application :data:`~overlay.smallworld.messages.LINK_APP`; they go to the node
  closest to a target *other than the requester*. A join routes one to the joiner's own id
  (``join.py``); a shortcut routes one to a Kleinberg-drawn target; near repair walks
  neighbour-of-neighbour queries (``maintenance.py``).
  A suspected connection holds no slot of the near window (``connections.py``): under churn the
  live node beyond crashed neighbours is linked as soon as it is heard of.
* **Stabilization** (``exchange.py``): every node sends its near window to its near neighbours
  whenever it changes, and every 20 s to the closest one on each side; they link what they were
  missing and answer with what the sender is missing. This is what makes concurrent joins
  converge, and the lists are the keep-alive of the closest neighbours.
* **Maintenance** (``maintenance.py``) runs on one timer per node: top up / trim shortcuts,
  the periodic near-list round, ping connections that stayed silent (closest neighbours 22 s,
  outer near 60 s, shortcuts 120 s), a repair walk every 300 s as a safety net. Failures come
  from the proximity failure detector (ALIVE → SUSPECTED → DEAD) through :meth:`_on_peer_dead`.
* **Routing under churn** (``routing.py``): a joining node holds what reaches it until it is
  ready, a second copy made by a lost ack is routed greedily again instead of as a loop, and
  messages in flight go to an avoided next hop that proves alive, or on from one declared
  dead, at once. A message retransmitted to a suspected next hop for want of any live one
  closer to its key asks the nearest live node on that side for the nodes beyond the gap
  (``exchange.ask_past_gap``) and goes through the first one linked.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from overlay.handle import Address, NodeHandle
from overlay.ids import HALF_RING, NodeId
from overlay.ids import ring_distance as _rd
from overlay.kbr import KbrCore, RouteAck, RouteMsg
from overlay.kbr_pending import Hop
from overlay.runtime import Runtime, Timer
from overlay.smallworld import churn as _churn
from overlay.smallworld import exchange as _xch
from overlay.smallworld import join as _join
from overlay.smallworld import linking as _lnk
from overlay.smallworld import maintenance as _mnt
from overlay.smallworld import offers as _off
from overlay.smallworld import routing as _rt
from overlay.smallworld.config import SmallWorldConfig
from overlay.smallworld.connections import ConnectionTable
from overlay.smallworld.estimate import desired_shortcuts, ttl_hops
from overlay.smallworld.messages import (
    JOIN,
    KINDS,
    LEFT,
    LINK_APP,
    NEAR,
    RIGHT,
    SHORTCUT,
    ConnectReply,
    ConnectRequest,
    JoinRequest,
    Link,
    LinkAck,
    NearList,
    NearQuery,
    NearReply,
    Unlink,
)
from overlay.smallworld.state import JoinState, Offers
from overlay.smallworld.validate import (
    MalformedInput,
    check_handle,
    check_int,
)

log = logging.getLogger(__name__)

_DEFAULT_CONFIG = SmallWorldConfig()
_NO_SEEDS: tuple[Address, ...] = ()
#: routed messages a node holds at most while it cannot tell it is their root
_MAX_UNSURE_HELD = 64
#: a side that lost a near neighbour counts as unsure this long at most (a repair walk that
#: finds nobody new leaves it so: the side may simply have fewer nodes than the window)
_GAP_MEMORY_S = 60.0


class SmallWorldCore(KbrCore):
    """Sans-io small-world ring node (Brunet/Symphony) implementing the KBR API."""

    overlay_name = "smallworld"
    overlay_apps = frozenset({LINK_APP})
    _sw_handlers_installed: ClassVar[bool] = False

    def __init__(
        self,
        runtime: Runtime,
        handle: NodeHandle,
        config: SmallWorldConfig | None = None,
    ) -> None:
        cfg = config if config is not None else _DEFAULT_CONFIG
        super().__init__(runtime, handle, cfg.kbr, cfg.proximity)
        self.config = cfg
        self.table = ConnectionTable(handle.id, cfg.near_per_side)
        self._timer: Timer | None = None
        self.join_state: JoinState | None = None
        self.seeds = _NO_SEEDS
        self.gone: dict[NodeHandle, float] | None = None
        self.shortcut_pending = 0
        self.shortcut_deadline = 0.0
        self.started_at = runtime.now()
        self.next_stabilize = 0.0
        self.next_exchange = 0.0
        #: hearsay near candidates sent a Link, awaiting its LinkAck (created on first use)
        self.proposed: dict[NodeHandle, tuple[int, float]] | None = None
        #: last NearList stamp of each connection and when it came (created on first use)
        self.list_stamps: dict[NodeHandle, tuple[float, float]] | None = None
        #: pending push of a changed near window, and who left the window meanwhile
        self._push_timer: Timer | None = None
        self._push_extra: set[NodeHandle] | None = None
        #: the near window as it was when the pending push was scheduled
        self._push_before: tuple[NodeHandle, ...] | None = None
        #: tokens of our own shortcut requests still awaiting a reply (created on first use:
        #: a 10^6-node ring pays nothing for it until maintenance runs)
        self.shortcut_tokens: set[int] | None = None
        #: shortcut candidates offered a Link, and the replacements of our own shortcuts
        #: (``offers.py``; created on first use)
        self.shortcut_offers: Offers | None = None
        self.shortcut_alts: dict[NodeHandle, tuple[NodeHandle, ...]] | None = None
        #: per side (True: clockwise), when a routed message that found no live way on last
        #: asked past the gap (``exchange.ask_past_gap``; created on first use)
        self.gap_asked: dict[bool, float] | None = None
        #: routed messages held because we could not tell we are their root
        #: (``unsure_root_hold_s``): (origin id, msg id) -> step arguments; created on use
        self._unsure_held: dict[tuple[int, int], tuple[Any, ...]] | None = None
        #: the message being stepped again after its hold (it is not held twice)
        self._unsure_released: tuple[int, int] | None = None
        #: per side, when a near neighbour there was declared dead and the side has not had
        #: ``near_per_side`` live near connections since (created on first use)
        self._gap_since: dict[int, float] | None = None
        #: churn estimate ``[connection-seconds, deaths, as of]`` that sets the width of the
        #: near window (``churn.py``); created at the first connection death
        self.churn: list[float] | None = None
        if not type(self).__dict__.get("_sw_handlers_installed", False):
            self._install_handlers()

    def _install_handlers(self) -> None:
        """Register our receive handlers (KbrCore keeps them per class, not per node)."""
        self.add_handler(JoinRequest, self._on_join_request)
        self.add_handler(ConnectReply, self._on_connect_reply)
        self.add_handler(Link, self._on_link)
        self.add_handler(LinkAck, self._on_link_ack)
        self.add_handler(Unlink, self._on_unlink)
        self.add_handler(NearQuery, self._on_near_query)
        self.add_handler(NearReply, self._on_near_reply)
        self.add_handler(NearList, self._on_near_list)
        type(self)._sw_handlers_installed = True

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Arm the maintenance tick (desynchronised: first tick at a random phase)."""
        if self.stopped or self._timer is not None or not self.config.maintenance_enabled:
            return
        now = self.started_at = self.runtime.now()
        rng = self.runtime.rng
        # one draw places both periodic rounds (nodes are desynchronised from each other; a
        # node's two rounds need not be), so starting a node costs the shared rng two draws
        phase = rng.random()
        self.next_stabilize = now + self.config.stabilize_interval_s * phase
        self.next_exchange = now + self.config.near_exchange_s * phase
        first = self.config.maintenance_interval_s * (0.5 + rng.random())
        self._timer = self.runtime.call_later(first, self._tick)

    def stop(self) -> None:
        """Stop answering, cancel the maintenance tick and abandon any join in progress."""
        super().stop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._push_timer is not None:
            self._push_timer.cancel()
            self._push_timer = None
        self._push_extra = None
        self._push_before = None
        self.proposed = None
        self.list_stamps = None
        self.shortcut_offers = None
        self.shortcut_alts = None
        self.gap_asked = None
        if self.join_state is not None:
            _join.cancel(self)

    def join(self, seeds: Sequence[Address], on_done: Callable[[bool], None] | None = None) -> None:
        """Join through ``seeds``; an empty list starts a new ring (ready at once)."""
        _join.begin(self, seeds, on_done)

    def is_joining(self) -> bool:
        """A first join is under way (a rejoin of a ready node is not: it stays responsible)."""
        return self.join_state is not None and not self.ready

    def rejoin(self) -> None:
        """Ask the original seeds again (an isolated node whose connections all failed)."""
        _join.rejoin(self)

    def probe_partition(self, address: Address) -> None:
        """Ask a node we declared dead where we belong (partition healing, maintenance.py)."""
        _join.probe_partition(self, address)

    def mark_built(self, seeds: tuple[Address, ...] = ()) -> None:
        """The oracle installed our table: we are a joined, ready node (nothing was sent).

        ``seeds`` are the bootstrap addresses kept for a rejoin should we ever be isolated.
        """
        self.ready = True
        self.seeds = seeds
        self.started_at = self.runtime.now()
        if self.join_state is not None:
            _join.cancel(self)

    def _tick(self) -> None:
        if self.stopped:
            return
        self._timer = self.runtime.call_later(self.config.maintenance_interval_s, self._tick)
        if self.churn is not None or self.table.near != self.config.near_per_side:
            self._tune_near(0)
        _mnt.tick(self)

    # ------------------------------------------------------------------ size, ttl, shortcuts
    @property
    def n_hat(self) -> float:
        """Current network-size estimate N̂."""
        return self.table.n_hat

    def ttl(self) -> int:
        """The greedy-routing TTL in hops for the current size estimate N̂."""
        return ttl_hops(self.table.n_hat, self.config)

    def desired_shortcuts(self) -> int:
        """How many shortcuts this node should hold for the current size estimate N̂."""
        return desired_shortcuts(self.table.n_hat, self.config)

    def next_token(self) -> int:
        """A fresh random token for a request (replies must echo it: an off-path sender cannot
        guess it, unlike a counter)."""
        return self.runtime.rng.getrandbits(31) | 1

    # ------------------------------------------------------------------ KBR API
    def next_hop(self, key: NodeId, exclude: set[NodeHandle] | None = None) -> NodeHandle | None:
        """Greedy routing over the connection table: the live connection closest to ``key``, or None
        when this node is closer than every one.

        Suspected connections are skipped while another closer one is live; when every closer
        connection is suspected but not yet declared DEAD, the closest of them is the next hop
        all the same (the engine retransmits to it until it acks or its probe ends): under
        loss a suspected node is mostly a live one whose datagram was lost, and delivering
        here in its place was the ``root_suspected`` incorrect delivery."""
        prox = self.prox
        bad = prox.bad
        nh = self.table.next_hop(key, bad, exclude)
        if nh is None and bad:
            dead = {h for h in bad if prox.is_dead(h)}
            if len(dead) < len(bad):
                nh = self.table.next_hop(key, dead, exclude)
        return nh

    def _origin_hedges(self) -> bool:
        """Fresh and spare first hops (``KbrConfig.fresh_first_hop_s``, ``spare_first_hop``)
        only while this node observes short sessions — its near window widened
        (``churn.py``): at 30-minute sessions a peer silent for 20 s has crashed with
        probability 1 %, and the rules would only cost hops (docs/smallworld.md, "Fresh first
        hops", "A spare first hop")."""
        return self._widened()

    def _widened(self) -> bool:
        """Whether this node observes short sessions: its near window is wider than
        ``near_per_side`` (``churn.py``). Fresh and spare first hops and the gap rule follow it."""
        return self.table.near > self.config.near_per_side

    def _live(self) -> list[NodeHandle]:
        bad = self.prox.bad
        if not bad:
            return list(self.table.all)
        return [h for h in self.table.all if h not in bad]

    def local_lookup(self, key: NodeId, n: int) -> list[NodeHandle]:
        """Up to ``n`` live connections strictly closer to ``key`` than this node, best first."""
        mine = _rd(self.id, key)
        cands = [
            h
            for h in self._live()
            if (d := _rd(h.id, key)) < mine or (d == mine and h.id < self.id)
        ]
        return heapq.nsmallest(n, cands, key=lambda h: (_rd(h.id, key), h.id))

    def neighbor_set(self, n: int) -> list[NodeHandle]:
        """Up to ``n`` ring neighbours: the live near window, closest first (the small-world
        counterpart of the Pastry leaf set; shortcuts are not neighbours)."""
        me = self.id
        bad = self.prox.bad
        near = [h for h in self.table.near_nodes() if h not in bad]
        near.sort(key=lambda h: (_rd(h.id, me), h.id))
        return near[:n]

    def replica_set(self, key: NodeId, k: int) -> list[NodeHandle]:
        """Up to ``k`` known nodes (self included) numerically closest to ``key``."""
        cands = [*self._live(), self.handle]
        return heapq.nsmallest(k, cands, key=lambda h: (_rd(h.id, key), h.id))

    def known_in_range(self, begin: NodeId, end: NodeId) -> list[NodeHandle]:
        """Live connections in [begin, end), clockwise from this node (self excluded)."""
        return self.table.in_range(begin, end, self.prox.bad)

    def known_nodes(self) -> list[NodeHandle]:
        """Every connection (near and shortcut)."""
        return list(self.table.all)

    def near_connections(self) -> list[NodeHandle]:
        """The near window (right side closest first, then left side)."""
        return list(self.table.near_nodes())

    def shortcuts(self) -> list[NodeHandle]:
        """Own shortcuts outside the near window (the ones that count towards the target)."""
        return self.table.effective_out()

    # ------------------------------------------------------------------ routing hooks
    def _on_route(self, src: NodeHandle, msg: RouteMsg) -> None:
        if msg.app == LINK_APP:
            self.ensure_link_app()
        if msg.hops > ttl_hops(self.table.n_hat, self.config):
            self.stats["ttl_expired"] += 1
            if self.kbr_config.hop_acks and src != self.handle:
                self.runtime.send(src, RouteAck(msg.msg_id))
            return
        if _rt.parallel_copy(self, src, msg):
            return
        limit = self.config.max_held_while_joining
        if _rt.hold_while_joining(self, self.join_state, limit, src, msg):
            return
        super()._on_route(src, msg)

    def release_held(self, held: list[tuple[NodeHandle, RouteMsg]]) -> None:
        """Route the messages held while the join was linking (it has ended, or failed and is
        starting over): delivered here when we are responsible now, else sent on — or back to
        the previous hop while we are still joining (the engine's loop rule takes it on from
        there). Each is acked a second time, which the previous hop ignores."""
        for src, msg in held:
            if not self.stopped:
                super()._on_route(src, msg)

    def _learn(self, h: NodeHandle) -> None:
        """A node that routed through us: link it if it belongs in our near window."""
        bad = self.prox.bad
        if h.id == self.id or h in bad or h in self.table or not self.table.fits_near(h.id, bad):
            return
        self.link(h, NEAR)

    def _on_peer_dead(self, h: NodeHandle) -> None:
        # the engine has already sent on the messages that waited on ``h`` (kbr_pending.py)
        t = self.table
        if h not in t:
            return
        # before the removal (the table held h for the interval just ended) and before the
        # snapshot below: a width change reports its own window change (_set_near), which a
        # snapshot taken first would report to the applications a second time
        self._tune_near(1)
        was_near = t.is_near(h)
        was_out = h in t.out
        before = self._near_snapshot()
        right = t.right()
        side_id, side = (RIGHT, right) if h in right else (LEFT, t.left())
        t.remove(h)
        self.stats["connections_lost"] += 1
        _mnt.remember_gone(self, h)
        self._near_changed(before)
        if was_near:
            gaps = self._gap_since
            if gaps is None:
                gaps = self._gap_since = {}
            gaps[side_id] = self.runtime.now()
            _mnt.near_lost(self, h, side_id, side)
        if was_out and self.ready:
            if self.config.reuse_shortcuts:
                _off.replace_from_alternates(self, h)
            _mnt.check_shortcuts(self)
        _mnt.check_isolated(self)

    def _tune_near(self, deaths: int) -> None:
        """Fold ``deaths`` connection deaths (and the time since the last update) into the churn
        estimate, and widen or narrow the near window as it asks (``churn.py``)."""
        cfg = self.config
        if cfg.churn_near_per_side <= cfg.near_per_side:
            return
        t = self.table
        now = self.runtime.now()
        est = self.churn = _churn.fold(
            self.churn, now, self.started_at, len(t), deaths, cfg.churn_horizon_s
        )
        k = _churn.wanted_near(est, t.near, cfg)
        if k != t.near:
            self.stats["near_widened" if k > t.near else "near_narrowed"] += 1
            self._set_near(k)

    def _set_near(self, k: int) -> None:
        """Keep ``k`` near connections a side from now on."""
        t = self.table
        old = t.near
        before = self._near_snapshot()
        t.set_near(k)
        self._near_changed(before)
        if k > old:
            # ask every member now for the nodes the wider window misses (they answer from
            # their own tables, exchange.answer): its new outer slots hold whatever connection
            # came next, often a shortcut, until the true neighbours are linked
            if self.ready:
                _xch.push_near(self)
        else:
            self.trim_near()  # the connections that fell out of the narrower window

    def adopt_near(self, k: int) -> None:
        """The node that answered our JOIN keeps ``k`` near connections a side, more than we
        do: take its width while our own churn estimate is too thin to decide
        (``churn.unsure``)."""
        t = self.table
        cfg = self.config
        if k <= t.near or k > cfg.churn_near_per_side or not _churn.unsure(self.churn, cfg):
            return
        self.stats["near_adopted"] += 1
        self._set_near(k)

    def _on_peer_alive(self, h: NodeHandle) -> None:
        """A peer we had given up on spoke again: take it back if it is a near neighbour (the
        engine then sends it the messages that avoid it only because it was silent)."""
        if h not in self.table and self.table.fits_near(h.id, self.prox.bad):
            self.link(h, NEAR)

    def _hop_timeout(self, mid: int, hop: Hop) -> None:
        """The engine's hop timeout; then, if the message is still waiting on the same next hop
        (retransmitted: no live connection is closer to its key, only that suspected one), ask
        for the nodes beyond it on that side now (``exchange.ask_past_gap``)."""
        super()._hop_timeout(mid, hop)
        if self._pending.get(mid) is hop and self.ready and not self.stopped:
            _xch.ask_past_gap(self, hop.msg.key)

    def _hold_delivery(
        self,
        msg: RouteMsg,
        exclude: set[NodeHandle] | None,
        reroutes: int,
        prev: NodeHandle | None,
    ) -> bool:
        """Hold ``msg``, which we would deliver, while we cannot tell we are its key's root
        (:meth:`_unsure_side`): delivering here was the ``root_unknown`` delivery under
        5-minute sessions. We ask past the gap and walk that side; the message is routed
        again once a near connection linked meanwhile makes us sure, or after
        ``unsure_root_hold_s`` (delivered here then if no closer node turned up)."""
        wait = self.config.unsure_root_hold_s
        if wait <= 0 or not self.ready or self.stopped:
            return False
        k = (msg.origin.id, msg.msg_id)
        if k == self._unsure_released:
            return False
        side_id = self._unsure_side(msg.key, exclude)
        if side_id is None:
            return False
        held = self._unsure_held
        if held is None:
            held = self._unsure_held = {}
        if k in held:
            return True  # a second copy: the first waits here already
        if len(held) >= _MAX_UNSURE_HELD:
            return False
        held[k] = (msg, exclude, reroutes, prev)
        self.stats["held_unsure_root"] += 1
        _xch.ask_past_gap(self, int(msg.key))  # at most once per maintenance interval
        if len(held) == 1:  # one walk for the messages held together
            _mnt.walk_near(self, (side_id,), frozenset(exclude or ()))
        self.runtime.call_later(self._unsure_wait(wait), lambda: self._release_unsure(k))
        return True

    def _unsure_wait(self, wait: float) -> float:
        """``unsure_root_hold_s`` (two initial RTOs: a walk's few hops on the transit-stub
        model), on the network's scale where this node scales its RTOs to it
        (``ProximityConfig.network_rto_samples``: live nodes): two RTOs of a never-measured
        peer, never below the initial RTO, as a walk past the gap may cross nodes never
        measured (the floor of ``join._scale_link_wait``). On loopback 1 s: traced there, a
        node that had just lost its neighbour to a crash held a joiner's JOIN request 2 s."""
        scaled = self.prox.wait_on_scale(2.0)
        return wait if scaled is None else min(wait, scaled)

    def _unsure_side(self, key: int, exclude: set[NodeHandle] | None) -> int | None:
        """The side of ``key`` (RIGHT / LEFT) if we cannot tell whether live nodes lie between
        us and it: our nearest connection on that side is suspected, dead or excluded, or
        that side lost a near neighbour and has not had ``near_per_side`` live ones *heard
        from* since (for at most ``_GAP_MEMORY_S``; while the window is widened, live ones
        held are enough); else None.

        Heard from, not merely held: traced at 30-minute sessions with 5 % loss
        (``root_unknown``), a node lost its two nearest neighbours on the key's side within seconds,
        and the two connections that slid into the window in their place — never heard from
        since, past the key, with the root between — cleared the gap's memory at once, so the
        node delivered as if sure (docs/smallworld.md, "A gap closed by neighbours heard from")."""
        t = self.table
        right = t.cw(int(key)) <= HALF_RING
        side_id = RIGHT if right else LEFT
        side = t.right() if right else t.left()
        prox = self.prox
        bad = prox.bad
        live = [h for h in side if h not in bad and not (exclude and h in exclude)]
        gaps = self._gap_since
        since = gaps.get(side_id) if gaps is not None else None
        if gaps is not None and since is not None:
            # widened: gaps are open most of the time at short sessions, and waiting for the
            # slid-in ones to be heard held 9 times as many messages and cost 2.5 s of latency
            # p99 at 5-minute sessions; held connections fill the side, as before
            widened = self._widened()
            heard = len(live) if widened else sum(prox.heard_since(h, since) for h in live)
            if heard >= t.near or self.runtime.now() - since > _GAP_MEMORY_S:
                del gaps[side_id]
                since = None
        if (side and side[0] not in live) or since is not None:
            return side_id
        return None

    def _release_unsure(self, k: tuple[int, int] | None = None) -> None:
        """Route held message ``k`` again, its time being up; with None (a near connection was
        linked), every held message that now has a way on or that we are no longer unsure of."""
        held = self._unsure_held
        if not held or self.stopped:
            return
        keys = list(held) if k is None else [k]
        for key in keys:
            item = held.get(key)
            if item is None:
                continue
            msg, exclude, reroutes, prev = item
            if (
                k is None
                and self.next_hop(msg.key, exclude) is None
                and self._unsure_side(msg.key, exclude) is not None
            ):
                continue  # no way on yet, and still unsure: it waits for its time
            del held[key]
            self._unsure_released = key
            try:
                self._step(msg, exclude, None, reroutes, prev)
            finally:
                self._unsure_released = None
        if not held:
            self._unsure_held = None

    def _reroute_past_suspected(self) -> None:
        """A connection was added: each message retransmitted to a suspected next hop for want
        of another way on goes through the new one now if it is closer to the key, instead of
        waiting for that hop's verdict (and, if it is dead, being delivered here in its place:
        the ``root_unknown`` deliveries under 5-minute sessions, docs/smallworld.md)."""
        bad = self.prox.bad
        pending = self._pending
        if not bad or not pending:
            return
        for mid, hop in [(m, x) for m, x in pending.items() if x.nh in bad]:
            if pending.get(mid) is not hop:
                continue
            exclude = set(hop.exclude) if hop.exclude else set()
            exclude.add(hop.nh)
            if self.next_hop(hop.msg.key, exclude) is None:
                continue
            if hop.timer is not None:
                hop.timer.cancel()
            self.stats["reroutes_past_suspected"] += 1
            super()._hop_timeout(mid, hop)

    # ------------------------------------------------------------------ connection changes
    def ensure_link_app(self) -> None:
        """Register the internal link application (carries ConnectRequest) if it is missing."""
        if LINK_APP not in self.apps:
            # its requests are retried end to end (``LinkApp.end_to_end``: a join asks again, a
            # missing shortcut is asked for again on a later tick), so ``register`` exempts them
            # from custody copies and HandedOff notices (kbr_custody.py). Measured with the
            # churn-following window: docs/smallworld.md, "Connect requests without custody".
            self.register(LINK_APP, _lnk.LinkApp(self))

    def _has_user_apps(self) -> bool:
        apps = self.apps
        return bool(apps) and not (len(apps) == 1 and LINK_APP in apps)

    def _near_snapshot(self) -> tuple[NodeHandle, ...]:
        return self.table.near_nodes()

    def _near_changed(self, before: tuple[NodeHandle, ...]) -> None:
        """React to near-window changes since ``before``: KBR ``update`` upcalls, and a push of
        the new window to the near neighbours (and to those that left it, if alive: they learn
        who displaced them)."""
        self._reroute_past_suspected()
        after = self.table.near_nodes()
        if after == before:
            return
        if self._unsure_held and any(h not in before for h in after):
            self._release_unsure()
        gone = [h for h in before if h not in after]
        new = [h for h in after if h not in before]
        if self._has_user_apps():
            for h in gone:
                self.notify_update(h, False)
            for h in new:
                self.notify_update(h, True)
        if self.ready:
            _xch.probe_stale(self, new)
        self._schedule_push(gone, before)

    def _schedule_push(self, gone: Sequence[NodeHandle], before: tuple[NodeHandle, ...]) -> None:
        if self.stopped:
            return
        if self._push_timer is None:
            self._push_before = before
        bad = self.prox.bad
        extra = [h for h in gone if h not in bad]
        if extra:
            if self._push_extra is None:
                self._push_extra = set()
            self._push_extra.update(extra)
        if self._push_timer is None:
            self._push_timer = self.runtime.call_later(
                self.config.near_push_delay_s, self._push_window
            )

    def _push_window(self) -> None:
        self._push_timer = None
        extra = self._push_extra
        before = self._push_before
        self._push_extra = self._push_before = None
        if self.stopped:
            return
        self.stats["near_pushes"] += 1
        _xch.push_near(self, extra, before=before)

    def link(self, h: NodeHandle, kind: int, token: int = 0) -> bool:
        """Add ``h`` as a connection, tell it (Link), trim what it pushed out. False if known."""
        if h.id == self.id or h in self.table:
            return False
        before = self._near_snapshot()
        self.table.add(h)
        self.runtime.send(h, Link(kind, token))
        self.stats["links_made"] += 1
        self.trim_near()
        self._near_changed(before)
        return True

    def trim_near(self) -> None:
        """Drop surplus connections (outside the near window, no shortcut role), without an
        Unlink: it would change nothing at the far end. A surplus connection is a near one
        on neither side's shortcut list, pushed out of our window by nodes between us and it;
        the far end either holds us in its own window still (it has not heard of those nodes
        yet, and an Unlink leaves a needed connection alone) or has dropped us itself when it
        linked them. Under 5-minute sessions these Unlinks were 0.04 msg/s/node."""
        t = self.table
        for h in t.surplus(self.prox.bad):
            if t.remove(h):
                self.stats["links_trimmed"] += 1
                self.prox.forget(h)

    def drop(self, h: NodeHandle, kind: int) -> None:
        """Remove ``h`` from the table, tell it (Unlink), forget its liveness state."""
        if self.table.remove(h):
            self.runtime.send(h, Unlink(kind))
            self.stats["links_trimmed"] += 1
            self.prox.forget(h)

    def consider_near(self, cands: Sequence[NodeHandle], token: int = 0) -> list[NodeHandle]:
        """Link every candidate that belongs in the near window; return those linked."""
        me = self.id
        bad = self.prox.bad
        t = self.table
        added: list[NodeHandle] = []
        for h in sorted(cands, key=lambda c: (_rd(c.id, me), c.id)):
            if h.id == me or h in bad or h in t or self.prox.is_dead(h):
                continue
            if t.fits_near(h.id, bad) and self.link(h, NEAR, token):
                added.append(h)
        return [h for h in added if h in t]

    def closest_known(
        self, target: int, k: int, exclude_id: int, with_self: bool = True
    ) -> tuple[NodeHandle, ...]:
        """Up to ``k`` live known nodes closest to ``target``, minus the node ``exclude_id``."""
        cands = [h for h in self._live() if h.id != exclude_id]
        if with_self and self.id != exclude_id:
            cands.append(self.handle)
        return tuple(heapq.nsmallest(k, cands, key=lambda h: (_rd(h.id, target), h.id)))

    def send_connect(
        self,
        target: int,
        kind: int,
        token: int,
        origin: NodeHandle | None = None,
        hint: NodeHandle | None = None,
    ) -> None:
        """Route a ConnectRequest for ``origin`` (default: us) to the node closest to target."""
        self.ensure_link_app()
        o = origin if origin is not None else self.handle
        if origin is None and kind == SHORTCUT:
            if self.shortcut_tokens is None:
                self.shortcut_tokens = set()
            self.shortcut_tokens.add(token)
        key = NodeId(target)
        self.stats["connect_requests"] += 1
        self.route(key, LINK_APP, ConnectRequest(o, key, kind, token), hint)

    # ------------------------------------------------------------------ handlers
    def _on_connect_reply(self, src: NodeHandle, m: ConnectReply) -> None:
        responder = check_handle(m.responder)
        cap = self.config.max_reply_nodes
        nodes = _xch.check_nodes(m.nodes, cap)
        token = check_int(m.token)
        if m.kind not in KINDS:
            raise MalformedInput(f"unknown connect kind {m.kind!r}")
        # A reply binds to its sender (the id its key proves on live nodes, at the address we
        # observed) and to a request of ours still pending; anything else is dropped and
        # counted and changes nothing (one forged reply must not replace our neighbours).
        if responder.id != src.id:
            self.stats["connect_reply_forged"] += 1
            return
        if m.kind == SHORTCUT:
            pending = self.shortcut_tokens
            if pending is None or token not in pending:
                self.stats["connect_reply_unsolicited"] += 1
                return
            pending.discard(token)
            self._on_shortcut_reply(src, nodes)
        elif m.kind == JOIN:
            _join.on_reply(self, src, nodes, token, _xch.check_nodes(m.shortcuts, cap))
        else:  # we never route NEAR connect requests: such a reply answers nothing of ours
            self.stats["connect_reply_unsolicited"] += 1

    def _on_shortcut_reply(self, r: NodeHandle, alts: tuple[NodeHandle, ...]) -> None:
        self.shortcut_pending = max(0, self.shortcut_pending - 1)
        t = self.table
        if r.id == self.id or r in t.out:
            return
        if r in t and t.is_near(r):
            # Landed inside our near window: not a shortcut (Brunet does not count it).
            self.stats["shortcut_attempt_wasted"] += 1
            return
        if r not in t and t.fits_near(r.id, self.prox.bad):
            # A near neighbour we did not know: keep it as near, not as a shortcut.
            self.link(r, NEAR)
            self.stats["shortcut_attempt_wasted"] += 1
            return
        before = self._near_snapshot()
        t.add_out(r)
        self._heard_at_link(r)
        # r records us as its in-connection; token 0: r just answered us, no ack needed
        self.runtime.send(r, Link(SHORTCUT, 0))
        self.stats["shortcuts_made"] += 1
        if self.config.reuse_shortcuts:
            _off.remember_alternates(self, r, alts)
        self._near_changed(before)

    def _heard_at_link(self, h: NodeHandle) -> None:
        """A shortcut was just made with a message from ``h``: start its liveness record now.

        Without a record, hearing a peer updates nothing (the proximity table keeps no state
        for passers-by), so a new shortcut counted as silent since our start and both ends
        pinged it on their next tick: two pings and two pongs per shortcut made, which under
        5-minute sessions was a fifth of the probes. A shortcut needs no RTT sample up front
        (its failure costs a reroute, not a wrong delivery): its first keep-alive ping after
        ``shortcut_idle_ping_s`` of silence measures it. Near connections are still pinged at
        once (``maintenance.ping_idle``): their probe timeout bounds failure detection."""
        self.prox.heard(h, start=True)

    def _adopt_shortcut(self, h: NodeHandle, alts: tuple[NodeHandle, ...]) -> None:
        """An offered shortcut acknowledged our Link (so it holds us as an incoming one): keep it
        as an own shortcut unless it now fits the near window or we have enough."""
        t = self.table
        bad = self.prox.bad
        if h in t.out:
            return
        if h in bad or (h not in t and t.fits_near(h.id, bad)) or t.is_near(h):
            self.runtime.send(h, Unlink(SHORTCUT))
            return
        want = desired_shortcuts(t.n_hat, self.config)
        if len(t.effective_out()) >= want:
            self.runtime.send(h, Unlink(SHORTCUT))
            return
        before = self._near_snapshot()
        t.add_out(h)
        self._heard_at_link(h)
        self.stats["shortcuts_taken_over"] += 1
        _off.remember_alternates(self, h, alts)
        self._near_changed(before)

    def _on_join_request(self, src: NodeHandle, m: JoinRequest) -> None:
        origin = check_handle(m.origin)
        token = check_int(m.token)
        if origin.id != src.id or origin.id == self.id:
            raise MalformedInput("join request origin does not match its sender")
        if not self.ready:
            self.stats["join_request_not_ready"] += 1
            return
        self.stats["join_requests"] += 1
        self.send_connect(origin.id, JOIN, token, origin=origin)

    def _on_link(self, src: NodeHandle, m: Link) -> None:
        token = check_int(m.token)
        if m.kind not in KINDS:
            raise MalformedInput(f"unknown link kind {m.kind!r}")
        if src.id == self.id:
            raise MalformedInput("link from our own id")
        t = self.table
        if m.kind == SHORTCUT:
            if src not in t.inc:
                before = self._near_snapshot()
                t.add_in(src)
                self._heard_at_link(src)
                self.stats["links_accepted"] += 1
                self.trim_near()
                self._near_changed(before)
            if token:  # an offer (offers.py): the origin adds us once we answer
                self.runtime.send(src, LinkAck(token))
            return  # a link made after our ConnectReply needs no ack: the origin counts it
        if src not in t:
            before = self._near_snapshot()
            t.add(src)
            self.stats["links_accepted"] += 1
            self.trim_near()
            self._near_changed(before)
        self.runtime.send(src, LinkAck(token))

    def _on_link_ack(self, src: NodeHandle, m: LinkAck) -> None:
        token = check_int(m.token)
        alts = _off.take(self, src, token)
        if alts is not None:
            self._adopt_shortcut(src, alts)
        elif _xch.take_proposal(self, src, token):
            self._adopt(src)
        elif self.join_state is not None:
            _join.on_link_ack(self, src, token)

    def _adopt(self, h: NodeHandle) -> None:
        """A proposed candidate acknowledged our Link (so it holds us): keep it if it still
        belongs in the near window, else tell it we do not."""
        t = self.table
        if h in t:
            return
        bad = self.prox.bad
        if h in bad or not t.fits_near(h.id, bad):
            self.runtime.send(h, Unlink(NEAR))
            return
        before = self._near_snapshot()
        t.add(h)
        self.stats["links_made"] += 1
        self.trim_near()
        self._near_changed(before)

    def _on_unlink(self, src: NodeHandle, m: Unlink) -> None:
        if m.kind not in KINDS:
            raise MalformedInput(f"unknown unlink kind {m.kind!r}")
        t = self.table
        if src not in t:
            return
        before = self._near_snapshot()
        t.discard_in(src)
        if not t.needed(src, self.prox.bad):
            t.remove(src)
            self.prox.forget(src)
        self._near_changed(before)

    def _on_near_query(self, src: NodeHandle, m: NearQuery) -> None:
        _mnt.on_near_query(self, m)

    def _on_near_reply(self, src: NodeHandle, m: NearReply) -> None:
        _mnt.on_near_reply(self, src, m)

    def _on_near_list(self, src: NodeHandle, m: NearList) -> None:
        _xch.receive_list(self, src, m)
