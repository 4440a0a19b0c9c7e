"""Pools on Demand (C-PonD): a query, signed invitations, a pond that lives as long as its job.

Theory of operation (PonD, Lee et al. 2012, §3.2 and Fig. 4, §3.2.2, §3.3; Thain et al. 2004
§5, claiming):

* **Forming** (:meth:`PoolOnDemand.form_pond`). The manager (the node with the job) runs the
  ClassAd tree query (:mod:`discovery.query`) for ``k`` machines (plus ``extra_invites``, to
  absorb declines), then sends each match a signed :class:`~discovery.pond_messages.PondInvite`
  carrying the job ad. An invitation unanswered after ``invite_timeout_s`` is sent again (with a
  new number) ``invite_retries`` times, then counted as lost. Each accepting machine becomes a
  member until ``k`` are in; any accept beyond that is *surplus* and is destroyed at once. A
  decline or a lost invitation leaves the pond smaller, never wrong: the manager lists only
  machines that accepted, and a machine that accepted an invitation the manager gave up on is
  destroyed when its late answer arrives (or withdraws for want of alives).
* **Accepting** (the machine's side, :mod:`discovery.pond_worker`). A machine checks the
  signature, the addressee and the replay window; its local policy (``invite-from``); that it is
  not already in a pond; and then *re-checks the match* of the job against its **current** ad
  with ``classad2`` (claiming lets the resource verify the match, Thain et al. 2004 §5): a
  machine whose ad changed since the query declines as ``stale`` (counted; PonD §4.2.2
  measures these). Accepting stamps the ad with the job id (PonD §3.2.2), points the startd's
  ``CONDOR_HOST`` at the manager through an injected hook (PonD §3.2) and answers.
* **Stamping is exclusive.** A stamped machine answers every other query "claimed" and
  declines every other invitation, until its pond destroys it or it withdraws. PonD §3.2.2 says
  a stamped machine "prioritizes" its job; a startd reports to exactly one ``CONDOR_HOST``, so
  it can serve one pond's negotiator at a time, and handing it to a second pond while the first
  one's job runs would mean preempting that job. Inside its pond, the stamp (``PondJobId``) is
  what the startd's ``RANK`` can prefer. So no two ponds ever hold one machine at once.
* **Alive and withdrawal** (PonD §3.3). The manager sends each member a signed
  :class:`~discovery.pond_messages.PondAlive` every ``alive_period_s``; a member that hears none
  for ``withdraw_after_s`` withdraws (clears its stamp, points ``CONDOR_HOST`` back at itself)
  and says so with a ``PondLeave``. With the defaults (10 s, 35 s) a member withdraws within
  35 s of its manager's crash, after three missed alives plus a WAN round trip — the pattern of
  HTCondor's claim keep-alives (``ALIVE_INTERVAL``, ``MAX_CLAIM_ALIVES_MISSED``).
* **Release** (:meth:`PoolOnDemand.release`): a signed destroy to every member, retried until
  acknowledged (``destroy_retries``), then the callback with who acknowledged.
* **Growing and shrinking** (:meth:`grow`, :meth:`shrink`) serve the job-queue scheduler
  (:mod:`discovery.pond_scheduler`): another query-and-invite round, or destroys.

Signatures use the injected :class:`~discovery.pond_messages.Signer` (the node's Ed25519
identity on live nodes). With ``require_signatures`` (default: on when this node signs)
unsigned and forged messages are dropped and counted; the simulator runs unsigned by default.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from discovery.classads import ClassAd, ExprTree
from discovery.machine import MachineAd
from discovery.pond_messages import (
    PondAlive,
    PondAnswer,
    PondDestroy,
    PondDestroyAck,
    PondInvite,
    PondLeave,
    Signer,
)
from discovery.pond_types import PondConfig, PondError, PondResult, ReleaseResult
from discovery.pond_worker import POND_APP, CondorHostHook, InvitePolicy, WorkerSide
from discovery.query import QUERY_APP, QueryResult, ResourceQuery, prepare_query
from discovery.query_messages import QueryArg
from overlay.errors import ConfigError, OverlayError
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.runtime import Timer

if TYPE_CHECKING:
    from overlay.kbr import KbrCore

__all__ = [
    "POND_APP",
    "PondConfig",
    "PondError",
    "PondResult",
    "PoolOnDemand",
    "ReleaseResult",
    "attach",
]


#: the reasons a machine gives for declining (``pond_worker``); anything else counts as "other"
DECLINE_REASONS = frozenset({"claimed", "stale", "policy", "no-machine", "bad-job", "apply-failed"})


class _Invite:
    __slots__ = ("attempts", "handle", "round", "seqs", "timer")

    def __init__(self, handle: NodeHandle, rnd: _Round) -> None:
        self.handle = handle
        self.round = rnd
        self.seqs: set[int] = set()
        self.attempts = 0
        self.timer: Timer | None = None


class _Round:
    __slots__ = (
        "declined",
        "joined",
        "lost",
        "need",
        "on_done",
        "outstanding",
        "query",
        "surplus",
        "t0",
    )

    def __init__(self, t0: float, need: int, on_done: Callable[[PondResult], None] | None):
        self.t0 = t0
        self.need = need
        self.on_done = on_done
        self.outstanding = 0
        self.joined: list[NodeHandle] = []
        self.declined: Counter[str] = Counter()
        self.lost: list[NodeHandle] = []
        self.surplus: list[NodeHandle] = []
        self.query: QueryResult | None = None


class _Destroy:
    __slots__ = ("attempts", "done", "handle", "pond_id", "seqs", "timer")

    def __init__(self, handle: NodeHandle, pond_id: int, done: Callable[[bool], None]) -> None:
        self.handle = handle
        self.pond_id = pond_id
        self.done = done
        self.seqs: set[int] = set()
        self.attempts = 0
        self.timer: Timer | None = None


class _Pond:
    """The manager's record of one pond."""

    __slots__ = (
        "alive_timer",
        "arg",
        "invites",
        "job_id",
        "members",
        "mode",
        "pond_id",
        "redundant",
        "releasing",
        "rounds",
    )

    def __init__(self, pond_id: int, job_id: str, arg: QueryArg, mode: str, redundant: bool):
        self.pond_id = pond_id
        self.job_id = job_id
        self.arg = arg
        self.mode = mode
        self.redundant = redundant
        self.members: dict[int, NodeHandle] = {}  # insertion order = join order
        self.invites: dict[int, _Invite] = {}
        self.rounds: list[_Round] = []
        self.alive_timer: Timer | None = None
        self.releasing = False


class PoolOnDemand(WorkerSide):
    """A node's Pool-on-Demand application: manager of its own ponds, member of at most one.

    ``signer`` signs outgoing messages (None: unsigned, the simulator's default);
    ``on_condor_host(manager, stamp)`` applies the startd's ``CONDOR_HOST`` (``manager`` None:
    back to this machine itself; live nodes render it through the HTCondor configuration path);
    ``policy.allows("invite-from", manager_handle)`` filters invitations. ``stats`` counts
    every outcome, including forged, unsigned, replayed and misdirected messages.
    """

    def __init__(
        self,
        core: KbrCore,
        machine: MachineAd | None = None,
        config: PondConfig | None = None,
        *,
        signer: Signer | None = None,
        policy: InvitePolicy | None = None,
        on_condor_host: CondorHostHook | None = None,
    ) -> None:
        cfg = config if config is not None else PondConfig()
        super().__init__(core, machine, cfg, signer, policy, on_condor_host)
        self.ponds: dict[int, _Pond] = {}
        self._seq = 0
        #: one epoch per incarnation: a restarted manager's numbers never collide with old ones
        self.epoch = core.runtime.rng.getrandbits(62)
        #: destroys in flight: surplus or late accepts, and members being released or shrunk
        self._strays: dict[tuple[int, int], _Destroy] = {}
        self._releases: dict[tuple[int, int], _Destroy] = {}

    # ------------------------------------------------------------------ helpers
    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _query_app(self) -> ResourceQuery:
        app = self.core.apps.get(QUERY_APP)
        if not isinstance(app, ResourceQuery):
            raise OverlayError("attach the query application (discovery.query) first")
        return app

    def _pond(self, pond_id: int) -> _Pond:
        p = self.ponds.get(pond_id)
        if p is None:
            raise PondError(f"no pond {pond_id} is managed here")
        return p

    def members(self, pond_id: int) -> tuple[NodeHandle, ...]:
        """The members of a pond this node manages, in join order."""
        return tuple(self._pond(pond_id).members.values())

    # ------------------------------------------------------------------ forming
    def form_pond(
        self,
        job: ClassAd | str | None = None,
        k: int = 1,
        *,
        on_done: Callable[[PondResult], None],
        requirements: str | ExprTree | None = None,
        rank: str | float | ExprTree | None = None,
        job_id: str = "",
        mode: str = "best",
        redundant: bool = False,
        timeout_s: float | None = None,
    ) -> int:
        """Discover ``k`` machines for ``job`` and invite them; ``on_done(PondResult)`` once
        every invitation is answered or lost. Returns the pond id (the pond stays until
        :meth:`release`). Raises ``QuerySyntaxError``/``ConfigError`` before sending anything.
        """
        pond_id = self.core.runtime.rng.getrandbits(62)
        jid = job_id or f"{self.core.id.short()}.{pond_id:x}"
        arg, _ = prepare_query(requirements, rank, k=k, mode=mode, job=job, job_id=jid)
        p = _Pond(pond_id, jid, arg, mode, redundant)
        self.ponds[pond_id] = p
        self.stats["ponds_formed"] += 1
        self._round(p, k, on_done, timeout_s)
        return pond_id

    def grow(
        self,
        pond_id: int,
        n: int,
        on_done: Callable[[PondResult], None] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Look for ``n`` more machines for a pond (another query-and-invite round)."""
        if n < 1:
            raise ConfigError(f"grow needs n >= 1, got {n}")
        p = self._pond(pond_id)
        if p.releasing:
            raise PondError(f"pond {pond_id} is being released")
        self._round(p, n, on_done, timeout_s)

    def _round(
        self,
        p: _Pond,
        n: int,
        on_done: Callable[[PondResult], None] | None,
        timeout_s: float | None,
    ) -> None:
        rnd = _Round(self.core.runtime.now(), n, on_done)
        p.rounds.append(rnd)
        extra = -(-n * self.config.extra_invites // 1) if self.config.extra_invites else 0
        want = min(n + int(extra), 1000)
        arg = attrs.evolve(p.arg, k=want)

        def got(res: QueryResult) -> None:
            rnd.query = res
            if p.releasing or self.ponds.get(p.pond_id) is not p:
                self._round_done(p, rnd)
                return
            fresh = []
            for m in res.matches:
                nid = int(m.handle.id)
                if nid in p.members or nid in p.invites:
                    continue
                inv = _Invite(m.handle, rnd)
                p.invites[nid] = inv
                fresh.append(inv)
            # count every invitation before sending any: an answer may come back at once (this
            # node invited itself) and must not close the round early
            rnd.outstanding = len(fresh)
            for inv in fresh:
                self._send_invite(p, inv)
            if not fresh:
                self._round_done(p, rnd)

        self._query_app().run(arg, got, redundant=p.redundant, timeout_s=timeout_s)

    def _send_invite(self, p: _Pond, inv: _Invite) -> None:
        seq = self._next()
        inv.seqs.add(seq)
        inv.attempts += 1
        msg = PondInvite(
            p.pond_id, p.job_id, p.arg.job_ad, self.core.handle, inv.handle.id, self.epoch, seq
        )
        self.stats["invites_sent"] += 1
        nid = int(inv.handle.id)
        inv.timer = self.core.runtime.call_later(
            self.config.invite_timeout_s, lambda: self._invite_timeout(p, nid, inv)
        )
        self._send(inv.handle, msg)

    def _invite_timeout(self, p: _Pond, nid: int, inv: _Invite) -> None:
        inv.timer = None
        if p.invites.get(nid) is not inv:
            return
        if inv.attempts <= self.config.invite_retries and not p.releasing:
            self.stats["invite_retransmits"] += 1
            self._send_invite(p, inv)
            return
        del p.invites[nid]
        self.stats["invites_lost"] += 1
        inv.round.lost.append(inv.handle)
        self._settle(p, inv.round)

    def _settle(self, p: _Pond, rnd: _Round) -> None:
        rnd.outstanding -= 1
        if rnd.outstanding == 0:
            self._round_done(p, rnd)

    def _round_done(self, p: _Pond, rnd: _Round) -> None:
        if rnd in p.rounds:
            p.rounds.remove(rnd)
        if p.members and p.alive_timer is None and not p.releasing:
            self._arm_alive(p)
        if rnd.on_done is not None:
            rt = self.core.runtime
            rnd.on_done(
                PondResult(
                    p.pond_id,
                    p.job_id,
                    tuple(p.members.values()),
                    tuple(rnd.joined),
                    dict(rnd.declined),
                    tuple(rnd.lost),
                    tuple(rnd.surplus),
                    rnd.query,
                    rt.now() - rnd.t0,
                )
            )

    def _on_answer(self, src: NodeHandle, m: PondAnswer) -> None:
        if not self._authentic(m, m.worker.id):
            return
        if m.manager != self.core.id:
            self.stats["misdirected"] += 1
            return
        nid = int(m.worker.id)
        p = self.ponds.get(m.pond_id)
        inv = p.invites.get(nid) if p is not None else None
        if p is None or inv is None or m.seq not in inv.seqs:
            if m.accept and p is not None and nid in p.members:
                self.stats["answer_duplicate"] += 1  # a re-sent accept of a member
                return
            if m.accept:  # we gave up on it, or it was never ours: do not leave it claimed
                self.stats["late_accepts"] += 1
                self._destroy_stray(m.pond_id, m.worker)
            else:
                self.stats["answer_unexpected"] += 1
            return
        del p.invites[nid]
        if inv.timer is not None:
            inv.timer.cancel()
        rnd = inv.round
        if not m.accept:
            # a peer's free text must not grow our counters without bound
            reason = m.reason if m.reason in DECLINE_REASONS else "other"
            rnd.declined[reason] += 1
            self.stats["declined_" + reason] += 1
        elif p.releasing:
            self._destroy_stray(p.pond_id, m.worker)
        elif len(rnd.joined) < rnd.need:  # each round fills its own need, no more
            p.members[nid] = m.worker
            rnd.joined.append(m.worker)
            self.stats["joined"] += 1
        else:  # more accepted than needed: release at once
            rnd.surplus.append(m.worker)
            self.stats["surplus_released"] += 1
            self._destroy_stray(p.pond_id, m.worker)
        self._settle(p, rnd)

    # ------------------------------------------------------------------ alive
    def _arm_alive(self, p: _Pond) -> None:
        p.alive_timer = self.core.runtime.call_later(
            self.config.alive_period_s, lambda: self._alive(p)
        )

    def _alive(self, p: _Pond) -> None:
        p.alive_timer = None
        if p.releasing or self.ponds.get(p.pond_id) is not p or self.core.stopped:
            return
        for h in p.members.values():
            self._send(h, PondAlive(p.pond_id, self.core.id, h.id, self.epoch, self._next()))
        self.stats["alives_sent"] += len(p.members)
        self._arm_alive(p)

    def _on_leave(self, src: NodeHandle, m: PondLeave) -> None:
        if not self._authentic(m, m.worker.id):
            return
        p = self.ponds.get(m.pond_id)
        if p is None or m.manager != self.core.id:
            return
        if p.members.pop(int(m.worker.id), None) is not None:
            self.stats["members_left"] += 1

    # ------------------------------------------------------------------ destroy
    def _destroy(self, h: NodeHandle, pond_id: int, done: Callable[[bool], None]) -> _Destroy:
        d = _Destroy(h, pond_id, done)
        self._send_destroy(d)
        return d

    def _send_destroy(self, d: _Destroy) -> None:
        seq = self._next()
        d.seqs.add(seq)
        d.attempts += 1
        self.stats["destroys_sent"] += 1
        d.timer = self.core.runtime.call_later(
            self.config.destroy_timeout_s, lambda: self._destroy_timeout(d)
        )
        self._send(d.handle, PondDestroy(d.pond_id, self.core.id, d.handle.id, self.epoch, seq))

    def _destroy_timeout(self, d: _Destroy) -> None:
        d.timer = None
        if d.attempts <= self.config.destroy_retries:
            self.stats["destroy_retransmits"] += 1
            self._send_destroy(d)
            return
        self.stats["destroys_unacked"] += 1
        d.done(False)

    def _destroy_stray(self, pond_id: int, h: NodeHandle) -> None:
        key = (pond_id, int(h.id))
        if key in self._strays:
            return

        def done(_ok: bool) -> None:
            self._strays.pop(key, None)

        self._strays[key] = self._destroy(h, pond_id, done)

    def _on_destroy_ack(self, src: NodeHandle, m: PondDestroyAck) -> None:
        if not self._authentic(m, m.worker.id):
            return
        key = (m.pond_id, int(m.worker.id))
        d = self._strays.get(key) or self._releases.get(key)
        if d is None or m.seq not in d.seqs:
            self.stats["destroy_ack_unexpected"] += 1
            return
        if d.timer is not None:
            d.timer.cancel()
            d.timer = None
        d.done(True)

    def shrink(
        self,
        pond_id: int,
        n: int = 0,
        on_done: Callable[[int], None] | None = None,
        *,
        members: Sequence[NodeHandle] | None = None,
    ) -> None:
        """Destroy ``members`` of a pond (or the ``n`` latest to join); ``on_done(acked)``."""
        p = self._pond(pond_id)
        if members is None:
            victims = list(p.members.values())[-n:] if n > 0 else []
        else:
            victims = [h for h in members if int(h.id) in p.members]
        acked: list[bool] = []
        if not victims and on_done is not None:
            on_done(0)
        for h in victims:
            del p.members[int(h.id)]

            def done(ok: bool, h: NodeHandle = h) -> None:
                self._releases.pop((pond_id, int(h.id)), None)
                acked.append(ok)
                if len(acked) == len(victims) and on_done is not None:
                    on_done(sum(acked))

            self._releases[(pond_id, int(h.id))] = self._destroy(h, pond_id, done)
        self.stats["members_shrunk"] += len(victims)

    def release(self, pond_id: int, on_done: Callable[[ReleaseResult], None] | None = None) -> None:
        """Destroy a pond: a destroy to every member until acknowledged, then ``on_done``."""
        p = self._pond(pond_id)
        if p.releasing:
            raise PondError(f"pond {pond_id} is already being released")
        p.releasing = True
        rt = self.core.runtime
        t0 = rt.now()
        if p.alive_timer is not None:
            p.alive_timer.cancel()
            p.alive_timer = None
        for nid, inv in list(p.invites.items()):  # answers still due: destroyed on arrival
            if inv.timer is not None:
                inv.timer.cancel()
            del p.invites[nid]
            inv.round.lost.append(inv.handle)
            self._settle(p, inv.round)
        members = list(p.members.values())
        acked: list[NodeHandle] = []
        unacked: list[NodeHandle] = []

        def finish() -> None:
            self.ponds.pop(pond_id, None)
            self.stats["ponds_released"] += 1
            if on_done is not None:
                on_done(ReleaseResult(pond_id, tuple(acked), tuple(unacked), rt.now() - t0))

        if not members:
            finish()
            return
        for h in members:

            def done(ok: bool, h: NodeHandle = h) -> None:
                self._releases.pop((pond_id, int(h.id)), None)
                (acked if ok else unacked).append(h)
                p.members.pop(int(h.id), None)
                if len(acked) + len(unacked) == len(members):
                    finish()

            self._releases[(pond_id, int(h.id))] = self._destroy(h, pond_id, done)

    # ------------------------------------------------------------------ dispatch
    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        """Pond messages arrive as KBR direct messages to :data:`POND_APP`."""
        t = type(payload)
        if t is PondInvite:
            self._on_invite(src, payload)
        elif t is PondAnswer:
            self._on_answer(src, payload)
        elif t is PondAlive:
            self._on_alive(src, payload)
        elif t is PondDestroy:
            self._on_destroy(src, payload)
        elif t is PondDestroyAck:
            self._on_destroy_ack(src, payload)
        elif t is PondLeave:
            self._on_leave(src, payload)
        else:
            self.stats["dropped_unknown"] += 1

    def stop(self) -> None:
        """Cancel every timer (the node is shutting down); members are not told."""
        for p in self.ponds.values():
            if p.alive_timer is not None:
                p.alive_timer.cancel()
            for inv in p.invites.values():
                if inv.timer is not None:
                    inv.timer.cancel()
        for d in (*self._strays.values(), *self._releases.values()):
            if d.timer is not None:
                d.timer.cancel()
        self._stop_worker()


def attach(
    core: KbrCore,
    machine: MachineAd | None = None,
    config: PondConfig | None = None,
    *,
    signer: Signer | None = None,
    policy: InvitePolicy | None = None,
    on_condor_host: CondorHostHook | None = None,
) -> PoolOnDemand:
    """Create the pond application for ``core`` and register it as :data:`POND_APP` (the
    query application must be attached too, with the same machine ad: ``discovery.query``)."""
    pond = PoolOnDemand(
        core, machine, config, signer=signer, policy=policy, on_condor_host=on_condor_host
    )
    core.register(POND_APP, pond)
    return pond
