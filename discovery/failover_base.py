"""Shared machinery of the failover application: state, timers, the role machine, hooks.

Theory of operation: see :mod:`discovery.failover`. This module holds what the listener, the
manager (:mod:`discovery.failover`) and the election and preemption code
(:mod:`discovery.failover_election`) share: the node's role, its knowledge of the manager (the
newest accepted alive), its replica store, named timers on the core's runtime, the dispatch of
:data:`~discovery.failover_roles.TRANSITIONS` to action methods, signature checks, and the
application hooks. Hooks are application code: an exception in one is logged and counted, never
propagated into the node's receive loop.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from discovery.failover_config import (
    ApplyCondorHost,
    FailoverConfig,
    ManagerChange,
    ManagerChangeHook,
    StateTooLargeError,
)
from discovery.failover_messages import (
    Alive,
    Epoch,
    HandoffConsent,
    PreemptRequest,
    Signer,
    sign,
    verify,
)
from discovery.failover_replica import ReplicaStore, Replicator
from discovery.failover_roles import (
    IGNORED,
    MANAGER_ROLES,
    TRANSITIONS,
    Action,
    Event,
    Role,
)
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.kbr import BaseApplication, KbrCore
from overlay.messages import Message
from overlay.runtime import Timer

log = logging.getLogger("discovery.failover")

RoleListener = Callable[["FailoverBase"], None]
ChangeListener = Callable[[ManagerChange], None]


class FailoverBase(BaseApplication):
    """State and plumbing shared by the failover modules (use :class:`Failover`)."""

    def __init__(
        self,
        core: KbrCore,
        config: FailoverConfig | None = None,
        *,
        pool_key: NodeId | None = None,
        original: bool = False,
        signer: Signer | None = None,
        require_signatures: bool | None = None,
        on_manager_change: ManagerChangeHook | None = None,
        apply_condor_host: ApplyCondorHost | None = None,
        initial_state: bytes = b"",
    ) -> None:
        self.core = core
        self.config = config if config is not None else FailoverConfig()
        if len(initial_state) > self.config.max_state_bytes:
            raise StateTooLargeError("initial_state exceeds max_state_bytes")
        self.original = original
        #: the pool key: the original manager's id, known to every resource (Butt §3.3)
        self.pool: NodeId | None = core.id if (original and pool_key is None) else pool_key
        self.signer = signer
        self.require_signatures = (
            signer is not None if require_signatures is None else (require_signatures)
        )
        self.on_manager_change = on_manager_change
        self.apply_condor_host = apply_condor_host
        self.initial_state = initial_state
        #: counters: alives accepted/duplicate/stale/forged, votes, pushes, errors, …
        self.stats: Counter[str] = Counter()
        self.role = Role.LISTENER
        self.store = ReplicaStore()
        #: the newest alive accepted from another node (this node's view of the manager)
        self.known: Alive | None = None
        #: when this node last heard a live manager (alive or state push) and whom
        self.contact_s = float("-inf")
        self.contact_id: NodeId | None = None
        #: the highest term this node has seen anywhere
        self.max_term = 0
        #: own epoch while a candidate, taking over or serving
        self.epoch: Epoch | None = None
        self.replicator: Replicator | None = None
        self.seq = 0
        #: managers this one replaced; they get its alives directly (partition healing)
        self.deposed: list[NodeHandle] = []
        self.history: deque[ManagerChange] = deque(maxlen=self.config.history)
        self.role_listeners: list[RoleListener] = []
        self.change_listeners: list[ChangeListener] = []
        self._timers: dict[str, Timer] = {}
        self._applied_host: NodeHandle | None = None
        self._told: dict[NodeId, float] = {}
        self._started = False
        self._actions: dict[Action, Callable[[Any], None]] = self._action_table()

    def _action_table(self) -> dict[Action, Callable[[Any], None]]:
        """The method each :class:`~discovery.failover_roles.Action` runs (the
        :class:`Failover` class provides it)."""
        raise NotImplementedError  # pragma: no cover - the Failover class provides it

    # ------------------------------------------------------------ small utilities
    @property
    def me(self) -> NodeHandle:
        """This node's handle."""
        return self.core.handle

    def now(self) -> float:
        """The runtime's clock."""
        return self.core.runtime.now()

    def send(self, dst: NodeHandle, msg: Message) -> None:
        """Datagram to ``dst`` (never to itself)."""
        if dst == self.core.handle:
            return
        self.core.runtime.send(dst, msg)

    def arm(self, name: str, delay_s: float, fn: Callable[[], None]) -> None:
        """(Re)start the named timer."""
        old = self._timers.pop(name, None)
        if old is not None:
            old.cancel()

        def fire() -> None:
            if self._timers.get(name) is timer:
                del self._timers[name]
                fn()

        timer = self.core.runtime.call_later(delay_s, fire)
        self._timers[name] = timer

    def disarm(self, *names: str) -> None:
        """Cancel the named timers."""
        for name in names:
            t = self._timers.pop(name, None)
            if t is not None:
                t.cancel()

    def armed(self, name: str) -> bool:
        """True while the named timer is pending."""
        return name in self._timers

    def disarm_all(self) -> None:
        """Cancel every timer."""
        for t in self._timers.values():
            t.cancel()
        self._timers.clear()

    def pool_ok(self, pool: NodeId) -> bool:
        """True for this node's pool; a node that does not know its pool yet adopts it."""
        if self.pool is None:
            self.pool = pool
            return True
        if pool != self.pool:
            self.stats["wrong_pool"] += 1
            return False
        return True

    def holder_view(self) -> list[NodeHandle]:
        """The K live nodes this node knows closest to the pool key, itself excluded."""
        pool = self.pool if self.pool is not None else self.core.id
        k = self.config.replicas
        me = self.core.id
        return [h for h in self.core.replica_set(pool, k + 1) if h.id != me][:k]

    def lease_fresh(self, exempt: NodeId | None = None) -> bool:
        """A live manager (other than ``exempt``) was heard within the lease."""
        if self.role in MANAGER_ROLES and self.core.id != exempt:
            return True
        if self.contact_id is None or self.contact_id == exempt:
            return False
        return self.now() - self.contact_s < self.config.lease_s

    def signed(self, msg: Any) -> Any:
        """``msg`` signed by this node's signer (unchanged without one)."""
        return sign(msg, self.signer) if self.signer is not None else msg

    def check_sig(self, msg: Alive | PreemptRequest | HandoffConsent, claimed: NodeId) -> bool:
        """Signature check (when required); counts unsigned and forged messages."""
        if not self.require_signatures:
            return True
        name = type(msg).__name__.lower()
        if not msg.sig:
            self.stats[f"{name}_unsigned"] += 1
            return False
        if not verify(msg, claimed):
            self.stats[f"{name}_forged"] += 1
            return False
        return True

    # ------------------------------------------------------------ the role machine
    def fire(self, event: Event, ctx: Any = None) -> None:
        """Take the transition for ``event`` in the current role (see failover_roles)."""
        key = (self.role, event)
        t = TRANSITIONS.get(key)
        if t is None:
            if key in IGNORED:
                self.stats["events_ignored"] += 1
            else:
                self.stats["events_illegal"] += 1
                log.debug("failover %s: event %s not allowed in %s", self.me, event, self.role)
            return
        old = self.role
        self.role = t.target
        if old is not t.target:
            self.stats[f"to_{t.target.value}"] += 1
        self._actions[t.action](ctx)
        if self.role is not old:
            for fn in list(self.role_listeners):
                try:
                    fn(self)
                except Exception:
                    self.stats["hook_errors"] += 1
                    log.exception("failover role listener failed")

    # ------------------------------------------------------------ hooks
    def notify_change(
        self,
        manager: NodeHandle | None,
        epoch: Epoch | None,
        i_am: bool,
        state: bytes | None,
        version: int,
        previous: NodeHandle | None,
    ) -> None:
        """Record a manager change and call the application's hooks."""
        ch = ManagerChange(manager, epoch, i_am, state, version, self.now(), previous)
        self.history.append(ch)
        self.stats["manager_changes"] += 1
        if self.on_manager_change is not None:
            self._guard(self.on_manager_change, manager, epoch, i_am, state)
        if manager is not None and manager != self._applied_host:
            self._applied_host = manager
            if self.apply_condor_host is not None:
                self._guard(self.apply_condor_host, manager)
        for fn in list(self.change_listeners):
            self._guard(fn, ch)

    def _guard(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            self.stats["hook_errors"] += 1
            log.exception("failover hook %r failed", fn)

    def run_callbacks(self, cbs: list[Callable[[bool], None] | None], ok: bool) -> None:
        """Call commit callbacks with ``ok``, each guarded."""
        for cb in cbs:
            if cb is not None:
                self._guard(cb, ok)

    # ------------------------------------------------------------ implemented elsewhere
    def consider_alive(self, a: Alive) -> None:  # pragma: no cover - overridden
        """Process an alive from any path (multicast, direct, inside a vote reply)."""
        raise NotImplementedError
