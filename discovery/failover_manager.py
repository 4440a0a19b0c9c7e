"""The manager side of faultD: taking over, serving, replicating, and leaving the role.

Theory of operation (Butt et al. 2006 §4.2: as a Manager, faultD "uses the Replication Module
to maintain replicas of necessary files on its immediate neighbors" and "periodically
broadcast[s] an alive message to all the resources in the pool"):

* **Taking over.** The election winner commits the recovered state under its own epoch to its
  holders and serves only once a quorum acknowledged it (``TAKING_OVER`` → ``MANAGER``).
* **Serving.** An alive every ``alive_period_s`` through the multicast application; every
  :meth:`commit` is pushed at once to every holder, unacknowledged pushes are retransmitted,
  and every ``replication_interval_s`` the newest state is pushed again to all holders. The
  manager also sends its alive straight to the managers it replaced: after a partition heals,
  a deposed manager on the other side learns the higher epoch even when the overlay itself has
  not re-merged (the small-world ring does not, see docs/failover.md).
* **Holder set changes** follow the overlay (a holder died, a node joined nearer the pool key),
  but safely: one member at a time, only once the newest version is committed under the
  current set, and only if a takeover that still uses the old set (listeners learn the new set
  from the next alive) is guaranteed to meet a holder of every version committed under the new
  one: ``(quorum(new) − added) + vote_quorum(old) > |old|``. A manager cut off from its
  holders therefore cannot move its replicas to its side of a partition and commit there.
* **Holder side.** A node pushed a state stores it unless its promise is newer
  (:class:`~discovery.failover_replica.ReplicaStore`), acknowledges, and counts the push as
  contact with a live manager (its lease). A push from a higher epoch deposes a local manager.
* **Leaving the role.** Stepping down, abandoning a claim or stopping cancels the role's timers
  and answers every pending commit with ``False``: uncommitted versions may be lost.
"""

from __future__ import annotations

from collections.abc import Sequence

from discovery.failover_election import ElectionMixin
from discovery.failover_messages import Alive, StateAck, StatePush
from discovery.failover_replica import Replicator, majority
from discovery.failover_roles import MANAGER_ROLES, Event, Role
from overlay.handle import NodeHandle
from overlay.multicast import MULTICAST_APP, Multicast

__all__ = ["ManagerMixin", "safe_holder_change"]

#: managers replaced by this one that still get its alives directly
_MAX_DEPOSED = 4


def safe_holder_change(
    old: Sequence[NodeHandle], new: Sequence[NodeHandle], commit_q: int, vote_q: int
) -> bool:
    """True when every vote quorum (``vote_q``) of ``old`` meets every commit quorum
    (``commit_q``) of ``new``: the old set can still elect a manager that sees the newest
    version committed under the new set."""
    if not old:
        return True
    olds = {h.id for h in old}
    added = sum(1 for h in new if h.id not in olds)
    return (commit_q - added) + vote_q > len(olds)


class ManagerMixin(ElectionMixin):
    """Taking over, serving and replicating (see the module docstring)."""

    multicast: Multicast | None = None

    # ------------------------------------------------------------ holder sets
    def commit_quorum(self, n: int) -> int:
        """Acknowledgements that commit a version among ``n`` holders."""
        q = self.config.quorum
        return majority(n) if q is None else min(q, n)

    def next_holders(self, current: Sequence[NodeHandle]) -> tuple[NodeHandle, ...]:
        """``current`` moved at most one member towards this node's view of the K nodes
        closest to the pool key, if that move is safe (else ``current`` unchanged)."""
        view = self.holder_view()
        cur = tuple(h for h in current if h.id != self.core.id)
        cur_ids = {h.id for h in cur}
        view_ids = {h.id for h in view}
        if cur_ids == view_ids:
            return cur
        add = [h for h in view if h.id not in cur_ids]
        drop = [h for h in cur if h.id not in view_ids]
        out = list(cur)
        if add and len(out) < self.config.replicas:
            out.append(add[0])
        elif add and drop:
            out[out.index(drop[-1])] = add[0]
        elif drop:
            out.remove(drop[-1])
        else:
            return cur
        n = len(out)
        if not safe_holder_change(cur, out, self.commit_quorum(n), self.vote_quorum(len(cur))):
            self.stats["holder_change_refused"] += 1
            return cur
        return tuple(out)

    def _refresh_holders(self) -> None:
        """Apply one safe step towards the view, once the newest version is committed."""
        rep = self.replicator
        if rep is None or self.role not in MANAGER_ROLES:
            return
        if rep.committed < rep.version:
            return  # the current set must hold the newest version first
        nxt = self.next_holders(rep.holders)
        if [h.id for h in nxt] == [h.id for h in rep.holders]:
            return
        self.stats["holder_changes"] += 1
        new = rep.set_holders(nxt)
        if new:
            self._push(new)
        self.run_callbacks(rep.settle_now(), True)

    # ------------------------------------------------------------ taking over
    def _act_commit_recovered(self, _ctx: object) -> None:
        el = self.election
        self.disarm("election", "vote_retry")
        if el is None or self.epoch is None:
            self.fire(Event.COMMIT_FAILED)
            return
        state = el.best_state if el.best_state is not None else self.initial_state
        version = el.best.version if el.best is not None else 0
        # start from the electorate (it holds the state) and move one step towards the view
        base = [h for h in el.universe if h.id != self.core.id]
        holders = self.next_holders(base) if base else tuple(self.holder_view())
        rep = Replicator(self.epoch, holders, version, state, self.config.quorum)
        self.replicator = rep
        self.store.accept(rep.stamp, state)
        rep.track(self._recovered_committed)
        self.arm("election", self.config.election_timeout_s, self._commit_timeout)
        self._push(rep.holders)
        self.run_callbacks(rep.settle_now(), True)

    def _recovered_committed(self, ok: bool) -> None:
        if ok and self.role is Role.TAKING_OVER:
            self.fire(Event.COMMIT_QUORUM)

    def _commit_timeout(self) -> None:
        self.stats["takeover_commit_timed_out"] += 1
        self.fire(Event.COMMIT_FAILED)

    # ------------------------------------------------------------ serving
    def _act_begin_serving(self, _ctx: object) -> None:
        rep = self.replicator
        el = self.election
        self.disarm("election", "vote_retry", "missing", "startup")
        self.election = None
        if rep is None or self.epoch is None:  # cannot happen: COMMIT_RECOVERED set both
            return
        kind = ("takeover", "bootstrap", "preempt")[el.kind] if el is not None else "?"
        self.stats[f"became_manager_{kind}"] += 1
        self.seq = 0
        prev = self.known.manager if self.known is not None else None
        replaced = [h for h in (el.replaces if el is not None else None, prev) if h is not None]
        for h in replaced:
            if h.id != self.core.id and h not in self.deposed:
                self.deposed.append(h)
        del self.deposed[:-_MAX_DEPOSED]
        self._send_alive()
        self.arm("replicate", self.config.replication_interval_s, self._replicate)
        self.notify_change(self.me, self.epoch, True, rep.state, rep.version, prev)

    def _make_alive(self, bump: bool = True) -> Alive | None:
        rep = self.replicator
        if self.epoch is None or rep is None or self.pool is None:
            return None
        if bump:
            self.seq += 1
        a = Alive(
            self.pool,
            self.me,
            self.epoch.term,
            self.seq,
            self.config.alive_period_s,
            rep.holders,
            max(rep.committed, 0),
        )
        out: Alive = self.signed(a)
        return out

    def _send_alive(self) -> None:
        if self.role not in MANAGER_ROLES:
            return
        a = self._make_alive()
        if a is not None:
            mc = self._multicast()
            if mc is not None:
                mc.broadcast(a)
            else:  # no multicast application: at least the holders hear it
                for h in a.holders:
                    self.send(h, a)
            for h in self.deposed:
                self.send(h, a)
            self.stats["alives_sent"] += 1
        self.arm("alive", self.config.alive_period_s, self._send_alive)

    def _multicast(self) -> Multicast | None:
        if self.multicast is None:
            app = self.core.apps.get(MULTICAST_APP)
            if isinstance(app, Multicast):
                self.multicast = app
                app.add_listener(self._on_multicast)
        return self.multicast

    def _on_multicast(self, payload: object) -> None:
        if type(payload) is Alive:
            self.consider_alive(payload)

    def _push(self, holders: Sequence[NodeHandle]) -> None:
        rep = self.replicator
        if rep is None or self.epoch is None or self.pool is None:
            return
        msg = StatePush(self.pool, self.me, self.epoch.term, rep.version, rep.state)
        for h in holders:
            self.send(h, msg)
            self.stats["pushes_sent"] += 1
        if rep.unacked() and not self.armed("push_retry"):
            self.arm("push_retry", self.config.push_retry_s, self._push_retry)

    def _push_retry(self) -> None:
        rep = self.replicator
        if rep is None or self.role not in (*MANAGER_ROLES, Role.TAKING_OVER):
            return
        todo = rep.unacked()
        if todo:
            self.stats["push_retransmits"] += len(todo)
            self._push(todo)

    def _replicate(self) -> None:
        """Periodic re-push to every holder (Butt §4.2), after a holder-set step."""
        if self.role not in MANAGER_ROLES:
            return
        self._refresh_holders()
        rep = self.replicator
        if rep is not None:
            self._push(rep.holders)
        self.arm("replicate", self.config.replication_interval_s, self._replicate)

    # ------------------------------------------------------------ holder side of pushes
    def recv_push(self, src: NodeHandle, m: StatePush) -> None:
        """Store a pushed state unless promised to a newer epoch; acknowledge either way."""
        if src.id != m.manager.id:
            self.stats["spoofed"] += 1
            return
        if not self.pool_ok(m.pool) or self.pool is None:
            return
        if len(m.state) > self.config.max_state_bytes:
            self.stats["state_too_large"] += 1
            return
        stamp = m.stamp
        ok = self.store.accept(stamp, m.state)
        self.stats["pushes_stored" if ok else "pushes_refused"] += 1
        if ok:
            self.contact_s = self.now()
            self.contact_id = m.manager.id
            if m.term > self.max_term:
                self.max_term = m.term
        self.send(src, StateAck(self.pool, m.term, m.version, ok, self.store.promised))
        if (
            ok
            and self.epoch is not None
            and stamp.epoch > self.epoch
            and self.role in (*MANAGER_ROLES, Role.TAKING_OVER)
        ):
            self.fire(Event.SUPERSEDED)  # a newer manager pushes to us: we were deposed

    def recv_ack(self, src: NodeHandle, m: StateAck) -> None:
        """Count a holder's acknowledgement; a refusal may depose this manager."""
        rep = self.replicator
        if rep is None or self.epoch is None or m.term != self.epoch.term:
            self.stats["acks_late"] += 1
            return
        if not m.ok:
            self.stats["nacks"] += 1
            if m.promised is not None and m.promised > self.epoch:
                if m.promised.term > self.max_term:
                    self.max_term = m.promised.term
                # one holder promised a newer epoch (perhaps to a candidate that then lost):
                # go on with the others while they can still form a quorum
                if not rep.refuse(src.id):
                    self.fire(Event.SUPERSEDED)
            return
        self.stats["acks"] += 1
        self.run_callbacks(rep.ack(src.id, m.version), True)
        if (
            self.role in MANAGER_ROLES
            and rep.committed >= rep.version
            and {h.id for h in rep.holders} != {h.id for h in self.holder_view()}
            and not self.armed("holders")
        ):
            self.arm("holders", self.config.holder_refresh_s, self._refresh_holders)

    # ------------------------------------------------------------ leaving the role
    def _end_claim(self) -> None:
        """Forget an election, takeover or reign; pending commits fail."""
        self.disarm(
            "election",
            "vote_retry",
            "alive",
            "replicate",
            "push_retry",
            "holders",
            "handoff",
            "preempt_retry",
            "preempt_timeout",
        )
        rep = self.replicator
        el = self.election
        if el is not None and rep is None and self.store.promised == el.epoch:
            # a candidate that lost withdraws the promise it made to itself, so that its own
            # store does not refuse the manager it goes back to following
            self.store.promised = el.prior
        self.replicator = None
        self.election = None
        self.preemption = None
        self._handoff = None
        self.epoch = None
        self.deposed.clear()
        if rep is not None:
            self.run_callbacks(rep.fail_all(), False)

    def _rearm_listening(self) -> None:
        if self.known is not None:
            if not self.armed("missing"):
                self.arm("missing", self.config.detection_s, self._alive_missed)
        elif self.original:
            self.arm("startup", self.config.startup_s, self._startup_quiet)

    def _act_abandon(self, _ctx: object) -> None:
        self.stats["claims_abandoned"] += 1
        self._end_claim()
        self._rearm_listening()

    def _act_abandon_and_follow(self, a: Alive) -> None:
        self._end_claim()
        self.act_follow(a)

    def _act_step_down(self, a: Alive | None) -> None:
        self.stats["step_downs"] += 1
        was = self.epoch
        self._end_claim()
        if a is not None:
            self.act_follow(a)
        else:
            known = self.known
            self.notify_change(
                known.manager if known is not None else None,
                known.epoch if known is not None else was,
                False,
                None,
                0,
                self.me,
            )
            self._rearm_listening()

    def _act_halt(self, _ctx: object) -> None:
        self._end_claim()
        self.disarm_all()

    # ------------------------------------------------------------ implemented by Failover
    def act_follow(self, a: Alive) -> None:  # pragma: no cover - overridden
        """Adopt ``a`` as the manager and notify (provided by Failover)."""
        raise NotImplementedError

    def _alive_missed(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _startup_quiet(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError
