"""Elections and preemption: how a node becomes the manager (Butt et al. 2006 §4.2, Fig. 4).

Theory of operation. The paper lets the node that receives ``manager_missing`` take over with
the replica it holds, and lets the returning original take the role back with
``preempt_replacement``. Both are done here as one safe step, an **election** among the
manager's K replica holders (the ones named in its alives):

1. The candidate picks a term above every term it has seen and sends :class:`VoteRequest`
   to the holders (retransmitted until answered, for ``election_timeout_s``).
2. A holder grants the vote if the term is above its promise (``ReplicaStore.vote``) and — for
   a takeover — if it has not heard a live manager within its lease (the manager is then alive
   and the report was caused by lost alives: the paper's "the manager ignores it"). The vote
   carries the holder's newest state. With a majority of votes the candidate holds the newest
   committed state (majorities of one set intersect) and no other candidate can win its term.
3. The winner commits that state to its own K holders (``TAKING_OVER``) and only then serves
   (``MANAGER``), so a crash in the middle loses nothing that was committed.

**Preemption.** The original (``original=True``, the paper's command-line flag) that hears a
replacement's alive sends it a signed :class:`PreemptRequest`. The replacement answers with a
:class:`Handoff`: its signed :class:`HandoffConsent` and its up-to-date state, and keeps
serving (``HANDING_OFF``) until it hears the original's alive (then it becomes a listener) or
the handoff times out (it resumes). The original runs the election with the consent attached,
which lets holders grant it despite their lease on the replacement. Commits the replacement
makes meanwhile are either seen by that election or refused by the holders' promises.

A **bootstrap** is the original's election at start-up when no manager was heard, among the
K + 1 nodes closest to the pool key (itself included).
"""

from __future__ import annotations

from collections.abc import Sequence

from discovery.failover_base import FailoverBase
from discovery.failover_messages import (
    Alive,
    Epoch,
    Handoff,
    HandoffConsent,
    ManagerMissing,
    PreemptRequest,
    StateStamp,
    VoteKind,
    VoteReason,
    VoteReply,
    VoteRequest,
)
from discovery.failover_replica import majority
from discovery.failover_roles import MANAGER_ROLES, Event, Role
from overlay.handle import NodeHandle
from overlay.ids import NodeId

__all__ = ["Election", "ElectionMixin"]


class Election:
    """One candidacy: the electorate, the votes so far and the newest state they carried."""

    __slots__ = (
        "best",
        "best_state",
        "consent",
        "epoch",
        "granted",
        "kind",
        "nonce",
        "prior",
        "quorum",
        "refused",
        "replaces",
        "universe",
    )

    def __init__(
        self,
        kind: int,
        epoch: Epoch,
        universe: Sequence[NodeHandle],
        quorum: int,
        nonce: int,
        consent: HandoffConsent | None,
    ) -> None:
        self.kind = kind
        self.epoch = epoch
        self.universe = tuple(universe)
        self.quorum = quorum
        self.nonce = nonce
        self.consent = consent
        self.granted: set[NodeId] = set()
        self.refused: set[NodeId] = set()
        self.best: StateStamp | None = None
        self.best_state: bytes | None = None
        #: the manager this election replaces (it gets the winner's alives directly)
        self.replaces: NodeHandle | None = None
        #: this node's own promise before it voted for itself (restored if it loses)
        self.prior: Epoch | None = None

    def offer(self, stamp: StateStamp | None, state: bytes | None) -> None:
        """Keep the newest state seen (only states that come with their stamp)."""
        if stamp is not None and state is not None and (self.best is None or stamp > self.best):
            self.best, self.best_state = stamp, state


class Preemption:
    """The original's request in flight: whom it preempts and the nonce of the exchange."""

    __slots__ = ("nonce", "target")

    def __init__(self, target: Alive, nonce: int) -> None:
        self.target = target
        self.nonce = nonce


class ElectionMixin(FailoverBase):
    """Candidate side, holder side of the votes, and preemption on both sides."""

    election: Election | None = None
    preemption: Preemption | None = None
    _handoff: Handoff | None = None

    # ------------------------------------------------------------ candidate side
    def vote_quorum(self, n: int) -> int:
        """Votes a candidate needs among ``n`` holders: a majority, and enough to intersect
        every commit quorum (``n - quorum + 1``)."""
        q = self.config.quorum
        qc = majority(n) if q is None else min(q, n)
        return max(majority(n), n - qc + 1) if n else 0

    def next_term(self) -> int:
        """A term above every term this node has seen (its promise, its state, alives, refusals)."""
        t = self.store.observe_term(self.max_term)
        if self.known is not None and self.known.term > t:
            t = self.known.term
        return t + 1

    def begin_election(
        self,
        kind: int,
        universe: Sequence[NodeHandle],
        consent: HandoffConsent | None = None,
        seed: tuple[StateStamp | None, bytes | None] = (None, None),
        replaces: NodeHandle | None = None,
    ) -> None:
        """Start a candidacy (the role is already ``CANDIDATE``)."""
        me = self.core.id
        uni = list(dict.fromkeys(universe))
        epoch = Epoch(self.next_term(), me)
        self.max_term = epoch.term
        self.epoch = epoch
        rng = self.core.runtime.rng
        el = Election(kind, epoch, uni, self.vote_quorum(len(uni)), rng.getrandbits(62), consent)
        el.replaces = replaces
        el.offer(*seed)
        el.offer(self.store.stamp, self.store.state)
        self.election = el
        self.stats[f"elections_{('takeover', 'bootstrap', 'preempt')[kind]}"] += 1
        el.prior = self.store.promised
        if any(h.id == me for h in uni):
            if self.store.vote(epoch) == VoteReason.GRANTED:
                el.granted.add(me)
            else:
                el.refused.add(me)
        self._request_votes()
        self.arm("election", self.config.election_timeout_s, self._election_timeout)
        self._check_election()

    def _request_votes(self) -> None:
        el = self.election
        if el is None or self.role is not Role.CANDIDATE or self.pool is None:
            return
        req = VoteRequest(self.pool, self.me, el.epoch.term, el.kind, el.nonce, el.consent)
        for h in el.universe:
            if h.id not in el.granted and h.id not in el.refused:
                self.send(h, req)
                self.stats["vote_requests_sent"] += 1
        self.arm("vote_retry", self.config.request_retry_s, self._request_votes)

    def _election_timeout(self) -> None:
        self.stats["elections_timed_out"] += 1
        self.fire(Event.VOTES_FAILED)

    def _check_election(self) -> None:
        el = self.election
        if el is None or self.role is not Role.CANDIDATE:
            return
        if len(el.granted) >= el.quorum:
            self.fire(Event.VOTES_QUORUM)
        elif len(el.universe) - len(el.refused) < el.quorum:
            self.fire(Event.VOTES_FAILED)

    def recv_vote_reply(self, src: NodeHandle, m: VoteReply) -> None:
        """Count a holder's vote (candidate side); win or give up once decided."""
        el = self.election
        if el is None or self.role is not Role.CANDIDATE or m.nonce != el.nonce:
            self.stats["votes_late"] += 1
            return
        if m.term != el.epoch.term or all(h.id != src.id for h in el.universe):
            self.stats["votes_unexpected"] += 1
            return
        if m.state is not None and len(m.state) > self.config.max_state_bytes:
            self.stats["state_too_large"] += 1
            return
        if m.promised is not None and m.promised.term > self.max_term:
            self.max_term = m.promised.term
        if m.newest is not None:
            self.consider_alive(m.newest)
            if self.role is not Role.CANDIDATE or self.election is not el:
                return
        if m.granted:
            el.granted.add(src.id)
            el.offer(m.stamp, m.state)
            self.stats["votes_granted"] += 1
        else:
            el.refused.add(src.id)
            self.stats[f"votes_refused_{m.reason}"] += 1
        self._check_election()

    # ------------------------------------------------------------ holder side
    def recv_vote_request(self, src: NodeHandle, m: VoteRequest) -> None:
        """Answer a candidate (holder side): promise, lease, and the newest state on a grant."""
        if src.id != m.candidate.id:
            self.stats["spoofed"] += 1
            return
        if not self.pool_ok(m.pool) or self.pool is None:
            return
        bypass = m.kind == VoteKind.PREEMPT and self._consent_ok(m.consent, m.candidate)
        if m.kind == VoteKind.PREEMPT and not bypass:
            self.stats["consent_rejected"] += 1
        if not bypass and self.lease_fresh(exempt=m.candidate.id):
            self.stats["votes_refused_lease"] += 1
            self.send(
                src,
                VoteReply(
                    self.pool,
                    m.term,
                    m.nonce,
                    False,
                    VoteReason.LEASE,
                    self.store.promised,
                    newest=self._newest_alive(),
                ),
            )
            return
        reason = self.store.vote(m.epoch)
        if reason == VoteReason.GRANTED:
            self.stats["votes_given"] += 1
            if m.term > self.max_term:
                self.max_term = m.term
            reply = VoteReply(
                self.pool,
                m.term,
                m.nonce,
                True,
                reason,
                self.store.promised,
                self.store.stamp,
                self.store.state,
            )
        else:
            self.stats["votes_refused_term"] += 1
            reply = VoteReply(self.pool, m.term, m.nonce, False, reason, self.store.promised)
        self.send(src, reply)

    def _consent_ok(self, c: HandoffConsent | None, candidate: NodeHandle) -> bool:
        """A consent lets holders ignore their lease: it must come from the manager they
        follow (or a newer one) and name this candidate."""
        if c is None or c.successor.id != candidate.id or c.pool != self.pool:
            return False
        if not self.check_sig(c, c.manager.id):
            return False
        if self.role in MANAGER_ROLES:
            return (
                c.manager.id == self.core.id
                and self.epoch is not None
                and (c.term == self.epoch.term)
            )
        return self.known is None or c.epoch >= self.known.epoch

    def _newest_alive(self) -> Alive | None:
        """Own fresh alive when serving, else the newest known."""
        raise NotImplementedError  # pragma: no cover - the Failover class provides it

    # ------------------------------------------------------------ the role machine's actions
    def act_start_takeover(self, m: ManagerMissing) -> None:
        """Run for the missing manager's role among the holders named in its last alive."""
        known = self.known
        if known is not None and known.manager.id == m.manager.id:
            universe: list[NodeHandle] = list(known.holders)
        else:
            universe = list(m.holders)
        universe = [h for h in universe if h.id != m.manager.id]
        if not universe:
            universe = [h for h in self.holder_view() if h.id != m.manager.id]
            universe.append(self.me)
        self.stats["takeovers_started"] += 1
        self.begin_election(VoteKind.TAKEOVER, universe, replaces=m.manager)

    def act_start_bootstrap(self, _ctx: object) -> None:
        """The original claims the role: the electorate is itself and its K closest nodes."""
        self.begin_election(VoteKind.BOOTSTRAP, [self.me, *self.holder_view()])

    def act_start_preempt_election(self, h: Handoff) -> None:
        """The original, consented to, runs for the replacement's role with its state."""
        p = self.preemption
        self.disarm("preempt_retry", "preempt_timeout")
        universe = list(p.target.holders) if p is not None else self.holder_view()
        self.preemption = None
        seed = (h.stamp, h.state)
        self.begin_election(VoteKind.PREEMPT, universe, h.consent, seed, h.consent.manager)

    # ------------------------------------------------------------ preemption (original side)
    def act_send_preempt(self, a: Alive) -> None:
        """The original asks the replacement ``a.manager`` to hand the role back."""
        self.preemption = Preemption(a, self.core.runtime.rng.getrandbits(62))
        self.stats["preempts_started"] += 1
        self._send_preempt()
        self.arm("preempt_timeout", self.config.election_timeout_s, self._preempt_timeout)

    def act_retarget_preempt(self, a: Alive) -> None:
        """A newer replacement appeared while preempting: preempt that one instead."""
        self.consider_known(a)
        self.act_send_preempt(a)

    def _send_preempt(self) -> None:
        p = self.preemption
        if p is None or self.role is not Role.PREEMPTING or self.pool is None:
            return
        req = self.signed(PreemptRequest(self.pool, self.me, p.target.term, p.nonce))
        self.send(p.target.manager, req)
        self.arm("preempt_retry", self.config.request_retry_s, self._send_preempt)

    def _preempt_timeout(self) -> None:
        self.stats["preempts_timed_out"] += 1
        self.fire(Event.PREEMPT_TIMEOUT)

    def recv_handoff(self, src: NodeHandle, m: Handoff) -> None:
        """The replacement's consent and state arrived (original side): check and elect."""
        p = self.preemption
        c = m.consent
        if p is None or self.role is not Role.PREEMPTING:
            self.stats["handoffs_late"] += 1
            return
        if (
            c.manager.id != src.id
            or c.manager.id != p.target.manager.id
            or c.successor.id != self.core.id
            or c.nonce != p.nonce
            or c.term != p.target.term
        ):
            self.stats["handoffs_unexpected"] += 1
            return
        if m.state is not None and len(m.state) > self.config.max_state_bytes:
            self.stats["state_too_large"] += 1
            return
        if not self.check_sig(c, c.manager.id):
            return
        self.stats["handoffs_received"] += 1
        self.fire(Event.HANDOFF_RECEIVED, m)

    # ------------------------------------------------------------ preemption (manager side)
    def recv_preempt(self, src: NodeHandle, m: PreemptRequest) -> None:
        """A preempt request (manager side): only from the pool's original, signed, current."""
        if src.id != m.original.id:
            self.stats["spoofed"] += 1
            return
        if not self.pool_ok(m.pool):
            return
        if m.original.id != self.pool or self.pool == self.core.id:
            self.stats["preempts_refused_not_original"] += 1
            return
        if self.role not in MANAGER_ROLES or self.epoch is None or m.term != self.epoch.term:
            self.stats["preempts_refused_stale"] += 1
            return
        if not self.check_sig(m, m.original.id):
            return
        self.fire(Event.PREEMPT_RECEIVED, m)

    def act_send_handoff(self, m: PreemptRequest) -> None:
        """Consent (signed) and send the up-to-date state; keep serving until replaced."""
        rep = self.replicator
        if self.epoch is None or rep is None or self.pool is None:
            return
        consent = self.signed(
            HandoffConsent(self.pool, self.me, self.epoch.term, m.original, m.nonce)
        )
        self._handoff = Handoff(consent, rep.stamp, rep.state)
        self.send(m.original, self._handoff)
        self.stats["handoffs_sent"] += 1
        if not self.armed("handoff"):
            self.arm("handoff", self.config.handoff_timeout_s, self._handoff_timeout)

    def _handoff_timeout(self) -> None:
        self.stats["handoffs_timed_out"] += 1
        self.fire(Event.HANDOFF_TIMEOUT)

    def act_resume(self, _ctx: object) -> None:
        """The original never took over: go on serving."""
        self._handoff = None

    # ------------------------------------------------------------ implemented by Failover
    def consider_known(self, a: Alive) -> None:  # pragma: no cover - overridden
        """Adopt ``a`` as the newest known alive (no notification)."""
        raise NotImplementedError
