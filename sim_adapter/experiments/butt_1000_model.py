"""One replicate of ``butt-1000`` (Butt et al. 2006 §5.2): 1000 pools, one series at a time.

Theory of operation. A replicate (one seed) fixes the GT-ITM-like transit-stub router graph
(:class:`~sim_adapter.latency.TransitStub`: 50 transit + 1000 stub routers), the pools (one per
stub router, its central manager on a LAN link to the router — :class:`PoolPerStub`), and the
job traces (:func:`~sim_adapter.experiments.butt_stepper.make_grid_traces`). A *series* runs
them under one policy on the time-stepped :class:`~sim_adapter.experiments.butt_stepper.Grid`:

* ``none`` — no flocking (the paper's Figs 7 and 9);
* ``self-joins`` / ``self-oracle`` — the unmodified :class:`discovery.announce.Flock` plug-in on
  every central manager, over a Pastry ring built by real joins with proximity neighbour
  selection (the realistic case) or computed by the oracle (steady-state PNS tables), in a
  :class:`~sim_adapter.network.Network` whose latencies are the topology's (Figs 6, 8, 10);
* ``static-<nearest|random>-<k>`` and ``gateway-<k>-<period>-<slots>`` — the baselines of
  :mod:`~sim_adapter.experiments.butt_stepper`.

Time. One unit is ``unit_s`` seconds of the network's virtual time (10 s by default). The
router graph's one-way delays are under 0.5 s, so a message sent in one unit arrives in that
unit, as in a time-stepped simulator. Pool ``p``'s unit ``t`` is processed at virtual time
``t0 + t * unit_s``; the plug-in's timers (announcements, Flocking Manager) run between.

Self-organized flocking (Butt et al. 2006 §5.2.1: TTL 1, validity 1 unit, manager period 1
unit). The announcement period is not in the paper: 0.9 unit, so that with the plug-in's 10%
period jitter a pool's next announcement always lands before the previous one expires. Every
Flocking Manager decision becomes the pool's target list (nearest first); each unit a pool with a
queue sends jobs to its targets in order, at most the free count that target's latest
announcement carried (spent across units until a newer announcement arrives) and only to
machines that are free now.
"""

from __future__ import annotations

import math
import random
import time
from array import array
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from discovery.announce import Flock, FlockConfig
from discovery.decision import FlockDecision
from overlay.errors import ConfigError
from overlay.ids import NodeId
from sim_adapter import bench
from sim_adapter.experiments.butt_stepper import (
    GatewayFlocking,
    Grid,
    GridTraces,
    NoFlocking,
    Policy,
    StaticFlocking,
    make_grid_traces,
    static_lists,
    symmetric_neighbours,
)
from sim_adapter.latency import TransitStub
from sim_adapter.network import Network
from sim_adapter.plugins.flock import collector_of
from sim_adapter.simnode import SimNode

__all__ = [
    "DEFAULT_SERIES",
    "Butt1000Config",
    "GridPoolView",
    "PoolPerStub",
    "SelfOrganized",
    "announce_reach",
    "parse_series",
    "run_series",
]

#: every series of a full run: no flocking, the self-organized flock on two rings, and the
#: baselines' sweep (static lists of 2 and 8 nearest pools and of 8 random ones; gateways to
#: the 4 nearest pools, availability lists every unit or every 5 units, 1 or 16 jobs a unit)
DEFAULT_SERIES = (
    "self-joins",
    "self-oracle",
    "gateway-4-1-1",
    "gateway-4-1-16",
    "gateway-4-5-16",
    "static-nearest-2",
    "static-nearest-8",
    "static-random-8",
    "none",
)

#: locality histogram: bins of this width on [0, 1]
LOCALITY_BIN = 0.005


@attrs.frozen(slots=True)
class Butt1000Config:
    """Parameters of ``butt-1000`` (Butt et al. 2006 §5.2.1 unless the comment says otherwise)."""

    #: pools — "one Condor pool attached to each stub domain router ... a total of 1000 pools"
    pools: int = 1000
    #: transit routers — "1050 routers, 50 of which are used in transit domains"
    transit_routers: int = 50
    #: transit domains (GT-ITM shape; not in the paper, see sim_adapter/topology.py)
    transit_domains: int = 10
    #: routers per stub domain (GT-ITM shape; not in the paper)
    stub_domain_size: int = 10
    #: machines per pool U[lo, hi] — "uniformly distributed between 25 and 225 machines"
    machines: tuple[int, int] = (25, 225)
    #: sequences per trace U[lo, hi] — "uniform distribution between 25 and 225"
    sequences: tuple[int, int] = (25, 225)
    #: jobs per sequence — "a single job sequence consists of 100 jobs"
    seq_len: int = 100
    #: inter-arrival and length U[lo, hi] units — "between 1 and 17 time units"
    step: tuple[int, int] = (1, 17)
    #: virtual seconds per time unit (assumption: > 20x the largest one-way delay)
    unit_s: float = 10.0
    #: announcement TTL — §5.2.1: one
    ttl: int = 1
    #: announcement validity, units — §5.2.1: one time unit
    validity_units: float = 1.0
    #: Flocking Manager period, units — §5.2.1: one time unit
    manager_period_units: float = 1.0
    #: announcement period, units — not in the paper (see the module docstring)
    announce_period_units: float = 0.9

    def __attrs_post_init__(self) -> None:
        if self.pools < 2:
            raise ConfigError("butt-1000 needs at least 2 pools")
        if self.announce_period_units > self.validity_units:
            raise ConfigError("announcements must come at least once per validity")

    def as_dict(self) -> dict[str, Any]:
        """The parameters, JSON-friendly."""
        return attrs.asdict(self)

    def flock_config(self) -> FlockConfig:
        """The plug-in's configuration in the network's seconds."""
        u = self.unit_s
        return FlockConfig(
            ttl=self.ttl,
            validity_s=self.validity_units * u,
            manager_period_s=self.manager_period_units * u,
            announce_period_s=self.announce_period_units * u,
            max_validity_s=max(600.0, self.validity_units * u),
            require_signatures=False,
        )


class PoolPerStub:
    """Latency model: node ``i`` is pool ``i``'s central manager, on a LAN access link to stub
    router ``i`` of a :class:`TransitStub` graph (Butt et al. 2003 §5: "the Condor central
    manager in each pool is attached to the domain router by a LAN connection"). Distances are
    shortest paths over the graph's link delays, which play the role of GT-ITM's routing-policy
    weights (a hierarchy: every inter-domain path crosses the transit core)."""

    name = "transit-stub-pools"

    def __init__(self, ts: TransitStub, pools: int, seed: int) -> None:
        """``pools`` managers on the first ``pools`` stub routers; their access delays are drawn
        here from ``seed`` (not from the network's generator), so every series of a replicate
        sees the same distances whether or not it builds an overlay."""
        self.ts = ts
        self._stubs = list(ts.topology.stub_routers)
        if pools > len(self._stubs):
            raise ConfigError(f"{pools} pools need as many stub routers, not {len(self._stubs)}")
        lo, hi = ts.delays.access_range_s()
        rng = random.Random(f"butt-1000-access-{seed}")
        self._acc: array[float] = array("d", (lo + (hi - lo) * rng.random() for _ in range(pools)))
        self.pools = pools
        self.nodes = 0
        # every pair once, flat (8 MB at 1000 pools): the network asks for millions of delays
        st, acc = self._stubs, self._acc
        self._flat = array(
            "d",
            (
                (acc[a] + acc[b]) + ts.router_distance_s(st[a], st[b])
                for a in range(pools)
                for b in range(pools)
            ),
        )

    def place(self, index: int, rng: Any) -> None:
        """Node ``index`` is pool ``index``'s manager (its access delay is already drawn)."""
        if index != self.nodes or index >= self.pools:
            raise ConfigError(f"{self.name}: node {index} has no pool of its own")
        self.nodes += 1

    def one_way_s(self, a: int, b: int) -> float:
        """Both access links plus the shortest path between the two stub routers."""
        return self._flat[a * self.pools + b]

    def rtt_s(self, a: int, b: int) -> float:
        """Twice the one-way delay (symmetric model)."""
        return 2.0 * self.one_way_s(a, b)

    def distances(self) -> Any:
        """Pool-to-pool one-way distance matrix (s), zero on the diagonal."""
        n = self.pools
        d = np.frombuffer(self._flat, dtype=np.float64).reshape(n, n).copy()
        np.fill_diagonal(d, 0.0)
        return d

    def describe(self) -> dict[str, object]:
        """The router graph's description plus the pools placed."""
        return {**self.ts.describe(), "name": self.name, "pools": self.pools}


def make_topology(cfg: Butt1000Config, seed: int) -> TransitStub:
    """The replicate's router graph: ``cfg.transit_routers`` + ``cfg.pools`` stub routers."""
    return TransitStub(
        transit=cfg.transit_routers,
        stub=cfg.pools,
        seed=seed,
        transit_domains=cfg.transit_domains,
        stub_domain_size=cfg.stub_domain_size,
    )


class GridPoolView:
    """What the Flock plug-in reads of pool ``p`` of a :class:`Grid` (as of its last unit)."""

    __slots__ = ("_g", "_p")

    def __init__(self, grid: Grid, p: int) -> None:
        self._g = grid
        self._p = p

    @property
    def machines(self) -> int:
        """Machines of the pool."""
        return int(self._g.machines[self._p])

    @property
    def free_machines(self) -> int:
        """Machines running nothing."""
        return int(self._g.free[self._p])

    @property
    def idle_jobs(self) -> int:
        """Jobs queued."""
        return self._g.queued(self._p)

    @property
    def running_jobs(self) -> int:
        """Busy machines."""
        return self.machines - self.free_machines

    @property
    def utilization(self) -> float:
        """Busy fraction of the machines."""
        m = self.machines
        return (m - self.free_machines) / m if m else 0.0


class SelfOrganized:
    """Jobs follow each pool's latest Flocking Manager decision (module docstring)."""

    flocking = True

    def __init__(self, nodes: list[SimNode], clock: Any) -> None:
        self.nodes = nodes
        self.clock = clock
        self.flocks: list[Flock] = []
        #: per pool: [(target pool, its node id)] of the latest decision, nearest first
        self.targets: list[list[tuple[int, NodeId]]] = [[] for _ in nodes]
        self._by_collector = {collector_of(n): i for i, n in enumerate(nodes)}
        self._used: dict[int, tuple[int, int]] = {}
        self.decisions = 0

    def on_decision(self, p: int) -> Any:
        """The Condor Module of pool ``p``: a decision becomes its target list."""

        def apply(d: FlockDecision) -> None:
            self.decisions += 1
            out = []
            if d.enabled:
                for t in d.targets:
                    q = self._by_collector.get(t.collector)
                    if q is not None and q != p:
                        out.append((q, self.nodes[q].id))
            self.targets[p] = out

        return apply

    def exchange(self, grid: Grid, t: int) -> None:
        """Announcements travel on the overlay between units, not here."""

    def flock(self, grid: Grid, p: int, t: int) -> None:
        """Send the queue head to the targets in order, capped by their announced free count."""
        targets = self.targets[p]
        if not targets:
            return
        wl = self.flocks[p].willing
        now = self.clock()
        n_pools = len(self.nodes)
        used = self._used
        for q, nid in targets:
            s = wl.slot(nid)
            if s is None or s.expires_at_s <= now:
                continue
            key = p * n_pools + q
            u = used.get(key)
            spent = u[1] if u is not None and u[0] == s.seq else 0
            credit = s.free_machines - spent
            if credit <= 0:
                continue
            moved = grid.move(p, q, credit, t)
            if moved:
                used[key] = (s.seq, spent + moved)
            if grid.arrived[p] == grid.head[p]:
                return


def announce_reach(nodes: list[SimNode]) -> list[set[int]]:
    """For every pool ``p``, the pools whose TTL-1 announcements reach it: those with ``p`` in
    their Pastry routing table (what the self-organized policy can ever flock to)."""
    idx = {n.id: i for i, n in enumerate(nodes)}
    reach: list[set[int]] = [set() for _ in nodes]
    for q, n in enumerate(nodes):
        core: Any = n.core
        r = 0
        while True:
            try:
                row = core.routing_row(r)
            except (IndexError, ValueError):
                break
            for h in row:
                p = idx.get(h.id)
                if p is not None and p != q:
                    reach[p].add(q)
            r += 1
            if r >= 40:
                break
    return reach


def parse_series(name: str) -> dict[str, Any]:
    """``static-nearest-8`` -> {"kind": "static", "choice": "nearest", "k": 8}, etc."""
    parts = name.split("-")
    try:
        if name in ("none", "self-joins", "self-oracle"):
            return {"kind": parts[0], "build": parts[1] if len(parts) > 1 else None}
        if parts[0] == "static" and len(parts) == 3 and parts[1] in ("nearest", "random"):
            return {"kind": "static", "choice": parts[1], "k": int(parts[2])}
        if parts[0] == "gateway" and len(parts) == 4:
            k, period, slots = (int(x) for x in parts[1:])
            return {"kind": "gateway", "k": k, "period": period, "slots": slots}
    except ValueError:
        pass
    raise ConfigError(
        f"unknown series {name!r}: none, self-joins, self-oracle, static-<nearest|random>-K, "
        "gateway-K-PERIOD-SLOTS"
    )


def _policy(spec: dict[str, Any], dist: Any, seed: int) -> Policy:
    if spec["kind"] == "none":
        return NoFlocking()
    if spec["kind"] == "static":
        return StaticFlocking(static_lists(dist, spec["k"], spec["choice"], seed))
    if spec["kind"] == "gateway":
        nb = symmetric_neighbours(dist, spec["k"])
        return GatewayFlocking(nb, spec["period"], spec["slots"], seed)
    raise ConfigError(f"no stepper policy for {spec}")


def _summarise(grid: Grid, dist: Any, diameter: float) -> dict[str, Any]:
    tr = grid.traces
    off = grid.off
    origin = tr.pool_of_job()
    wait = (grid.start - grid.sub).astype(np.int64)
    end = grid.start.astype(np.int64) + grid.dur
    first = off[:-1]
    count = np.diff(off)
    mean_wait = np.add.reduceat(wait, first) / count
    max_wait = np.maximum.reduceat(wait, first)
    completion = np.maximum.reduceat(end, first)
    remote = grid.ran != origin
    loc = dist[origin[remote], grid.ran[remote]] / diameter
    bins = round(1.0 / LOCALITY_BIN)
    hist = np.bincount(np.minimum((loc / LOCALITY_BIN).astype(np.int64), bins - 1), minlength=bins)
    n = len(wait)
    local = n - int(remote.sum())
    cdf = np.cumsum(hist)

    def within(x: float) -> float:
        k = round(x / LOCALITY_BIN)
        return (local + int(cdf[k - 1])) / n if k > 0 else local / n

    return {
        "jobs": n,
        "units": grid.t + 1,
        "moved": int(remote.sum()),
        "mean_wait": float(wait.mean()),
        "max_wait": int(wait.max()),
        "per_pool_mean_wait": [round(float(x), 3) for x in mean_wait],
        "per_pool_max_wait": [int(x) for x in max_wait],
        "per_pool_completion": [int(x) for x in completion],
        "max_pool_mean_wait": float(mean_wait.max()),
        "completion_max": int(completion.max()),
        "completion_min": int(completion.min()),
        "completion_stdev": float(completion.std()),
        "locality_hist": [int(x) for x in hist],
        "locality_bin": LOCALITY_BIN,
        "frac_local": local / n,
        "frac_within_0.2": within(0.2),
        "frac_within_0.35": within(0.35),
        "frac_within_0.7": within(0.7),
        "max_locality": float(loc.max()) if loc.size else 0.0,
        "mean_locality_flocked": float(loc.mean()) if loc.size else 0.0,
        "backlog_max": max(grid.backlog) if grid.backlog else 0,
    }


def run_series(
    cfg: Butt1000Config,
    item: tuple[int, str],
    *,
    keep_grid: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run one series (``item = (seed, name)``); returns its summary (picklable). With
    ``keep_grid`` the summary also holds the grid, distances and nodes, and for the
    self-organized series the announcement reach at every unit (tests)."""
    seed, name = item
    spec = parse_series(name)
    t_start = time.perf_counter()
    cpu0 = time.process_time()
    ts = make_topology(cfg, seed)
    lat = PoolPerStub(ts, cfg.pools, seed)
    traces: GridTraces = make_grid_traces(
        cfg.pools,
        seed,
        machines=cfg.machines,
        sequences=cfg.sequences,
        seq_len=cfg.seq_len,
        step=cfg.step,
    )
    grid = Grid(traces, seed)
    out: dict[str, Any] = {"seed": seed, "series": name, "spec": spec}
    nodes: list[SimNode] = []
    if spec["kind"] == "self":
        net = Network(seed=seed, latency=lat)
        t_b = time.perf_counter()
        nodes = net.spawn(cfg.pools, overlay="pastry", build=spec["build"])
        out["build_wall_s"] = round(time.perf_counter() - t_b, 2)
        out["build_virtual_s"] = round(net.now, 1)
        policy_so = SelfOrganized(nodes, lambda: net.now)
        fcfg = cfg.flock_config()
        for p, node in enumerate(nodes):
            f = Flock(
                node.core,
                GridPoolView(grid, p),
                fcfg,
                collector=collector_of(node),
                pool_name=f"pool{p}",
                on_decision=policy_so.on_decision(p),
            )
            policy_so.flocks.append(f)
            f.start()
        u = cfg.unit_s
        t0 = math.ceil(net.now / u) * u + 2.0 * u  # the first announcements go out
        msgs0 = net.message_count
        by0 = net.msg_by_type
        t = 0
        last_arrival = grid.arrivals.shape[1]
        reach_log: list[list[set[int]]] = []
        while not grid.done():
            net.run(t0 + t * u - net.now)
            if keep_grid:  # who reaches whom at this unit (routing tables are maintained)
                reach_log.append(announce_reach(nodes))
            grid.tick(t, policy_so)
            t += 1
            if progress is not None and t % 10 == 0:
                progress(t, max(t, last_arrival))
        out["reach_log"] = reach_log if keep_grid else None
        for f in policy_so.flocks:
            f.stop()
        by = net.msg_by_type
        units = max(1, grid.t + 1)
        out["messages"] = net.message_count - msgs0
        out["announcements"] = by["FlockAnnounce"] - by0["FlockAnnounce"]
        out["announcements_per_pool_per_unit"] = round(
            out["announcements"] / (cfg.pools * units), 2
        )
        out["decisions"] = policy_so.decisions
        out["flock_stats"] = {
            k: sum(f.stats[k] for f in policy_so.flocks)
            for k in ("sent", "received", "accepted", "expired", "withdrawn", "probes")
        }
        dist = lat.distances()
    else:
        dist = lat.distances()
        grid.run(_policy(spec, dist, seed))
    diameter = float(dist.max())
    out.update(_summarise(grid, dist, diameter))
    out["diameter_s"] = diameter
    out["machines"] = [int(x) for x in traces.machines]
    out["sequences"] = [int(x) for x in traces.sequences]
    out["wall_s"] = round(time.perf_counter() - t_start, 2)
    out["cpu_s"] = round(time.process_time() - cpu0, 2)
    out["peak_rss_mib"] = round(bench.peak_rss_mib(), 1)
    if keep_grid:
        out["grid"] = grid
        out["dist"] = dist
        out["nodes"] = nodes
    return out
