"""A pool ring of HTCondor-site machines in the simulator: faultD, the flock and the submit push.

Theory of operation: :class:`SitePool` puts on every machine of one pool ring the three
unmodified plugins and their coordinator (:class:`discovery.failover.Failover` through
:class:`~sim_adapter.plugins.failover.FailoverPool`, :class:`discovery.announce.Flock`,
:class:`discovery.submit.SubmitSync`, :class:`discovery.site.Site`). Every apply on every
machine is recorded (:attr:`SitePool.applies`), so tests can check that versions only grow
and that every machine converges to the manager's newest decision. :meth:`SitePool.crash` and
:meth:`SitePool.restart` fail-stop and bring back a machine with fresh plugins, as a rebooted
host would run them.

Simplification: the pool ring and the flock ring are one simulated overlay. The pool's machines
get adjacent node ids (:func:`pool_ids`), so the K replica holders faultD picks around the pool
key are machines of the pool, and the other pools' managers on the same overlay are the flock
ring. Live sites run two rings; the plugins do not depend on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from discovery.announce import Flock, FlockConfig, PoolView
from discovery.decision import FlockDecision
from discovery.failover import Failover, FailoverConfig
from discovery.failover_messages import Signer
from discovery.site import Site
from discovery.submit import SubmitConfig, SubmitSync
from overlay.ids import ID_BITS, NodeId
from sim_adapter.network import Network
from sim_adapter.plugins.failover import FailoverPool
from sim_adapter.simnode import SimNode

__all__ = ["SitePool", "pool_ids"]


def pool_ids(key: NodeId, n: int) -> list[NodeId]:
    """``n`` adjacent ids starting at ``key`` (the pool's machines cluster around its key)."""
    return [NodeId((int(key) + i) % (1 << ID_BITS)) for i in range(n)]


#: ``applier_for(node) -> applier``: the decision applier of one machine (e.g. a
#: ``FlockConfigApplier`` on a per-machine directory)
ApplierFactory = Callable[[SimNode], Callable[[FlockDecision], object]]


class SitePool:
    """One pool ring of site machines: node ``original`` is the pool's central manager."""

    def __init__(
        self,
        net: Network,
        nodes: Sequence[SimNode],
        original: SimNode,
        pool: PoolView,
        *,
        collector: str,
        pool_name: str,
        flock_config: FlockConfig | None = None,
        failover_config: FailoverConfig | None = None,
        submit_config: SubmitConfig | None = None,
        signers: dict[NodeId, Signer] | None = None,
        applier_for: ApplierFactory | None = None,
    ) -> None:
        self.net = net
        self.pool = pool
        self.collector = collector
        self.pool_name = pool_name
        self.flock_config = flock_config if flock_config is not None else FlockConfig()
        self.submit_config = (
            submit_config
            if submit_config is not None
            else SubmitConfig(require_signatures=signers is not None)
        )
        self.signers = signers
        self.applier_for = applier_for
        #: every apply, in order: (virtual time, node index, decision)
        self.applies: list[tuple[float, int, FlockDecision]] = []
        self.sites: dict[int, Site] = {}
        self.failover = FailoverPool(net, nodes, original, failover_config, signers=signers)
        for n in nodes:
            self._attach(n)

    def _attach(self, node: SimNode) -> Site:
        fo: Failover = self.failover.app(node)
        signer = self.signers.get(node.id) if self.signers is not None else None
        flock = Flock(
            node.core,
            self.pool,
            self.flock_config,
            signer=signer if self.flock_config.require_signatures else None,
            collector=self.collector,
            pool_name=self.pool_name,
        )
        idx = node.index
        base = self.applier_for(node) if self.applier_for is not None else None
        # a persisting applier (FlockConfigApplier(persist=True)) knows what the machine applied
        # before it was restarted: the push never goes back behind it
        load = getattr(base, "load", None)
        applied = load() if callable(load) else None

        def apply(d: FlockDecision) -> None:
            if base is not None:
                base(d)
            self.applies.append((self.net.now, idx, d))

        sync = SubmitSync(
            node.core,
            self.failover.pool_key,
            apply,
            self.submit_config,
            signer=signer,
            applied=applied if isinstance(applied, FlockDecision) else None,
        )
        site = Site(fo, flock, sync, collector=self.collector, pool_name=self.pool_name)
        self.sites[idx] = site
        return site

    # ------------------------------------------------------------ control
    def start(self) -> None:
        """Start faultD on every machine (the flock role starts with the manager role)."""
        self.failover.start()

    def crash(self, node: SimNode) -> None:
        """Fail-stop ``node``."""
        self.failover.crash(node)

    def restart(self, node: SimNode) -> SimNode:
        """Bring ``node`` back with fresh plugins (same id and address); returns the new node."""
        new = self.failover.restart(node)
        self._attach(new)
        return new

    # ------------------------------------------------------------ views
    def site(self, node: SimNode | int) -> Site:
        """The coordinator of ``node``."""
        return self.sites[node if isinstance(node, int) else node.index]

    def live_sites(self) -> list[tuple[SimNode, Site]]:
        """(node, site) of every live machine."""
        nodes = self.net.nodes
        return [(nodes[i], s) for i, s in self.sites.items() if nodes[i].alive]

    def serving(self) -> list[tuple[SimNode, Site]]:
        """Live machines holding the flock role."""
        return [(n, s) for n, s in self.live_sites() if s.serving]

    def published(self) -> FlockDecision | None:
        """The newest decision a live serving machine published (None: none)."""
        best: FlockDecision | None = None
        for _, s in self.serving():
            p = s.sync.published
            if p is not None and p.newer_than(best):
                best = p
        return best

    def converged(self) -> bool:
        """Every live machine applied the newest published decision."""
        p = self.published()
        return p is not None and all(
            s.sync.applied is not None and s.sync.applied.version == p.version
            for _, s in self.live_sites()
        )

    def monotone(self) -> bool:
        """No machine ever applied a decision not newer than its previous one."""
        last: dict[int, tuple[int, int]] = {}
        for _, idx, d in self.applies:
            prev = last.get(idx)
            if prev is not None and d.version <= prev:
                return False
            last[idx] = d.version
        return True

    def status(self) -> dict[int, Any]:
        """Per-machine coordinator status, by node index."""
        return {i: s.status() for i, s in self.sites.items()}
