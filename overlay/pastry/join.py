"""The Pastry join: routed join request, row collection, consistent-join readiness, retries.

Theory of operation (Rowstron & Druschel 2001 §2.4 "node arrival"; MSPastry, Castro et al. 2003
§3.1 "consistent join"; FreePastry ``ConsistentJoinProtocol``):

State machine of the joiner, as data (:class:`JoinState`)::

    IDLE --join(seeds)--> LOCATING --near node found--> JOINING --JoinReply--> PROBING
      \\--join([])--> READY      |                            |   --all leaves confirmed--> READY
                                 timeout: retry through the nearest node found (else the
                                 next seed), doubled timeout (join_attempts exhausted → FAILED)

Timeouts: the seed must answer the first discovery request (sent again after
``join_locate_wait_s``, doubled each time) within ``join_timeout_s``; from
then on the discovery is bounded by its own timers (the join timer only backs that bound), and
the routed join gets ``join_timeout_s`` (doubled per attempt) from when it is sent, so a slow
discovery is never restarted from scratch. Within an attempt the routed join's request goes
again, with the same nonce, after ``join_route_wait_s`` (doubled each time) without a reply:
the request and the reply are one datagram each, and either lost cost the whole attempt.

0. LOCATING — nearby-node discovery (``locate.py``; Castro, Druschel, Hu & Rowstron 2002 §4;
   FreePastry ``PNSApplication.getNearest``): X walks from the seed towards the nodes nearest
   to it in the network, probing only candidates the triangle inequality says may be nearer,
   within a probe budget per round and per discovery; every RTT measured there seeds X's
   routing table too, and the nearest nodes found hear of X once it is ready.
1. JOINING: X sends :class:`JoinRequest` to the nearest node found (or, with discovery off, to
   the seed address). That node routes a :class:`JoinPayload` to key X.id over the KBR (per-hop
   acks and reroutes included). Row r of X is sent (:class:`JoinRows`) by the *first* hop that
   shares r digits with X — the nearest such node on the route: the entry node sends rows
   0..l_0 - 1, each hop i rows l_i..l_{i+1} - 1 (``forward`` upcall, l = prefix shared with X),
   and the numerically closest node Z answers :class:`JoinReply` with its leaf set (X's leaf set
   is Z's, shifted by one) and its row l_Z. (R&D §2.4 send every row 0..l_i from every hop; the
   lower rows of later hops only repeat rows X already has, from nodes further away.)
2. PROBING (consistent join): X installs the leaf set and asks every member with
   :class:`LeafSetRequest` (``insert_me``). Each member inserts X and answers its own leaf set;
   members X did not know yet are asked in turn. Requests are retransmitted with RTO back-off;
   a member that never answers is declared dead and dropped.
   Routing-table candidates go through PNS with the hops' RTT hints
   (:meth:`~overlay.pastry.core.PastryCore.offer_hinted`): a candidate for an empty slot is
   installed at once; one competing with an entry is compared on measured minimum RTTs, probing
   at most ``join_probe_budget`` unmeasured nodes per attempt, and only those whose lower bound
   beats the entry. Leaf-set members are measured by the consistent-join exchange itself (a
   request and its reply are a round trip of X's own), so the rows the hops sent during
   JOINING are held until the reply names the members, and then offered without probing the
   members being asked; a hop among them is anchored on its reply rather than a probe.
3. READY once every current leaf-set member has confirmed: X is then in all their leaf sets.
   X announces itself to its routing-table entries — its leaf-set members excepted, whom the
   consistent join's insert-me request told already, and in row 0 only the nearest few — and
   to the nearest nodes its discovery found (:class:`TableAnnounce`, with the RTT it measured:
   FreePastry ``StandardJoinProtocol.broadcastRows``), starts ``join_walks`` row walks, and
   maintenance starts (``tables.py``).

**Row walks** (``tables.py``) ride on the same routed request with ``walk=True``: a ready node
asks one of its nearest entries to route it towards its own id; every hop sends its
:class:`JoinRows`, the last one a :class:`JoinReply` with its row and no leaf set. Rows and
replies whose nonce is an outstanding walk's go to ``core.tables``.

The same routed request with ``rejoin=True`` is the partition healer's probe (FreePastry
``PartitionHandler``): the reply is then merged as gossip (probe, then insert).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from typing import Any

from overlay.errors import OverlayError
from overlay.handle import Address, NodeHandle
from overlay.ids import NodeId, shared_prefix_len
from overlay.kbr import BaseApplication
from overlay.runtime import Timer

from .host import PastryHost
from .locate import NearbyLocator
from .messages import (
    Handles,
    Hints,
    JoinPayload,
    JoinReply,
    JoinRequest,
    JoinRows,
    LeafSetRequest,
    NearbyReply,
    NearbyRequest,
    check_handles,
    check_hints,
)
from .tables import Budget, offer_anchored

log = logging.getLogger(__name__)

JOIN_APP = "_pastry.join"

#: the probing phase may take a few RTO back-offs per member; it gets this many times the
#: current join timeout before the whole join is retried (a safety net only).
_PROBING_SLACK = 6.0


class JoinState(enum.Enum):
    """States of the joiner (see the state machine above)."""

    IDLE = "idle"
    LOCATING = "locating"
    JOINING = "joining"
    PROBING = "probing"
    READY = "ready"
    FAILED = "failed"


_ACTIVE = (JoinState.LOCATING, JoinState.JOINING, JoinState.PROBING)
#: states in which rows bound to our join's nonce are still taken
_ROWS_WANTED = (JoinState.JOINING, JoinState.PROBING, JoinState.READY)


class _JoinApp(BaseApplication):
    """KBR application that carries the routed leg of joins on existing nodes."""

    #: a joiner whose routed join is lost tries again after ``join_timeout_s`` (and a row walk
    #: is best effort): no custody copies or notices for these messages
    end_to_end = True

    def __init__(self, core: PastryHost, joiner: JoinProtocol) -> None:
        self.core = core
        self.joiner = joiner

    def forward(self, key: NodeId, payload: Any, next_hop: NodeHandle) -> NodeHandle | None:
        if not isinstance(payload, JoinPayload):
            return next_hop
        core = self.core
        joiner = payload.joiner
        if next_hop.id == joiner.id:
            return core.handle  # the joiner is already known here: answer in its place
        if not payload.rejoin:  # joins and row walks
            b = core.config.b_bits
            mine = shared_prefix_len(core.id, joiner.id, b)
            nxt = shared_prefix_len(next_hop.id, joiner.id, b)
            rows = core.table.rows_between(mine, max(mine, nxt - 1))
            if rows:
                core.runtime.send(joiner, JoinRows(payload.nonce, rows, core.hints(rows)))
        return next_hop

    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        if isinstance(payload, JoinPayload):
            self.joiner.answer(payload)


class _Ask:
    __slots__ = ("attempt", "first_at", "sent_at", "timer")

    def __init__(self) -> None:
        self.attempt = 0
        self.first_at = 0.0  # when the first request went
        self.sent_at = 0.0
        self.timer: Timer | None = None


class JoinProtocol:
    """The joiner's state machine and the existing nodes' side of the join."""

    def __init__(self, core: PastryHost) -> None:
        self.core = core
        self.app = _JoinApp(core, self)
        self.state = JoinState.IDLE
        self.seeds: list[Address] = []
        self.attempt = 0
        self.nonce = 0
        self.started_at = -1.0
        #: when the root's reply came and the consistent join began asking the members
        self.probing_at = -1.0
        self.ready_at = -1.0
        self._timer: Timer | None = None
        self._on_done: Callable[[bool], None] | None = None
        self._asked: dict[NodeHandle, _Ask] = {}
        self._confirmed: set[NodeHandle] = set()
        self._merging = False
        self._budget = Budget(0, "join_pns_probes")  # PNS probes left in this attempt
        #: rows the hops sent while our join was being routed: offered once the root's reply
        #: tells which of their nodes the consistent join measures anyway (bounded)
        self._held: list[tuple[NodeHandle, Handles, Hints]] = []
        #: rows from unmeasured hops we are asking for their leaf set: offered when the
        #: member's reply, an RTT sample, comes — in place of an anchoring probe
        self._deferred: dict[NodeHandle, list[tuple[Handles, Hints]]] = {}
        #: nearby-node discovery (LOCATING)
        self.locator = NearbyLocator(core, self._located)
        #: the node our join was routed through (the nearest found)
        self.entry: NodeHandle | None = None
        #: the nearest nodes the discovery walk measured (told about us once we are ready)
        self.near_found: list[NodeHandle] = []
        #: nodes an attempt was routed through that produced no reply in time
        self._silent: tuple[NodeHandle, ...] = ()
        #: the routed join's resend timer (JOINING)
        self._again: Timer | None = None

    # ------------------------------------------------------------------ joiner side
    def start_join(self, seeds: Sequence[Address], on_done: Callable[[bool], None] | None) -> None:
        """Begin a join through ``seeds`` (the first node of a ring when empty); ``on_done(ok)``
        reports the outcome. Raises OverlayError if already joining or joined."""
        if self.state in _ACTIVE:
            raise OverlayError("a join is already in progress on this node")
        if self.state is JoinState.READY:
            raise OverlayError("this node has already joined")
        self.seeds = list(seeds)
        self._on_done = on_done
        self.started_at = self.core.runtime.now()
        self.near_found = []
        self._silent = ()
        if not self.seeds:
            self._become_ready()  # the first node of a new ring
            return
        self.attempt = 0
        self._send_request()

    def _send_request(self) -> None:
        core = self.core
        rt = core.runtime
        cfg = core.config
        self._cancel_asks()
        self._stop_again()
        self.locator.reset()
        self._budget = Budget(cfg.join_probe_budget, "join_pns_probes")
        self.nonce = rt.rng.getrandbits(62)
        self._arm(cfg.join_timeout_s * (2**self.attempt))
        via = self._fallback() if self.attempt > 0 else None
        if via is not None:
            # An earlier attempt's discovery measured these nodes: join through the nearest
            # one that has not failed us, with no second discovery and without the seed. Under
            # churn the one seed a joiner has may be gone: 7 of 11 joins that failed in an hour
            # (N = 2 000, 5 % loss) had reached an entry node, got no reply through it, and
            # spent the four retries asking a crashed seed (docs/reliability.md).
            self.state = JoinState.JOINING
            self.entry = via
            core.stats["join_retries_via_found"] += 1
            self._request_join(0)
            return
        if cfg.join_locate_rounds > 0:
            self.state = JoinState.LOCATING
            self.locator.start(self.nonce, self._seed_address())
            return
        self.state = JoinState.JOINING
        self.entry = None  # through an address: no node to hold silent
        self._request_join(0)

    def _request_join(self, resend: int) -> None:
        """JOINING: send the routed join's request to the entry node (None: to this attempt's
        seed address), and again after ``join_route_wait_s`` (doubled each time) while no
        reply came, up to ``join_probe_retries`` times. The entry routes every copy; the
        root's second reply is dropped (``on_join_reply``)."""
        core = self.core
        rt = core.runtime
        core.stats["join_request_resends" if resend else "join_requests"] += 1
        msg = JoinRequest(self.nonce)
        via = self.entry
        if via is None:
            rt.send_address(self._seed_address(), msg)
        else:
            rt.send(via, msg)
        if resend < core.config.join_probe_retries:
            nonce = self.nonce

            def again() -> None:
                self._again = None
                if self.nonce == nonce and self.state is JoinState.JOINING:
                    self._request_join(resend + 1)

            self._again = rt.call_later(core.config.join_route_wait_s * 2**resend, again)

    # ------------------------------------------------------------------ nearby-node discovery
    def on_nearby_request(self, src: NodeHandle, msg: NearbyRequest) -> None:
        """Existing-node side of the discovery (``locate.py``)."""
        self.locator.on_nearby_request(src, msg)

    def on_nearby_reply(self, src: NodeHandle, msg: NearbyReply) -> None:
        """LOCATING: a discovery reply (``locate.py``).

        Once the seed has answered, the discovery is bounded by its own timers; the join timer
        is then only a safety net over that bound, and the routed join gets its own timeout
        when it starts. (One timeout over both retried a quarter of the joins of a 1 000-node
        transit-stub ring while they were still locating — each retry a whole new discovery.)"""
        answered = self.locator.answered
        self.locator.on_nearby_reply(src, msg)
        if not answered and self.locator.answered and self.state is JoinState.LOCATING:
            self._arm(self.locator.max_duration_s() + self.core.config.join_timeout_s)

    def _located(self, target: NodeHandle | None, near: list[NodeHandle]) -> None:
        """The discovery ended: join through the nearest node found."""
        if self.state is not JoinState.LOCATING:
            return
        core = self.core
        self.near_found = near
        self.state = JoinState.JOINING
        self._arm(core.config.join_timeout_s * (2**self.attempt))
        self.entry = target  # None: nothing answered but the seed address itself
        self._request_join(0)

    def _seed_address(self) -> Address:
        """The seed this attempt asks (the seeds in turn, one per attempt)."""
        return self.seeds[self.attempt % len(self.seeds)]

    def _fallback(self) -> NodeHandle | None:
        """The nearest node an earlier discovery measured that no attempt went silent through
        and that is not suspected or dead (None: none is left, ask a seed again)."""
        bad = self.core.prox.bad  # suspected and DEAD peers both
        for h in self.near_found:
            if h not in self._silent and h not in bad:
                return h
        return None

    def _stop_again(self) -> None:
        if self._again is not None:
            self._again.cancel()
            self._again = None

    def _arm(self, delay_s: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        nonce = self.nonce
        self._timer = self.core.runtime.call_later(delay_s, lambda: self._on_timeout(nonce))

    def _on_timeout(self, nonce: int) -> None:
        if nonce != self.nonce or self.state not in _ACTIVE:
            return
        if self.core.stopped:
            return
        if self.state is JoinState.JOINING and self.entry is not None:
            self._silent = (*self._silent, self.entry)  # no reply through it: try another
        self.attempt += 1
        if self.attempt >= self.core.config.join_attempts:
            self.state = JoinState.FAILED
            self._cancel_asks()
            self.locator.reset()
            log.debug("join of %s failed after %d attempts", self.core.id.short(), self.attempt)
            self._finish(False)
            return
        self.core.stats["join_retries"] += 1
        self._send_request()

    def on_join_rows(self, src: NodeHandle, msg: JoinRows) -> None:
        """A hop on the join route sent its rows: offer them to the routing table through PNS."""

        entries = check_handles(msg.entries)
        rtts = check_hints(msg.rtts, len(entries))
        if msg.nonce == self.nonce and self.state in _ROWS_WANTED:
            if self.state is JoinState.JOINING and len(self._held) < self.core.table.nrows:
                # Held until the root's reply: its leaf set names the hops and candidates whose
                # RTT our leaf-set requests measure, which need no probe of their own (a tenth
                # to a quarter of a join's PNS probes went to such a node, transit-stub). A hop
                # sends its rows before it forwards the join, so holding them delays no probe
                # by more than the rest of the route.
                self._held.append((src, entries, rtts))
                return
            self._offer(src, entries, rtts)  # (a hop's rows may trail the root's reply)
            return
        walk = self.core.tables.walk(msg.nonce)
        if walk is not None:
            self.core.tables.offer_walk(src, entries, rtts, walk)
        else:
            self.core.stats["join_rows_unsolicited"] += 1

    def on_join_reply(self, src: NodeHandle, msg: JoinReply) -> None:
        """The root answered our join: offer its leaf set and row and move to PROBING (on a ready
        node, a partition healer's reply, merged as gossip)."""

        leaves = check_handles(msg.leaves)
        entries = check_handles(msg.entries)
        rtts = check_hints(msg.rtts, len(entries))
        core = self.core
        walk = core.tables.walk(msg.nonce)
        if walk is not None:  # the end of one of our row walks
            core.tables.end_walk(msg.nonce)
            core.consider(src, probe=False)
            core.tables.offer_walk(src, entries, rtts, walk)
            return
        if msg.nonce == self.nonce and self.state is JoinState.PROBING:
            # the reply to a resent request (or a second root's): the first one was taken
            core.stats["join_reply_duplicates"] += 1
            return
        if msg.nonce == self.nonce and self.state is JoinState.JOINING:
            self.state = JoinState.PROBING
            self.probing_at = core.runtime.now()
            self._stop_again()
            self._arm(core.config.join_timeout_s * (2**self.attempt) * _PROBING_SLACK)
            cands = [h for h in leaves if h.id != core.id]
            cands.append(src)
            for h in cands:
                # a candidate we hold dead may be alive again (a false verdict under loss):
                # the consistent-join ask settles it, and a timed-out ask removes it for good
                core.add_leaf(h)
            self.on_leaf_changed()  # the members are being asked from here on
            held, self._held = self._held, []
            held.append((src, entries, rtts))
            for hop, ents, hints in held:  # in the order they came, the root's row last
                self._offer(hop, ents, hints)
            for h in cands:  # measured by the consistent-join exchange: no PNS probe
                core.consider(h, probe=False)
            return
        if core.ready:  # a partition healer's probe came back: merge it as gossip
            core.stats["rejoin_replies"] += 1
            core.learn_alive(src)
            core.offer_leaves((*leaves, src), skip_dead=False)

    def _offer(self, src: NodeHandle, entries: Handles, rtts: Hints) -> None:
        """Bounded PNS for the rows a hop of our join's route sent (``offer_anchored``),
        sparing what the consistent join measures anyway: while we ask the leaf set, a hop we
        are asking waits for its reply — an RTT sample — instead of an anchoring probe, and
        the candidates we are asking are not probed (``on_leafset_reply`` offers each to the
        routing table once its RTT is known)."""
        core = self.core
        if self.state is not JoinState.PROBING:
            offer_anchored(core, src, entries, rtts, self._budget)
            return
        if src in self._asked and core.prox.rtt(src) is None:
            waiting = self._deferred.setdefault(src, [])
            if len(waiting) < 2:  # a hop sends its rows and, the root, its reply: no more
                waiting.append((entries, rtts))
                return
        offer_anchored(core, src, entries, rtts, self._budget, spare=self._asked)

    def _offer_deferred(self, m: NodeHandle) -> None:
        """Offer the rows that waited for ``m``'s leaf-set reply (or its death)."""
        for entries, rtts in self._deferred.pop(m, ()):
            self._offer(m, entries, rtts)

    def _ask(self, m: NodeHandle) -> None:
        ask = _Ask()
        self._asked[m] = ask
        ask.first_at = self.core.runtime.now()
        self._send_ask(m, ask)

    def _send_ask(self, m: NodeHandle, ask: _Ask) -> None:
        rt = self.core.runtime
        prox = self.core.prox
        ask.sent_at = rt.now()
        timeout = min(prox.config.max_rto_s, prox.rto(m) * (2**ask.attempt))
        ask.timer = rt.call_later(timeout, lambda: self._ask_timeout(m, ask))
        rt.send(m, LeafSetRequest(self.nonce, insert_me=True))

    def _ask_timeout(self, m: NodeHandle, ask: _Ask) -> None:
        if self._asked.get(m) is not ask or self.core.stopped:
            return
        if ask.attempt < self.core.config.join_probe_retries:
            ask.attempt += 1
            self._send_ask(m, ask)
            return
        # a member never sampled was asked on the scale of the RTTs we have measured: as a
        # probe's verdict on such a peer, the drop waits the initial RTO from the first
        # request, within which any live member answers (``Proximity.verdict_wait``)
        wait = self.core.prox.verdict_wait(m, ask.first_at)
        if wait > 1e-9:
            ask.timer = self.core.runtime.call_later(wait, lambda: self._ask_timeout(m, ask))
            return
        del self._asked[m]
        # → core._on_peer_dead → on_dead / on_leaf_changed; a peer already marked dead is
        # removed too (declare_dead alone would do nothing and the join would wait for it)
        self.core.drop_dead(m)

    def on_leafset_reply(self, src: NodeHandle, nonce: int, leaves: tuple[NodeHandle, ...]) -> bool:
        """A member answered our consistent-join request; False if this is not ours."""
        if self.state is not JoinState.PROBING or nonce != self.nonce:
            return False
        core = self.core
        ask = self._asked.pop(src, None)
        if ask is not None:
            if ask.timer is not None:
                ask.timer.cancel()
            if ask.attempt == 0:  # Karn's rule
                core.prox.sample(src, core.runtime.now() - ask.sent_at)
        self._confirmed.add(src)
        core.consider(src, probe=False)  # its RTT is known now: PNS without a probe
        rows = self._deferred.pop(src, None)
        prox = core.prox
        self._merging = True
        try:
            core.add_leaf(src)
            for c in leaves:
                if c.id != core.id and c not in core.leaf.members and not prox.is_dead(c):
                    core.add_leaf(c)
                if c not in core.table.members:
                    core.consider(c, probe=False)
        finally:
            self._merging = False
        self.on_leaf_changed()  # (new members are asked: spared by the rows below)
        for entries, rtts in rows or ():
            self._offer(src, entries, rtts)  # anchored on this reply's RTT sample
        return True

    def on_leaf_changed(self) -> None:
        """Ask every new member; become ready once all of them confirmed."""
        if self.state is not JoinState.PROBING:
            return
        members = self.core.leaf.members
        for m in self.core.leaf.nodes():  # a tuple: deterministic order (sets hash per run)
            if m not in self._asked and m not in self._confirmed:
                self._ask(m)
        if self._merging or not members:
            return  # everyone we knew died: the join timer will retry
        if members <= self._confirmed:
            self._become_ready()

    def on_dead(self, h: NodeHandle) -> None:
        """``h`` was declared dead: stop waiting for its confirmation and recheck readiness."""
        ask = self._asked.pop(h, None)
        if ask is not None and ask.timer is not None:
            ask.timer.cancel()
        self._confirmed.discard(h)
        self.on_leaf_changed()
        self._offer_deferred(h)  # its rows still name candidates (unbounded by its RTT)

    def _become_ready(self) -> None:
        core = self.core
        self.state = JoinState.READY
        core.ready = True
        self.ready_at = core.runtime.now()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # rows still waiting for a reply (from a hop that left the leaf set before it
        # answered) are offered as any others now (READY: anchored by a probe)
        for hop in list(self._deferred):
            self._offer_deferred(hop)
        self._cancel_asks()
        core.maint.on_ready()
        self._finish(True)

    def _finish(self, ok: bool) -> None:
        cb, self._on_done = self._on_done, None
        if cb is not None:
            cb(ok)

    def _cancel_asks(self) -> None:
        for ask in self._asked.values():
            if ask.timer is not None:
                ask.timer.cancel()
        self._asked.clear()
        self._confirmed.clear()
        self._held.clear()
        self._deferred.clear()

    def stop(self) -> None:
        """Cancel the join timer, pending leaf-set requests and nearby-node discovery."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._stop_again()
        self._cancel_asks()
        self.locator.reset()

    def mark_ready(self) -> None:
        """Oracle build: the steady state was installed directly."""
        self.state = JoinState.READY
        self.core.ready = True
        self.ready_at = self.core.runtime.now()

    # ------------------------------------------------------------------ existing-node side
    def on_join_request(self, src: NodeHandle, msg: JoinRequest) -> None:
        """On an existing node: a joiner asks us to route its join (refused until we are ready)."""
        core = self.core
        if not core.ready:
            core.stats["join_refused_not_ready"] += 1
            return
        if src.id == core.id:
            return
        walk = bool(msg.walk) and not msg.rejoin
        payload = JoinPayload(src, msg.nonce, bool(msg.rejoin), walk)
        core.stats["walks_routed" if walk else "join_routed"] += 1
        if not msg.rejoin:  # the entry node contributes the rows below its own level
            mine = shared_prefix_len(core.id, src.id, core.config.b_bits)
            rows = core.table.rows_between(0, mine - 1)
            if rows:
                core.runtime.send(src, JoinRows(msg.nonce, rows, core.hints(rows)))
        core.route(src.id, JOIN_APP, payload)

    def answer(self, payload: JoinPayload) -> None:
        """We are the numerically closest node to the joiner's id: send it our state."""
        core = self.core
        joiner = payload.joiner
        if joiner.id == core.id:
            return
        if payload.rejoin:
            entries: tuple[NodeHandle, ...] = ()
        else:
            last = shared_prefix_len(core.id, joiner.id, core.config.b_bits)
            entries = core.table.rows_between(last, last)
        leaves = () if payload.walk else core.leaf.nodes()  # a walk only wants rows
        reply = JoinReply(payload.nonce, leaves, entries, core.hints(entries))
        core.runtime.send(joiner, reply)
        if payload.rejoin:
            core.offer_leaves((joiner,), skip_dead=False)
