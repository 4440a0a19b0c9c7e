"""Pieces shared by the PonD experiments (Lee et al. 2012 §4): Zipf, geography, plotting.

Theory of operation. PonD's synthetic ``ZipfAttribute`` (§4.2.2, §4.3) is an integer 1..10 drawn
with P(i) ∝ 1/i (skew 1.0): P(1) = 1/H₁₀ ≈ 0.341, the "35 % of nodes" the paper quotes.
Machines draw it with :func:`discovery.machine.zipf_value`; :func:`zipf_pmf` gives the exact
probabilities the analytic models use.

Geography (PonD §4.3 FutureGrid sites, §4.4 PlanetLab continents). :class:`GeoLatency` is the
latency model of a node placed at a latitude and longitude: the one-way delay between two nodes
is the great-circle distance at the speed of light in fibre (2/3 c, ~200 km per ms) plus a fixed
per-path overhead for routing detours and queues (an assumption, 5 ms one way by default: the
same 10 ms per round trip that our ``butt-table2`` model assumes; neither paper publishes
measured RTTs), and a LAN delay between nodes of one site (0.25 ms one way, an assumption).
It implements :class:`sim_adapter.latency.LatencyModel`, so the unmodified protocol code runs
over it in :class:`sim_adapter.network.Network`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from overlay.errors import ConfigError
from overlay.smallworld import SmallWorldConfig
from sim_adapter.latency import Uniform
from sim_adapter.network import Network

__all__ = [
    "EARTH_RADIUS_KM",
    "FIBRE_KM_PER_MS",
    "GeoLatency",
    "crossing",
    "great_circle_km",
    "job_ad",
    "static_ring",
    "zipf_pmf",
]

EARTH_RADIUS_KM = 6371.0
#: light in fibre: 2/3 c, ~200 km per ms
FIBRE_KM_PER_MS = 299_792.458 * (2.0 / 3.0) / 1000.0


def zipf_pmf(n: int = 10, skew: float = 1.0) -> list[float]:
    """P(1..n) of PonD's ``ZipfAttribute``: ∝ 1/i^skew (PonD §4.2.2: n = 10, skew 1.0)."""
    w = [1.0 / (i**skew) for i in range(1, n + 1)]
    s = sum(w)
    return [x / s for x in w]


def great_circle_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance between two points given in degrees (haversine, spherical Earth)."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


class GeoLatency:
    """One-way delay from positions on the globe (module docstring).

    ``coords[i]`` is node ``i``'s (latitude, longitude) in degrees; nodes must be spawned in
    that order. ``one_way_s = km / FIBRE_KM_PER_MS + overhead`` between distinct positions,
    ``lan_s`` between nodes at the same position (one site)."""

    name = "geo"

    def __init__(
        self,
        coords: Sequence[tuple[float, float]],
        *,
        overhead_s: float = 0.005,
        lan_s: float = 0.00025,
    ) -> None:
        if overhead_s < 0 or lan_s < 0:
            raise ConfigError("geo latency: overhead_s and lan_s must be >= 0")
        self.coords = [(float(a), float(b)) for a, b in coords]
        self.overhead_s = float(overhead_s)
        self.lan_s = float(lan_s)
        self.nodes = 0
        self._cache: dict[tuple[int, int], float] = {}

    def place(self, index: int, rng: random.Random) -> None:
        """Node ``index`` takes ``coords[index]`` (no randomness: positions are given)."""
        if index != self.nodes or index >= len(self.coords):
            raise ConfigError(
                f"geo latency: node {index} has no position (have {len(self.coords)})"
            )
        self.nodes += 1

    def one_way_s(self, a: int, b: int) -> float:
        """Fibre delay of the great-circle distance plus the overhead (LAN delay at one site)."""
        key = (a, b) if a < b else (b, a)
        v = self._cache.get(key)
        if v is None:
            (la1, lo1), (la2, lo2) = self.coords[a], self.coords[b]
            if la1 == la2 and lo1 == lo2:
                v = self.lan_s
            else:
                v = great_circle_km(la1, lo1, la2, lo2) / FIBRE_KM_PER_MS / 1000.0
                v += self.overhead_s
            self._cache[key] = v
        return v

    def rtt_s(self, a: int, b: int) -> float:
        """Twice the one-way delay (symmetric model)."""
        return 2.0 * self.one_way_s(a, b)

    def describe(self) -> dict[str, object]:
        """Name, parameters and size."""
        return {
            "name": self.name,
            "overhead_s": self.overhead_s,
            "lan_s": self.lan_s,
            "fibre_km_per_ms": FIBRE_KM_PER_MS,
            "nodes": self.nodes,
        }


def job_ad(requirements: str, *, rank: str = "0", **attrs: Any) -> str:
    """A job ClassAd in new syntax with ``Requirements``, ``Rank`` and extra attributes."""
    parts = [f"Requirements = {requirements}", f"Rank = {rank}", 'Owner = "pond"']
    for k, v in attrs.items():
        parts.append(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}")
    return "[ " + "; ".join(parts) + " ]"


def crossing(xs: Sequence[float], a: Sequence[float], b: Sequence[float]) -> float | None:
    """The first x where curve ``a`` rises above curve ``b``, interpolated in log-log between
    grid points (None if it never does within ``xs``)."""
    for i in range(1, len(xs)):
        d0 = a[i - 1] - b[i - 1]
        d1 = a[i] - b[i]
        if d0 < 0 <= d1 or (d0 <= 0 < d1):
            if a[i - 1] <= 0 or b[i - 1] <= 0 or a[i] <= 0 or b[i] <= 0:
                return xs[i]
            l0 = math.log(a[i - 1]) - math.log(b[i - 1])
            l1 = math.log(a[i]) - math.log(b[i])
            f = 0.0 if l1 == l0 else -l0 / (l1 - l0)
            return math.exp(math.log(xs[i - 1]) + f * (math.log(xs[i]) - math.log(xs[i - 1])))
    return None


def static_ring(edge_s: tuple[float, float], n: int, seed: int) -> Network:
    """The ring of the C-PonD scaling runs (PonD §4.2.1): ``n`` small-world nodes built by the
    oracle, no maintenance traffic, no loss, each message's delay uniform in ``edge_s``."""
    lo, hi = edge_s
    net = Network(seed=seed, latency=Uniform(lo, hi, seed=seed), loss=0.0)
    net.spawn(
        n, overlay="smallworld", build="oracle", config=SmallWorldConfig(maintenance_enabled=False)
    )
    return net
