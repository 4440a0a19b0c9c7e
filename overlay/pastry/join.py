"""The Pastry join: routed join request, row collection, consistent-join readiness, retries.

Theory of operation (Rowstron & Druschel 2001 §2.4 "node arrival"; MSPastry, Castro et al. 2003
§3.1 "consistent join"; FreePastry ``ConsistentJoinProtocol``):

State machine of the joiner, as data (:class:`JoinState`)::

    IDLE --join(seeds)--> LOCATING --near node found--> JOINING --JoinReply--> PROBING
      \\--join([])--> READY      |                            |   --all leaves confirmed--> READY
                                 timeout: retry the next seed, doubled timeout
                                 (join_attempts exhausted → FAILED)

0. LOCATING — nearby-node discovery (Castro, Druschel, Hu & Rowstron 2002, "Exploiting network
   proximity in peer-to-peer overlay networks" §4; FreePastry ``PNSApplication.getNearest``).
   Proximity neighbour selection only pays if the join starts *near the joiner in the network*:
   row i of X is taken from hop i of the join route, and hop 0's row 0 is near hop 0. So X first
   asks the seed *address* for its leaf set (:class:`NearbyRequest` row -1; leaf sets are spread
   over the whole network) and probes the members, then asks the nearest node found for its
   rows 0-2 with its RTTs to them (hints) and probes those the triangle inequality says may be
   nearer (each request and its reply are a round trip of X's own, so the replier's RTT is a
   sample without a probe, and it turns even the seed's hints into bounds), and so on from the
   nearest node not asked yet, until two rounds in a row found no nearer node or
   ``join_locate_rounds`` requests were spent (:meth:`JoinProtocol._loc_step`).
   Each round waits at most ``join_locate_wait_s`` for the pongs; every RTT measured here seeds
   X's routing table too, and the nearest nodes found hear of X once it is ready.
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
   beats the entry (leaf-set members are measured by the consistent-join exchange itself).
3. READY once every current leaf-set member has confirmed: X is then in all their leaf sets.
   X announces itself to its routing-table entries and to the nearest nodes its discovery found
   (:class:`TableAnnounce`, with the RTT it measured and its row the receiver belongs to:
   FreePastry ``StandardJoinProtocol.broadcastRows``), starts ``join_walks`` row walks, and
   maintenance starts.

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
import math
from collections.abc import Callable, Sequence
from typing import Any

from overlay.errors import OverlayError
from overlay.handle import Address, NodeHandle
from overlay.ids import NodeId, shared_prefix_len
from overlay.kbr import BaseApplication
from overlay.runtime import Timer

from .host import PastryHost
from .messages import (
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
    __slots__ = ("attempt", "sent_at", "timer")

    def __init__(self) -> None:
        self.attempt = 0
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
        self.ready_at = -1.0
        self._timer: Timer | None = None
        self._on_done: Callable[[bool], None] | None = None
        self._asked: dict[NodeHandle, _Ask] = {}
        self._confirmed: set[NodeHandle] = set()
        self._merging = False
        self._budget = Budget(0, "join_pns_probes")  # PNS probes left in this attempt
        # nearby-node discovery (LOCATING)
        self._loc_round = 0
        self._loc_asked: NodeHandle | None = None  # None: the seed address
        self._loc_replied = False  # the node asked this round has answered
        self._loc_sent_at = 0.0  # when this round's request left (its reply is an RTT sample)
        self._loc_done: set[NodeHandle] = set()  # nodes asked so far
        self._loc_best: NodeHandle | None = None  # nearest after the previous round
        self._loc_stale = 0  # rounds in a row that found no nearer node
        self._loc_pending: set[NodeHandle] = set()
        self._loc_rtt: dict[NodeHandle, float] = {}
        self._loc_timer: Timer | None = None
        #: this round's candidates not yet taken (least promising first) with their hints,
        #: our RTT to the replier, and the probes the round may still start
        self._loc_cands: list[tuple[NodeHandle, float]] = []
        self._loc_a: float | None = None
        self._loc_left = 0
        #: the node our join was routed through (the nearest found)
        self.entry: NodeHandle | None = None
        #: the nearest nodes the discovery walk measured (told about us once we are ready)
        self.near_found: list[NodeHandle] = []

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
        self._loc_reset()
        self._budget = Budget(cfg.join_probe_budget, "join_pns_probes")
        self.nonce = rt.rng.getrandbits(62)
        addr = self.seeds[self.attempt % len(self.seeds)]
        self._arm(cfg.join_timeout_s * (2**self.attempt))
        if cfg.join_locate_rounds > 0:
            self.state = JoinState.LOCATING
            core.stats["join_locate_requests"] += 1
            self._loc_sent_at = rt.now()
            rt.send_address(addr, NearbyRequest(self.nonce, -1))
            return
        self.state = JoinState.JOINING
        core.stats["join_requests"] += 1
        rt.send_address(addr, JoinRequest(self.nonce))

    # ------------------------------------------------------------------ nearby-node discovery
    def _loc_reset(self) -> None:
        if self._loc_timer is not None:
            self._loc_timer.cancel()
            self._loc_timer = None
        self._loc_round = 0
        self._loc_asked = None
        self._loc_replied = False
        self._loc_done.clear()
        self._loc_stale = 0
        self._loc_pending.clear()
        self._loc_rtt.clear()
        self._loc_cands.clear()

    def on_nearby_request(self, src: NodeHandle, msg: NearbyRequest) -> None:
        """Existing-node side: answer a joiner's discovery request (ready nodes only) with our
        leaf set (row -1) or our routing rows ``row`` .. ``row + 2``, with our RTTs as hints.

        Three rows — the whole table of rings up to ~10^5 nodes: row 0's near entries to zoom
        in, the deeper rows' spread-out ones to move on (two rows found the nearest node less
        often: 97 % of row-0 slots best at N = 2 000 against 99 %). Capped all the same: a
        discovery request comes from a node that is no member yet, so its answer amplifies."""
        core = self.core
        row = msg.row
        if type(row) is not int or not -1 <= row < core.table.nrows:
            raise ValueError(f"NearbyRequest row out of range: {row!r}")
        if not core.ready or src.id == core.id:
            return
        table = core.table
        entries = core.leaf.nodes() if row < 0 else table.rows_between(row, row + 2)
        rows = table.populated_rows()
        depth = rows[-1] + 1 if rows else 0
        core.runtime.send(src, NearbyReply(msg.nonce, row, entries, core.hints(entries), depth))

    def on_nearby_reply(self, src: NodeHandle, msg: NearbyReply) -> None:
        """LOCATING: measure the RTT to the sender and to the nodes it listed that may be nearer
        than the nearest found so far, then take the next step of the walk."""

        entries = check_handles(msg.entries)
        rtts = check_hints(msg.rtts, len(entries))
        if type(msg.depth) is not int:
            raise ValueError("NearbyReply.depth must be an int")
        if self.state is not JoinState.LOCATING or msg.nonce != self.nonce:
            return
        if self._loc_asked is not None and src != self._loc_asked:
            return  # replies bind to the node asked (the seed address: whoever answers it)
        if self._loc_replied or src.id == self.core.id:  # a duplicate, a late reply, or us
            return
        core = self.core
        self._loc_replied = True
        self._loc_asked = src
        self._loc_done.add(src)
        if self._loc_timer is not None:
            self._loc_timer.cancel()
            self._loc_timer = None
        prox = core.prox
        # The request and its reply are a round trip of our own: an RTT sample of the replier
        # (an upper bound of the true RTT — no answer leaves before its request arrives), so
        # the seed needs no probe, and its RTT turns the hints of round 0 into bounds too.
        prox.sample(src, core.runtime.now() - self._loc_sent_at)
        self._loc_rtt[src] = prox.rtt(src) or 0.0
        limit = core.config.join_locate_probes
        a = self._loc_rtt.get(src)
        rnd = self._loc_round
        hints = rtts if rtts else (-1.0,) * len(entries)

        def promise(t: tuple[NodeHandle, float]) -> tuple[float, float, int]:
            # Triangle inequality: |a - h| <= rtt(us, it) <= a + h. Most promising first: the
            # smallest lower bound — nodes about as far from the replier as we are, i.e. in
            # the *other* branches at our level of a hierarchical network (the replier's own
            # neighbourhood, h ~ 0, is no nearer to us than the replier itself).
            h, hint = t
            if h == src:
                return (-1.0, 0.0, 0)  # the replier first: its RTT anchors the bounds
            if a is None or hint < 0.0:
                return (math.inf, math.inf, int(h.id))
            return (abs(a - hint), a + hint, int(h.id))

        self._loc_cands = sorted([(src, 0.0), *zip(entries, hints, strict=True)], key=promise)
        self._loc_cands.reverse()  # popped from the end: most promising first
        self._loc_a = a
        self._loc_left = limit
        self._loc_batch(rnd)

    def _loc_batch(self, rnd: int) -> None:
        """Probe the next few candidates of this round's reply, most promising first, pruning
        again with the nearest RTT found so far; with none left to probe, end the round.

        Probing in small batches (``join_locate_batch``) rather than all at once lets each
        batch's pongs tighten the bound that prunes the next: a candidate whose lower bound
        |a - h| is no better than the nearest node found cannot be nearer (the triangle
        inequality), and the candidates come sorted by that bound, so once one is pruned the
        rest of the hinted ones are too."""
        core = self.core
        prox = core.prox
        a = self._loc_a
        best = min(self._loc_rtt.values(), default=math.inf)
        cands = self._loc_cands
        batch = core.config.join_locate_batch
        started = 0
        while cands and started < batch and self._loc_left > 0:
            h, hint = cands.pop()
            if h.id == core.id or h in self._loc_rtt or h in self._loc_pending:
                continue
            if prox.is_dead(h):
                continue
            rtt = prox.rtt(h)
            if rtt is not None:
                self._loc_rtt[h] = rtt
                best = min(best, rtt)
                continue
            if a is not None and hint >= 0.0 and abs(a - hint) >= best:
                core.stats["join_locate_pruned"] += 1
                continue  # it cannot be nearer than the nearest found so far
            self._loc_left -= 1
            started += 1
            self._loc_pending.add(h)
            core.stats["join_locate_probes"] += 1
            prox.probe(h, self._loc_cb(h, rnd))
        if not self._loc_pending:
            cands.clear()
            self._loc_step(rnd)
            return
        if self._loc_timer is not None:
            self._loc_timer.cancel()
        wait = core.config.join_locate_wait_s
        self._loc_timer = core.runtime.call_later(wait, lambda: self._loc_batch_timeout(rnd))

    def _loc_batch_timeout(self, rnd: int) -> None:
        """A batch's pongs did not all come in time: go on without the silent ones."""
        if self._loc_round != rnd or self.state is not JoinState.LOCATING or self.core.stopped:
            return
        self._loc_timer = None
        self._loc_pending.clear()
        self._loc_batch(rnd)

    def _loc_cb(self, h: NodeHandle, rnd: int) -> Callable[[float | None], None]:
        def done(rtt: float | None) -> None:
            if self._loc_round != rnd or self.state is not JoinState.LOCATING:
                return
            if rtt is not None:  # a straggler of an earlier batch still counts
                self._loc_rtt[h] = self.core.prox.rtt(h) or rtt
            if h not in self._loc_pending:
                return
            self._loc_pending.discard(h)
            if not self._loc_pending:
                self._loc_batch(rnd)

        return done

    def _loc_step(self, rnd: int) -> None:
        """A discovery round ended: ask the nearest node not asked yet for its routing rows,
        or join through the nearest node found.

        The walk (Castro et al. 2002 §4; FreePastry ``PNSApplication.getNearest``): the seed's
        leaf set (spread over the network), then rows 0-2 of the nearest node so far — deep
        rows hold few candidates per slot, so their entries are spread out and move the walk
        to the right region; row 0 holds the nearest of many, so it zooms in (FreePastry asks
        one row per request, deepest first; all rows in one request, with the hints pruning
        what is probed, take fewer round trips; asking the deep rows first found the nearest
        node less often in 300-node rings, 73 % against 91 %). It stops when
        ``join_locate_patience`` rounds in a row found no nearer node, or after
        ``join_locate_rounds`` requests; a round that finds nothing nearer asks the next
        nearest node not asked yet (a small beam against local minima).
        """
        if self._loc_round != rnd or self.state is not JoinState.LOCATING or self.core.stopped:
            return
        core = self.core
        cfg = core.config
        if self._loc_timer is not None:
            self._loc_timer.cancel()
            self._loc_timer = None
        self._loc_pending.clear()
        self._loc_round += 1
        order = sorted(self._loc_rtt, key=lambda h: (self._loc_rtt[h], int(h.id)))
        best = order[0] if order else None
        asked = self._loc_asked
        if rnd > 0:  # the seed's leaf set (round 0) is no step of the walk
            self._loc_stale = 0 if best != self._loc_best else self._loc_stale + 1
        self._loc_best = best
        nxt = next((h for h in order if h not in self._loc_done), None)
        if (
            nxt is not None
            and self._loc_round <= cfg.join_locate_rounds
            and self._loc_stale < cfg.join_locate_patience
        ):
            self._loc_asked = nxt
            self._loc_replied = False
            core.stats["join_locate_requests"] += 1
            self._loc_sent_at = core.runtime.now()
            core.runtime.send(nxt, NearbyRequest(self.nonce, 0))
            nonce = self.nonce
            rnd2 = self._loc_round

            def no_answer() -> None:
                if self.nonce == nonce and self._loc_round == rnd2 and not self._loc_replied:
                    # it did not answer: forget it and go on from the next nearest node
                    core.stats["join_locate_silent"] += 1
                    self._loc_rtt.pop(nxt, None)
                    self._loc_done.add(nxt)
                    self._loc_step(rnd2)

            self._loc_timer = core.runtime.call_later(
                cfg.join_locate_wait_s + core.prox.rto(nxt), no_answer
            )
            return
        target = best if best is not None else asked
        # every RTT measured while searching is a PNS sample for our own table
        for h in sorted(self._loc_rtt, key=lambda h: int(h.id)):
            core.consider(h, probe=False)
        self.near_found = order[: cfg.announce_nearest]
        self._loc_rtt.clear()
        self.state = JoinState.JOINING
        core.stats["join_requests"] += 1
        if target is None:  # nothing answered but the seed address itself
            core.runtime.send_address(
                self.seeds[self.attempt % len(self.seeds)], JoinRequest(self.nonce)
            )
            return
        self.entry = target
        core.runtime.send(target, JoinRequest(self.nonce))

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
        self.attempt += 1
        if self.attempt >= self.core.config.join_attempts:
            self.state = JoinState.FAILED
            self._cancel_asks()
            self._loc_reset()
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
            # (a hop's rows may trail the root's reply)
            offer_anchored(self.core, src, entries, rtts, self._budget)
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
        if msg.nonce == self.nonce and self.state in (JoinState.JOINING, JoinState.PROBING):
            if self.state is JoinState.JOINING:
                self.state = JoinState.PROBING
                self._arm(core.config.join_timeout_s * (2**self.attempt) * _PROBING_SLACK)
            cands = [h for h in leaves if h.id != core.id]
            cands.append(src)
            offer_anchored(core, src, entries, rtts, self._budget)
            for h in cands:  # measured by the consistent-join exchange: no PNS probe
                core.consider(h, probe=False)
            for h in cands:
                # a candidate we hold dead may be alive again (a false verdict under loss):
                # the consistent-join ask settles it, and a timed-out ask removes it for good
                core.add_leaf(h)
            self.on_leaf_changed()
            return
        if core.ready:  # a partition healer's probe came back: merge it as gossip
            core.stats["rejoin_replies"] += 1
            core.learn_alive(src)
            core.offer_leaves((*leaves, src), skip_dead=False)

    def _ask(self, m: NodeHandle) -> None:
        ask = _Ask()
        self._asked[m] = ask
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
        self.on_leaf_changed()
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

    def _become_ready(self) -> None:
        core = self.core
        self.state = JoinState.READY
        core.ready = True
        self.ready_at = core.runtime.now()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._cancel_asks()
        self._confirmed.clear()
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

    def stop(self) -> None:
        """Cancel the join timer, pending leaf-set requests and nearby-node discovery."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._cancel_asks()
        self._loc_reset()

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
