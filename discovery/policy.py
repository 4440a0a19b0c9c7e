"""The Policy Manager: a TOML file that says who may do what, and what this pool shares.

Theory of operation (Butt et al. 2006 §3.4 and §4.1: "the policy file itself is a list of
machines from which jobs are either permitted or denied ... explicit machine or domain names, or
use of wild cards"; Epema et al. 1996 §3.1 resource-sharing agreements; Thain et al. 2004
quotas):

* **Actions.** Seven interactions are gated: ``announce-from`` (whose announcements enter our
  willing list), ``flock-to`` (pools our jobs may be sent to), ``accept-flock-from`` (pools whose
  jobs we run — and therefore the pools we announce our free machines to), ``query-from`` and
  ``invite-from`` (resource queries and pool-on-demand invitations), ``blacklist-from`` and
  ``blacklist-to`` (the trusted pools whose blacklists we adopt and to which we send ours,
  §3.2.1). Each action has an ``allow`` and a ``deny`` list of patterns and a ``default``
  (``allow``, except for the two blacklist actions: trust is named, never assumed). **Deny
  wins**: a peer matched by any deny pattern is refused even if an allow pattern matches too; a
  peer matched by no pattern gets the action's default.
* **Patterns** are shell wildcards (:mod:`fnmatch`) over one of a peer's names:
  ``id:HEX`` (node-id prefix, e.g. ``id:3fa2``; self-certifying, so the strongest rule),
  ``host:NAME`` (the host part of the pool's collector, e.g. ``host:*.cs.wisc.edu``),
  ``addr:ADDR`` (the overlay address; a CIDR block such as ``addr:10.0.0.0/8`` matches by
  containment) and a bare pattern, which matches the host name or the address. ``*`` matches
  everyone.
* **Sharing rules** (``[sharing]``, ``[[agreement]]``, ``[[user]]``): Epema's idle threshold
  (offer nothing unless more than ``share_threshold`` machines are free) and idle time (count
  only machines idle for ``min_idle_s``); caps on what is advertised (``max_machines``);
  one-way agreements (``direction = "to"``: we flock to them, they do not flock to us;
  ``"from"``: the reverse); per-user rules; quotas per remote pool and per remote user that the
  accepting pool enforces when a job claims a machine (Thain et al. 2004); and how long a pool
  that failed or evicted our jobs stays blacklisted. Agreements never grant access — the
  allow/deny lists do — they only narrow it and set limits, so "deny wins" holds everywhere.
  The first agreement (in file order) whose ``peers`` match a pool applies to it.
* **Loading is all or nothing.** :meth:`Policy.load` parses the whole file with :mod:`tomllib`,
  validates every key and builds a new frozen :class:`Policy`; any problem raises
  :class:`PolicyError` naming the file, the line and what is wrong, and nothing is half-loaded
  (a running node swaps policies only after a successful load).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from pathlib import Path

import attrs

from discovery.policy_file import parse_policy
from discovery.policy_rules import (
    ACCEPT_FLOCK_FROM,
    ACTIONS,
    ANNOUNCE_FROM,
    BLACKLIST_FROM,
    BLACKLIST_TO,
    FLOCK_TO,
    INVITE_FROM,
    QUERY_FROM,
    Agreement,
    Pattern,
    Peer,
    PolicyError,
    Rule,
    Sharing,
    UserRule,
    _default_rules,
    collector_host,
)

__all__ = [
    "ACCEPT_FLOCK_FROM",
    "ACTIONS",
    "ANNOUNCE_FROM",
    "BLACKLIST_FROM",
    "BLACKLIST_TO",
    "FLOCK_TO",
    "INVITE_FROM",
    "QUERY_FROM",
    "Agreement",
    "Pattern",
    "Peer",
    "Policy",
    "PolicyError",
    "Rule",
    "Sharing",
    "UserRule",
    "collector_host",
]


@attrs.frozen(slots=True)
class Policy:
    """A loaded policy. Build with :meth:`load`, :meth:`loads` or :meth:`allow_all`."""

    rules: Mapping[str, Rule] = attrs.field(factory=_default_rules)
    sharing: Sharing = attrs.field(factory=Sharing)
    agreements: tuple[Agreement, ...] = ()
    users: tuple[UserRule, ...] = ()
    source: str = "<built-in>"

    # ------------------------------------------------------------------ construction
    @classmethod
    def allow_all(cls) -> Policy:
        """Every action allowed for everyone, nothing capped (the self-organizing default) —
        except the blacklist exchange, which only named pools are trusted with."""
        return cls()

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        """Read and validate a policy file; raises :class:`PolicyError` (nothing half-loaded)."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise PolicyError(str(p), None, f"cannot read policy file: {reason}") from None
        return cls.loads(text, source=str(p))

    @classmethod
    def loads(cls, text: str, source: str = "<string>") -> Policy:
        """Parse policy text (``source`` names it in errors); see ``discovery.policy_file``."""
        return cls(*parse_policy(text, source))

    # ------------------------------------------------------------------ decisions
    def rule(self, action: str) -> Rule:
        """The rule of ``action`` (raises :class:`PolicyError` for an unknown action name)."""
        r = self.rules.get(action)
        if r is None:
            raise PolicyError(self.source, None, f"unknown action {action!r}; one of {ACTIONS}")
        return r

    def allows(self, action: str, peer: Peer) -> bool:
        """The allow/deny decision for ``action`` and ``peer`` (deny wins, then allow, then
        the action's default). Agreements are not consulted: see :meth:`may_flock_to`."""
        return self.rule(action).decide(peer)

    def agreement_for(self, peer: Peer) -> Agreement | None:
        """The first agreement whose ``peers`` match ``peer``, or None."""
        for ag in self.agreements:
            if ag.matches(peer):
                return ag
        return None

    def may_flock_to(self, peer: Peer) -> bool:
        """May our jobs flock to ``peer``? (flock-to rule and one-way agreements.)"""
        if not self.allows(FLOCK_TO, peer):
            return False
        ag = self.agreement_for(peer)
        return ag is None or ag.direction != "from"

    def may_accept_flock_from(self, peer: Peer) -> bool:
        """May ``peer``'s jobs run here? (accept-flock-from rule and one-way agreements.)"""
        if not self.allows(ACCEPT_FLOCK_FROM, peer):
            return False
        ag = self.agreement_for(peer)
        return ag is None or ag.direction != "to"

    @property
    def uniform_offer(self) -> bool:
        """True when every receiver is offered the same (no per-peer sharing distinctions)."""
        return not self.agreements and self.rule(ACCEPT_FLOCK_FROM).is_trivial

    def offer_to(self, peer: Peer | None, free_machines: int) -> int:
        """How many free machines to advertise to ``peer`` (None: a pool we cannot name —
        one a forwarded announcement may reach). The sender-side check of Butt et al. 2006
        §3.2: nothing for pools we do not accept jobs from, nothing unless more than
        ``share_threshold`` machines are free, and at most the applicable caps."""
        s = self.sharing
        if free_machines <= s.share_threshold:
            return 0
        cap = s.max_machines
        if peer is None:
            if not self.rule(ACCEPT_FLOCK_FROM).open_to_anyone:
                return 0
        else:
            if not self.may_accept_flock_from(peer):
                return 0
            ag = self.agreement_for(peer)
            if ag is not None and ag.max_machines is not None:
                cap = ag.max_machines if cap is None else min(cap, ag.max_machines)
        return free_machines if cap is None else min(free_machines, cap)

    def admits_user(self, peer: Peer, user: str) -> bool:
        """May a job of remote ``user`` from pool ``peer`` run here (per-user rules,
        Epema et al. 1996 §3.1)? Checks pool admission too."""
        if not self.may_accept_flock_from(peer):
            return False
        for ur in self.users:
            if ur.matches(user):
                if not ur.allow:
                    return False
                break
        ag = self.agreement_for(peer)
        if ag is not None:
            if any(fnmatch.fnmatchcase(user, p) for p in ag.deny_users):
                return False
            if ag.users and not any(fnmatch.fnmatchcase(user, p) for p in ag.users):
                return False
        return True

    def pool_quota(self, peer: Peer) -> int | None:
        """At most how many of our machines ``peer``'s jobs may hold at once (None: no quota)."""
        ag = self.agreement_for(peer)
        if ag is not None and ag.quota is not None:
            return ag.quota
        return self.sharing.quota

    def user_quota(self, user: str) -> int | None:
        """At most how many of our machines remote ``user``'s jobs may hold at once."""
        for ur in self.users:
            if ur.matches(user) and ur.quota is not None:
                return ur.quota
        return self.sharing.user_quota

    def flock_from_hosts(self) -> tuple[str, ...]:
        """Host patterns for HTCondor's execute-side ``FLOCK_FROM``: ``("*",)`` when the
        ``accept-flock-from`` rule is open to anyone, else the host (and bare) patterns of its
        allow list. Node-id and address rules have no HTCondor form and deny rules are not
        rendered: they are enforced by the flock (no offer is announced) and at claim time."""
        r = self.rule(ACCEPT_FLOCK_FROM)
        if r.open_to_anyone:
            return ("*",)
        return tuple(p.glob for p in r.allow if p.kind in ("host", "any") and not p.universal)

    def admits(self, origin_pool: Peer | str, user: str) -> bool:
        """:meth:`admits_user` with the origin also named by a string (:meth:`Peer.parse`):
        the ``admit(origin_pool, user)`` callable a pool model checks at claim time."""
        peer = origin_pool if isinstance(origin_pool, Peer) else Peer.parse(origin_pool)
        return self.admits_user(peer, user)

    def quota_for(self, origin_pool: Peer | str, user: str | None = None) -> int | None:
        """Thain et al. 2004 quota, read by the accepting pool at claim time: at most how many
        of our machines the jobs of ``origin_pool`` may hold at once (``user`` None), or those
        of remote ``user`` (when given). ``origin_pool`` is a :class:`Peer` or a name
        (:meth:`Peer.parse`). None means unlimited. This is the ``quota(origin_pool, user)``
        callable of a pool model's sharing rules."""
        if user is not None:
            return self.user_quota(user)
        peer = origin_pool if isinstance(origin_pool, Peer) else Peer.parse(origin_pool)
        return self.pool_quota(peer)
