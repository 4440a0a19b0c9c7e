"""Run the flock plugin on every node of a simulated network.

Theory of operation: :class:`FlockSim` attaches one unmodified :class:`discovery.Flock` to the
core of each live node of a :class:`~sim_adapter.network.Network` (Pastry or small world), with
a pool state per node, and drives it either in explicit *rounds* (every pool announces once,
then virtual time runs long enough for forwarding and RTT probes to finish — what the oracle
tests and the benchmark measure) or with the plugin's own timers (``start()``). Pools are any
objects with the ``PoolView`` properties; :class:`FixedPool` is a plain settable one.

Signatures: a simulated node's id is drawn from the seeded generator, not hashed from a key,
so by default announcements are unsigned (``require_signatures=False``), which is also much
faster. :func:`spawn_signed` spawns nodes whose ids are SHA-1 of Ed25519 keys drawn from the
network's generator, and ``FlockSim(identities=...)`` then signs and verifies every
announcement exactly as a live node does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from discovery.announce import Flock, FlockConfig, PoolView
from discovery.decision import FlockDecision
from discovery.flock_messages import IdentitySigner
from discovery.policy import Policy
from overlay.identity import Identity
from sim_adapter.network import Network
from sim_adapter.simnode import SimNode

__all__ = ["FixedPool", "FlockSim", "collector_of", "spawn_signed"]


@attrs.define(slots=True)
class FixedPool:
    """A pool state set by hand (the simulated pool model drives these numbers in experiments)."""

    machines: int
    free_machines: int
    idle_jobs: int = 0

    @property
    def running_jobs(self) -> int:
        """Jobs running in the pool (machines minus free ones)."""
        return self.machines - self.free_machines

    @property
    def utilization(self) -> float:
        """Busy machines over machines (0 for an empty pool)."""
        return self.running_jobs / self.machines if self.machines else 0.0


def collector_of(node: SimNode) -> str:
    """The collector contact string simulated node ``node`` announces."""
    return f"cm{node.index}.pool.sim:9618"


def spawn_signed(
    net: Network, n: int, overlay: str = "pastry", build: str = "oracle", **kw: Any
) -> tuple[list[SimNode], dict[int, Identity]]:
    """Spawn ``n`` nodes whose ids are SHA-1 of Ed25519 public keys (drawn from the network's
    seeded generator); returns the nodes and their identities by node index."""
    idents = [Identity.from_rng(net.rng) for _ in range(n)]
    nodes = net.spawn(n, overlay=overlay, build=build, ids=[i.id for i in idents], **kw)
    return nodes, {node.index: ident for node, ident in zip(nodes, idents, strict=True)}


PoolSpec = Mapping[int, PoolView] | Sequence[PoolView] | Callable[[SimNode], PoolView]
PolicySpec = Policy | Mapping[int, Policy] | Callable[[SimNode], Policy | None] | None


class FlockSim:
    """One Flock per live node of ``net``."""

    def __init__(
        self,
        net: Network,
        pools: PoolSpec,
        config: FlockConfig | None = None,
        *,
        policies: PolicySpec = None,
        identities: Mapping[int, Identity] | None = None,
        nodes: Sequence[SimNode] | None = None,
    ) -> None:
        """``pools``: one per node (a map or sequence indexed by node index) or a factory.
        ``policies``: one for all, a map by node index, or a factory (None: allow
        everything). ``identities``: sign with these keys (see :func:`spawn_signed`); without
        them signing is off."""
        self.net = net
        if config is None:
            config = FlockConfig(require_signatures=identities is not None)
        self.config = config
        self.flocks: dict[int, Flock] = {}
        for node in nodes if nodes is not None else net.live_nodes():
            pool = pools(node) if callable(pools) else pools[node.index]
            if isinstance(policies, Policy) or policies is None:
                pol = policies
            elif callable(policies):
                pol = policies(node)
            else:
                pol = policies.get(node.index)
            signer = None
            if identities is not None:
                signer = IdentitySigner(identities[node.index])
            self.flocks[node.index] = Flock(
                node.core,
                pool,
                config,
                policy=pol,
                signer=signer,
                collector=collector_of(node),
                pool_name=f"pool{node.index}",
            )

    def __getitem__(self, node: SimNode | int) -> Flock:
        return self.flocks[node if isinstance(node, int) else node.index]

    def start(self) -> None:
        """Arm every flock's own announcement and manager timers."""
        for f in self.flocks.values():
            f.start()

    def live(self) -> list[tuple[SimNode, Flock]]:
        """The live nodes and their Flock applications."""
        nodes = self.net.nodes
        return [(nodes[i], f) for i, f in self.flocks.items() if nodes[i].alive]

    def round(self, settle_s: float = 5.0) -> int:
        """Every live pool announces once; then virtual time runs ``settle_s`` so that
        forwarded copies and RTT probes complete. Returns announcement messages sent (direct
        and forwarded)."""
        before = self.net.msg_by_type.get("FlockAnnounce", 0)
        for _, f in self.live():
            f.announce_now()
        if settle_s > 0:
            self.net.run(settle_s)
        return self.net.msg_by_type.get("FlockAnnounce", 0) - before

    def decide_all(self) -> dict[int, FlockDecision]:
        """One Flocking Manager pass on every live pool."""
        return {n.index: f.decide_now() for n, f in self.live()}
