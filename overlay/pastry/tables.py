"""Routing-table maintenance for proximity: row swaps, row walks, announcements, slot repair.

Theory of operation (Castro, Druschel, Hu & Rowstron 2002 §4 and 2003, "Proximity neighbor
selection in tree-based structured peer-to-peer overlays" (PNS, constrained gossiping);
FreePastry ``StandardRouteSetProtocol``, ``StandardJoinProtocol.broadcastRows``; R&D 2001 §2.5).
A routing-table slot should hold the nearest live node of its prefix class. Joins give a good
start (``join.py``: a join through the nearest node takes row i from the i-th hop); what keeps
the tables near as nodes arrive is done here, every candidate going through
:meth:`~overlay.pastry.core.PastryCore.offer_hinted` (RTT hints bound each candidate's RTT by the
triangle inequality; only candidates that may beat an entry are probed, at most a fixed number
per message, and only our own measurements decide a slot):

* **Announcements.** A node that becomes ready tells its routing-table entries about itself
  (with its RTT to it: the receiver probes the newcomer only if that hint beats its entry), and
  likewise the nearest nodes its discovery found — near nodes need each other most, yet a table
  holds one of them per slot. Not told: leaf-set members (the consistent join's insert-me
  request made them learn us already) and row-0 entries beyond the nearest
  ``announce_row0_nearest`` (a receiver keeps the nearest of ~N/16 candidates in row 0: a far
  newcomer never wins it). The row the receiver sits in goes along as candidates only when
  receivers probe some of them (``announce_probe_limit`` > 0).
* **Row swaps.** Every ``row_exchange_interval_s`` each populated row is swapped with one of its
  entries — one of the nearest half the time (their rows hold nodes near us), any otherwise
  (sparse slots are found by looking around): the request carries our row, the reply its row.
  A request and its reply are a round trip of our own: the reply is an RTT sample of the
  replier (Karn's rule: not when a second request to it was outstanding), so its hints are
  bounds at once and an unmeasured replier needs no probe.
* **Row walks.** Every ``walk_interval_s`` (and ``join_walks`` times at the end of a join) a
  ``JoinRequest(walk=True)`` is routed from one of our nearest entries towards our own id: each
  hop sends the rows a joiner would get from it. A route that starts near us stays near us while
  each entry is the nearest of its slot, so every walk offers near candidates for every row —
  what ``build_oracle``'s refinement replays — including nodes that joined near us since.
* **Slot repair.** A dead entry's slot is refilled at once from the nodes we measured, then a
  node sharing the row's prefix is asked for its entry (R&D §2.5).

Replies bind to requests: a row reply to our pending (peer, row) request, walk rows and replies
to the walk's random nonce; entries pushed unasked (a row swap request, an announcement) enter
even an empty slot only after our own probe answered.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from overlay.handle import NodeHandle
from overlay.ids import ID_BITS, shared_prefix_len
from overlay.runtime import Timer

from .host import PastryHost
from .messages import (
    MAX_HINT_S,
    JoinRequest,
    RowReply,
    RowRequest,
    TableAnnounce,
    check_handles,
    check_hints,
)

__all__ = ["TableMaintenance"]


class TableMaintenance:
    """Proximity maintenance of one core's routing table (see the module doc)."""

    def __init__(self, core: PastryHost) -> None:
        self.core = core
        self.cfg = core.config
        #: row requests awaiting their reply: (peer, row) -> (when sent, whether the reply is
        #: an RTT sample) — replies bind to them
        self._row_pending: dict[tuple[NodeHandle, int], tuple[float, bool]] = {}
        #: outstanding row walks by nonce (replies bind to them)
        self._walks: dict[int, _Walk] = {}
        self._row_timer: Timer | None = None
        self._walk_timer: Timer | None = None

    def start(self) -> None:
        """Arm the row-swap and walk timers (randomised first period); idempotent."""
        if self._row_timer is not None:
            return
        rt = self.core.runtime
        rng = rt.rng
        cfg = self.cfg
        self._row_timer = rt.call_later(
            rng.uniform(0.5, 1.5) * cfg.row_exchange_interval_s, self._row_exchange
        )
        self._walk_timer = rt.call_later(
            rng.uniform(0.5, 1.5) * cfg.walk_interval_s, self._periodic_walk
        )

    def stop(self) -> None:
        """Cancel the timers."""
        for t in (self._row_timer, self._walk_timer):
            if t is not None:
                t.cancel()
        self._row_timer = self._walk_timer = None

    def on_ready(self) -> None:
        """The join finished: announce us to our entries and to the nearest nodes the discovery
        found (with our row each belongs to), then start ``join_walks`` row walks."""
        core = self.core
        table = core.table
        # The receiver sits in our row r: the rest of that row is a set of candidates for its
        # own row r, with our RTTs as hints — sent only if receivers spend probes on them
        # (``announce_probe_limit``; unprobed, unsolicited candidates never enter a table).
        push = self.cfg.announce_probe_limit > 0
        # Leaf-set members need no announcement: the consistent join's insert-me request
        # already made each of them learn us (MSPastry §3.1), the one message doing both.
        leaf = core.leaf.members
        skip = self._far_row0() if not push else set()
        sent = 0
        for r in table.populated_rows():
            row = table.row(r)
            hints = core.hints(row)
            for i, h in enumerate(row):
                if not push and (h in leaf or h in skip):
                    continue
                sent += 1
                if push:
                    rest = tuple(row[:i] + row[i + 1 :])
                    msg = TableAnnounce(hints[i], rest, hints[:i] + hints[i + 1 :])
                else:
                    msg = TableAnnounce(hints[i])
                core.runtime.send(h, msg)
        core.stats["table_announces"] += sent
        # The nearest nodes the discovery walk found need us in *their* tables most (a near
        # pair routes near only through near entries), yet our table may hold only one of them
        # per slot: tell them too, with the row of ours they would take candidates from.
        b = self.cfg.b_bits
        joiner = core.joiner
        for h in joiner.near_found:
            if h in table.members or h in leaf or core.prox.is_dead(h):
                continue
            r = shared_prefix_len(h.id, core.id, b)
            row = table.row(r)
            mine = core.prox.rtt(h)
            rtt = -1.0 if mine is None else mine
            announce = (
                TableAnnounce(rtt, tuple(row), core.hints(row)) if push else TableAnnounce(rtt)
            )
            core.runtime.send(h, announce)
            core.stats["near_announces"] += 1
        joiner.near_found = []
        # more routes towards our id from other near nodes: more near candidates per row
        self.walk_from_nearest(self.cfg.join_walks, skip=core.joiner.entry)

    def _far_row0(self) -> set[NodeHandle]:
        """Row-0 entries beyond the ``announce_row0_nearest`` nearest: not announced to.

        An announce pays when the receiver would take us into a slot; in its row 0 our slot
        has ~N/16 candidates and holds the nearest of them, which we beat only if we are
        near the receiver (Castro et al. 2002 §4: a node's row-0 entries are its near nodes).
        The nearest nodes the discovery found are told in any case (``on_ready``)."""
        core = self.core
        row = core.table.row(0)
        k = self.cfg.announce_row0_nearest
        if len(row) <= k:
            return set()
        rtt = core.prox.rtt
        ranked = sorted(row, key=lambda h: (math.inf if (r := rtt(h)) is None else r, int(h.id)))
        return set(ranked[k:])

    def start_walk(self, via: NodeHandle) -> bool:
        """Route a row walk for our own id from ``via`` (a ready node only): every hop sends
        the rows the joiner would get from it, the last one its row, no leaf set.

        Theory (Castro et al. 2002 §4 and 2003, PNS: a joiner takes row i from the i-th node
        of its route, and a route started near us stays near us as long as each table entry is
        the nearest of its slot): a walk from another near node gives another set of near
        candidates per row — what ``build_oracle``'s refinement replays — and, repeated from
        time to time, it brings the nodes that joined near us since into our table. Returns
        False when ``walk_max_pending`` walks are already outstanding."""
        core = self.core
        if not core.ready or via.id == core.id:
            return False
        now = core.runtime.now()
        walks = self._walks
        for k in [k for k, w in walks.items() if w.expires < now]:
            del walks[k]
        if len(walks) >= core.config.walk_max_pending:
            return False
        nonce = core.runtime.rng.getrandbits(62)
        walks[nonce] = _Walk(core.config.walk_probe_budget, now + core.config.walk_timeout_s)
        core.stats["row_walks"] += 1
        core.runtime.send(via, JoinRequest(nonce, walk=True))
        return True

    def walk(self, nonce: object) -> _Walk | None:
        """The outstanding walk with this nonce (expired ones are dropped), or None."""
        w = self._walks.get(nonce) if type(nonce) is int else None
        if w is not None and w.expires < self.core.runtime.now():
            del self._walks[nonce]  # type: ignore[arg-type]
            return None
        return w

    def walk_from_nearest(self, k: int, skip: NodeHandle | None = None) -> None:
        """Start ``k`` row walks from our ``k`` nearest measured routing-table entries."""
        core = self.core
        prox = core.prox
        bad = prox.bad
        ents = [h for h in core.table.entries() if h != skip and h not in bad]
        near = sorted(
            (h for h in ents if prox.rtt(h) is not None), key=lambda h: (prox.rtt(h), int(h.id))
        )
        for h in near[:k]:
            self.start_walk(h)

    def offer_walk(
        self, src: NodeHandle, entries: Sequence[NodeHandle], rtts: Sequence[float], walk: _Walk
    ) -> None:
        """Offer the rows a walk hop (or its end) sent, within the walk's probe budget."""
        offer_anchored(self.core, src, entries, rtts, walk)

    def end_walk(self, nonce: int) -> None:
        """The walk's last reply came: forget it."""
        self._walks.pop(nonce, None)

    def repair_slot(self, row: int, col: int) -> None:
        """Lazy repair: refill R[row][col] at once with the nearest live node we measured that
        belongs there (leaf-set members and measured peers: no message); only if there is none,
        ask a live node sharing >= row digits for its R[row][col] (R&D §2.5), which PNS compares
        on arrival.

        A measured peer of the slot is most often the runner-up of the PNS contest the crashed
        occupant won, so asking for one more candidate buys little that the periodic row
        exchange will not bring: at N = 10^4 under 30-min churn the request after a local refill
        was 0.016 msg/s/node, with the probes its reply set off more (docs/reliability.md,
        "Candidate probes and local slot repairs")."""
        core = self.core
        prox = core.prox
        bad = prox.bad
        table = core.table
        if table.get(row, col) is None:
            best: NodeHandle | None = None
            bd = math.inf
            for h, p in prox.peers.items():
                if p.min_rtt is None or p.min_rtt >= bd or h in bad or prox.is_dead(h):
                    continue
                if table.slot_of(h.id) == (row, col):
                    best, bd = h, p.min_rtt
            if best is not None:
                table.put(row, col, best)
                core.stats["slot_refills_local"] += 1
                return
        cands = [h for r in range(row, table.nrows) for h in table.row(r) if h not in bad]
        if not cands:
            return
        core.stats["slot_repairs"] += 1
        peer = core.runtime.rng.choice(cands)
        self._expect_row(peer, row)
        core.runtime.send(peer, RowRequest(row, col))

    def _expect_row(self, peer: NodeHandle, row: int) -> None:
        """Remember a row request so that only its reply is accepted (bounded: stale entries
        go first, and at most 4 per routing row)."""
        now = self.core.runtime.now()
        pend = self._row_pending
        limit = self.cfg.row_reply_timeout_s
        if pend and next(iter(pend.values()))[0] < now - limit:
            for k in [k for k, (t, _) in pend.items() if t < now - limit]:
                del pend[k]
        while len(pend) >= 4 * self.core.table.nrows:
            del pend[next(iter(pend))]
        # A second request while one is outstanding: the reply may answer either, so it is
        # no RTT sample (Karn's rule, RFC 6298 §3).
        again = pend.pop((peer, row), None) is not None
        pend[(peer, row)] = (now, not again)

    def _row_exchange(self) -> None:
        core = self.core
        if core.stopped:
            return
        rt = core.runtime
        cfg = self.cfg
        self._row_timer = rt.call_later(
            cfg.row_exchange_interval_s * rt.rng.uniform(0.9, 1.1), self._row_exchange
        )
        if not core.ready:
            return
        core.maint.table_leaf_check()
        bad = core.prox.bad
        prox = core.prox
        k = cfg.row_exchange_nearest
        deep = self.first_row_in_leaf_range()
        for r in core.table.populated_rows():
            if r >= deep:
                # every node that could fill this row is a leaf-set member already, known and
                # watched through the leaf set: a swap could bring nothing new (N = 10^4: row
                # 3 of most nodes, ~a quarter of the swaps)
                core.stats["row_swaps_in_leaf_range"] += 1
                continue
            row = core.table.row(r)
            ents = [h for h in row if h not in bad]
            if not ents:
                continue
            measured = sorted(
                (h for h in ents if prox.rtt(h) is not None),
                key=lambda h: (prox.rtt(h), int(h.id)),
            )
            # half the time one of the nearest (their rows hold nodes near us), half the
            # time any entry (sparse slots are found by looking around, not by zooming in)
            near = measured[:k] if k and measured and rt.rng.random() < 0.5 else ents
            peer = rt.rng.choice(near)
            core.stats["row_requests"] += 1
            self._expect_row(peer, r)
            rtt = prox.rtt(peer)
            # FreePastry swaps rows: our row r goes with the request, so both sides learn
            msg = RowRequest(r, -1, tuple(row), core.hints(row), -1.0 if rtt is None else rtt)
            rt.send(peer, msg)

    def first_row_in_leaf_range(self) -> int:
        """The shallowest row ``r`` whose whole prefix class — every id sharing our first ``r``
        digits, so every candidate for rows ``r`` and deeper — lies within the leaf set's range.

        A correct leaf set holds every live node of that arc (Rowstron & Druschel 2001 §2.2),
        so those rows hold leaf-set members only, chosen among candidates all known. With
        ~N/16^r nodes in the class of row ``r`` and L = 16 members, that is from about
        r = log16(N) - 0.5 on (N = 2 000: row 2; N = 10^4: row 3). ``nrows`` if none is.
        """
        core = self.core
        leaf = core.leaf
        b = self.cfg.b_bits
        oid = int(core.id)
        nrows = core.table.nrows
        for r in range(nrows):
            shift = ID_BITS - r * b
            lo = (oid >> shift) << shift
            if leaf.covers_block(lo, lo + (1 << shift) - 1):
                return r
        return nrows

    def _periodic_walk(self) -> None:
        """A row walk from one of our nearest entries (see :meth:`start_walk`)."""
        core = self.core
        if core.stopped:
            return
        rt = core.runtime
        cfg = self.cfg
        self._walk_timer = rt.call_later(
            cfg.walk_interval_s * rt.rng.uniform(0.9, 1.1), self._periodic_walk
        )
        if not core.ready:
            return
        prox = core.prox
        bad = prox.bad
        near = sorted(
            (h for h in core.table.entries() if h not in bad and prox.rtt(h) is not None),
            key=lambda h: (prox.rtt(h), int(h.id)),
        )[: max(1, cfg.row_exchange_nearest)]
        if near:
            self.start_walk(rt.rng.choice(near))

    def on_row_request(self, src: NodeHandle, msg: RowRequest) -> None:
        """Answer a routing-table row request (lazy repair and row exchange)."""
        core = self.core
        table = core.table
        row, col = msg.row, msg.col
        if type(row) is not int or type(col) is not int:
            raise ValueError("RowRequest fields must be ints")
        if not (0 <= row < table.nrows and -1 <= col < table.cols):
            raise ValueError(f"RowRequest out of range: {row}, {col}")
        pushed = check_handles(msg.entries)
        rtts = check_hints(msg.rtts, len(pushed))
        via_rtt = _rtt_hint(msg.rtt_s)
        if col < 0:
            entries = tuple(table.row(row))
        else:
            e = table.get(row, col)
            entries = (e,) if e is not None else ()
        core.runtime.send(src, RowReply(row, entries, core.hints(entries)))
        core.learn_alive(src)
        if pushed:
            # unsolicited candidates: measured before they take even an empty slot
            core.stats["row_pns_probes"] += core.offer_hinted(
                src, pushed, rtts, self.cfg.row_probe_limit, via_rtt, fill_unmeasured=False
            )

    def on_row_reply(self, src: NodeHandle, msg: RowReply) -> None:
        """Offer the entries of a row reply to our routing table (bounded probing)."""

        entries = check_handles(msg.entries)
        rtts = check_hints(msg.rtts, len(entries))
        core = self.core
        row = msg.row
        pending = self._row_pending.pop((src, row), None) if type(row) is int else None
        now = core.runtime.now()
        if pending is None or now - pending[0] > self.cfg.row_reply_timeout_s:
            core.stats["row_reply_unsolicited"] += 1
            return  # replies bind to our requests (and to the node asked)
        sent, is_sample = pending
        if is_sample:
            # The request and its reply are a round trip of our own (the replier answers at
            # once): an RTT sample without a probe, which also turns the reply's hints into
            # bounds, so an unmeasured replier costs no anchoring probe.
            core.prox.sample(src, now - sent)
            core.stats["row_reply_rtt_samples"] += 1
        core.stats["row_pns_probes"] += core.offer_hinted(
            src, entries, rtts, self.cfg.row_probe_limit
        )

    def on_table_announce(self, src: NodeHandle, msg: TableAnnounce) -> None:
        """A new node's table announcement: learn it; probe only if it may win a slot."""
        rtt = msg.rtt_s
        if not isinstance(rtt, float | int) or isinstance(rtt, bool) or not math.isfinite(rtt):
            raise ValueError("TableAnnounce.rtt_s must be a finite number")
        pushed = check_handles(msg.entries)
        rtts = check_hints(msg.rtts, len(pushed))
        core = self.core
        if pushed:
            # the new node's row we sit in: candidates for ours, measured before believed
            core.stats["announce_pns_probes"] += core.offer_hinted(
                src,
                pushed,
                rtts,
                self.cfg.announce_probe_limit,
                _rtt_hint(rtt),
                fill_unmeasured=False,
            )
        core.learn_alive(src)  # an empty slot takes it at once (no RTT needed)
        # The announced RTT is the sender's own measurement: a hint of whether measuring is
        # worth a probe, never a sample. Taken as a sample, one announce of 0.0 would win a
        # routing-table slot for ever (a minimum RTT of 0 is never beaten). Only our own timed
        # probes feed proximity neighbour selection (Castro et al. 2002, PNS).
        slot = core.table.slot_of(src.id)
        if slot is None or core.prox.rtt(src) is not None:
            return
        occupant = core.table.get(*slot)
        if occupant is None or occupant == src:
            return
        known = core.prox.rtt(occupant)
        # Against an unmeasured occupant the pong decides nothing at once (``consider``
        # compares two measurements), yet it is not wasted: the newcomer is then comparable
        # when the occupant is measured or dies (``learn_alive``, ``repair_slot``). Skipping
        # it saved 8 probes per join into an oracle-built ring but cost row 0 ~2 ms of excess
        # RTT per slot in join-built ones. An occupant near enough is not contested at all.
        near = core.near_enough_s()
        if rtt >= 0.0 and (known is None or (near < known and rtt < known)):
            core.stats["announce_probes"] += 1
            core.consider(src, probe=True)


class Budget:
    """Probes a join attempt or a walk may still spend on PNS, and where they are counted."""

    __slots__ = ("left", "stat")

    def __init__(self, left: int, stat: str) -> None:
        self.left = left
        self.stat = stat


class _Walk(Budget):
    """An outstanding row walk: its probe budget and when it expires."""

    __slots__ = ("expires",)

    def __init__(self, budget: int, expires: float) -> None:
        super().__init__(budget, "walk_pns_probes")
        self.expires = expires


def offer_anchored(
    core: PastryHost,
    src: NodeHandle,
    entries: Sequence[NodeHandle],
    rtts: Sequence[float],
    budget: Budget,
    spare: Collection[NodeHandle] = (),
) -> None:
    """Bounded PNS for rows a join or walk hop sent with its RTT hints: empty slots are filled
    at once, contested ones probed while ``budget`` lasts. A hop we never measured is probed
    first — it is a candidate itself, and its RTT is what turns its hints into bounds.
    Candidates in ``spare`` (looked up when the offer runs) are not probed: see
    :meth:`~overlay.pastry.core.PastryCore.offer_hinted`."""
    prox = core.prox

    def spend(used: int) -> None:
        budget.left -= used
        core.stats[budget.stat] += used

    if budget.left > 0 and prox.rtt(src) is None and not prox.is_dead(src):
        spend(1)

        def anchored(rtt: float | None) -> None:
            if rtt is not None and not core.stopped:
                core.consider(src, probe=False)
                spend(core.offer_hinted(src, entries, rtts, max(0, budget.left), spare=spare))

        prox.probe(src, anchored, hint=True)
        return
    spend(core.offer_hinted(src, entries, rtts, max(0, budget.left), spare=spare))


def _rtt_hint(v: object) -> float | None:
    """An RTT hint from the wire: a finite number >= 0, clamped; anything else is no hint."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v < math.inf:
        return None
    return min(float(v), MAX_HINT_S)
