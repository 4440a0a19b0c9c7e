"""Self-organizing flock of Condor pools: TTL announcements, the willing list, the Flocking
Manager (Butt et al. 2006 §3.2, §4.1; Butt et al. 2003 §3.2).

Theory of operation. One :class:`Flock` runs on each pool's central manager, as an application
on the node's overlay core (Pastry or the small-world ring):

* **Information Gatherer, sending side.** Every ``announce_period_s`` (jittered, so pools do
  not synchronise) a pool with free machines announces them "to all the pools specified in its
  routing table, starting from the first row and going downwards" (§3.2.1): row 0 first, each
  copy carrying its row. On the small-world ring, which has no rows, it announces to all its
  connections. Before sending, the Policy Manager decides what each receiver is offered (the
  sender-side check of §3.2, §4.1): pools we do not accept jobs from get nothing, caps and the
  idle threshold apply. The offer every unnamed pool would get is the *public* announcement —
  signed once per row, forwardable; a receiver offered something else gets a *tailored* copy
  addressed to it alone (never forwarded). A pool whose offer fell to zero sends one withdrawal
  (free = 0) to the receivers it last offered something.
* **Information Gatherer, receiving side.** A receiver checks shape, the origin signature
  (``flock_messages``), freshness (not expired, not from the future beyond the allowed clock
  skew) and the per-origin sequence number (older ⇒ replayed; the same copy again ⇒
  duplicate); every drop is counted in ``stats``. It forwards while ``ttl - hops - 1 > 0`` —
  on Pastry to the nodes of the *same row* of its own table (§3.2.2), on the small-world ring to
  all its connections — whatever its own policy says ("in either case, the announcement is
  forwarded in accordance with the TTL", §4.1). Then its Policy Manager decides
  (``announce-from``); if allowed, the origin enters ``willing_list[row]`` (Pastry: the origin's
  row; small world: the number of forwarding hops). Origins without a measured RTT are probed
  through the core's proximity (§4.1: "pinging the nodes on the list").
* **Willing list** (``willing.py``): sublists in the total order (RTT rounded to a tolerance,
  more free machines first, seeded random); entries expire when the origin's offer does.
* **Flocking Manager** (:mod:`discovery.flock_manager`, a mixin of :class:`Flock`). Every
  ``manager_period_s``: local idle jobs exceeding free local machines ⇒ flocking on, targets =
  the willing list flattened nearest first, keeping only pools with free machines that the
  ``flock-to`` policy and the blacklists admit; free machines exceeding idle jobs
  (underused) ⇒ off; equal ⇒ unchanged (a hysteresis band, so a full pool with an empty queue
  does not toggle HTCondor's configuration). A new :class:`~discovery.decision.FlockDecision`
  (next ``seq``) is published only when the configuration it renders (on/off and the ordered
  collectors) changes.

Defaults (Butt et al. 2006 §5.1.1 and §5.2.1 ran TTL 1, announcement validity 1 min and a
Flocking Manager period of 1 min; the papers say only "periodically" for announcements — see
:class:`FlockConfig` for the period chosen here and why).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs

from discovery.condor_syntax import is_valid_contact
from discovery.decision import FlockDecision
from discovery.flock_config import FlockConfig, IdleAwarePool, PoolView
from discovery.flock_manager import FlockingManager
from discovery.flock_messages import (
    FLOCK_APP,
    AnnounceSigner,
    BlacklistShare,
    FlockAnnounce,
    KeyCache,
    sign_announce,
    verify_announce,
)
from discovery.policy import ANNOUNCE_FROM, FLOCK_TO, Peer, Policy, collector_host
from discovery.signing import PUBLIC_KEY_BYTES, SIGNATURE_BYTES
from discovery.willing import WillingEntry, WillingList
from overlay.errors import ConfigError
from overlay.handle import NodeHandle
from overlay.ids import ID_BITS, NodeId
from overlay.kbr import BaseApplication, KbrCore
from overlay.pastry.core import PastryCore
from overlay.pastry.routing_table import RoutingTable
from overlay.runtime import Timer

__all__ = [
    "FLOCK_APP",
    "Flock",
    "FlockConfig",
    "IdleAwarePool",
    "PoolView",
]


_MAX_TEXT = 255  # longest collector / pool name accepted from the network
_MAX_CONTACTS = 4096  # bound of the per-receiver cache of checked collector contacts


class _Origin:
    """Replay / duplicate state of one origin: its newest sequence number and, for that
    number, the most remaining TTL seen per copy kind (row, tailored). Most origins reach a
    receiver as one kind, so the first is kept in two slots and a dict only holds the rest
    (thousands of these live on every simulated node)."""

    __slots__ = ("k0", "more", "r0", "seq", "tailored", "until")

    def __init__(self, seq: int, until: float) -> None:
        self.seq = seq
        self.until = until
        self.tailored = False
        self.k0 = -1
        self.r0 = 0
        self.more: dict[int, int] | None = None

    def reset(self, seq: int, until: float) -> None:
        # a newer round from this origin: start over (reusing the record saves an allocation
        # per origin and round on every receiver)
        self.seq = seq
        self.until = until
        self.tailored = False
        self.k0 = -1
        self.r0 = 0
        self.more = None

    def seen(self, kind: int) -> int | None:
        if kind == self.k0:
            return self.r0
        return None if self.more is None else self.more.get(kind)

    def mark(self, kind: int, remaining: int) -> None:
        if self.k0 < 0 or kind == self.k0:
            self.k0, self.r0 = kind, remaining
        else:
            if self.more is None:
                self.more = {}
            self.more[kind] = remaining


class Flock(FlockingManager, BaseApplication):
    """The flock plugin on one central manager's overlay node (sans-io)."""

    def __init__(
        self,
        core: KbrCore,
        pool: PoolView,
        config: FlockConfig | None = None,
        *,
        policy: Policy | None = None,
        signer: AnnounceSigner | None = None,
        collector: str = "",
        pool_name: str = "",
        clock: Callable[[], float] | None = None,
        on_decision: Callable[[FlockDecision], object] | None = None,
        register: bool = True,
    ) -> None:
        """``clock`` is the time announcements are stamped and checked with: on live nodes
        the wall clock (pools compare stamps across machines), by default the runtime's
        clock (the simulator's virtual time is one clock for every node). ``on_decision`` is
        called with every newly published decision."""
        self.core = core
        self.runtime = core.runtime
        self.id = core.id
        self.pool = pool
        self.config = cfg = config if config is not None else FlockConfig()
        if cfg.require_signatures and signer is None:
            raise ConfigError("require_signatures is on but no signer was given")
        if signer is not None and NodeId.hash_of(signer.public_key) != core.id:
            raise ConfigError("the signer's public key does not hash to this node's id")
        if len(collector) > _MAX_TEXT or len(pool_name) > _MAX_TEXT:
            raise ConfigError("collector and pool_name are limited to 255 characters")
        self.signer = signer
        self.collector = collector
        self.pool_name = pool_name
        self.clock: Callable[[], float] = clock if clock is not None else self.runtime.now
        self.on_decision = on_decision
        self.policy = Policy.allow_all()
        self._hosts: dict[NodeId, str] = {}  # collector hosts learned from verified announcements
        # what the hot paths need of the policy, derived once per policy object (see _learn)
        self._learned: Policy | None = None
        self._uniform = True
        self._announce_from: bool | None = True
        self._flock_to: bool | None = True
        # collector contacts that passed is_valid_contact -> their host (a pure function of
        # the string, so remembering it changes nothing; bounded against junk)
        self._contacts: dict[str, str] = {}
        self.set_policy(policy if policy is not None else Policy.allow_all())
        self.stats: Counter[str] = Counter()
        self.willing = WillingList(cfg.rtt_tolerance_s)
        self.decision: FlockDecision | None = None
        self.epoch = 0
        self._dseq = 0
        self._republish = False
        self._pastry = callable(getattr(core, "routing_row", None))
        # a stock Pastry core's routing_row(i) is table.row(i): read the table's rows directly
        # instead of asking for each of the 160/b rows, most of them empty, every round
        self._table: RoutingTable | None = None
        if getattr(type(core), "routing_row", None) is PastryCore.routing_row:
            tbl = getattr(core, "table", None)
            if isinstance(tbl, RoutingTable):
                self._table = tbl
        b = getattr(getattr(core, "config", None), "b_bits", 4)
        self._nrows = ID_BITS // b if isinstance(b, int) and b > 0 else ID_BITS
        self._seq = -1
        self._origins: dict[NodeId, _Origin] = {}
        # what each receiver was offered last round (for withdrawals); with a uniform policy
        # only the one public offer is kept
        self._last_offer: dict[NodeId, int] = {}
        self._last_public = 0
        self._probing: set[NodeId] | None = None  # allocated while probes are in flight
        self._blacklist: dict[str, float] = {}
        self._shared: dict[NodeId, tuple[int, dict[str, float]]] = {}
        self._keys = KeyCache()
        self._timers: list[Timer | None] = [None, None]
        self._stopped = False
        if register:
            core.register(FLOCK_APP, self)
            core.add_handler(FlockAnnounce, self._on_announce)
            core.add_handler(BlacklistShare, self._on_blacklist_share)

    # ------------------------------------------------------------------ control
    def set_policy(self, policy: Policy) -> None:
        """Swap in a (fully loaded) policy; refuses one the pool model cannot honour."""
        if policy.sharing.min_idle_s > 0 and not isinstance(self.pool, IdleAwarePool):
            raise ConfigError(
                f"policy {policy.source} sets min_idle_s but the pool model cannot count "
                "machines by idle time (it has no free_machines_idle_for())"
            )
        self.policy = policy
        self._learn(policy)
        if policy.uniform_offer:
            self._hosts = {}

    def _learn(self, policy: Policy) -> None:
        # Decisions that do not depend on the peer, precomputed so that the per-message paths
        # build no Peer when the policy could not tell peers apart (a rule without patterns
        # answers its default for everyone; flock-to also consults agreements).
        self._learned = policy
        self._uniform = policy.uniform_offer
        af = policy.rule(ANNOUNCE_FROM)
        self._announce_from = af.default if af.is_trivial else None
        ft = policy.rule(FLOCK_TO)
        self._flock_to = ft.default if ft.is_trivial and not policy.agreements else None

    def start(self) -> None:
        """Arm the announcement and manager timers (random first phase within a period)."""
        rng = self.runtime.rng
        self._stopped = False
        self._arm(0, rng.random() * self.config.announce_period_s)
        self._arm(1, rng.random() * self.config.manager_period_s)

    def stop(self) -> None:
        """Cancel the timers; receiving stops too."""
        self._stopped = True
        for t in self._timers:
            if t is not None:
                t.cancel()
        self._timers = [None, None]

    def _arm(self, which: int, delay_s: float) -> None:
        fn = self._announce_tick if which == 0 else self._manager_tick
        self._timers[which] = self.runtime.call_later(delay_s, fn)

    def _period(self, period_s: float) -> float:
        return period_s * (1.0 - self.config.period_jitter * self.runtime.rng.random())

    def _announce_tick(self) -> None:
        if self._stopped:
            return
        self.announce_now()
        self._forget_old_origins()
        self._arm(0, self._period(self.config.announce_period_s))

    def _manager_tick(self) -> None:
        if self._stopped:
            return
        # a non-empty blacklist goes again to the pools trusted with it every Flocking Manager
        # period (1 min, a thirtieth of blacklist_s): one that arrived since hears it, and a
        # lost share is made good
        self.share_blacklist_now()
        self.decide_now()
        self._arm(1, self._period(self.config.manager_period_s))

    # ------------------------------------------------------------------ queries
    def willing_list(self) -> tuple[tuple[WillingEntry, ...], ...]:
        """The sublists (index = row), each in the willing-list order; expired entries gone."""
        return self.willing.sublists(self.clock())

    def willing_entries(self) -> list[WillingEntry]:
        """The willing list flattened, sublist 0 first (nearest first)."""
        return self.willing.flat(self.clock())

    # ------------------------------------------------------------------ sending side
    def _shareable_free(self) -> int:
        s = self.policy.sharing
        if s.min_idle_s > 0 and isinstance(self.pool, IdleAwarePool):
            return max(0, int(self.pool.free_machines_idle_for(s.min_idle_s)))
        return max(0, int(self.pool.free_machines))

    def _rows(self) -> list[tuple[int, list[NodeHandle]]]:
        tbl = self._table
        if tbl is not None:
            return [
                (r, hs)
                for r, row in enumerate(tbl.rows)
                if row is not None and (hs := [h for h in row if h is not None])
            ]
        if self._pastry:
            rr: Callable[[int], list[NodeHandle]] = self.core.routing_row  # type: ignore[attr-defined]
            return [(r, row) for r in range(self._nrows) if (row := rr(r))]
        return [(0, self.core.known_nodes())]

    def _peer_of(self, h: NodeHandle) -> Peer:
        return Peer.from_handle(h, self._hosts.get(h.id, ""))

    def _next_seq(self) -> int:
        # Milliseconds of the announcement clock, forced strictly increasing: a restarted pool
        # (whose counter would start again) is not taken for a replayer by its receivers.
        self._seq = max(self._seq + 1, int(self.clock() * 1000.0))
        return self._seq

    def announce_now(self) -> int:
        """One announcement round; returns the number of messages sent."""
        if self._stopped:
            return 0
        cfg = self.config
        pol = self.policy
        free = self._shareable_free()
        public = pol.offer_to(None, free)
        if pol is not self._learned:
            self._learn(pol)
        uniform = self._uniform
        last = self._last_offer
        last_public = self._last_public
        if public == 0 and not last and last_public == 0 and uniform:
            return 0  # nothing to offer and nothing to withdraw
        pool = self.pool
        idle_jobs = max(0, int(pool.idle_jobs))
        util = min(1.0, max(0.0, float(pool.utilization)))
        seq = self._next_seq()
        issued = self.clock()
        send = self.runtime.send
        offers: dict[NodeId, int] = {}
        sent = 0

        def make(row: int, offer: int, to: NodeId | None, ttl: int) -> FlockAnnounce:
            m = FlockAnnounce(
                self.core.handle,
                b"",
                self.collector,
                self.pool_name,
                offer,
                idle_jobs,
                util,
                issued,
                cfg.validity_s,
                ttl,
                row,
                seq,
                to,
                b"",
            )
            return sign_announce(m, self.signer) if self.signer is not None else m

        me = self.id
        if uniform and not last:
            # every receiver gets the public offer and had last_public before: one message per
            # row, and no per-receiver bookkeeping
            if public > 0 or (last_public > 0 and cfg.withdraw):
                for row, handles in self._rows():
                    pub_msg: FlockAnnounce | None = None
                    for h in handles:
                        if h.id == me:
                            continue
                        if pub_msg is None:
                            pub_msg = make(row, public, None, cfg.ttl)
                        send(h, pub_msg)
                        sent += 1
            self._last_offer = offers
            self._last_public = public
            self.stats["sent"] += sent
            return sent
        for row, handles in self._rows():
            pub_msg = None
            for h in handles:
                if h.id == me:
                    continue
                o = public if uniform else pol.offer_to(self._peer_of(h), free)
                before = last.get(h.id, last_public)
                if o == public:
                    if public == 0 and (before == 0 or not cfg.withdraw):
                        continue
                    if pub_msg is None:
                        pub_msg = make(row, public, None, cfg.ttl)
                    send(h, pub_msg)
                else:
                    if o == 0 and (before == 0 or not cfg.withdraw):
                        continue
                    send(h, make(row, o, h.id, 1))
                    self.stats["sent_tailored"] += 1
                sent += 1
                if o > 0 and not uniform:
                    offers[h.id] = o
        self._last_offer = offers
        self._last_public = public if uniform else 0
        self.stats["sent"] += sent
        return sent

    # ------------------------------------------------------------------ receiving side
    def _on_announce(self, src: NodeHandle, m: FlockAnnounce) -> None:
        # The hot path of a flock simulation (every receiver, every round): attribute lookups
        # are hoisted into locals and nothing is allocated for a duplicate or a drop.
        if self._stopped:
            return
        st = self.stats
        st["received"] += 1
        # shape: types and ranges of every field (inline: a call per message is measurable)
        try:
            o = m.origin
            bad = not (
                type(o) is NodeHandle
                and isinstance(o.id, NodeId)
                and isinstance(o.address, (int, str))
                and 0 <= m.free_machines < 1 << 31
                and 0 <= m.idle_jobs < 1 << 40
                and 0.0 <= m.utilization <= 1.0
                and m.valid_for_s > 0.0
                and m.issued_at_s == m.issued_at_s  # not NaN
                and abs(m.issued_at_s) < 1e12
                and 1 <= m.ttl <= self.config.max_ttl
                and 0 <= m.hops < m.ttl
                and 0 <= m.row < self._nrows
                and m.seq >= 0
                and len(m.collector) <= _MAX_TEXT
                and len(m.pool_name) <= _MAX_TEXT
                and len(m.public_key) in (0, PUBLIC_KEY_BYTES)
                and len(m.signature) in (0, SIGNATURE_BYTES)
                and (m.to is None or isinstance(m.to, NodeId))
            )
        except (TypeError, AttributeError):
            bad = True
        if bad:
            st["malformed"] += 1
            return
        c = m.collector
        host = self._contacts.get(c)
        if host is None:
            if c and not is_valid_contact(c):
                # it would end up in FLOCK_TO: only host[:port] contacts (no spaces, newlines
                # or macro syntax) ever reach HTCondor's configuration
                st["bad_collector"] += 1
                return
            host = self._remember_contact(c)
        oid = m.origin.id
        me = self.id
        if oid == me:
            st["own"] += 1
            return
        to = m.to
        if to is not None and to != me:
            st["misdirected"] += 1
            return
        cfg = self.config
        if cfg.require_signatures or m.signature or m.public_key:
            why = verify_announce(m, self._keys)
            if why is not None and (why != "unsigned" or cfg.require_signatures):
                st[why] += 1
                return
        now = self.clock()
        issued = m.issued_at_s
        valid = m.valid_for_s
        expires = issued + (valid if valid < cfg.max_validity_s else cfg.max_validity_s)
        if now >= expires:
            st["expired"] += 1
            return
        if issued > now + cfg.clock_skew_s:
            st["future"] += 1
            return
        seq = m.seq
        og = self._origins.get(oid)
        if og is None:
            og = self._origins[oid] = _Origin(seq, expires)
        elif seq > og.seq:
            og.reset(seq, expires)
        elif seq < og.seq:
            st["replayed"] += 1
            return
        remaining = m.ttl - m.hops - 1
        kind = 2 * m.row + (to is not None)
        prev = og.r0 if kind == og.k0 else og.seen(kind)
        if prev is not None and prev >= remaining:
            st["duplicate"] += 1
            return
        og.mark(kind, remaining)
        if remaining > 0 and to is None:
            self._forward(src, m)
        pol = self.policy
        if pol is not self._learned:
            self._learn(pol)
        if not self._uniform and self._hosts.get(oid) != host:
            # host names of the pools we may announce to, for host rules of the sender-side
            # check (kept only while the policy distinguishes receivers)
            if len(self._hosts) >= 2 * cfg.max_entries:
                self._hosts.clear()
            self._hosts[oid] = sys.intern(host)  # one string for every node that hears it
        self._store(m, host, expires, og)

    def _remember_contact(self, contact: str) -> str:
        host = sys.intern(collector_host(contact))
        if type(contact) is str:
            if len(self._contacts) >= _MAX_CONTACTS:
                self._contacts.clear()
            self._contacts[contact] = host
        return host

    def _forward(self, src: NodeHandle, m: FlockAnnounce) -> None:
        out = attrs.evolve(m, hops=m.hops + 1)
        if self._pastry:
            targets: list[NodeHandle] = self.core.routing_row(m.row)  # type: ignore[attr-defined]
        else:
            targets = self.core.known_nodes()
        oid = m.origin.id
        send = self.runtime.send
        n = 0
        for h in targets:
            if h.id != oid and h != src and h.id != self.id:
                send(h, out)
                n += 1
        self.stats["forwarded"] += n

    def _store(self, m: FlockAnnounce, host: str, expires: float, o: _Origin) -> None:
        st = self.stats
        wl = self.willing
        origin = m.origin
        oid = origin.id
        allowed = self._announce_from
        if allowed is None:
            allowed = self.policy.allows(ANNOUNCE_FROM, Peer.from_handle(origin, host))
        if not allowed:
            st["denied"] += 1
            wl.remove(oid)
            return
        sub = m.row if self._pastry else m.hops
        slot = wl.slot(oid)
        if m.to is None and o.tailored:
            # this round's tailored offer to us outranks the public copies of the same round
            if slot is not None and slot.seq == m.seq and sub < slot.row:
                slot.row = sub
                wl.changed(slot)
            st["accepted"] += 1
            return
        if m.to is not None:
            o.tailored = True
        if m.free_machines == 0:
            if wl.remove(oid):
                st["withdrawn"] += 1
            return
        if slot is None:
            if len(wl) >= self.config.max_entries:
                st["full"] += 1
                return
            slot = wl.add(m.origin, self.runtime.rng.random())
        if slot.seq == m.seq:
            slot.row = min(slot.row, sub)
        else:
            slot.row = sub
        slot.origin = m.origin
        slot.collector = m.collector
        slot.pool_name = m.pool_name
        slot.free_machines = m.free_machines
        slot.idle_jobs = m.idle_jobs
        slot.utilization = m.utilization
        slot.expires_at_s = expires
        slot.seq = m.seq
        rtt = self.core.rtt(m.origin)
        if rtt is not None:
            slot.rtt_s = rtt
        elif slot.rtt_s is None:
            self._probe(m.origin)
        wl.changed(slot)
        st["accepted"] += 1

    def _probe(self, h: NodeHandle) -> None:
        probing = self._probing
        if probing is None:
            probing = self._probing = set()
        elif h.id in probing:
            return
        probing.add(h.id)

        def done(rtt: float | None) -> None:
            p = self._probing
            if p is not None:
                p.discard(h.id)
                if not p:
                    self._probing = None
            s = self.willing.slot(h.id)
            if self._stopped or s is None:
                return
            if rtt is None:
                self.willing.remove(h.id)
                self.stats["probe_dead"] += 1
                return
            best = self.core.rtt(h)
            s.rtt_s = best if best is not None else rtt
            self.willing.changed(s)

        self.stats["probes"] += 1
        self.core.probe(h, done)

    def _forget_old_origins(self) -> None:
        # Any copy of a sequence number whose offer has expired would be dropped as expired,
        # so its replay state is no longer needed.
        now = self.clock()
        if len(self._origins) > len(self.willing) + 64:
            self._origins = {k: o for k, o in self._origins.items() if o.until > now}

    # ------------------------------------------------------------------ KBR upcalls
    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        """A blacklist share routed to this pool by its node id (``flock_blacklist``); any
        other payload is stray and counted."""
        if type(payload) is BlacklistShare:
            self._on_routed_share(key, payload, src)
            return
        self.stats["stray_payload"] += 1
