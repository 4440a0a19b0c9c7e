"""The flock's blacklists: pools that failed our jobs, and pools trusted peers told us of
(Butt et al. 2006 §3.2.1).

Theory of operation:

* **First-hand** (§3.2.1: pools "can individually maintain history about pools with whom
  previous sharing was not beneficial"). The pool model, or an operator, calls
  :meth:`FlockBlacklist.report_failure` when a pool accepted our jobs and then failed or evicted
  them; that pool — by node id or collector — is skipped for the policy's ``blacklist_s``.
* **Shared** (§3.2.1: pools "can dynamically learn of 'black listed' pools from other trusted
  pools"). A pool sends its first-hand entries, each with the seconds it has left, in one
  :class:`~discovery.flock_messages.BlacklistShare` to every pool it knows — the nodes of its
  routing state and the origins of its willing list — that its ``blacklist-to`` rule admits: at
  once when it blacklists a pool, and every Flocking Manager period while its list is not empty, so
  that a trusted pool arriving later learns it too and a lost share is made good. A receiver
  adopts the entries if its ``blacklist-from`` rule admits the sender, each until the sender's
  time left or its own ``blacklist_s``, whichever ends first; one share replaces all that
  receiver held from that sender, so what a sender no longer lists is dropped with its next
  share. Both rules deny by default: trust between pools is named by their administrators
  (``id:``, ``host:`` or ``addr:`` patterns), never assumed.
* **First-hand only.** Adopted entries are never passed on — trust is between two pools, and a
  rumour must not gain weight by travelling — and no pool adopts an entry naming itself.
* **Routed to pools named by id.** A ``blacklist-to`` allow pattern that is a whole node id
  (``id:`` and 40 hex digits) names one pool, which may be anywhere on the overlay: the share
  is also routed to that id (KBR ``route``), signed by its sender — it passes through other
  pools — and taken only by the pool whose id it is (``blacklist_misrouted`` at another root:
  the named pool is gone), within ``max_validity_s`` of being made (``blacklist_stale``: a
  captured copy replayed later); its signature is checked against the claimed sender
  (``blacklist_unsigned``, ``blacklist_forged``) and ``blacklist-from`` matches it by that id
  and its host, never by the address its route claims (relayed by others). Prefix, host and
  address patterns cannot be routed to; they reach the pools we know.
* **Otherwise one hop.** A direct share is never forwarded, so it names no origin: the sender
  is the node the transport authenticated (pair frames or signed envelopes on live nodes).
  Input that is not a
  share a pool could have sent — a wrong shape, more than :data:`MAX_SHARED` entries, a name
  that is neither a node id nor a collector contact, a time left that is not a positive number
  of seconds — is dropped and counted (``blacklist_malformed``), as are shares from untrusted
  senders (``blacklist_untrusted``) and older shares that arrive after a newer one
  (``blacklist_stale``); nothing raises.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from discovery.condor_syntax import is_valid_contact
from discovery.decision import FlockDecision
from discovery.flock_config import FlockConfig
from discovery.flock_messages import (
    FLOCK_APP,
    AnnounceSigner,
    BlacklistShare,
    KeyCache,
    sign_share,
    verify_share,
)
from discovery.policy import BLACKLIST_FROM, BLACKLIST_TO, Peer, Policy, Rule, collector_host
from discovery.signing import PUBLIC_KEY_BYTES, SIGNATURE_BYTES
from discovery.willing import WillingEntry, WillingList
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.kbr import KbrCore
from overlay.runtime import Runtime

__all__ = ["MAX_SHARED", "FlockBlacklist"]

# the flock's one logger, as before the blacklists had their own module
log = logging.getLogger("discovery.announce")

#: most entries one share carries (a sender with more sends those with the most time left);
#: a pool blacklists the few pools that failed it, not hundreds
MAX_SHARED = 256
#: most senders whose shares a pool keeps (only trusted ones get this far; a bound anyway)
MAX_SENDERS = 1024
_MAX_NAME = 255
_HEX = frozenset("0123456789abcdef")


def _key(pool: NodeId | str) -> str:
    """How a blacklist names a pool: 40 hex digits of its node id, or its collector contact
    lower-cased."""
    return f"{int(pool):040x}" if isinstance(pool, NodeId) else str(pool).strip().lower()


def _named_pools(rule: Rule) -> list[NodeId]:
    """The pools an allow list names by whole node id (``id:`` and 40 hex digits, which
    compile to that id followed by ``*``): the ones a share can be routed to."""
    out = []
    for p in rule.allow:
        g = p.glob
        if p.kind == "id" and len(g) == 41 and g[40] == "*" and set(g[:40]) <= _HEX:
            out.append(NodeId(int(g[:40], 16)))
    return out


def _valid_name(k: object) -> bool:
    if type(k) is not str or not 0 < len(k) <= _MAX_NAME or k != k.strip().lower():
        return False
    return (len(k) == 40 and set(k) <= _HEX) or is_valid_contact(k)


class FlockBlacklist:
    """The blacklist half of :class:`~discovery.announce.Flock`'s Flocking Manager (the Flock
    sets every attribute declared here)."""

    id: NodeId
    core: KbrCore
    runtime: Runtime
    config: FlockConfig
    signer: AnnounceSigner | None
    policy: Policy
    willing: WillingList
    collector: str
    clock: Callable[[], float]
    stats: Counter[str]
    decision: FlockDecision | None
    _stopped: bool
    _keys: KeyCache
    #: first-hand: pool name -> when it leaves the blacklist (runtime clock)
    _blacklist: dict[str, float]
    #: adopted: sender -> (seq of its newest share, pool name -> when it leaves)
    _shared: dict[NodeId, tuple[int, dict[str, float]]]

    if TYPE_CHECKING:

        def decide_now(self) -> FlockDecision:
            """One Flocking Manager pass (``FlockingManager``)."""

        def _next_seq(self) -> int:
            """The sender's next sequence number (``Flock``)."""

    # ------------------------------------------------------------------ first-hand
    def blacklist(self) -> dict[str, float]:
        """Our own blacklist: pool (node-id hex or collector) → seconds it stays blacklisted."""
        now = self.runtime.now()
        self._blacklist = {k: t for k, t in self._blacklist.items() if t > now}
        return {k: t - now for k, t in self._blacklist.items()}

    def report_failure(self, pool: NodeId | str, reason: str = "") -> None:
        """A pool accepted our jobs and then failed or evicted them: skip it for the policy's
        ``blacklist_s`` (Butt et al. 2006 §3.2.1), and tell the pools ``blacklist-to``
        admits. ``pool`` is a node id or a collector."""
        key = _key(pool)
        self._blacklist[key] = self.runtime.now() + self.policy.sharing.blacklist_s
        self.stats["blacklisted"] += 1
        log.info(
            "flock: blacklisted %s for %.0f s (%s)",
            key,
            self.policy.sharing.blacklist_s,
            reason or "failure reported",
        )
        self.share_blacklist_now()
        if self.decision is not None and self.decision.enabled:
            self.decide_now()

    # ------------------------------------------------------------------ adopted
    def learned_blacklist(self) -> dict[str, tuple[float, tuple[str, ...]]]:
        """What trusted pools told us: pool → (seconds it stays blacklisted here, the senders'
        node ids in hex)."""
        now = self.runtime.now()
        out: dict[str, tuple[float, list[str]]] = {}
        for sender, (_, got) in self._shared.items():
            for k, t in got.items():
                if t > now:
                    left, by = out.setdefault(k, (0.0, []))
                    by.append(f"{int(sender):040x}")
                    out[k] = (max(left, t - now), by)
        return {k: (left, tuple(by)) for k, (left, by) in out.items()}

    def _is_blacklisted(self, e: WillingEntry, now: float) -> bool:
        bl = self._blacklist
        shared = self._shared
        if not bl and not shared:
            return False
        keys = (f"{int(e.origin.id):040x}", e.collector.strip().lower())
        for key in keys:
            t = bl.get(key)
            if t is not None and t > now:
                return True
        for _, got in shared.values():
            for key in keys:
                t = got.get(key)
                if t is not None and t > now:
                    return True
        return False

    # ------------------------------------------------------------------ sending
    def _host_of(self, node: NodeId) -> str:
        """The collector host of a pool whose announcement we hold ("" if none)."""
        slot = self.willing.slot(node)
        return collector_host(slot.collector) if slot is not None and slot.collector else ""

    def share_blacklist_now(self) -> int:
        """Send our first-hand blacklist to every pool we know that ``blacklist-to`` admits;
        returns the number of shares sent (none while the list is empty or nobody is
        trusted with it)."""
        if not self._blacklist or self._stopped:
            return 0
        rule = self.policy.rule(BLACKLIST_TO)
        if rule.is_trivial and not rule.default:
            return 0
        now = self.runtime.now()
        live = sorted(
            ((k, t - now) for k, t in self._blacklist.items() if t > now),
            key=lambda kv: -kv[1],
        )
        if not live:
            return 0
        known: dict[NodeId, NodeHandle] = {}
        for h in self.core.known_nodes():
            known.setdefault(h.id, h)
        for e in self.willing.flat(self.clock()):
            known.setdefault(e.origin.id, e.origin)
        known.pop(self.id, None)
        msg: BlacklistShare | None = None
        sent = 0
        for nid, h in known.items():
            if not rule.decide(Peer.from_handle(h, self._host_of(nid))):
                continue
            if msg is None:
                msg = BlacklistShare(tuple(live[:MAX_SHARED]), self._next_seq())
            self.runtime.send(h, msg)
            sent += 1
        routed = 0
        for nid in _named_pools(rule):
            # a pool we reached directly, ourselves, or one a deny pattern names: not routed
            if nid in known or nid == self.id or not rule.decide(Peer(f"{int(nid):040x}")):
                continue
            if msg is None:
                msg = BlacklistShare(tuple(live[:MAX_SHARED]), self._next_seq())
            signed = sign_share(msg, self.signer) if self.signer is not None else msg
            self.core.route(nid, FLOCK_APP, signed)
            routed += 1
        self.stats["blacklist_shares_sent"] += sent + routed
        self.stats["blacklist_shares_routed"] += routed
        return sent + routed

    # ------------------------------------------------------------------ receiving
    def _on_routed_share(self, key: NodeId, m: BlacklistShare, origin: NodeHandle) -> None:
        """A share routed to ``key``: ours only if ``key`` is our id, and only if signed by
        the ``origin`` the route claims (other pools carried it)."""
        if self._stopped:
            return
        st = self.stats
        if key != self.id:
            st["blacklist_misrouted"] += 1  # the pool it names is gone; we are that id's root
            return
        # Freshness: ``seq`` is milliseconds of the sender's announcement clock (wall clock on
        # live nodes). A direct share rides the transport's replay window; a routed one could
        # be captured on its way and replayed — to a pool that restarted and forgot the
        # sender's newest seq, it would blacklist anew. So a routed share is taken only within
        # ``max_validity_s`` of being made and not from beyond the allowed clock skew, as an
        # announcement is.
        if type(m.seq) is int:
            made = m.seq / 1000.0
            now = self.clock()
            cfg = self.config
            if made < now - cfg.max_validity_s or made > now + cfg.clock_skew_s:
                st["blacklist_stale"] += 1
                return
        k, sig = m.key, m.sig
        if type(k) is not bytes or type(sig) is not bytes or type(origin) is not NodeHandle:
            st["blacklist_malformed"] += 1
            return
        if k or sig or self.config.require_signatures:
            if not k or not sig:
                st["blacklist_unsigned"] += 1
                return
            try:
                ok = (
                    len(k) == PUBLIC_KEY_BYTES
                    and len(sig) == SIGNATURE_BYTES
                    and verify_share(m, origin.id, self._keys)
                )
            except (TypeError, ValueError, OverflowError):  # a payload that cannot be encoded
                ok = False
            if not ok:
                st["blacklist_forged"] += 1
                return
        self._on_blacklist_share(origin, m, routed=True)

    def _on_blacklist_share(self, src: NodeHandle, m: BlacklistShare, routed: bool = False) -> None:
        if self._stopped or src.id == self.id:
            return
        st = self.stats
        st["blacklist_shares_received"] += 1
        try:
            entries = m.entries
            ok = (
                type(m.seq) is int
                and m.seq >= 0
                and isinstance(entries, tuple)
                and len(entries) <= MAX_SHARED
                and all(
                    isinstance(x, tuple)
                    and len(x) == 2
                    and _valid_name(x[0])
                    and isinstance(x[1], float)
                    and 0.0 < x[1] < 1e9
                    for x in entries
                )
            )
        except (TypeError, AttributeError):
            ok = False
        if not ok:
            st["blacklist_malformed"] += 1
            return
        host = self._host_of(src.id)
        # a routed share's signature proves the sender's id, not the address its route names
        # (hearsay relayed by other pools): an ``addr:`` rule must not admit it
        peer = Peer(f"{int(src.id):040x}", host) if routed else Peer.from_handle(src, host)
        if not self.policy.allows(BLACKLIST_FROM, peer):
            st["blacklist_untrusted"] += 1
            return
        shared = self._shared
        prev = shared.get(src.id)
        if prev is not None and m.seq <= prev[0]:
            st["blacklist_stale"] += 1
            return
        now = self.runtime.now()
        cap = self.policy.sharing.blacklist_s
        mine = (f"{int(self.id):040x}", self.collector.strip().lower())
        got = {k: now + min(left, cap) for k, left in entries if k not in mine}
        before = {k for k, t in prev[1].items() if t > now} if prev is not None else set()
        if prev is None and len(shared) >= MAX_SENDERS:
            del shared[next(iter(shared))]
        shared[src.id] = (m.seq, got)
        st["blacklist_adopted"] += len(got.keys() - before)
        if got.keys() != before:
            log.info("flock: %d pools blacklisted by trusted %s", len(got), f"{int(src.id):040x}")
            if self.decision is not None and self.decision.enabled:
                self.decide_now()
