"""faultD in the simulator: a pool ring of ``Failover`` applications, crashes, restarts and an
invariant observer that checks the manager invariants after every event.

Typical use::

    net = Network(seed=1, latency=latency.Uniform(0.01, 0.05, seed=1), loss=0.05)
    obs = plugins.failover.observe(net)           # checks the invariants after every event
    nodes = net.spawn(30, overlay="pastry", join_interval_s=0.5)
    pool = plugins.failover.FailoverPool(net, nodes, original=nodes[0])
    pool.start(); net.run(60)
    m = pool.the_manager()                        # exactly one serving manager, or None
    pool.crash(m); net.run(60)                    # the closest replica holder takes over
    pool.restart(m); net.run(60)                  # the original returns and preempts

**Restart.** :func:`restart_node` (``Network.restart``) brings a crashed node back with the same
id and the same address (index), as a rebooted daemon with its key and port would: a fresh core
(empty routing state and empty failover state) that joins through a random ready node. The old
``SimNode`` object stays dead, so the timers of the crashed core stay silent.

**Observer.** :func:`observe` installs an :class:`Observer` as the engine's ``after_event``
hook (called after every event); a :class:`FailoverPool` then registers
:meth:`FailoverPool.check` there. The check runs in O(number
of serving managers): the pool keeps the set of nodes in a manager role up to date from the
role-change listeners of the applications.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from discovery.failover import Failover, FailoverConfig, attach
from discovery.failover_messages import Ed25519Signer, Epoch, Signer
from discovery.failover_roles import MANAGER_ROLES
from overlay.errors import ConfigError
from overlay.ids import NodeId
from sim_adapter.network import Network
from sim_adapter.simnode import SimNode

__all__ = [
    "FailoverPool",
    "InvariantViolation",
    "Observer",
    "failover_bound_s",
    "observe",
    "preempt_bound_s",
    "restart_node",
    "signers_for",
]


class InvariantViolation(AssertionError):
    """A manager invariant failed (raised from the event loop by the observer)."""


# ---------------------------------------------------------------------- the observer
class Observer:
    """Hooks called after every event of a network's engine (``Engine.after_event``)."""

    __slots__ = ("hooks",)

    def __init__(self) -> None:
        self.hooks: list[Callable[[], None]] = []

    def __call__(self) -> None:
        """Run every hook, in order."""
        for h in self.hooks:
            h()


def observe(net: Network) -> Observer:
    """Install (or return) the network's after-every-event observer."""
    cur = net.engine.after_event
    if isinstance(cur, Observer):
        return cur
    if cur is not None:
        raise ConfigError("the network's engine already has another after_event hook")
    obs = Observer()
    net.engine.after_event = obs
    return obs


# ---------------------------------------------------------------------- restart
def restart_node(net: Network, node: SimNode, config: Any = None) -> SimNode:
    """Bring crashed ``node`` back (``Network.restart``): same id and address, fresh state,
    joining through a random ready node at the current virtual time."""
    return net.restart(node, config)


# ---------------------------------------------------------------------- bounds
def failover_bound_s(config: FailoverConfig, route_s: float = 15.0) -> float:
    """The takeover bound the tests state: detection (``alive_period_s × missed_alives`` plus
    the jitter), ``route_s`` for routing ``manager_missing`` (hop-by-hop retransmissions
    around the dead manager, MSPastry §3.2), the election and the commit of the recovered
    state (each at most ``election_timeout_s``), and one alive period for the new manager's
    first alive to reach every listener (multicast with retransmissions)."""
    c = config
    detect = c.detection_s + c.detection_jitter * c.alive_period_s
    return detect + route_s + 2 * c.election_timeout_s + c.alive_period_s


def preempt_bound_s(config: FailoverConfig, join_s: float = 15.0) -> float:
    """The preemption bound the tests state, from the original's restart: ``join_s`` to
    rejoin the ring, up to two alive periods to hear the replacement's alive through the
    multicast, the preempt exchange, the election and the commit (each at most
    ``election_timeout_s``), and one alive period for the original's alive to reach everyone."""
    c = config
    return join_s + 3 * c.alive_period_s + 3 * c.election_timeout_s


# ---------------------------------------------------------------------- the pool
class FailoverPool:
    """Failover applications on every node of a simulated pool ring."""

    def __init__(
        self,
        net: Network,
        nodes: Sequence[SimNode],
        original: SimNode,
        config: FailoverConfig | None = None,
        *,
        signers: dict[NodeId, Signer] | None = None,
        overlay_config: Any = None,
        on_manager_change: Callable[[SimNode, Any], None] | None = None,
    ) -> None:
        self.net = net
        self.config = config if config is not None else FailoverConfig()
        self.pool_key = original.id
        self.signers = signers
        self.overlay_config = overlay_config
        self.on_manager_change = on_manager_change
        self.apps: dict[int, Failover] = {}
        #: indices of live nodes in a manager role (kept by the role listeners)
        self.managers: set[int] = set()
        #: (epoch, index) of every reign seen, for the "one manager per epoch/term" checks
        self.reigns: dict[Epoch, int] = {}
        self.term_owner: dict[int, int] = {}
        self.checks = 0
        self.violations: list[str] = []
        #: the observer raises at the first violation (else it only records them)
        self.strict = True
        #: check "at most one manager per term" (valid while no partition splits the holders)
        self.check_terms = True
        self.counts: Counter[str] = Counter()
        for n in nodes:
            self.attach(n, original=n.id == original.id)
        if isinstance(net.engine.after_event, Observer):
            net.engine.after_event.hooks.append(self.check)

    # ------------------------------------------------------------ set-up
    def attach(self, node: SimNode, original: bool = False) -> Failover:
        """Attach a Failover application to ``node`` (not started)."""
        signer = self.signers.get(node.id) if self.signers is not None else None
        idx = node.index

        def changed(manager: Any, epoch: Any, i_am: bool, state: Any) -> None:
            self.counts["changes"] += 1
            if self.on_manager_change is not None:
                self.on_manager_change(node, (manager, epoch, i_am, state))

        fo = attach(
            node.core,
            self.config,
            pool_key=self.pool_key,
            original=original,
            signer=signer,
            require_signatures=self.signers is not None,
            on_manager_change=changed,
        )
        fo.role_listeners.append(lambda _f: self._role_changed(idx, fo))
        self.apps[idx] = fo
        return fo

    def start(self) -> None:
        """Start every attached application that is not started yet."""
        for fo in self.apps.values():
            if not fo._started:
                fo.start()

    def app(self, node: SimNode) -> Failover:
        """The Failover application of ``node``."""
        return self.apps[node.index]

    # ------------------------------------------------------------ faults
    def crash(self, node: SimNode) -> None:
        """Fail-stop ``node`` (``Network.crash``)."""
        self.net.crash(node)
        self.managers.discard(node.index)

    def restart(self, node: SimNode) -> SimNode:
        """Restart a crashed node with the same id and a fresh Failover (the original again if
        it was the original); returns the new SimNode."""
        was_original = self.apps[node.index].original
        new = restart_node(self.net, node, self.overlay_config)
        fo = self.attach(new, original=was_original)
        fo.start()
        return new

    # ------------------------------------------------------------ views
    def live(self) -> list[tuple[SimNode, Failover]]:
        """(node, application) of every live node."""
        nodes = self.net.nodes
        return [(nodes[i], fo) for i, fo in self.apps.items() if nodes[i].alive]

    def serving(self) -> list[tuple[SimNode, Failover]]:
        """Live nodes in a manager role."""
        nodes = self.net.nodes
        return [
            (nodes[i], self.apps[i])
            for i in sorted(self.managers)
            if nodes[i].alive and self.apps[i].is_manager
        ]

    def the_manager(self) -> tuple[SimNode, Failover] | None:
        """The one serving manager, or None when there are none or several."""
        s = self.serving()
        return s[0] if len(s) == 1 else None

    def agreed(self) -> bool:
        """Exactly one manager, and every live listener knows it (by epoch)."""
        m = self.the_manager()
        if m is None:
            return False
        fo = m[1]
        return all(f.manager_epoch == fo.epoch for _, f in self.live())

    def run_until(self, pred: Callable[[], bool], max_s: float, step_s: float = 0.5) -> float:
        """Run until ``pred()`` holds (checked every ``step_s``); returns the virtual time it
        took, or ``nan`` if it did not hold within ``max_s``."""
        t0 = self.net.now
        while self.net.now - t0 < max_s:
            if pred():
                return self.net.now - t0
            self.net.run(step_s)
        return self.net.now - t0 if pred() else float("nan")

    # ------------------------------------------------------------ invariants
    def _role_changed(self, idx: int, fo: Failover) -> None:
        if fo.role in MANAGER_ROLES and self.net.nodes[idx].alive:
            self.managers.add(idx)
            e = fo.epoch
            if e is not None:
                self._record_reign(e, idx)
        else:
            self.managers.discard(idx)

    def _record_reign(self, e: Epoch, idx: int) -> None:
        nid = int(self.net.nodes[idx].id)
        if e.node != nid:
            self._violate(f"node {idx} serves epoch {e} that names another node")
        owner = self.reigns.setdefault(e, idx)
        if owner != idx:
            self._violate(f"epoch {e} served by nodes {owner} and {idx}")
        if self.check_terms:
            t = self.term_owner.setdefault(e.term, nid)
            if t != nid:
                self._violate(f"term {e.term} won by two nodes ({t:x}, {nid:x})")

    def check(self) -> None:
        """The per-event invariant: at most one live manager per epoch (and per term when
        ``check_terms``); every serving manager's epoch names itself."""
        self.checks += 1
        ms = self.managers
        if len(ms) < 2:
            return
        nodes = self.net.nodes
        seen: dict[int, int] = {}
        for i in ms:
            if not nodes[i].alive:
                continue
            e = self.apps[i].epoch
            if e is None:
                continue
            key = e.term if self.check_terms else hash(e)
            if key in seen:
                self._violate(f"two live managers in {'term' if self.check_terms else 'epoch'} {e}")
            seen[key] = i

    def _violate(self, what: str) -> None:
        self.violations.append(f"t={self.net.now:.3f}: {what}")
        if self.strict:
            raise InvariantViolation(what)


def signers_for(
    identities: Iterable[Any],
) -> dict[NodeId, Signer]:
    """``{id: Ed25519Signer}`` for ``overlay.Identity`` objects (spawn with their ids)."""
    return {ident.id: Ed25519Signer(ident.private_key) for ident in identities}
