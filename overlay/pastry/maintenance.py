"""Pastry maintenance: leaf-set liveness and repair, partition healing.

Theory of operation (Rowstron & Druschel 2001 §2.5 "node departure"; MSPastry,
Castro et al. 2003 §3.2–3.3; FreePastry ``PeriodicLeafSetProtocol``, ``PartitionHandler``).
The budget is MSPastry's: < 0.5 messages/s/node at steady state, so nothing here pings all L
leaves periodically.

* **Heartbeats.** Every ``heartbeat_interval_s`` (20 s) a node sends :class:`Heartbeat` — which
  carries its leaf set — to its left (counter-clockwise) neighbour only (MSPastry, Castro et al.
  2004 §3; 0.05 msg/s/node). Each node holds a *lease* on its right neighbour: any message from
  it (heartbeats, route acks, pongs) renews it. A lease older than ``neighbor_lease_s`` (30 s)
  starts a probe (RFC 6298 RTO back-off, ``overlay.proximity``); if that probe's first ping goes
  unanswered, the failure may be correlated, so every leaf-set member we have not heard from
  lately is probed too. A node's left neighbour is watched by the left neighbour's own left
  neighbour, whose verdict reaches us as a failure report (below).
* **Failure spreading.** A member that our own probes declare DEAD is removed and
  :class:`LeafFailed` goes to the rest of the leaf set. A report is a hint, never a verdict
  (MSPastry §3.2): a receiver probes the named node itself (at most once per
  ``failure_report_probe_interval_s``) and removes it only if its own probe fails, so no
  single datagram — forged, stale or from a non-member — evicts a live neighbour.
* **Re-integration.** A node declared dead while it was merely cut off is told so (the verdict
  also goes to the accused; a member that finds it alive tells it) and announces itself to its
  whole leaf set, both sides at once: :class:`~overlay.pastry.reintegration.Reintegration`.
* **Gossip and consistency.** Heartbeat leaf sets are merged: a candidate that belongs in our
  leaf set is probed and inserted on the pong ("probe new members on insertion"), then told
  about us. A member that should appear in the sender's leaf set but does not is probed.
* **Leaf-set repair.** A side that falls short of L/2 (and the sides do not overlap) asks its
  extreme live member for its leaf set (R&D §2.5); candidates are merged as gossip.
* **Routing table.** A dead entry's slot is repaired and the table kept near by row swaps,
  row walks and announcements: ``tables.py`` (:class:`~overlay.pastry.tables.TableMaintenance`).
* **Partition healing.** Every ``partition_check_interval_s`` (300 s) a node routes a rejoin for
  its own id through a recently *gone* node (or, rarely, a bootstrap address). If the gone node
  lives in another ring, the reply brings that ring's nodes near our id; leaf-set gossip does
  the rest.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import partial

from overlay.handle import NodeHandle
from overlay.ids import HALF_RING, RING
from overlay.runtime import Timer

from .host import PastryHost
from .messages import (
    Handles,
    Heartbeat,
    JoinRequest,
    LeafFailed,
    LeafSetRequest,
    check_handles,
)
from .reintegration import Reintegration

log = logging.getLogger(__name__)

_MIN_SLEEP_S = 0.5
#: a neighbour's unchanged heartbeat is fully re-merged at least this often (see on_heartbeat)
_HB_FULL_EVERY_S = 100.0


class Maintenance:
    """Timers and handlers of the periodic Pastry protocols, for one core."""

    def __init__(self, core: PastryHost) -> None:
        self.core = core
        self.cfg = core.config
        #: last time each immediate neighbour renewed its lease (any message from it)
        self.heard: dict[NodeHandle, float] = {}
        #: recently gone nodes (partition healing), insertion-ordered: handle -> time gone
        self.gone: dict[NodeHandle, float] = {}
        self._tick_timer: Timer | None = None
        self._part_timer: Timer | None = None
        self._started = False
        self._next_hb = 0.0
        self._lease_probing: set[NodeHandle] = set()
        #: per neighbour: (its last merged leaf set, ours at that time, when)
        self._hb_seen: dict[NodeHandle, tuple[Handles, Handles, float]] = {}
        self._last_verify = -math.inf
        #: nodes a failure report named, and when (a verdict our probe then confirms is not
        #: spread again: the reporter already told the leaf set)
        self._reported: dict[NodeHandle, float] = {}
        self._last_repair = [-math.inf, -math.inf]
        self._repair_round = [0, 0]
        self._repair_prev: list[tuple[NodeHandle, float] | None] = [None, None]
        #: a side went short while its repair was rate-limited: repair it when allowed
        self._repair_due = [False, False]
        #: when the last few leaf-set members were found dead (correlated-failure test)
        self._leaf_failures: list[float] = []
        #: a node declared dead while alive announces itself (``reintegration.py``)
        self.reint = Reintegration(core)

    # ------------------------------------------------------------------ timers
    def start(self) -> None:
        """Arm the heartbeat, lease and partition-check timers."""
        if self._started:
            return
        self._started = True
        rt = self.core.runtime
        rng = rt.rng
        cfg = self.cfg
        first = rng.uniform(0.0, cfg.heartbeat_interval_s)
        self._next_hb = rt.now() + first
        self._tick_timer = rt.call_later(first, self._tick)
        self._part_timer = rt.call_later(
            rng.uniform(0.5, 1.5) * cfg.partition_check_interval_s, self._partition_check
        )

    def stop(self) -> None:
        """Cancel every maintenance timer."""
        for t in (self._tick_timer, self._part_timer):
            if t is not None:
                t.cancel()
        self._tick_timer = self._part_timer = None

    def _tick(self) -> None:
        core = self.core
        if core.stopped:
            return
        rt = core.runtime
        now = rt.now()
        cfg = self.cfg
        wake = now + cfg.lease_check_interval_s
        if core.ready:
            if now >= self._next_hb - 1e-9:
                self._send_heartbeats()
                self._next_hb = now + cfg.heartbeat_interval_s
            wake = min(wake, self._next_hb, self._check_leases(now))
            self._maybe_repair(now)
        self._tick_timer = rt.call_later(max(_MIN_SLEEP_S, wake - now), self._tick)

    def on_ready(self) -> None:
        """The join finished: renew the neighbours' leases; announce us to the tables."""
        core = self.core
        now = core.runtime.now()
        for n in core.leaf.neighbors():
            if n is not None:
                self.heard[n] = now
        core.tables.on_ready()

    # ------------------------------------------------------------------ heartbeats & leases
    def _send_heartbeats(self) -> None:
        # MSPastry (Castro et al. 2004 §3): the heartbeat goes to the left (counter-clockwise)
        # neighbour only, which holds the lease on us; our left neighbour's failure is found by
        # *its* left neighbour, which spreads it to the leaf set (us included). One message
        # per node per period instead of two.
        core = self.core
        ccw, cw = core.leaf.neighbors()
        msg = Heartbeat(core.leaf.nodes(), self.recent_failures())
        if self.cfg.heartbeat_left_only:
            n = ccw if ccw is not None else cw
            targets: tuple[NodeHandle | None, ...] = (n,)
        else:
            targets = (ccw, cw) if cw != ccw else (ccw,)
        for n in targets:
            if n is not None:
                core.runtime.send(n, msg)
                core.stats["heartbeats_sent"] += 1

    def push_to(self, h: NodeHandle) -> None:
        """Tell a node we just put in our leaf set about us and our leaf set."""
        core = self.core
        core.stats["leaf_pushes"] += 1
        core.runtime.send(h, Heartbeat(core.leaf.nodes(), self.recent_failures()))

    def recent_failures(self) -> tuple[tuple[NodeHandle, float], ...]:
        """(node, age) of nodes found dead within ``failed_spread_s`` (<= gone history)."""
        if not self.gone:
            return ()
        now = self.core.runtime.now()
        limit = self.cfg.failed_spread_s
        return tuple((h, now - t) for h, t in self.gone.items() if now - t < limit)

    def _last_heard(self, h: NodeHandle) -> float | None:
        last = self.heard.get(h)
        p = self.core.prox.peers.get(h)
        if p is not None and p.last_heard >= 0 and (last is None or p.last_heard > last):
            last = p.last_heard
        return last

    def _check_leases(self, now: float) -> float:
        """Probe the right neighbour if its lease expired; return its next expiry.

        Only the right (clockwise) neighbour heartbeats us (see ``_send_heartbeats``), so only
        its lease is held; with no right neighbour (a one-sided leaf set) the left one's."""
        leaf = self.core.leaf
        if not self.cfg.heartbeat_left_only:
            earliest = math.inf
            if leaf.ccw:
                earliest = self._check_lease(leaf.ccw[0], now)
            if leaf.cw:
                earliest = min(earliest, self._check_lease(leaf.cw[0], now))
            return earliest
        if leaf.cw:
            return self._check_lease(leaf.cw[0], now)
        if leaf.ccw:
            return self._check_lease(leaf.ccw[0], now)
        return math.inf

    def _check_lease(self, n: NodeHandle, now: float) -> float:
        if n in self._lease_probing:
            return math.inf
        last = self.heard.get(n)
        p = self.core.prox.peers.get(n)
        if p is not None and (last is None or p.last_heard > last):
            last = p.last_heard if p.last_heard >= 0 else last
        if last is None:
            self.heard[n] = last = now
        expiry = last + self.cfg.neighbor_lease_s
        if expiry > now:
            return expiry
        core = self.core
        self._lease_probing.add(n)
        core.stats["lease_probes"] += 1
        first_rto = core.prox.rto(n)
        core.prox.probe(n, self._lease_cb(n))
        core.runtime.call_later(first_rto * 1.01, partial(self._suspicion, n))
        return math.inf

    def _lease_cb(self, n: NodeHandle) -> Callable[[float | None], None]:
        def done(rtt: float | None) -> None:
            self._lease_probing.discard(n)
            if rtt is not None:
                self.heard[n] = self.core.runtime.now()

        return done

    def _suspicion(self, n: NodeHandle) -> None:
        """The first ping to a silent neighbour went unanswered: verify the whole leaf set."""
        if n in self._lease_probing and not self.core.stopped:
            self._verify_leaves(self.core.runtime.now())

    def _verify_leaves(self, now: float) -> None:
        cfg = self.cfg
        if now - self._last_verify < cfg.leaf_verify_after_s:
            return
        self._last_verify = now
        core = self.core
        for m in core.leaf.nodes():
            last = self._last_heard(m)
            if last is None or now - last > cfg.leaf_verify_after_s:
                core.stats["leaf_sweep_probes"] += 1
                core.prox.probe(m)

    def on_heartbeat(self, src: NodeHandle, msg: Heartbeat) -> None:
        """A neighbour's heartbeat: renew its lease, merge its leaf set, check consistency."""
        core = self.core
        now = core.runtime.now()
        leaf = core.leaf
        if src in leaf.members:
            self.heard[src] = now
        # Fast path (most heartbeats): neither its leaf set nor ours changed since we last
        # merged them, and no failure news — nothing to learn. Re-merged at least every
        # ``_HB_FULL_EVERY_S`` so that time-dependent checks still run.
        seen = self._hb_seen.get(src)
        if (
            not msg.failed
            and seen is not None
            and seen[1] is leaf.nodes()
            and now - seen[2] < _HB_FULL_EVERY_S
            and seen[0] == msg.leaves
        ):
            return

        leaves = check_handles(msg.leaves)
        failed = _check_failed(msg.failed)
        for f, ago in failed:
            self._failure_report(src, f, now - ago, now)
        core.learn_alive(src)
        core.offer_leaves(leaves)
        self._consistency(src, leaves, now)
        if src in core.leaf.members:
            self._hb_seen[src] = (leaves, core.leaf.nodes(), now)

    def _consistency(self, src: NodeHandle, leaves: tuple[NodeHandle, ...], now: float) -> None:
        """Probe members that ``src``'s (full) leaf set should list but does not (MSPastry)."""
        core = self.core
        half = core.leaf.half
        if len(leaves) < 2 * half or src not in core.leaf.members:
            return
        ring = 1 << 160
        sid = int(src.id)
        ccw_far = (sid - int(leaves[half - 1].id)) % ring
        cw_far = (int(leaves[-1].id) - sid) % ring
        listed = set(leaves)
        tell = False
        for m in core.leaf.nodes():
            if m == src or m in listed:
                continue
            d = (int(m.id) - sid) % ring
            if d < cw_far or ring - d < ccw_far:
                last = self._last_heard(m)
                if last is None or now - last > self.cfg.heartbeat_interval_s:
                    core.stats["consistency_probes"] += 1
                    core.prox.probe(m)
                elif m not in core.prox.bad:
                    tell = True
        if tell:
            # ``src`` misses a member we heard from lately: send it our leaf set. Heartbeats
            # flow leftwards only, so this is how a node on our right hears of nodes on its
            # left that its own (short, then refilled) side never learnt — after a partition
            # heals into two rings, or a run of crashes.
            core.stats["consistency_pushes"] += 1
            self.push_to(src)

    # ------------------------------------------------------------------ failures
    def on_dead(
        self,
        h: NodeHandle,
        was_leaf: bool,
        slot: tuple[int, int] | None,
        spread: bool = True,
        neighbour: bool = False,
    ) -> None:
        """Our own probes found ``h`` dead: repair its slot, tell the leaf set (unless it left).
        ``neighbour``: ``h`` was one of our two immediate neighbours."""
        core = self.core
        now = core.runtime.now()
        self.heard.pop(h, None)
        self._lease_probing.discard(h)
        self.gone.pop(h, None)
        self.gone[h] = now
        while len(self.gone) > self.cfg.gone_history_size:
            del self.gone[next(iter(self.gone))]
        if slot is not None:
            self.repair_slot(*slot)
        if not was_leaf:
            return
        reported = self._reported.pop(h, None)
        found_by_us = reported is None or now - reported > self.cfg.failed_spread_s
        # An immediate neighbour's verdict is spread even when a report came first: the
        # reporter's leaf set is not ours, and with heartbeats going left only the dead node's
        # right-hand members hear of it from us, its watcher (a 20 % mass crash left them
        # holding it for over a minute otherwise).
        if spread and (found_by_us or neighbour):
            # Our own probes found it dead, and no one told us first: tell the leaf set, whose
            # members probe it themselves. A verdict that confirms someone else's report is not
            # spread again — the reporter's leaf set (which overlaps ours) already heard, and
            # heartbeats carry recent failures on to the immediate neighbours. Spreading every
            # confirmation cost L x L = 256 messages a crash (0.14 msg/s/node at 30-min
            # sessions) instead of ~L.
            msg = LeafFailed(h, 0.0)
            for m in core.leaf.nodes():
                core.runtime.send(m, msg)
            # ... and the accused itself: if it was merely cut off, it learns it was declared
            # dead and announces itself to its whole leaf set (``reintegration.py``)
            core.runtime.send(h, msg)
            core.stats["leaf_failed_sent"] += len(core.leaf) + 1
        elif spread and reported is not None:
            last = self._last_heard(h)
            if last is not None and last > reported:
                # It spoke after the report that made us probe it, yet the probe ran out (its
                # pings went while it was cut off): a verdict a message contradicts. Tell it,
                # or it stays out of our leaf set until it happens to speak to us again.
                self.reint.tell(h, now)
        if (int(core.id) - int(h.id)) % RING <= HALF_RING:
            # A counter-clockwise member went. Heartbeats flow leftwards only, so nothing else
            # brings that side's farther nodes: ask the side's neighbour for its leaf set
            # (``_maybe_repair``), even if gossip from the right refills the side first.
            self._repair_due[0] = True
        recent = self._leaf_failures
        correlated = any(now - t <= self.cfg.leaf_verify_after_s for t in recent)
        recent.append(now)
        if len(recent) > 4:
            del recent[0]
        if spread and (found_by_us or correlated):
            # Failures may be correlated (a site, a partition), and a member no one reports to
            # us would stay until a route to it ran out: the detector checks the rest of its
            # leaf set (rate-limited), and so does every member once a second failure comes
            # within ``leaf_verify_after_s``. A lone failure confirmed from someone's report does
            # not: under churn every one of the L members swept ~L probes per crash
            # (0.056 msg/s/node, N = 2 000, 30-min sessions) to find the crash already found.
            self._verify_leaves(now)
        self._maybe_repair(now)

    def on_alive(self, h: NodeHandle) -> None:
        """``h`` is alive again: it is no longer a gone node to heal through. If our own
        probes had declared it dead and it belongs in our leaf set, the other members that
        did the same hold it out until it speaks to them: tell it (``reintegration.py``)."""
        found_at = self.gone.pop(h, None)
        core = self.core
        if found_at is not None and core.ready and not core.stopped and core.leaf.fits(h.id):
            self.reint.tell(h, found_at)

    def on_leaf_failed(self, src: NodeHandle, msg: LeafFailed) -> None:
        """A failure report: a hint that makes us probe the named node ourselves."""
        ((dead, ago),) = _check_failed(((msg.dead, msg.ago_s),))
        now = self.core.runtime.now()
        self._failure_report(src, dead, now - ago, now)

    def _failure_report(
        self, src: NodeHandle, dead: NodeHandle, found_at: float, now: float
    ) -> None:
        """``src`` says ``dead`` was found dead at ``found_at`` (our clock, give or take)."""
        core = self.core
        if dead == core.handle:
            # we are alive: say so — to the whole leaf set, whose members may hold the verdict
            self.reint.accused(src, found_at, [h for h, _ in self.recent_failures()])
            return
        if dead == src or now - found_at > self.cfg.failed_spread_s:
            return
        last = self._last_heard(dead)
        if last is not None and last >= found_at:
            # it spoke after it was found dead: the report is stale — and the reporter (with
            # whoever confirmed it) holds a false verdict that only the accused can undo
            if dead in core.leaf.members:
                self.reint.tell(dead, found_at)
            return
        reported = self._reported
        if len(reported) >= 4 * self.cfg.leaf_set_size:
            limit = self.cfg.failed_spread_s
            for k in [k for k, t in reported.items() if now - t > limit]:
                del reported[k]
        if len(reported) < 8 * self.cfg.leaf_set_size:  # bounded against floods of reports
            reported[dead] = now
        core.accept_failure_report(dead, found_at)

    def _maybe_repair(self, now: float) -> None:
        """Refill a short leaf-set side by asking its extreme live member (R&D §2.5)."""
        core = self.core
        leaf = core.leaf
        if not core.ready:
            return
        if not leaf.members:
            if len(core.table) and now - self._last_repair[0] >= self.cfg.lease_check_interval_s:
                self._last_repair[0] = now
                self._rejoin_via(core.runtime.rng.choice(list(core.table.entries())))
            return
        if leaf.covers_ring:
            return
        bad = core.prox.bad
        for idx, side, other in ((0, leaf.ccw, leaf.cw), (1, leaf.cw, leaf.ccw)):
            if len(side) >= leaf.half and not self._repair_due[idx]:
                if self._repair_round[idx]:
                    self._repair_done(self._repair_round[idx])
                self._repair_round[idx] = 0
                self._repair_prev[idx] = None
                continue
            if now - self._last_repair[idx] < self.cfg.lease_check_interval_s:
                # Short again while the last request is recent: ask once more when the rate
                # limit allows, even if gossip refills the side meanwhile — a short side takes
                # any candidate, however far, and with heartbeats going left only nothing else
                # brings the nearer nodes of the counter-clockwise side.
                self._repair_due[idx] = len(side) < leaf.half or self._repair_due[idx]
                continue
            self._repair_due[idx] = False
            nearest = self._nearest_known(clockwise=idx == 1, skip=set())
            if nearest is not None:
                core.offer_leaves((nearest,), skip_dead=True)
            skip: set[NodeHandle] = set()
            prev = self._repair_prev[idx]
            if prev is not None:
                last = self._last_heard(prev[0])
                if last is None or last < prev[1]:  # it never answered: check it is alive
                    skip.add(prev[0])
                    core.prox.probe(prev[0])
            rnd = self._repair_round[idx]
            self._repair_round[idx] = rnd + 1
            target = None
            if len(side) >= leaf.half:
                # full again (gossip refilled it), yet a member went: the neighbour on that
                # side lists the L/2 nodes beyond it, which a short side may have taken
                # farther nodes in place of
                target = next((h for h in side if h not in bad and h not in skip), None)
            elif rnd % 2 == 1 or not side:
                # The extreme may be as lost as we are (a partition cut the ring next to us):
                # every other round ask the nearest node our routing table knows that way.
                target = self._nearest_known(clockwise=idx == 1, skip=skip)
            if target is None:
                target = next((h for h in reversed(side) if h not in bad and h not in skip), None)
            if target is None:
                target = next((h for h in other if h not in bad and h not in skip), None)
            if target is None:
                continue
            self._last_repair[idx] = now
            self._repair_prev[idx] = (target, now)
            core.stats["leaf_repairs"] += 1
            core.runtime.send(target, LeafSetRequest(0, insert_me=False))

    def _repair_done(self, rounds: int) -> None:
        """A repair episode of ``rounds`` requests ended: cross-check the leaf set against the
        routing table and, after more than one round, re-route a join for our own id, which
        reaches our true neighbours even when the members we asked were as lost as we were (a
        partition cut the ring next to us). A side refilled by its first request (a lone
        crash, the common case under churn) skips the join: every member of a crashed node's
        leaf set re-routed one, ~0.025 msg/s/node at N = 2,000 with 30-min sessions."""
        core = self.core
        self.table_leaf_check()
        if rounds < 2:
            return
        ents = [h for h in core.table.entries() if h not in core.prox.bad]
        if ents:
            self._rejoin_via(core.runtime.rng.choice(ents))

    def table_leaf_check(self) -> None:
        """Routing-table entries that belong in the leaf set but are not there are offered
        (probed, then inserted). A no-op, without messages, when the state is consistent."""
        core = self.core
        leaf = core.leaf
        core.offer_leaves(
            [h for h in core.table.entries() if h not in leaf.members and leaf.fits(h.id)]
        )

    def _nearest_known(self, clockwise: bool, skip: set[NodeHandle]) -> NodeHandle | None:
        """The live routing-table entry nearest to us in one direction, outside the leaf set."""
        core = self.core
        bad = core.prox.bad
        members = core.leaf.members
        oid = int(core.id)
        ring = 1 << 160
        best: NodeHandle | None = None
        bd = ring
        for h in core.table.entries():
            if h in bad or h in skip or h in members:
                continue
            d = (int(h.id) - oid) % ring if clockwise else (oid - int(h.id)) % ring
            if d < bd:
                best, bd = h, d
        return best

    def repair_slot(self, row: int, col: int) -> None:
        """A dead entry's slot: see :meth:`~overlay.pastry.tables.TableMaintenance.repair_slot`."""
        self.core.tables.repair_slot(row, col)

    # ------------------------------------------------------------------ partitions
    def _partition_check(self) -> None:
        core = self.core
        if core.stopped:
            return
        rt = core.runtime
        cfg = self.cfg
        self._part_timer = rt.call_later(cfg.partition_check_interval_s, self._partition_check)
        now = rt.now()
        core.prox.expire_dead()
        # proximity state only for peers our tables hold (overlay/proximity.py): without this the
        # table keeps every peer ever measured, growing for as long as the node runs under churn
        core.prox.forget_unreferenced({*core.leaf.members, *core.table.entries()})
        members = core.leaf.members
        for h in [h for h in self._hb_seen if h not in members]:
            del self._hb_seen[h]
        for h in [h for h, t in self.gone.items() if now - t > cfg.gone_history_age_s]:
            del self.gone[h]
        if not core.ready:
            return
        rng = rt.rng
        use_bootstrap = rng.random() < cfg.bootstrap_check_rate
        if self.gone and not use_bootstrap:
            self._rejoin_via(rng.choice(list(self.gone)))
        elif use_bootstrap and core.joiner.seeds:
            core.stats["rejoins"] += 1
            rt.send_address(
                rng.choice(core.joiner.seeds), JoinRequest(rng.getrandbits(62), rejoin=True)
            )

    def _rejoin_via(self, h: NodeHandle) -> None:
        core = self.core
        core.stats["rejoins"] += 1
        core.runtime.send(h, JoinRequest(core.runtime.rng.getrandbits(62), rejoin=True))


def _check_failed(items: object) -> tuple[tuple[NodeHandle, float], ...]:
    """Validate a (handle, age) list from the network (malformed → ValueError)."""
    if not isinstance(items, tuple | list):
        raise ValueError("failed set must be a tuple")
    out = []
    for it in items:
        if not isinstance(it, tuple | list) or len(it) != 2:
            raise ValueError("failed entry must be (handle, age)")
        h, ago = it
        if type(h) is not NodeHandle or isinstance(ago, bool) or not isinstance(ago, int | float):
            raise ValueError("failed entry must be (handle, age)")
        if not 0.0 <= ago < math.inf:
            raise ValueError("failed age must be >= 0")
        out.append((h, float(ago)))
    return tuple(out)
