"""Network-size estimate, shortcut count, greedy TTL and the Kleinberg distance draw.

Theory of operation (Kleinberg 2000; Symphony, Manku et al. 2003; Brunet, Boykin et al.):

* **Size estimate.** Ids are uniform on the ring, so the gaps between consecutive nodes average
  2^160 / N. A node sees ``2·near_per_side`` gaps at once: from its farthest left near
  connection to its farthest right one. N̂ = 2^160 / (width / #near). It never goes below the
  number of distinct nodes the node already knows (+1 for itself). With fewer than
  ``2·near_per_side`` connections the node knows the whole (tiny) ring: N̂ = #known + 1.
* **Shortcut count.** ceil(0.5 · log2 N̂) once N̂ > 10 (Brunet DesiredShortcuts), which with
  greedy routing gives O(log² N / k) expected hops (Kleinberg, Symphony §3).
* **Distance draw.** P(d) ∝ 1/d on [2^160/N̂, 2^160] is log-uniform: pick p ~ U[0, 1) and
  d = 2^(160 − (1 − p)·log2 N̂) (the derivation in Brunet's CreateShortcut). The direction is a
  fair coin, so shortcuts point either way round the ring. The simulator's oracle build calls
  the very same function, so oracle-built and protocol-built rings share one distribution.
* **TTL.** Greedy routing strictly decreases the distance to the key, so it cannot loop on a
  consistent ring; the TTL, (ln N̂)^3 as in Brunet, only bounds damage while the ring is
  inconsistent.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from overlay.handle import NodeHandle
from overlay.ids import ID_BITS, RING
from overlay.smallworld.config import SmallWorldConfig


def estimate_size(me: int, conns: Sequence[NodeHandle], near_per_side: int) -> float:
    """N̂ from the spread of the near connections; ``conns`` sorted clockwise from ``me``."""
    n = len(conns)
    if n < 2 * near_per_side:
        return float(n + 1)
    far_right = conns[near_per_side - 1].id
    far_left = conns[n - near_per_side].id
    width = (far_right - far_left) % RING
    if width == 0:  # cannot happen with distinct ids; be defensive with hostile input
        return float(n + 1)
    return max(float(n + 1), (2 * near_per_side) * (RING / width))


def estimate_from_gaps(width: int, gaps: int, known: int) -> float:
    """Same estimate for callers that already have the width (the oracle build)."""
    if width <= 0:
        return float(known + 1)
    return max(float(known + 1), gaps * (RING / width))


def desired_shortcuts(n_hat: float, config: SmallWorldConfig) -> int:
    """ceil(factor · log2 N̂) when N̂ exceeds the minimum network size, else 0."""
    if n_hat <= config.shortcut_min_network or n_hat <= 1.0:
        return 0
    return math.ceil(config.shortcut_factor * math.log2(n_hat))


def ttl_hops(n_hat: float, config: SmallWorldConfig) -> int:
    """Greedy routing TTL: max(floor, ceil((ln N̂) ** exponent))."""
    if n_hat <= 1.0:
        return config.ttl_min_hops
    ttl = math.ceil(math.log(n_hat) ** config.ttl_exponent)
    return max(config.ttl_min_hops, int(ttl))


def draw_distance(rng: random.Random, n_hat: float) -> int:
    """A distance with P(d) ∝ 1/d on [2^160 / N̂, 2^160) (one draw from ``rng``)."""
    log2n = math.log2(n_hat) if n_hat > 1.0 else 0.0
    p = rng.random()
    return int(2.0 ** (ID_BITS - (1.0 - p) * log2n)) % RING


def draw_shortcut_target(rng: random.Random, me: int, n_hat: float) -> int:
    """A shortcut target: ``me`` ± a Kleinberg distance, direction by a fair coin."""
    d = draw_distance(rng, n_hat)
    if rng.getrandbits(1):
        return (me + d) % RING
    return (me - d) % RING
