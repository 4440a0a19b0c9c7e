"""The simulated network: spawn, crash, loss, partitions, oracle builds and measurements.

Theory of operation (docs/simulator.md): a :class:`Network` owns one :class:`Engine` and a list of
:class:`SimNode`. Each node runs an unmodified protocol core (Pastry or small-world) behind a
:class:`SimRuntime`, whose ``send`` turns into a delivery event ``latency.one_way_s(a, b)`` later
(unless the message is lost or crosses a partition: the :class:`~sim_adapter.delivery.Delivery`
mixin, ``sim_adapter/delivery.py``). Sim addresses are node indices. Every node shares the
network's one seeded ``random.Random`` (a Mersenne Twister state is 2.5 KB; one per node would
cost gigabytes at 10^6 nodes, and one loop makes sharing deterministic anyway).

Measurements (the oracle, lookups, counting) are the :class:`~sim_adapter.measure.Measurements`
mixin (``sim_adapter/measure.py``): made through the KBR API, never by peeking into routing tables.

``fidelity=True`` makes deliveries look as they do on a live node (:class:`~sim_adapter.simnode.
Fidelity`): every message crosses ``overlay.wire`` both ways, receivers get the observed sender
handle, self-addressed messages are dropped and failed joins do not count as live.
"""

from __future__ import annotations

import bisect
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from overlay.errors import ConfigError, OverlayError
from overlay.handle import Address, NodeHandle
from overlay.ids import NodeId
from overlay.kbr import KbrCore
from overlay.messages import Message
from overlay.multicast import attach as attach_multicast
from sim_adapter.delivery import Delivery
from sim_adapter.engine import Engine
from sim_adapter.measure import LOOKUP_APP, Aggregate, Measurements
from sim_adapter.simnode import (
    FIDELITY_DEFAULT,
    Fidelity,
    Lookup,
    LookupApp,
    SimNode,
    SimRuntime,
)

if TYPE_CHECKING:
    from sim_adapter.latency import LatencyModel

log = logging.getLogger(__name__)

__all__ = ["LOOKUP_APP", "OVERLAYS", "Aggregate", "Lookup", "Network", "SimNode", "SimRuntime"]


_Parts = tuple[Callable[..., KbrCore], Callable[[], Any], Callable[..., None]]

#: extra overlays plugged in by users (name -> (core class, config factory, oracle builder)).
#: Each core class is built as ``cls(runtime, handle, config)``; the oracle builder is called as
#: ``build(cores, rtt_s)`` and must leave every core ready without sending anything.
OVERLAYS: dict[str, _Parts] = {}


def _overlay_parts(name: str) -> _Parts:
    """(core class, default config factory, oracle builder) for an overlay name."""
    if name == "pastry":
        from overlay import pastry

        return pastry.PastryCore, pastry.PastryConfig, pastry.build_oracle
    if name == "smallworld":
        from overlay import smallworld

        return smallworld.SmallWorldCore, smallworld.SmallWorldConfig, smallworld.build_oracle
    if name in OVERLAYS:
        return OVERLAYS[name]
    known = ", ".join(repr(k) for k in ("pastry", "smallworld", *OVERLAYS))
    raise ConfigError(f"unknown overlay {name!r}: expected one of {known}")


class Network(Delivery, Measurements):
    """A whole simulated overlay network in one process (docs/design.md, "Public API")."""

    def __init__(
        self,
        seed: int = 1,
        latency: LatencyModel | None = None,
        loss: float = 0.0,
        codec: bool = False,
        fidelity: bool | None = None,
    ) -> None:
        if not 0.0 <= loss < 1.0:
            raise ConfigError(f"loss must be in [0, 1), got {loss!r}")
        if latency is None:
            from sim_adapter.latency import Uniform

            latency = Uniform(0.05, 0.30, seed=seed)
        self.seed = seed
        self.rng = random.Random(seed)
        self.engine = Engine()
        self.latency: LatencyModel = latency
        self.loss = loss
        self.nodes: list[SimNode] = []
        self.overlay: str | None = None
        self._live_ids: list[int] = []  # sorted ids of live nodes (the oracle's view)
        self._by_id: dict[int, SimNode] = {}
        self._ready: list[SimNode] = []  # nodes that finished joining: seeds for later joins
        self._partition: list[int] | None = None
        self._ungrouped = 0  # the partition label of nodes in no group
        self._send_to: NodeId | None = None  # see SimHost._send_to
        super().__init__()  # the lookups' state (sim_adapter/measure.py)
        self.message_count = 0
        self.bytes_sent = 0
        self.dropped_loss = 0
        self.dropped_partition = 0
        self.dropped_dead = 0
        #: called with (sender index, destination address, message) for every message the
        #: loss model drops (tests whose oracle must tell loss from a protocol's fault)
        self.on_loss: Callable[[int, Address, Message], None] | None = None
        self.failed_arrivals = 0  # arrive() joins that failed
        self._by_class: dict[type[Message], int] = {}
        self._encode: Callable[[Message], bytes] | None = None
        if codec:
            from overlay.wire import encode_message

            self._encode = encode_message
        if fidelity is None:
            fidelity = FIDELITY_DEFAULT
        #: fidelity mode's codec and counters (None: messages are handed over as objects)
        self.fidelity: Fidelity | None = Fidelity() if fidelity else None

    # ------------------------------------------------------------------ basics
    @property
    def now(self) -> float:
        """Virtual time, seconds."""
        return self.engine.now

    def live_nodes(self) -> list[SimNode]:
        """The nodes currently alive."""
        return [n for n in self.nodes if n.alive]

    def node_by_id(self, nid: int) -> SimNode:
        """The node with id ``nid``."""
        return self._by_id[nid]

    def run(self, seconds: float) -> None:
        """Advance virtual time by ``seconds``, processing every event due."""
        if seconds < 0:
            raise ConfigError("run() needs a non-negative duration")
        self.engine.run_until(self.engine.now + seconds)

    # ------------------------------------------------------------------ population
    def _new_node(
        self, overlay: str, config: Any, nid: NodeId | None, index: int | None = None
    ) -> SimNode:
        """A new node with a fresh core; ``index`` given: a restart in a crashed node's place
        (same id, address and network position)."""
        cls, default_cfg, _ = _overlay_parts(overlay)
        restart = index is not None
        if index is None:
            index = len(self.nodes)
        if nid is None:
            nid = NodeId.random(self.rng)
            while int(nid) in self._by_id:
                nid = NodeId.random(self.rng)
        elif int(nid) in self._by_id and not restart:
            raise OverlayError(f"id {nid} is already in the network")
        handle = NodeHandle(nid, index)
        if not restart:
            self.latency.place(index, self.rng)
        runtime = SimRuntime(self, index)
        core = cls(runtime, handle, config if config is not None else default_cfg())
        core.register(LOOKUP_APP, LookupApp(self, nid))
        attach_multicast(core)
        node = SimNode(index, handle, core)
        runtime.node = node
        if restart:
            self.nodes[index] = node
        else:
            self.nodes.append(node)
            if self._partition is not None:  # spawned during a partition: in the "no group" group
                self._partition.append(self._ungrouped)
        self._by_id[int(nid)] = node
        return node

    def _mark_live(self, node: SimNode) -> None:
        bisect.insort(self._live_ids, int(node.id))

    def spawn(
        self,
        n: int,
        overlay: str = "pastry",
        build: str = "joins",
        config: Any = None,
        ids: Sequence[NodeId] | None = None,
        join_timeout_s: float = 300.0,
        progress: Callable[[int, int], None] | None = None,
        join_interval_s: float | None = None,
    ) -> list[SimNode]:
        """Add ``n`` nodes.

        ``build="joins"`` runs the real join protocol. By default one node at a time: each
        joins through a random ready node and the simulation runs until it is ready. With
        ``join_interval_s`` the joins overlap instead: node i starts joining ``i *
        join_interval_s`` virtual seconds after the first (through a random node already
        ready at that moment), without waiting for earlier joins to finish — arrivals as on
        a real network, and far less virtual time (so less maintenance traffic) per node.
        ``build="oracle"`` computes the steady state directly (large N) and sends nothing.
        """
        if n < 0:
            raise ConfigError("spawn() needs n >= 0")
        if self.overlay is not None and overlay != self.overlay:
            raise ConfigError(f"this network runs {self.overlay!r}; cannot add {overlay!r} nodes")
        if ids is not None and len(ids) != n:
            raise ConfigError("spawn(ids=...) must give exactly n ids")
        if join_interval_s is not None and not join_interval_s > 0:
            raise ConfigError(f"join_interval_s must be > 0, got {join_interval_s!r}")
        _overlay_parts(overlay)  # validate the name before touching state
        self.overlay = overlay
        if build == "oracle":
            return self._spawn_oracle(n, overlay, config, ids, progress)
        if build != "joins":
            raise ConfigError(f"unknown build {build!r}: expected 'joins' or 'oracle'")
        new = [
            self._new_node(overlay, config, ids[i] if ids is not None else None) for i in range(n)
        ]
        if join_interval_s is None:
            for i, node in enumerate(new):
                self._join_one(node, join_timeout_s)
                if progress is not None:
                    progress(i + 1, n)
        else:
            self._join_overlapping(new, join_interval_s, join_timeout_s, progress)
        return new

    def _ready_seed(self, joiner: SimNode) -> list[Address]:
        """One random ready live node's address (empty: the joiner starts a new ring)."""
        ready = self._ready
        for _ in range(64):  # bounded: entries may have crashed or (rarely) be un-ready
            if not ready:
                break
            i = self.rng.randrange(len(ready))
            m = ready[i]
            if not m.alive:  # prune crashed entries lazily
                ready[i] = ready[-1]
                ready.pop()
            elif m.core.ready and m is not joiner:
                return [m.index]
        return []

    def _join_one(self, node: SimNode, timeout_s: float) -> None:
        seeds = self._ready_seed(node)
        done: list[bool] = []

        def on_done(ok: bool) -> None:
            done.append(ok)
            self.engine.stop()

        node.core.start()
        node.core.join(seeds, on_done)
        deadline = self.engine.now + timeout_s
        while not done and self.engine.now < deadline:
            if self.engine.run_until(deadline) and not done:
                break
        if not done or not done[0]:
            log.warning("node %s did not become ready within %.0f s", node.id.short(), timeout_s)
            if self._failed_join(node):
                return
        else:
            self._ready.append(node)
        self._mark_live(node)

    def _failed_join(self, node: SimNode) -> bool:
        """Fidelity mode: a node whose join failed stops and is not live (True); a live node's
        ``join`` raises and its process goes away. Otherwise it stays and counts (False)."""
        if self.fidelity is None:
            return False
        self.fidelity.stats["failed_joins"] += 1
        node.alive = False
        node.core.stop()
        return True

    def _join_overlapping(
        self,
        nodes: list[SimNode],
        interval_s: float,
        timeout_s: float,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        outcome: dict[int, bool] = {}
        total = len(nodes)

        def finished(node: SimNode, ok: bool) -> None:
            if node.index in outcome:
                return
            outcome[node.index] = ok
            if ok:
                self._ready.append(node)
            if progress is not None:
                progress(len(outcome), total)
            if len(outcome) == total:
                self.engine.stop()

        def start(node: SimNode) -> None:
            node.core.start()
            node.core.join(self._ready_seed(node), lambda ok: finished(node, ok))

        t0 = self.engine.now
        for i, node in enumerate(nodes):
            self.engine.push(t0 + i * interval_s, start, (node,))
        deadline = t0 + total * interval_s + timeout_s
        while len(outcome) < total and self.engine.now < deadline:
            if self.engine.run_until(deadline):
                break
        failed = total - sum(outcome.values())
        if failed:
            log.warning("%d of %d joins did not become ready", failed, total)
        for node in nodes:
            if outcome.get(node.index) or not self._failed_join(node):
                self._mark_live(node)

    def _spawn_oracle(
        self,
        n: int,
        overlay: str,
        config: Any,
        ids: Sequence[NodeId] | None,
        progress: Callable[[int, int], None] | None,
    ) -> list[SimNode]:
        _, _, build_oracle = _overlay_parts(overlay)
        new = [
            self._new_node(overlay, config, ids[i] if ids is not None else None) for i in range(n)
        ]
        live = [m for m in self.nodes if m.alive]
        lat = self.latency

        def rtt_s(a: NodeHandle, b: NodeHandle) -> float:
            return lat.rtt_s(int(a.address), int(b.address))  # type: ignore[call-overload]

        build_oracle([m.core for m in live], rtt_s)
        for m in new:
            m.core.start()
        self._ready = [m for m in live if m.core.ready]
        self._live_ids = sorted(int(m.id) for m in live)
        if progress is not None:
            progress(n, n)
        return new

    def crash(self, nodes: SimNode | Iterable[SimNode]) -> None:
        """Fail-stop: the node(s) stop at once, silently (no leave messages)."""
        batch = [nodes] if isinstance(nodes, SimNode) else list(nodes)
        for node in batch:
            if not node.alive:
                continue
            node.alive = False
            node.core.stop()
            i = bisect.bisect_left(self._live_ids, int(node.id))
            if i < len(self._live_ids) and self._live_ids[i] == int(node.id):
                del self._live_ids[i]

    def restart(self, node: SimNode, config: Any = None) -> SimNode:
        """Bring a crashed ``node`` back: same id and address, fresh state, joining now through
        a random ready node (returns the new ``SimNode``, which replaces the old one)."""
        if node.alive:
            raise OverlayError(f"restart of {node!r}, which is alive")
        if self.overlay is None:
            raise ConfigError("this network has no overlay yet")
        new = self._new_node(self.overlay, config, node.id, index=node.index)

        fidelity = self.fidelity is not None

        def joined(ok: bool) -> None:
            if not new.alive:
                return
            if ok:
                self._ready.append(new)
                if fidelity:
                    self._mark_live(new)
            elif fidelity:
                self._failed_join(new)

        new.core.start()
        new.core.join(self._ready_seed(new), joined)
        if not fidelity:  # fidelity mode: live once it has joined
            self._mark_live(new)
        return new

    def arrive(
        self, config: Any = None, on_joined: Callable[[SimNode, bool], None] | None = None
    ) -> SimNode:
        """A new node (fresh id and address) starts joining now through a random ready node,
        without running the simulation: arrivals under churn. It counts as live for the oracle
        (``closest_live``) once its join completes, as MSPastry counts only active nodes; a
        failed join stops it. ``on_joined(node, ok)`` is called then (not if it crashed
        first)."""
        if self.overlay is None:
            raise ConfigError("this network has no overlay yet: spawn() the first nodes")
        node = self._new_node(self.overlay, config, None)

        def joined(ok: bool) -> None:
            if not node.alive:
                return
            if ok:
                self._ready.append(node)
                self._mark_live(node)
            else:
                self.failed_arrivals += 1
                node.alive = False
                node.core.stop()
            if on_joined is not None:
                on_joined(node, ok)

        node.core.start()
        node.core.join(self._ready_seed(node), joined)
        return node

    def leave(self, nodes: SimNode | Iterable[SimNode]) -> None:
        """Graceful departure: each node tells the nodes it knows (``KbrCore.leave``), which
        repair at once, and stops."""
        batch = [nodes] if isinstance(nodes, SimNode) else list(nodes)
        for node in batch:
            if node.alive:
                node.core.leave()
        self.crash(batch)
