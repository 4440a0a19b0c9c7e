"""PastryCore: the sans-io Pastry node — routing state, routing decision, state mutation.

Theory of operation (Rowstron & Druschel 2001 §2.2 "routing"; MSPastry, Castro et al. 2003 §3;
Butt et al. 2006 §2.3):

* **Routing** (:meth:`PastryCore.next_hop`, the simulator's hot path). If the key lies in the
  leaf-set range, the node numerically closest among leaf set ∪ self is responsible: deliver here
  or forward to that leaf. Otherwise forward to ``R[l][digit_l(key)]`` where ``l`` is the length
  of the prefix the key shares with us. If that slot is empty, suspected or excluded — the *rare
  case* — forward to any known node that shares at least ``l`` digits with the key and is
  numerically closer to it than we are. Suspected/dead nodes (``prox.bad``) and the caller's
  ``exclude`` set are skipped everywhere, which gives MSPastry's per-hop reroute (the hop
  machinery itself is :class:`~overlay.kbr.KbrCore`'s). Every hop either lengthens the shared
  prefix or strictly shrinks the numerical distance, so routes terminate.
* **State mutation** goes through a few methods so that upcalls and maintenance hooks fire in
  one place: :meth:`add_leaf` (a node known to be alive enters the leaf set), :meth:`learn_alive`
  (a node spoke to us directly), :meth:`offer_leaves` (gossiped candidates: probed first, inserted
  on the pong — "probe new leaf-set members on insertion"), :meth:`consider` (proximity neighbour
  selection for the routing table: a candidate replaces an entry only if its measured minimum RTT
  is lower; unknown RTT → probe first) and :meth:`_on_peer_dead` (remove, spread, repair).
* The join state machine lives in ``join.py`` and the periodic protocols in ``maintenance.py``;
  both are small objects holding a reference to the core.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import ClassVar

from overlay.handle import Address, NodeHandle
from overlay.ids import HALF_RING, ID_BITS, RING, NodeId, is_between, ring_distance
from overlay.kbr import KbrCore
from overlay.proximity import Liveness, ProbeCallback
from overlay.runtime import Runtime

from .config import PastryConfig
from .join import JOIN_APP, JoinProtocol, JoinState
from .leaf_set import LeafSet
from .maintenance import Maintenance
from .messages import (
    Heartbeat,
    JoinReply,
    JoinRequest,
    JoinRows,
    LeafFailed,
    LeafSetReply,
    LeafSetRequest,
    NearbyReply,
    NearbyRequest,
    RowReply,
    RowRequest,
    TableAnnounce,
    check_handles,
)
from .routing_table import RoutingTable
from .tables import TableMaintenance

log = logging.getLogger(__name__)

#: previous hops remembered by ``_learn`` (cleared when full)
_LEARNED_MEMO = 256


class PastryCore(KbrCore):
    """A Pastry node (sans-io). Construct with a runtime, its own handle and a config."""

    overlay_name: ClassVar[str] = "pastry"
    overlay_apps: ClassVar[frozenset[str]] = frozenset({JOIN_APP})

    def __init__(
        self, runtime: Runtime, handle: NodeHandle, config: PastryConfig | None = None
    ) -> None:
        cfg = config if config is not None else PastryConfig()
        super().__init__(runtime, handle, cfg.kbr, cfg.proximity)
        self.config = cfg
        self._oid = int(handle.id)
        self._b = cfg.b_bits
        self._mask = (1 << cfg.b_bits) - 1
        self.leaf = LeafSet(handle, cfg.half_leaf)
        self.table = RoutingTable(self._oid, cfg.b_bits)
        self._verifying: set[NodeHandle] = set()
        #: leaf-set candidates not probed because nearer ones were being verified
        #: (:meth:`offer_leaves`), offered again when one of those turns out dead
        self._leaf_reserve: tuple[NodeHandle, ...] = ()
        self._learned: set[NodeHandle] = set()
        #: the node whose leave notice is being handled (its departure is not spread as a
        #: failure: every member it knew was told by the node itself)
        self._leaving: NodeHandle | None = None
        #: when we last probed a node because someone reported it failed (rate limit)
        self._report_probed: dict[NodeHandle, float] = {}
        self.joiner = JoinProtocol(self)
        self.maint = Maintenance(self)
        self.tables = TableMaintenance(self)
        self.register(JOIN_APP, self.joiner.app)
        add = self.add_handler
        add(JoinRequest, self.joiner.on_join_request)
        add(JoinRows, self.joiner.on_join_rows)
        add(JoinReply, self.joiner.on_join_reply)
        add(LeafSetRequest, self._on_leafset_request)
        add(LeafSetReply, self._on_leafset_reply)
        add(Heartbeat, self.maint.on_heartbeat)
        add(LeafFailed, self.maint.on_leaf_failed)
        add(RowRequest, self.tables.on_row_request)
        add(RowReply, self.tables.on_row_reply)
        add(TableAnnounce, self.tables.on_table_announce)
        add(NearbyRequest, self.joiner.on_nearby_request)
        add(NearbyReply, self.joiner.on_nearby_reply)

    # ------------------------------------------------------------------ driver-facing
    def start(self) -> None:
        """Start leaf-set heartbeats and routing-table maintenance."""
        self.maint.start()
        self.tables.start()

    def join(self, seeds: Sequence[Address], on_done: Callable[[bool], None] | None = None) -> None:
        """Join through ``seeds`` with the Pastry join protocol; an empty list starts a new ring."""
        self.joiner.start_join(seeds, on_done)

    def stop(self) -> None:
        """Stop answering, stop maintenance and any join, and drop in-flight probes."""
        super().stop()
        self.maint.stop()
        self.tables.stop()
        self.joiner.stop()
        for h in list(self.prox._probes):  # in-flight probes must not fire after a crash
            self.prox.forget(h)

    @property
    def join_state(self) -> JoinState:
        """Where this node's join protocol stands."""
        return self.joiner.state

    def is_joining(self) -> bool:
        """A join is under way (locating, joining or probing): not yet responsible for keys."""
        return self.joiner.state in (JoinState.LOCATING, JoinState.JOINING, JoinState.PROBING)

    # ------------------------------------------------------------------ routing (hot path)
    def next_hop(self, key: NodeId, exclude: set[NodeHandle] | None = None) -> NodeHandle | None:
        """Pastry routing: the closest leaf when ``key`` is within the leaf set, else the
        routing-table entry sharing one more digit, else (the rare case) a known node sharing as
        long a prefix that is numerically closer; None = deliver here."""
        bad = self.prox.bad
        leaf = self.leaf
        if leaf.in_range(key):
            return leaf.closest(key, bad, exclude)
        x = self._oid ^ key  # != 0: our own id is always in range
        b = self._b
        row_i = (ID_BITS - x.bit_length()) // b
        row = self.table.rows[row_i]
        if row is not None:
            h = row[(key >> (ID_BITS - (row_i + 1) * b)) & self._mask]
            if h is not None and not (bad and h in bad) and not (exclude and h in exclude):
                return h
        return self._rare_case(key, row_i, bad, exclude)

    def _rare_case(
        self,
        key: int,
        row_i: int,
        bad: Collection[NodeHandle],
        exclude: Collection[NodeHandle] | None,
    ) -> NodeHandle | None:
        """Any known node with prefix >= l that is numerically closer to ``key`` than us."""
        self.stats["rare_case"] += 1
        oid = self._oid
        bd = ring_distance(oid, key)
        bid = oid
        best: NodeHandle | None = None
        limit = ID_BITS - row_i * self._b  # prefix >= l  <=>  (id ^ key).bit_length() <= limit
        rows = self.table.rows
        cands: list[Iterable[NodeHandle | None]] = [self.leaf.nodes()]
        cands.extend(r for r in rows[row_i:] if r is not None)
        for group in cands:
            for h in group:
                if h is None or (bad and h in bad) or (exclude and h in exclude):
                    continue
                hid = h.id
                if (hid ^ key).bit_length() > limit:
                    continue
                d = (key - hid) % RING
                if d > HALF_RING:
                    d = RING - d
                if d < bd or (d == bd and hid < bid):
                    best, bd, bid = h, d, hid
        return best

    # ------------------------------------------------------------------ KBR queries
    def local_lookup(self, key: NodeId, n: int) -> list[NodeHandle]:
        """Up to ``n`` usable next hops towards ``key``: the routing choice first, then every
        known live node that makes progress (longer shared prefix, then numerically closer)."""
        first = self.next_hop(key)
        bad = self.prox.bad
        mine = (ID_BITS - (self._oid ^ key).bit_length(), ring_distance(self._oid, key))
        scored: list[tuple[int, int, int, NodeHandle]] = []
        for h in self.known_nodes():
            if h in bad or h == first:
                continue
            spl = ID_BITS - (int(h.id) ^ key).bit_length()
            d = ring_distance(h.id, key)
            if (spl // self._b, -d) > (mine[0] // self._b, -mine[1]):
                scored.append((-(spl // self._b), d, int(h.id), h))
        scored.sort(key=lambda t: t[:3])
        out = [first] if first is not None else []
        out.extend(t[3] for t in scored)
        return out[: max(0, n)]

    def neighbor_set(self, n: int) -> list[NodeHandle]:
        """Up to ``n`` live leaf-set members, closest first."""
        bad = self.prox.bad
        return [h for h in self.leaf.ordered_by_distance() if h not in bad][: max(0, n)]

    def replica_set(self, key: NodeId, k: int) -> list[NodeHandle]:
        """Up to ``k`` live leaf-set members and this node, numerically closest to ``key`` first."""
        bad = self.prox.bad
        cands = [h for h in self.leaf.nodes() if h not in bad]
        cands.append(self.handle)
        cands.sort(key=lambda h: (ring_distance(h.id, key), int(h.id)))
        return cands[: max(0, k)]

    def known_in_range(self, begin: NodeId, end: NodeId) -> list[NodeHandle]:
        """Live leaf-set and routing-table nodes in [begin, end), clockwise from ``begin``."""
        bad = self.prox.bad
        out = [
            h
            for h in self.known_nodes()
            if h not in bad and h != self.handle and is_between(h.id, begin, end)
        ]
        out.sort(key=lambda h: (int(h.id) - begin) % RING)
        return out

    def known_nodes(self) -> list[NodeHandle]:
        """The leaf set followed by the routing-table entries, without duplicates."""
        seen = set(self.leaf.members)
        out = list(self.leaf.nodes())
        for h in self.table.entries():
            if h not in seen:
                seen.add(h)
                out.append(h)
        return out

    def routing_row(self, i: int) -> list[NodeHandle]:
        """The filled entries of routing-table row ``i`` (what poolD announces along)."""
        return self.table.row(i)

    @property
    def leaf_set(self) -> tuple[NodeHandle, ...]:
        """The leaf-set members."""
        return self.leaf.nodes()

    # ------------------------------------------------------------------ state mutation
    def add_leaf(self, h: NodeHandle) -> bool:
        """Insert a node known to be alive into the leaf set (if it belongs there)."""
        if h.id == self.id:
            return False
        before = self.leaf.members
        if not self.leaf.insert(h):
            return False
        self._leaf_changed(before, self.leaf.members)
        return True

    def _leaf_changed(self, before: set[NodeHandle], after: set[NodeHandle]) -> None:
        # Iterate tuples, not set differences: handle hashes (string addresses) vary with
        # PYTHONHASHSEED, and upcall order must not depend on it.
        for m in self.leaf.nodes():
            if m not in before:
                self.notify_update(m, True)
        if len(before) + len(after) > 0 and not before <= after:
            for m in sorted(before - after, key=lambda h: int(h.id)):
                self.maint.heard.pop(m, None)
                self.notify_update(m, False)
        self.joiner.on_leaf_changed()

    def learn_alive(self, h: NodeHandle) -> None:
        """``h`` just spoke to us: it may enter the leaf set and the routing table."""
        if h.id == self.id:
            return
        leaf = self.leaf
        if h not in leaf.members and leaf.fits(h.id):
            self.add_leaf(h)
        if h not in self.table.members:
            self.consider(h, probe=False)

    def _learn(self, h: NodeHandle) -> None:
        # KbrCore calls this for the previous hop of every routed message (hot path): a
        # bounded memo keeps repeat senders that lost PNS to an existing entry at one lookup.
        if h in self.table.members or h in self.leaf.members or h in self._learned:
            return
        learned = self._learned
        if len(learned) >= _LEARNED_MEMO:
            learned.clear()
        learned.add(h)
        self.learn_alive(h)

    def offer_leaves(self, cands: Iterable[NodeHandle], skip_dead: bool = True) -> None:
        """Gossiped leaf-set candidates: probe each one that fits, insert it on the pong.

        Only the candidates that would still be members once every candidate being verified
        is in are probed (:meth:`LeafSet.would_keep`). A side short of a crashed member takes
        any node, so the leaf set a repair reply lists fitted whole, and every member of it
        was probed; half the pongs then found the nearer ones already in (2 000 nodes, 30-min
        sessions, 5 % loss: 0.016 of 0.031 verification probes/s/node). A nearer candidate
        that turns out dead has the deferred ones offered again at once. A deferred candidate
        that is one of our routing-table entries is still probed (the cut probes were also how
        such entries were found dead; docs/reliability.md)."""
        leaf = self.leaf
        prox = self.prox
        now = self.runtime.now()
        lease = self.config.neighbor_lease_s
        verifying = self._verifying
        probe: list[NodeHandle] = []
        for c in cands:
            if c.id == self.id or c in leaf.members or c in verifying or c in probe:
                continue
            if not leaf.fits(c.id):
                continue
            if skip_dead and prox.is_dead(c):
                continue
            p = prox.peers.get(c)
            if p is not None and p.state is Liveness.ALIVE and now - p.last_heard < lease:
                if self.add_leaf(c):
                    self.maint.push_to(c)
                continue
            probe.append(c)
        if not probe:
            return
        keep = leaf.would_keep(probe, verifying)
        if len(keep) < len(probe):
            self.stats["leaf_verify_deferred"] += len(probe) - len(keep)
            reserve = self._leaf_reserve
            new = [c for c in probe if c not in keep and c not in reserve]
            # the latest deferred, at most a leaf set's worth (a tuple: most cores hold none,
            # and the empty one is shared)
            self._leaf_reserve = (*reserve, *new)[-2 * leaf.half :]
            # The deferred probes were also our failure detector for routing-table entries:
            # a leaf set names its owner's id-space neighbours, which sit in our deepest rows,
            # and under churn some have crashed unnoticed. Without them lookups met those
            # entries (reroutes +31 %, hops +10 % at 5-min sessions): an entry named here is
            # still checked (one heard from within a lease never gets here: it enters at once).
            members = self.table.members
            for c in new:
                if c in members:
                    self.stats["leaf_deferred_entry_probes"] += 1
                    prox.probe(c, hint=True)
        for c in keep:
            verifying.add(c)
            self.stats["leaf_verify_probes"] += 1
            prox.probe(c, self._verified_cb(c), hint=True)

    def _verified_cb(self, c: NodeHandle) -> Callable[[float | None], None]:
        def done(rtt: float | None) -> None:
            self._verifying.discard(c)
            if self.stopped:
                return
            if rtt is None:
                # it held the place of candidates deferred behind it: offer them again now,
                # not at the next repair request or heartbeat
                reserve, self._leaf_reserve = self._leaf_reserve, ()
                if reserve:
                    self.offer_leaves(reserve)
                return
            if c not in self.leaf.members and self.leaf.fits(c.id) and self.add_leaf(c):
                self.maint.push_to(c)
            self.consider(c, probe=False)

        return done

    def consider(self, h: NodeHandle, probe: bool) -> bool:
        """Proximity neighbour selection for the routing-table slot ``h`` belongs to.

        An empty slot takes ``h`` at once; an occupied slot is replaced only when ``h``'s
        measured minimum RTT is lower (or the occupant is suspected). With ``probe`` an
        unmeasured RTT is probed first and the comparison re-run on the pong. Returns True
        if a probe was started.
        """
        table = self.table
        slot = table.slot_of(h.id)
        if slot is None:
            return False
        prox = self.prox
        if prox.is_dead(h):
            return False
        row, col = slot
        e = table.get(row, col)
        if e is None:
            table.put(row, col, h)
            if probe and prox.rtt(h) is None:
                self.probe_candidate(h)
                return True
            return False
        if e == h:
            return False
        if e in prox.bad and h not in prox.bad:
            table.put(row, col, h)
            return False
        rh = prox.rtt(h)
        if rh is None:
            if probe:
                self.probe_candidate(h, self._pns_cb(h))
                return True
            return False
        re = prox.rtt(e)
        if re is None:
            if probe:
                prox.probe(e, self._pns_cb(h))
                return True
            return False
        if rh < re:
            table.put(row, col, h)
            self.stats["pns_replacements"] += 1
        return False

    def near_enough_s(self) -> float:
        """An RTT within which a node is near enough that nothing nearer is worth a probe:
        ``pns_near_enough_s`` plus what the runtime says its RTT samples may owe to waiting in
        event loops (``timing_noise_s``: live nodes measure it, ``transports/lag.py``; a
        simulated network has none). With 300 nodes in one process a datagram waits 1-3 ms
        for its loop, and PNS probed on comparing that noise."""
        return self.config.pns_near_enough_s + getattr(self.runtime, "timing_noise_s", 0.0)

    def probe_candidate(self, h: NodeHandle, callback: ProbeCallback | None = None) -> None:
        """Probe ``h``, a routing-table candidate (PNS): one ping, no retransmission, when ``h``
        is outside the leaf set's range (``ProximityConfig.candidate_probe_retries``); a node
        that would enter the leaf set keeps the hint probe's retransmission, since a false
        verdict on it would hold a live member out of the leaf set."""
        self.prox.probe(h, callback, hint=True, candidate=not self.leaf.fits(h.id))

    def hints(self, entries: Iterable[NodeHandle]) -> tuple[float, ...]:
        """Our measured minimum RTT to each of ``entries``; for an entry never measured, the
        upper bound its slot holds, negated (``-u``, ``0 < u < 1``), else -1: the RTT hints sent
        along with routing candidates (see ``messages.py``)."""
        rtt = self.prox.rtt
        bound = self.table.bound_of

        def hint(h: NodeHandle) -> float:
            r = rtt(h)
            if r is not None:
                return r
            u = bound(h)
            return -u if u is not None and u < 1.0 else -1.0

        # from a list, not a generator: a resized tuple parks on a freelist (overlay/wire.py)
        return tuple([hint(h) for h in entries])

    def offer_hinted(
        self,
        via: NodeHandle | None,
        entries: Sequence[NodeHandle],
        rtts: Sequence[float],
        budget: int,
        via_rtt_hint: float | None = None,
        fill_unmeasured: bool = True,
        spare: Collection[NodeHandle] = (),
    ) -> int:
        """Offer ``entries`` (received from ``via``, with ``via``'s RTT hints) to the routing
        table; start at most ``budget`` probes; return how many were started.

        Proximity neighbour selection with triangle-inequality pruning (module doc of
        ``messages.py``): with ``a`` our RTT to ``via`` (our own measurement, else
        ``via_rtt_hint``) and ``h`` its RTT to a candidate, the candidate's RTT lies in
        ``[|a - h|, a + h]``. Candidates are taken most promising first (smallest upper bound),
        so an empty slot gets the likeliest-nearest one at once; an occupied slot is contested
        only by a candidate whose lower bound beats the occupant's measured RTT, and then only
        after our own probe (``consider`` decides on measurements alone); an occupant, or an
        empty slot's candidate, within ``pns_near_enough_s`` costs no probe at all. Without
        ``fill_unmeasured`` (unsolicited candidates) an empty slot waits for the probe too.
        Candidates in ``spare`` are never probed: their RTT is being measured already (the
        consistent join's leaf-set requests), and :meth:`consider` runs when it comes.
        """
        prox = self.prox
        table = self.table
        a = prox.rtt(via) if via is not None else None
        if a is None and via_rtt_hint is not None and via_rtt_hint >= 0.0:
            a = via_rtt_hint
        inf = float("inf")
        scored: list[tuple[int, float, float, int, NodeHandle]] = []
        for i, h in enumerate(entries):
            if h.id == self.id or h == via or prox.is_dead(h):
                continue
            known = prox.rtt(h)
            if known is not None:
                lo = hi = known
            else:
                hint = rtts[i] if i < len(rtts) else -1.0
                if a is None:
                    lo, hi = 0.0, inf
                elif hint >= 0.0:
                    lo, hi = abs(a - hint), a + hint
                elif hint > -1.0:  # the sender's own upper bound, -u: ours is a + u
                    lo, hi = 0.0, a - hint
                else:
                    lo, hi = 0.0, inf
            # an empty slot first: filling a hole shortens routes more than a better entry
            empty = table.get(*slot) is None if (slot := table.slot_of(h.id)) else False
            scored.append((0 if empty else 1, hi, lo, int(h.id), h))
        scored.sort(key=lambda t: t[:4])
        probes = 0
        bad = prox.bad
        near = self.near_enough_s()
        for _, hi, lo, _, h in scored:
            slot = table.slot_of(h.id)
            if slot is None:
                continue
            row, col = slot
            e = table.get(row, col)
            if e == h:
                continue
            rh = prox.rtt(h)
            if e is None:
                if rh is not None or fill_unmeasured:
                    # unmeasured and within near enough by its bound: the slot keeps the bound,
                    # so the entry is not probed later as "unknown" (routing_table.py)
                    table.put(row, col, h, hi if rh is None and hi <= near else None)
                    if rh is None and probes < budget and hi > near and h not in spare:
                        # measured now, so later candidates can be compared (not when its
                        # hints put it near enough: none would contest it)
                        self.probe_candidate(h)
                        probes += 1
                elif probes < budget and h not in spare:
                    self.probe_candidate(h, self._pns_cb(h))
                    probes += 1
                continue
            if e in bad and h not in bad:
                table.put(row, col, h)
                continue
            re = prox.rtt(e)
            if re is None and (be := table.bound(row, col)) is not None and be <= near:
                continue  # the occupant went in unprobed, near enough by its bound: as below
            if rh is not None and re is not None:
                if rh < re:
                    table.put(row, col, h)
                    self.stats["pns_replacements"] += 1
                continue
            if probes >= budget or (re is not None and (lo >= re or re <= near)):
                continue  # out of budget, it cannot beat the occupant, or no need to
            cb = self._pns_cb(h)
            if re is None:
                prox.probe(e, cb)
                probes += 1
            if rh is None and probes < budget and h not in spare:
                self.probe_candidate(h, cb)
                probes += 1
        if probes:
            self.stats["pns_hinted_probes"] += probes
        return probes

    def _pns_cb(self, h: NodeHandle) -> Callable[[float | None], None]:
        def done(rtt: float | None) -> None:
            if not self.stopped and self.prox.rtt(h) is not None:
                self.consider(h, probe=False)

        return done

    # ------------------------------------------------------------------ liveness hooks
    def _on_peer_dead(self, h: NodeHandle) -> None:
        was_leaf = h in self.leaf.members
        neighbour = h in self.leaf.neighbors()
        before = self.leaf.members
        if self.leaf.remove(h):
            self._leaf_changed(before, self.leaf.members)
        slot = self.table.remove(h)
        self.maint.on_dead(h, was_leaf, slot, spread=h != self._leaving, neighbour=neighbour)
        self.joiner.on_dead(h)

    def peer_left(self, h: NodeHandle) -> None:
        """``h`` left gracefully: remove and repair now, without spreading a failure report."""
        self._leaving = h
        try:
            self.prox.declare_dead(h)
        finally:
            self._leaving = None

    def drop_dead(self, h: NodeHandle) -> None:
        """Remove ``h`` from our state as dead: through the proximity verdict if it is news,
        directly if the verdict was already given (``declare_dead`` tells us only once)."""
        if self.prox.is_dead(h):
            self._on_peer_dead(h)
        else:
            self.prox.declare_dead(h)

    def _on_peer_alive(self, h: NodeHandle) -> None:
        self.maint.on_alive(h)
        if not self.stopped:
            self.learn_alive(h)

    def accept_failure_report(self, h: NodeHandle, found_at: float) -> None:
        """Another node says ``h`` failed at ``found_at``: a hint, never a verdict.

        MSPastry §3.2 (suspicion, probe, removal): the report only makes us probe ``h`` with
        our own RTO back-off; only our own probe removes it (and then we spread our own
        verdict). One probe per named node per ``failure_report_probe_interval_s``, so a
        stream of forged reports costs a bounded trickle of pings and evicts nobody.
        """
        if h not in self.leaf.members and h not in self.table.members:
            self.stats["failure_reports_ignored"] += 1
            return
        now = self.runtime.now()
        last = self._report_probed.get(h)
        if last is not None and now - last < self.config.failure_report_probe_interval_s:
            self.stats["failure_reports_rate_limited"] += 1
            return
        if len(self._report_probed) >= 4 * (2 * self.config.half_leaf + 1):
            limit = self.config.failure_report_probe_interval_s
            for k in [k for k, t in self._report_probed.items() if now - t >= limit]:
                del self._report_probed[k]
        self._report_probed[h] = now
        self.stats["failure_report_probes"] += 1
        # a hint probe: the reporter's own probes ran out already, so ours only has to guard
        # against a false report (one retransmission; see ProximityConfig.hint_probe_retries)
        self.prox.probe(h, self._report_probe_cb(h, found_at), hint=True)

    def _report_probe_cb(self, h: NodeHandle, found_at: float) -> Callable[[float | None], None]:
        def done(rtt: float | None) -> None:
            # The report was false (it answered us): members whose probes failed hold it out
            # until it speaks to them, so it must learn of the verdict (``reintegration.py``).
            if rtt is not None and not self.stopped and h in self.leaf.members:
                self.maint.reint.tell(h, found_at)

        return done

    # ------------------------------------------------------------------ leaf-set requests
    def _on_leafset_request(self, src: NodeHandle, msg: LeafSetRequest) -> None:
        if msg.insert_me:
            self.learn_alive(src)
        self.runtime.send(src, LeafSetReply(msg.nonce, self.leaf.nodes()))

    def _on_leafset_reply(self, src: NodeHandle, msg: LeafSetReply) -> None:
        leaves = check_handles(msg.leaves)
        if self.joiner.on_leafset_reply(src, msg.nonce, leaves):
            return
        self.learn_alive(src)
        self.offer_leaves(leaves)
