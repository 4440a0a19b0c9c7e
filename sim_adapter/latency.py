"""Latency models for the discrete-event simulator (docs/latency.md).

Theory of operation
-------------------
A latency model gives every spawned node a *position* and turns two positions into a one-way
delay. The Network calls ``place(index, rng)`` once per node, in spawn order 0, 1, 2, ..., and
then ``one_way_s(a, b)`` for every message it delivers, so:

* positions live in flat ``array('d')`` / ``array('i')`` columns indexed by node number
  (O(1) memory per node: 8-24 bytes, ~24 MB for 10^6 nodes at most);
* ``one_way_s`` is a few array reads and float operations, with no validation (the hot path);
  it is deterministic for the pair — no per-message jitter — so RTT probes are stable;
* all randomness comes from the ``random.Random`` handed to ``place`` (or, for the pair hash of
  :class:`Uniform` and the graph of :class:`TransitStub`, from an explicit ``seed``).

Models and their sources:

``Uniform(lo_s, hi_s, seed)``
    A fixed per-pair latency uniform on [lo, hi], symmetric, computed from a SplitMix64-style hash
    of (min(a, b), max(a, b), seed): no per-pair storage. PonD's analytic evaluation used edges
    uniform on 50-300 ms (Lee et al. HPDC 2012 §4.1); ``Network``'s default is
    ``Uniform(0.05, 0.30)``.
``Sphere(diameter_s=0.2)``
    FreePastry's default direct-simulator topology (``direct_simulator_topology = sphere``,
    ``pastry_direct_max_diameter=200`` ms, ``pastry_direct_min_delay=2`` ms; class
    ``rice.pastry.direct.proximitygenerators.SphereNetworkProximityGenerator``): each node gets
    a point uniform on the sphere, ``theta = asin(2U - 1)``, ``phi = 2 pi U``; the one-way delay is
    the great-circle distance on a sphere of radius ``maxDiameter / pi`` (so antipodes are
    ``diameter_s`` apart), at least ``min_delay_s`` for distinct nodes. FreePastry's
    ``proximity`` (RTT) is twice that.
``TransitStub(transit=50, stub=1000, seed)``
    The GT-ITM-like router graph of :mod:`sim_adapter.topology` (Butt et al. JPDC 2006 §5.2.1);
    each node attaches to a uniformly chosen stub router by an access link;
    ``one_way_s = access(a) + D[stub(a)][stub(b)] + access(b)`` with D the all-pairs shortest
    path among stub routers, computed once.
``Matrix(rows)`` / ``Matrix.from_file(path)``
    A measured square matrix (King-data style, milliseconds by default); node i uses row
    ``i mod size``; row ``r`` to column ``c`` is the one-way delay ``r -> c``.
``PondSim(seed)``
    The PonD simulator's model (kyungyonglee/PondSim, ``p2p_res_disc/src/deetoomessage.cpp``
    ``DeetooMessage::visit`` and ``p2p_res_disc/src/MapReduceTask.cpp``
    ``MapReduceTask::GetElapsedTime``): a parent draws ``edge_latency = 200 + U * 400`` ms
    (C ``int``, so whole milliseconds 200..599) and each child exchange costs
    ``2 * edge_latency``; an exchange is lost with probability ``p_drop_prob`` (0.005 in the
    paper's runs) and then redone after a randomised binary exponential back-off of
    ``edge_latency * ceil(U * 2**k)`` ms, capped at 10 s. Here the edge latency is drawn once
    per node and charged to every message that node *sends*. See docs/latency.md for the
    differences from PondSim.
"""

from __future__ import annotations

import functools
import math
import random
import time
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from overlay.errors import ConfigError
from sim_adapter import topology

__all__ = [
    "MODEL_NAMES",
    "LatencyModel",
    "Matrix",
    "PondSim",
    "Sphere",
    "TransitStub",
    "Uniform",
    "by_name",
]

_M64 = (1 << 64) - 1
_INV53 = 1.0 / float(1 << 53)


@runtime_checkable
class LatencyModel(Protocol):
    """What the simulator's Network needs from a latency model."""

    @property
    def name(self) -> str:
        """Short model name (the CLI name), for bench JSON."""
        ...

    def place(self, index: int, rng: random.Random) -> None:
        """Give node ``index`` (spawned in order 0, 1, 2, ...) a position, drawing from ``rng``."""
        ...

    def one_way_s(self, a: int, b: int) -> float:
        """One-way latency in seconds from node ``a`` to node ``b`` (``a != b``)."""
        ...

    def rtt_s(self, a: int, b: int) -> float:
        """``one_way_s(a, b) + one_way_s(b, a)``."""
        ...

    def describe(self) -> dict[str, object]:
        """JSON-friendly description: name, parameters, size."""
        ...


def _check_index(index: int, placed: int, model: str) -> None:
    if index != placed:
        raise ConfigError(
            f"{model}: nodes must be placed in spawn order; expected index {placed}, got {index}"
        )


# ---------------------------------------------------------------------------------------------
class Uniform:
    """Per-pair latency uniform on [lo_s, hi_s], symmetric, stable, stored nowhere."""

    name = "uniform"

    def __init__(self, lo_s: float = 0.05, hi_s: float = 0.30, seed: int = 0) -> None:
        if not (0.0 <= lo_s <= hi_s) or math.isinf(hi_s):
            raise ConfigError(f"uniform: need 0 <= lo_s <= hi_s < inf, got {lo_s!r}, {hi_s!r}")
        self.lo_s = float(lo_s)
        self.hi_s = float(hi_s)
        self.seed = int(seed)
        self._span = (self.hi_s - self.lo_s) * _INV53
        # Mix the seed once so seeds 0, 1, 2 give unrelated streams.
        self._salt = _mix64((self.seed * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019) & _M64)
        self.nodes = 0

    def place(self, index: int, rng: random.Random) -> None:
        """Count the node in; its latencies come from the pair hash, not from a position."""
        _check_index(index, self.nodes, self.name)
        self.nodes += 1

    def one_way_s(self, a: int, b: int) -> float:
        """The pair's fixed latency: a SplitMix64 hash of (min, max, seed) scaled to [lo, hi]."""
        if a > b:
            a, b = b, a
        # SplitMix64 finaliser over a 64-bit combination of (a, b, seed).
        x = (a * 0x9E3779B97F4A7C15 + b * 0xC2B2AE3D27D4EB4F + self._salt) & _M64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
        x ^= x >> 31
        return self.lo_s + (x >> 11) * self._span

    def rtt_s(self, a: int, b: int) -> float:
        """Twice the one-way latency (symmetric model)."""
        return 2.0 * self.one_way_s(a, b)

    def describe(self) -> dict[str, object]:
        """Name, bounds, seed and number of nodes."""
        return {
            "name": self.name,
            "lo_s": self.lo_s,
            "hi_s": self.hi_s,
            "seed": self.seed,
            "nodes": self.nodes,
        }


def _mix64(x: int) -> int:
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


# ---------------------------------------------------------------------------------------------
class Sphere:
    """FreePastry's SphereNetwork: great-circle delay between random points of a sphere."""

    name = "sphere"

    def __init__(self, diameter_s: float = 0.2, min_delay_s: float = 0.002) -> None:
        if not diameter_s > 0 or math.isinf(diameter_s):
            raise ConfigError(f"sphere: diameter_s must be > 0, got {diameter_s!r}")
        if not 0.0 <= min_delay_s <= diameter_s:
            raise ConfigError(
                f"sphere: min_delay_s must be in [0, diameter_s], got {min_delay_s!r}"
            )
        self.diameter_s = float(diameter_s)
        self.min_delay_s = float(min_delay_s)
        self._radius_s = self.diameter_s / math.pi
        # Unit vectors, interleaved x, y, z: 24 bytes per node.
        self._xyz: array[float] = array("d")
        self.nodes = 0

    def place(self, index: int, rng: random.Random) -> None:
        """Draw a uniform point on the sphere for the node (FreePastry's draws, in its order)."""
        _check_index(index, self.nodes, self.name)
        # Same draws, same order as FreePastry's SphereNodeRecord().
        theta = math.asin(2.0 * rng.random() - 1.0)
        phi = 2.0 * math.pi * rng.random()
        ct = math.cos(theta)
        self._xyz.extend((ct * math.cos(phi), ct * math.sin(phi), math.sin(theta)))
        self.nodes += 1

    def position(self, index: int) -> tuple[float, float]:
        """(theta, phi) of a placed node: latitude in [-pi/2, pi/2], longitude in [-pi, pi]."""
        i = 3 * index
        x, y, z = self._xyz[i], self._xyz[i + 1], self._xyz[i + 2]
        return math.asin(max(-1.0, min(1.0, z))), math.atan2(y, x)

    def one_way_s(self, a: int, b: int) -> float:
        """Great-circle delay between the two points, at least ``min_delay_s``."""
        p = self._xyz
        i = 3 * a
        j = 3 * b
        dot = p[i] * p[j] + p[i + 1] * p[j + 1] + p[i + 2] * p[j + 2]
        if dot >= 1.0:
            return self.min_delay_s
        if dot <= -1.0:
            return self.diameter_s
        d = self._radius_s * math.acos(dot)
        return d if d > self.min_delay_s else self.min_delay_s

    def rtt_s(self, a: int, b: int) -> float:
        """Twice the one-way latency (symmetric model)."""
        return 2.0 * self.one_way_s(a, b)

    def describe(self) -> dict[str, object]:
        """Name, diameter, minimum delay and number of nodes."""
        return {
            "name": self.name,
            "diameter_s": self.diameter_s,
            "min_delay_s": self.min_delay_s,
            "nodes": self.nodes,
            "source": "FreePastry SphereNetworkProximityGenerator",
        }


# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _routers(
    seed: int,
    transit: int,
    stub: int,
    transit_domains: int,
    stub_domain_size: int,
    delays: topology.LinkDelays,
    top_edge_prob: float,
    transit_edge_prob: float,
    stub_edge_prob: float,
) -> tuple[topology.TransitStubGraph, array[float]]:
    """The router graph and its stub-to-stub delay matrix for these parameters, built once per
    process: a pure function of them (the graph's own seeded rng), and at 1,000 stub routers
    ~3 s of Dijkstra that every simulation on the same topology repeated — experiments that
    compare protocols on one topology, and the test suite. Neither is changed after it is
    built; each model keeps its own node placement. Only the last parameter set is kept: the
    matrix is 8·S² bytes (32 MB at 2,000 stub routers), and a run that goes through several
    topologies should not hold them all."""
    graph = topology.transit_stub_graph(
        random.Random(seed),
        transit=transit,
        stub=stub,
        transit_domains=transit_domains,
        stub_domain_size=stub_domain_size,
        delays=delays,
        top_edge_prob=top_edge_prob,
        transit_edge_prob=transit_edge_prob,
        stub_edge_prob=stub_edge_prob,
    )
    return graph, topology.stub_distance_matrix(graph.graph, list(graph.stub_routers))


class TransitStub:
    """Nodes on the stub routers of a GT-ITM-like transit-stub graph (Butt et al. §5.2.1)."""

    name = "transit-stub"

    def __init__(
        self,
        transit: int = 50,
        stub: int = 1000,
        seed: int = 0,
        *,
        transit_domains: int = 10,
        stub_domain_size: int = 10,
        delays: topology.LinkDelays | None = None,
        top_edge_prob: float = 0.5,
        transit_edge_prob: float = 0.5,
        stub_edge_prob: float = 0.2,
    ) -> None:
        t0 = time.perf_counter()
        self.seed = int(seed)
        self.delays = delays if delays is not None else topology.LinkDelays()
        self.topology, self._dist = _routers(
            self.seed,
            transit,
            stub,
            transit_domains,
            stub_domain_size,
            self.delays,
            top_edge_prob,
            transit_edge_prob,
            stub_edge_prob,
        )
        self._stubs = list(self.topology.stub_routers)
        self._s = len(self._stubs)
        self._access_lo, self._access_hi = self.delays.access_range_s()
        self._stub_of: array[int] = array("i")
        self._access: array[float] = array("d")
        self.nodes = 0
        self.build_s = time.perf_counter() - t0
        self.router_diameter_s = max(self._dist)
        self.router_mean_s = sum(self._dist) / len(self._dist) if self._s > 1 else 0.0

    def place(self, index: int, rng: random.Random) -> None:
        """Attach the node to a uniformly drawn stub router with a random access-link delay."""
        _check_index(index, self.nodes, self.name)
        self._stub_of.append(rng.randrange(self._s))
        self._access.append(self._access_lo + (self._access_hi - self._access_lo) * rng.random())
        self.nodes += 1

    def stub_router(self, index: int) -> int:
        """Router number (in ``self.topology.graph``) that node ``index`` is attached to."""
        return self._stubs[self._stub_of[index]]

    def access_s(self, index: int) -> float:
        """Access-link delay of node ``index`` in seconds."""
        return self._access[index]

    def router_distance_s(self, r1: int, r2: int) -> float:
        """Shortest-path delay between two stub routers (router numbers of the graph)."""
        t = self.topology.transit
        return self._dist[(r1 - t) * self._s + (r2 - t)]

    def one_way_s(self, a: int, b: int) -> float:
        """Both access links plus the shortest path between the two stub routers."""
        acc = self._access
        st = self._stub_of
        # (acc[a] + acc[b]) first: float + is commutative, so the result is exactly symmetric.
        return (acc[a] + acc[b]) + self._dist[st[a] * self._s + st[b]]

    def rtt_s(self, a: int, b: int) -> float:
        """Twice the one-way latency (symmetric model)."""
        return 2.0 * self.one_way_s(a, b)

    def describe(self) -> dict[str, object]:
        """Name, seed, router-graph sizes, link delays, router distances, build time and nodes."""
        g = self.topology.graph
        return {
            "name": self.name,
            "seed": self.seed,
            "transit_routers": self.topology.transit,
            "stub_routers": self.topology.stub,
            "transit_domains": self.topology.transit_domains,
            "stub_domains": self.topology.stub_domains,
            "links": g.number_of_edges(),
            "delays_ms": {
                "transit": self.delays.transit_ms,
                "transit_stub": self.delays.transit_stub_ms,
                "stub": self.delays.stub_ms,
                "access": self.delays.access_ms,
                "jitter": self.delays.jitter,
                "scale": self.delays.scale,
            },
            "router_diameter_s": self.router_diameter_s,
            "router_mean_s": self.router_mean_s,
            "build_s": round(self.build_s, 3),
            "nodes": self.nodes,
        }


# ---------------------------------------------------------------------------------------------
class Matrix:
    """A measured square latency matrix (King-data style); node i uses row i mod size."""

    name = "matrix"

    def __init__(
        self,
        rows: Sequence[Sequence[float]],
        *,
        unit_s: float = 0.001,
        same_row_s: float = 0.001,
        source: str = "<rows>",
    ) -> None:
        if not unit_s > 0:
            raise ConfigError(f"matrix: unit_s must be > 0, got {unit_s!r}")
        if not same_row_s >= 0:
            raise ConfigError(f"matrix: same_row_s must be >= 0, got {same_row_s!r}")
        n = len(rows)
        if n == 0:
            raise ConfigError(f"matrix {source}: empty matrix")
        flat = array("d")
        for r, row in enumerate(rows):
            if len(row) != n:
                raise ConfigError(
                    f"matrix {source}: not square: {n} rows, but row {r + 1} has {len(row)} values"
                )
            for c, v in enumerate(row):
                fv = float(v)
                if not (fv >= 0.0) or math.isinf(fv):
                    raise ConfigError(
                        f"matrix {source}: row {r + 1}, column {c + 1}: latency {v!r} is not a "
                        "finite value >= 0 (King data marks missing pairs with -1: fill or drop "
                        "them first)"
                    )
                flat.append(fv * unit_s)
        self.size = n
        self.unit_s = float(unit_s)
        self.same_row_s = float(same_row_s)
        self.source = source
        self._m = flat
        self.nodes = 0

    @classmethod
    def from_file(
        cls, path: str | Path, *, unit_s: float = 0.001, same_row_s: float = 0.001
    ) -> Matrix:
        """Read whitespace-separated rows; blank lines and ``#`` comments are skipped."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"matrix: cannot read {p}: {exc}") from exc
        rows: list[list[float]] = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            body = line.split("#", 1)[0].strip()
            if not body:
                continue
            row: list[float] = []
            for col, tok in enumerate(body.split(), start=1):
                try:
                    row.append(float(tok))
                except ValueError:
                    raise ConfigError(
                        f"matrix {p}:{lineno}: column {col}: {tok!r} is not a number"
                    ) from None
            rows.append(row)
        return cls(rows, unit_s=unit_s, same_row_s=same_row_s, source=str(p))

    def place(self, index: int, rng: random.Random) -> None:
        """Count the node in; node ``index`` uses matrix row ``index mod size``."""
        _check_index(index, self.nodes, self.name)
        self.nodes += 1

    def one_way_s(self, a: int, b: int) -> float:
        """The matrix entry from ``a``'s row to ``b``'s (``same_row_s`` when they share a row)."""
        n = self.size
        ra = a % n
        rb = b % n
        if ra == rb:
            return self.same_row_s
        return self._m[ra * n + rb]

    def rtt_s(self, a: int, b: int) -> float:
        """Sum of the two directions (the matrix need not be symmetric)."""
        return self.one_way_s(a, b) + self.one_way_s(b, a)

    def describe(self) -> dict[str, object]:
        """Name, source, size, unit, same-row delay and number of nodes."""
        return {
            "name": self.name,
            "source": self.source,
            "size": self.size,
            "unit_s": self.unit_s,
            "same_row_s": self.same_row_s,
            "nodes": self.nodes,
        }


# ---------------------------------------------------------------------------------------------
class PondSim:
    """The PonD simulator's latency: a per-sender edge latency of 200 + U*400 ms (whole ms).

    ``loss`` (0.005) is PondSim's ``p_drop_prob`` as used for the paper's figures: the
    probability that a parent-child *exchange* (request + reply) is lost. ``loss_per_message``
    is the per-message rate that gives the same exchange loss when a Network drops request and
    reply independently. ``retransmit_s`` is the mean time from a lost send to its resend for
    the mean edge (2·e + e·E[ceil(2U)] = 2·0.4 + 0.4·1.5 = 1.4 s); ``retransmit_delay_s`` gives
    PondSim's exact randomised back-off for a given sender and attempt.
    """

    name = "pondsim"

    #: PondSim: ``edge_latency = 200 + _r_num.getDouble01() * 400`` (deetoomessage.cpp).
    EDGE_BASE_MS = 200
    EDGE_SPAN_MS = 400
    #: PondSim: ``reschedule_time > 10000 ? 10000 : reschedule_time`` (MapReduceTask.cpp).
    BACKOFF_CAP_S = 10.0
    #: PondSim: ``_max_resends = 5`` (resends to a failed child before giving up).
    MAX_RESENDS = 5

    def __init__(self, seed: int = 0, *, loss: float = 0.005) -> None:
        if not 0.0 <= loss < 1.0:
            raise ConfigError(f"pondsim: loss must be in [0, 1), got {loss!r}")
        self.seed = int(seed)
        self.loss = float(loss)
        self.loss_per_message = 1.0 - math.sqrt(1.0 - self.loss)
        self.max_resends = self.MAX_RESENDS
        self.backoff_cap_s = self.BACKOFF_CAP_S
        mean_edge_s = (self.EDGE_BASE_MS + (self.EDGE_SPAN_MS - 1) / 2.0) / 1000.0
        self.retransmit_s = 2.0 * mean_edge_s + 1.5 * mean_edge_s
        self._rng = random.Random(self.seed)
        self._edge: array[float] = array("d")
        self.nodes = 0

    def place(self, index: int, rng: random.Random) -> None:
        """Draw the node's edge latency, whole milliseconds in 200..599 (PondSim's C ``int``)."""
        _check_index(index, self.nodes, self.name)
        # C: int edge_latency = 200 + U * 400;  (truncation toward zero: 200..599 ms)
        ms = int(self.EDGE_BASE_MS + rng.random() * self.EDGE_SPAN_MS)
        self._edge.append(ms / 1000.0)
        self.nodes += 1

    def edge_s(self, index: int) -> float:
        """The edge latency node ``index`` drew (seconds). PondSim charges a child 2·edge."""
        return self._edge[index]

    def one_way_s(self, a: int, b: int) -> float:
        """The sender's edge latency (the receiver's is not charged)."""
        return self._edge[a]

    def rtt_s(self, a: int, b: int) -> float:
        """Sum of the two nodes' edge latencies."""
        return self._edge[a] + self._edge[b]

    def retransmit_delay_s(self, a: int, attempt: int, rng: random.Random | None = None) -> float:
        """Time from sender ``a``'s lost send to its resend number ``attempt`` (1, 2, ...).

        PondSim (``MapReduceTask::GetElapsedTime``) charges every lost exchange a full
        round trip plus ``edge * ceil(U * 2**attempt)`` of back-off, the back-off capped at
        10 s; the resend then costs a normal exchange.
        """
        if attempt < 1:
            raise ConfigError(f"pondsim: attempt must be >= 1, got {attempt}")
        r = rng if rng is not None else self._rng
        e = self._edge[a]
        backoff = e * math.ceil(r.random() * (1 << min(attempt, 62)))
        return 2.0 * e + min(backoff, self.backoff_cap_s)

    def describe(self) -> dict[str, object]:
        """Name, seed, edge range, loss rates, back-off parameters, nodes and the PondSim source."""
        return {
            "name": self.name,
            "seed": self.seed,
            "edge_ms": [self.EDGE_BASE_MS, self.EDGE_BASE_MS + self.EDGE_SPAN_MS - 1],
            "loss": self.loss,
            "loss_per_message": self.loss_per_message,
            "retransmit_s": self.retransmit_s,
            "backoff_cap_s": self.backoff_cap_s,
            "max_resends": self.max_resends,
            "nodes": self.nodes,
            "source": "kyungyonglee/PondSim deetoomessage.cpp, MapReduceTask.cpp",
        }


# ---------------------------------------------------------------------------------------------
def _matrix(**kw: Any) -> Matrix:
    kw.pop("seed", None)  # a file has no randomness
    path = kw.pop("path", None)
    if path is None:
        raise ConfigError("latency model 'matrix' needs path=FILE (a square matrix in ms)")
    return Matrix.from_file(path, **kw)


def _sphere(**kw: Any) -> Sphere:
    kw.pop("seed", None)  # positions come from the rng given to place()
    return Sphere(**kw)


_FACTORIES: dict[str, Callable[..., LatencyModel]] = {
    "uniform": Uniform,
    "sphere": _sphere,
    "transit-stub": TransitStub,
    "matrix": _matrix,
    "pondsim": PondSim,
}

#: CLI names accepted by :func:`by_name`.
MODEL_NAMES: tuple[str, ...] = tuple(_FACTORIES)


def by_name(name: str, **kw: Any) -> LatencyModel:
    """Build a model from its CLI name (``uniform``, ``sphere``, ``transit-stub``, ``matrix``,
    ``pondsim``) and keyword options; ``matrix`` takes ``path=``. Every model accepts ``seed=``
    (``sphere`` and ``matrix`` ignore it: their positions come from ``place``'s rng or a file).
    """
    key = name.strip().lower().replace("_", "-")
    if key == "transitstub":
        key = "transit-stub"
    factory = _FACTORIES.get(key)
    if factory is None:
        raise ConfigError(
            f"unknown latency model {name!r}; choose one of: {', '.join(MODEL_NAMES)}"
        )
    try:
        return factory(**kw)
    except TypeError as exc:
        raise ConfigError(f"latency model {key!r}: bad options {sorted(kw)}: {exc}") from exc
