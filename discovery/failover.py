"""faultD: replica-based central-manager failover inside a pool ring (Butt et al. 2006 §3.3, §4.2).

Theory of operation. Every machine of a pool, its central manager included, runs a
:class:`Failover` application on a pool-local ring (Pastry or the small-world ring; the paper:
"another p2p ring comprising of the central manager and all the resources in the pool"). All
start as listeners; the one started with ``original=True`` (the paper's command-line flag)
claims the role when it hears no manager. The roles and their transitions are data, in
:mod:`discovery.failover_roles`.

* **Manager.** Multicasts a signed ``alive(manager, epoch, seq, next_in, holders, version)``
  every ``alive_period_s`` through the recursive-partition multicast application (see below),
  and pushes every new state version to its K replica holders, the K live nodes closest to the
  pool key (the original's id; Butt: "the K immediate neighbors"). ``commit(state, cb)`` calls
  back once a quorum of them acknowledged (:mod:`discovery.failover_replica`).
* **Listener.** Follows the newest alive by ``(epoch, seq)``: duplicates, reordered, stale and
  replayed alives change nothing (a stale manager is sent the newest alive so it steps down);
  with signatures required, unsigned and forged alives are dropped and counted. After
  ``missed_alives`` periods of silence it routes ``manager_missing`` to the manager's id and
  goes on listening; it repeats each detection period until an alive arrives.
* **Takeover.** ``manager_missing`` reaches the manager if alive (it answers the reporter with
  an alive: the paper ignores it) or the live node closest to its id, which runs an election
  among the manager's holders and takes over with the newest replicated state
  (:mod:`discovery.failover_election`). **Preemption**: the returning original hears the
  replacement's alive, preempts it and gets the up-to-date state; the replacement becomes a
  listener when it hears the original's alive (higher epoch). Any manager that hears a higher
  epoch, or whose state a holder refuses for a newer promise, steps down.
* **Hooks.** On every change of the manager as this node sees it, ``on_manager_change(manager,
  epoch, i_am_manager, state)`` runs (``state`` = the committed state when this node became the
  manager), ``apply_condor_host(manager)`` when the manager is a different node than last time,
  and the change listeners get a :class:`ManagerChange` (the trio wrapper turns them into an
  async iterator). Applications re-send their ads and job requests then (Butt §4.2).

Why multicast for alives: the manager does not know every pool member (its routing state holds
O(log N) of them); the multicast partitions the ring over what every node knows, reaches all
live nodes in O(log N) levels with acknowledged, retransmitted edges and repairs around dead
children, at ~2.3 messages per node per alive (measured on 30-node rings). Direct sends would
need a membership list the paper's design does not have.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from discovery.failover_config import (
    FailoverConfig,
    FailoverError,
    ManagerChange,
    NotManagerError,
    StateTooLargeError,
)
from discovery.failover_manager import ManagerMixin
from discovery.failover_messages import (
    Alive,
    Epoch,
    Handoff,
    ManagerMissing,
    PreemptRequest,
    StateAck,
    StatePush,
    StateStamp,
    VoteReply,
    VoteRequest,
)
from discovery.failover_replica import CommitCallback
from discovery.failover_roles import MANAGER_ROLES, Action, Event, Role
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.kbr import KbrCore

__all__ = [
    "ChangeFeed",
    "Failover",
    "FailoverConfig",
    "FailoverError",
    "ManagerChange",
    "NotManagerError",
    "Role",
    "StateTooLargeError",
    "attach",
]

#: the longest ``next_in`` a listener believes (a bogus huge value must not silence detection)
_MAX_NEXT_IN_S = 3600.0


class Failover(ManagerMixin):
    """faultD on one node of a pool ring. Create it with :func:`attach`, then :meth:`start`."""

    # The constructor is FailoverBase's (its keyword arguments are documented on :func:`attach`).

    def _action_table(self) -> dict[Action, Callable[[Any], None]]:
        """The method each :class:`~discovery.failover_roles.Action` runs."""
        A = Action
        return {
            A.NONE: lambda _c: None,
            A.START_BOOTSTRAP: self.act_start_bootstrap,
            A.START_TAKEOVER: self.act_start_takeover,
            A.START_PREEMPT_ELECTION: self.act_start_preempt_election,
            A.REPORT_MISSING: self._act_report_missing,
            A.FOLLOW: self.act_follow,
            A.REFRESH: lambda _c: None,  # consider_alive already adopted the alive
            A.TELL_STALE: self._act_tell_stale,
            A.ANSWER_ALIVE: self._act_answer_alive,
            A.COMMIT_RECOVERED: self._act_commit_recovered,
            A.BEGIN_SERVING: self._act_begin_serving,
            A.ABANDON: self._act_abandon,
            A.ABANDON_AND_FOLLOW: self._act_abandon_and_follow,
            A.STEP_DOWN: self._act_step_down,
            A.SEND_PREEMPT: self.act_send_preempt,
            A.RETARGET_PREEMPT: self.act_retarget_preempt,
            A.SEND_HANDOFF: self.act_send_handoff,
            A.RESUME: self.act_resume,
            A.HALT: self._act_halt,
        }

    # ================================================================== public API
    def start(self) -> None:
        """Begin as a listener; the original claims the role after ``startup_s`` of silence."""
        if self._started:
            raise FailoverError("Failover.start() called twice")
        self._started = True
        if self.original:
            self.arm("startup", self.config.startup_s, self._startup_quiet)

    def stop(self) -> None:
        """Stop: cancel every timer; pending commits are reported as not committed."""
        self.fire(Event.STOP)

    @property
    def is_manager(self) -> bool:
        """This node serves as the pool's manager."""
        return self.role in MANAGER_ROLES

    @property
    def manager(self) -> NodeHandle | None:
        """The pool's manager as this node knows it (itself when serving)."""
        if self.role in MANAGER_ROLES:
            return self.me
        return self.known.manager if self.known is not None else None

    @property
    def manager_epoch(self) -> Epoch | None:
        """The epoch of :attr:`manager`."""
        if self.role in MANAGER_ROLES:
            return self.epoch
        return self.known.epoch if self.known is not None else None

    @property
    def holders(self) -> tuple[NodeHandle, ...]:
        """The manager's replica holders (own when serving, else from the newest alive)."""
        if self.replicator is not None:
            return self.replicator.holders
        return self.known.holders if self.known is not None else ()

    @property
    def state(self) -> bytes | None:
        """The newest state while serving (committed or not), else None."""
        return self.replicator.state if self.replicator is not None else None

    @property
    def stamp(self) -> StateStamp | None:
        """Stamp of :attr:`state` while serving."""
        return self.replicator.stamp if self.replicator is not None else None

    @property
    def committed_version(self) -> int:
        """Highest committed version while serving (-1: none in this epoch), else -1."""
        return self.replicator.committed if self.replicator is not None else -1

    def commit(self, state: bytes, on_committed: CommitCallback | None = None) -> int:
        """Replicate ``state`` (opaque bytes) as the next version; returns the version.

        ``on_committed(True)`` once a quorum of the replica holders acknowledged this version
        or a later one; ``on_committed(False)`` if this node stops serving first — the version
        may then be lost (only committed versions survive a failover). Raises
        :class:`NotManagerError` on a node that is not serving, :class:`StateTooLargeError`
        beyond ``max_state_bytes``.
        """
        if not isinstance(state, bytes):
            raise FailoverError(f"state must be bytes, got {type(state).__name__}")
        if len(state) > self.config.max_state_bytes:
            raise StateTooLargeError(
                f"state of {len(state)} bytes exceeds max_state_bytes={self.config.max_state_bytes}"
            )
        rep = self.replicator
        if self.role not in MANAGER_ROLES or rep is None:
            raise NotManagerError(f"this node is {self.role.value}, not the pool's manager")
        v = rep.new_version(state, on_committed)
        self.store.accept(rep.stamp, state)
        self.stats["commits"] += 1
        self._push(rep.holders)
        self.run_callbacks(rep.settle_now(), True)
        return v

    def add_change_listener(self, fn: Callable[[ManagerChange], None]) -> None:
        """Call ``fn(ManagerChange)`` on every manager change this node sees."""
        self.change_listeners.append(fn)

    def remove_change_listener(self, fn: Callable[[ManagerChange], None]) -> None:
        """Stop calling ``fn``."""
        if fn in self.change_listeners:
            self.change_listeners.remove(fn)

    def changes(self, maxlen: int = 64) -> ChangeFeed:
        """A new :class:`ChangeFeed` of the manager changes from now on."""
        return ChangeFeed(self, maxlen)

    def status(self) -> dict[str, Any]:
        """What ``flockring manager ADDR`` shows: role, manager, epoch, seq, holders, stats."""
        m = self.manager
        e = self.manager_epoch
        return {
            "role": self.role.value,
            "pool": str(self.pool) if self.pool is not None else None,
            "manager": str(m.id) if m is not None else None,
            "manager_address": m.address if m is not None else None,
            "epoch": [e.term, str(e.node)] if e is not None else None,
            "seq": self.seq if self.is_manager else (self.known.seq if self.known else None),
            "holders": [str(h.id) for h in self.holders],
            "version": self.known.version
            if self.known and not self.is_manager
            else (self.committed_version),
            "stats": dict(self.stats),
        }

    # ================================================================== KBR upcalls
    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        """Routed ``manager_missing`` (and payloads a peer wrapped in a DirectMsg)."""
        t = type(payload)
        if t is ManagerMissing:
            self._recv_missing(payload)
        elif t is Alive:
            self.consider_alive(payload)
        else:
            self.stats["dropped_unknown"] += 1

    def update(self, handle: NodeHandle, joined: bool) -> None:
        """A neighbour joined or left: a manager refreshes its holder set soon."""
        if self.role in MANAGER_ROLES and not self.armed("holders"):
            self.arm("holders", self.config.holder_refresh_s, self._refresh_holders)

    # ================================================================== alives
    def consider_alive(self, a: Alive) -> None:
        """Every alive, whatever path it took, goes through here."""
        if self.role is Role.STOPPED:
            return
        if not self.pool_ok(a.pool):
            return
        if not 0.0 < a.next_in_s <= _MAX_NEXT_IN_S:
            self.stats["alive_malformed"] += 1
            return
        if a.manager.id == self.core.id:
            self.stats["alive_own"] += 1
            return
        known = self.known
        e = a.epoch
        if known is not None and e == known.epoch and a.seq <= known.seq:
            self.stats["alive_duplicate"] += 1  # duplicate, reordered or replayed
            return
        if not self.check_sig(a, a.manager.id):
            return
        own = (
            self.epoch if self.role in (*MANAGER_ROLES, Role.CANDIDATE, Role.TAKING_OVER) else None
        )
        if known is None or e >= known.epoch:  # the newest news of the pool's manager
            if own is not None and e < own:
                # older than this node's own claim: remember it (lease), tell it if serving
                self.consider_known(a)
                self.stats["alive_stale"] += 1
                self.fire(Event.LOWER_ALIVE, a)
                return
            self.stats["alive_accepted"] += 1
            if known is None or e > known.epoch:
                self.fire(Event.HIGHER_ALIVE, a)  # a new reign (FOLLOW adopts it)
            else:
                self.consider_known(a)  # in every role: the lease and the detection timer
                self.fire(Event.ALIVE_HEARD, a)
            self._maybe_preempt()
            return
        self.stats["alive_stale"] += 1
        self.fire(Event.LOWER_ALIVE, a)

    def _maybe_preempt(self) -> None:
        k = self.known
        if (
            self.original
            and self.config.preempt
            and self.role is Role.LISTENER
            and k is not None
            and k.manager.id != self.core.id
            and self.pool == self.core.id
        ):
            self.fire(Event.OTHER_MANAGER_HEARD, k)

    def consider_known(self, a: Alive) -> None:
        """Adopt ``a`` as the newest alive and restart the detection timer."""
        self.known = a
        self.contact_s = self.now()
        self.contact_id = a.manager.id
        if a.term > self.max_term:
            self.max_term = a.term
        self.disarm("startup")
        jitter = self.core.runtime.rng.random() * self.config.detection_jitter
        wait = (a.next_in_s * self.config.missed_alives) + jitter * self.config.alive_period_s
        self.arm("missing", wait, self._alive_missed)

    def _alive_missed(self) -> None:
        self.fire(Event.ALIVE_MISSED)

    def _startup_quiet(self) -> None:
        self.fire(Event.STARTUP_QUIET)

    def _newest_alive(self) -> Alive | None:
        if self.role in MANAGER_ROLES:
            return self._make_alive(bump=False)
        return self.known

    def act_follow(self, a: Alive) -> None:
        """Adopt a new manager's alive and tell the application."""
        prev = self.known.manager if self.known is not None else None
        self.consider_known(a)
        # a new epoch is a new reign even when the node is the same (it was re-elected)
        self.notify_change(a.manager, a.epoch, False, None, a.version, prev)

    def _act_tell_stale(self, a: Alive) -> None:
        """Send a stale manager the newest alive so it steps down (rate-limited)."""
        now = self.now()
        last = self._told.get(a.manager.id, float("-inf"))
        if now - last < self.config.alive_period_s:
            return
        newest = self._newest_alive()
        if newest is None:
            return
        if len(self._told) > 256:
            self._told.clear()
        self._told[a.manager.id] = now
        self.stats["stale_told"] += 1
        self.send(a.manager, newest)

    def _act_report_missing(self, _ctx: object) -> None:
        k = self.known
        self.preemption = None
        self.disarm("preempt_retry", "preempt_timeout")
        if k is None or self.pool is None:
            return
        self.stats["missing_sent"] += 1
        msg = ManagerMissing(self.pool, k.manager, k.term, self.me, k.holders)
        self.core.route(k.manager.id, self.config.app_name, msg)
        jitter = self.core.runtime.rng.random() * self.config.detection_jitter
        self.arm(
            "missing",
            self.config.detection_s + jitter * self.config.alive_period_s,
            self._alive_missed,
        )

    # ================================================================== manager_missing
    def _recv_missing(self, m: ManagerMissing) -> None:
        if self.role is Role.STOPPED or not self.pool_ok(m.pool):
            return
        self.stats["missing_received"] += 1
        if self.role in (Role.LISTENER, Role.PREEMPTING):
            k = self.known
            reported = Epoch(m.term, m.manager.id)
            if k is not None and k.epoch >= reported and self.lease_fresh():
                # the manager (or a newer one) is alive: the reporter only lost alives
                self.stats["missing_redirected"] += 1
                self.send(m.reporter, k)
                return
        self.fire(Event.MISSING_RECEIVED, m)

    def _act_answer_alive(self, m: ManagerMissing) -> None:
        self.stats["missing_ignored"] += 1
        a = self._make_alive(bump=False)
        if a is not None:
            self.send(m.reporter, a)


class ChangeFeed:
    """Manager changes as a pull-style queue (the trio wrapper's async iterator sits on it).

    ``Failover.changes()`` creates one; every change is queued (the oldest dropped and counted
    beyond ``maxlen``) and ``waker()`` — set with :meth:`set_waker`, e.g. a trio event's
    ``set`` — is called after each. Iterating drains what is queued without blocking.
    """

    def __init__(self, fo: Failover, maxlen: int = 64) -> None:
        self._fo = fo
        self._queue: deque[ManagerChange] = deque()
        self.maxlen = maxlen
        self.dropped = 0
        self._waker: Callable[[], None] | None = None
        fo.add_change_listener(self._push)

    def _push(self, ch: ManagerChange) -> None:
        if len(self._queue) >= self.maxlen:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(ch)
        if self._waker is not None:
            self._waker()

    def set_waker(self, fn: Callable[[], None] | None) -> None:
        """Call ``fn()`` whenever a change is queued (None: stop)."""
        self._waker = fn

    def pop(self) -> ManagerChange | None:
        """The oldest queued change, or None."""
        return self._queue.popleft() if self._queue else None

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[ManagerChange]:
        while self._queue:
            yield self._queue.popleft()

    def close(self) -> None:
        """Stop receiving changes."""
        self._fo.remove_change_listener(self._push)
        self._waker = None


def attach(core: KbrCore, config: FailoverConfig | None = None, **kw: Any) -> Failover:
    """Create a :class:`Failover` for ``core``, register it under ``config.app_name``, install
    the handlers of its point-to-point messages and listen to the multicast application.

    Keyword arguments are those of :class:`Failover` (``pool_key``, ``original``, ``signer``,
    ``require_signatures``, ``on_manager_change``, ``apply_condor_host``, ``initial_state``).
    Call :meth:`Failover.start` once the node is up.
    """
    fo = Failover(core, config, **kw)
    core.register(fo.config.app_name, fo)
    handlers: tuple[tuple[type[Any], Callable[[NodeHandle, Any], None]], ...] = (
        (VoteRequest, fo.recv_vote_request),
        (VoteReply, fo.recv_vote_reply),
        (StatePush, fo.recv_push),
        (StateAck, fo.recv_ack),
        (PreemptRequest, fo.recv_preempt),
        (Handoff, fo.recv_handoff),
        (Alive, lambda _src, a: fo.consider_alive(a)),
    )
    for cls, fn in handlers:
        core.add_handler(cls, fn)
    fo._multicast()
    return fo
