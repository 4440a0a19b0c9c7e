"""Measurements of a simulated :class:`~sim_adapter.network.Network`: the brute-force oracle
(:meth:`Measurements.closest_live`), lookups and the counting map-reduce. :class:`Measurements`
is a mixin of :class:`~sim_adapter.network.Network`, which re-exports this module's names.

Measurements are made through the KBR API, never by peeking into routing tables: a lookup is a
real ``route()`` of a tiny payload for the built-in application ``sim.lookup``; its ``forward``
upcalls count hops and its ``deliver`` upcall records which node answered and when.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from overlay.errors import ConfigError, OverlayError
from overlay.ids import NodeId, closer
from overlay.multicast import MULTICAST_APP, Multicast, MulticastResult
from sim_adapter.engine import Engine
from sim_adapter.simnode import Lookup, LookupState, SimNode

if TYPE_CHECKING:
    from sim_adapter.latency import LatencyModel

__all__ = ["LOOKUP_APP", "Aggregate", "Measurements"]

#: the application every simulated node registers for :meth:`Measurements.lookup`
LOOKUP_APP = "sim.lookup"


class Aggregate(NamedTuple):
    """Outcome of ``Network.count_nodes``: the count, the clockwise ranges whose nodes were not
    counted, the tree depth and the virtual time the query took."""

    value: int
    missing: list[tuple[NodeId, NodeId]]
    depth: int
    latency_s: float


class Measurements:
    """The measuring side of a :class:`~sim_adapter.network.Network` (a mixin). The network
    state it reads is declared here for the type checker; ``Network.__init__`` sets it."""

    engine: Engine
    rng: random.Random
    nodes: list[SimNode]
    latency: LatencyModel
    loss: float
    seed: int
    _live_ids: list[int]  # sorted ids of live nodes (the oracle's view)
    _by_id: dict[int, SimNode]

    def __init__(self) -> None:
        self._lookups: dict[int, LookupState] = {}
        self._lookup_seq = 0
        self._waiting = 0
        self.duplicate_deliveries = 0

    # ------------------------------------------------------------------ oracles
    def closest_live(self, key: int) -> NodeId:
        """The live node numerically closest to ``key`` (ties → smaller id), by brute force
        over the sorted live ids: the oracle every routing test checks against."""
        ids = self._live_ids
        if not ids:
            raise OverlayError("no live node")
        i = bisect.bisect_left(ids, key)
        a = ids[i % len(ids)]
        b = ids[(i - 1) % len(ids)]
        return self._by_id[a if closer(key, a, b) else b].id

    # ------------------------------------------------------------------ lookups
    def _lookup_delivered(self, lid: int, at: NodeId) -> None:
        st = self._lookups.get(lid)
        if st is None:
            return
        if st.done:
            self.duplicate_deliveries += 1
            return
        st.done = True
        st.result = at
        st.t1 = self.engine.now
        self._waiting -= 1
        if self._waiting == 0:
            self.engine.stop()

    def lookup(self, src: SimNode, key: NodeId, timeout_s: float = 60.0) -> Lookup:
        """Route ``key`` from ``src`` and run the simulation until it is delivered."""
        return self.lookup_many([(src, key)], timeout_s)[0]

    def lookup_many(
        self, pairs: Sequence[tuple[SimNode, NodeId]], timeout_s: float = 60.0
    ) -> list[Lookup]:
        """Start all lookups at once (at the current virtual time) and run until every one is
        delivered or ``timeout_s`` passes; undelivered ones have ``result=None``."""
        states: list[tuple[int, LookupState]] = []
        now = self.engine.now
        for src, key in pairs:
            if not src.alive:
                raise OverlayError(f"lookup from crashed node {src!r}")
            self._lookup_seq += 1
            lid = self._lookup_seq
            st = LookupState(key, now)
            self._lookups[lid] = st
            states.append((lid, st))
            self._waiting += 1
            src.core.route(key, LOOKUP_APP, lid)
        deadline = now + timeout_s
        while self._waiting > 0 and self.engine.now < deadline:
            if self.engine.run_until(deadline):
                break
        out = []
        for lid, st in states:
            del self._lookups[lid]
            if st.done:
                out.append(Lookup(st.result, st.hops, st.t1 - st.t0))
            else:
                self._waiting -= 1
                out.append(Lookup(None, st.hops, timeout_s))
        return out

    # ========================================================================== multicast ====
    # Counting map-reduce over the ring through the multicast application that ``_new_node``
    # attaches to every core (overlay/multicast/app.py).
    def count_nodes(
        self,
        src: SimNode,
        redundant: bool = False,
        *,
        begin: NodeId | None = None,
        end: NodeId | None = None,
        timeout_s: float | None = None,
        level_s: float | None = None,
        max_run_s: float = 3600.0,
        method: str = "events",
        rng: random.Random | None = None,
    ) -> Aggregate:
        """Count the nodes of the ring (or of the clockwise region [begin, end)) with a real
        recursive-partition map-reduce started at ``src``; ``redundant`` runs the clockwise and
        the counter-clockwise tree and merges them (PonD §3.1.4). Runs the simulation until the
        root answers; ``timeout_s`` bounds the query itself, ``max_run_s`` the virtual time.

        ``method="analytic"`` runs no protocol at all: PondSim's critical-path recursion over the
        same tree (``sim_adapter.fastquery.count_analytic``; no events, virtual time does not
        advance; ``rng`` draws its losses, by default one seeded from the network's stream)."""
        if not src.alive:
            raise OverlayError(f"count_nodes from crashed node {src!r}")
        if method == "analytic":
            from sim_adapter.fastquery import count_analytic

            if rng is None:
                rng = random.Random(self.rng.getrandbits(64))
            fast = count_analytic(self, src, redundant, begin=begin, end=end, rng=rng)
            return Aggregate(fast.value, fast.missing, fast.depth, fast.latency_s)
        if method != "events":
            raise ConfigError(f"method must be 'events' or 'analytic', got {method!r}")
        out: list[MulticastResult] = []

        def done(r: MulticastResult) -> None:
            out.append(r)
            self.engine.stop()

        mc = src.core.apps.get(MULTICAST_APP)
        if not isinstance(mc, Multicast):
            raise OverlayError("this node has no multicast application")
        mc.aggregate(
            "count",
            None,
            on_done=done,
            begin=begin,
            end=end,
            direction="both" if redundant else "cw",
            timeout_s=timeout_s,
            level_s=level_s,
        )
        deadline = self.engine.now + (timeout_s if timeout_s is not None else max_run_s)
        while not out and self.engine.now < deadline:
            if self.engine.run_until(deadline) and not out:
                break
        if not out:
            raise OverlayError(f"count_nodes: no answer within {deadline:.0f} s of virtual time")
        r = out[0]
        return Aggregate(int(r.value or 0), list(r.missing), r.depth, r.elapsed_s)
