"""In-memory trio swarms for other projects' pytest-trio tests (``open_swarm``, docs/live.md).

Theory of operation: a :class:`Swarm` is ``n`` real :class:`overlay.Node` objects over one
:class:`transports.MemoryNetwork`, each hosted in its own task of the swarm's nursery, joined one
by one through a randomly chosen earlier node (the real join protocol, not an oracle build).
Everything is seeded from ``seed`` — identities, node generators and the network's loss draws —
and the only clock is ``trio.current_time()``, so under pytest-trio's ``autojump_clock`` fixture
(``MockClock(autojump_threshold=0)``) a 50-node swarm with 100 ms latencies runs in virtual
time, deterministically. ``crash`` silences a node without a goodbye; ``leave`` exits cleanly;
``closest_live`` is the brute-force oracle for routing checks.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from overlay.handle import NodeHandle
from overlay.identity import Identity
from overlay.ids import NodeId, closer
from overlay.live.node import CoreFactory, Node
from transports.memory import LatencyFn, MemoryNetwork

__all__ = ["Swarm", "open_swarm"]


class Swarm:
    """A set of live in-memory nodes; see :func:`open_swarm`."""

    def __init__(
        self,
        network: MemoryNetwork,
        nursery: trio.Nursery,
        rng: random.Random,
        overlay: str | CoreFactory,
        config: Any,
        signing: bool,
        join_timeout_s: float,
        node_kwargs: dict[str, Any],
    ) -> None:
        self.network = network
        self.nodes: list[Node] = []
        self._nursery = nursery
        self._rng = rng
        self._overlay = overlay
        self._config = config
        self._signing = signing
        self._join_timeout_s = join_timeout_s
        self._node_kwargs = node_kwargs

    @property
    def live(self) -> list[Node]:
        """Nodes that have neither crashed nor left."""
        return [n for n in self.nodes if not n.closed]

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i: int) -> Node:
        return self.nodes[i]

    async def _host(self, node: Node, task_status: trio.TaskStatus[None]) -> None:
        async with node:
            task_status.started()
            await node.closed_event.wait()

    async def add(self, seeds: list[str] | None = None, *, join: bool = True) -> Node:
        """Start one more node and (by default) join it through a random live node."""
        ident = Identity.from_rng(self._rng)
        transport = self.network.endpoint()
        node = Node(
            transport,
            self._overlay,
            ident,
            self._config,
            seed=self._rng.getrandbits(64),
            signing=self._signing,
            join_timeout_s=self._join_timeout_s,
            **self._node_kwargs,
        )
        live = [n for n in self.live if n.ready]
        await self._nursery.start(self._host, node)
        self.nodes.append(node)
        if join:
            if seeds is None:
                seeds = [self._rng.choice(live).address] if live else []
            await node.join(seeds)
        return node

    async def crash(self, node: Node) -> None:
        """Kill ``node`` silently (no leave messages); its address stops answering."""
        node.crash()
        await node.transport.aclose()

    async def leave(self, node: Node) -> None:
        """Let ``node`` leave cleanly."""
        node.leave()
        await node.transport.aclose()

    def closest_live(self, key: int) -> Node:
        """Oracle: the live node numerically closest to ``key`` (ties towards the smaller id)."""
        best: Node | None = None
        for n in self.live:
            if best is None or closer(key, n.id, best.id):
                best = n
        if best is None:
            raise LookupError("the swarm has no live node")
        return best

    def by_handle(self, h: NodeHandle) -> Node | None:
        """The swarm node with ``h``'s id, or None if there is none."""
        for n in self.nodes:
            if n.id == h.id:
                return n
        return None

    def random_key(self) -> NodeId:
        """A key drawn from the swarm's seeded generator."""
        return NodeId.random(self._rng)

    async def settle(self, seconds: float = 5.0) -> None:
        """Let maintenance run for ``seconds`` (virtual seconds under a MockClock)."""
        await trio.sleep(seconds)

    async def aclose(self) -> None:
        """Make every node leave and close its transport."""
        for n in self.nodes:
            n.leave()
        for n in self.nodes:
            await n.transport.aclose()


@asynccontextmanager
async def open_swarm(
    n: int,
    overlay: str | CoreFactory = "pastry",
    *,
    seed: int = 0,
    latency: float | tuple[float, float] | LatencyFn | None = 0.01,
    loss: float = 0.0,
    config: Any = None,
    signing: bool = True,
    join_timeout_s: float = 60.0,
    **node_kwargs: Any,
) -> AsyncIterator[Swarm]:
    """Start ``n`` nodes on an in-memory network and join them into one overlay.

    ``latency``: one-way seconds, a ``(lo, hi)`` uniform range or ``f(src, dst, rng)``.
    Use inside a trio test, ideally with the ``autojump_clock`` fixture::

        async def test_routes(autojump_clock):
            async with open_swarm(50, overlay="pastry", seed=1) as swarm:
                ...
    """
    rng = random.Random(seed)
    net = MemoryNetwork(latency=latency, loss=loss, seed=rng.getrandbits(64))
    async with trio.open_nursery() as nursery:
        swarm = Swarm(net, nursery, rng, overlay, config, signing, join_timeout_s, node_kwargs)
        try:
            for _ in range(n):
                await swarm.add()
            yield swarm
        finally:
            with trio.CancelScope(shield=True):
                await swarm.aclose()
