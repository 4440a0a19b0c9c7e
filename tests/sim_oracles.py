"""Oracle checks shared by the simulated-network tests of both overlays."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from overlay import NodeHandle, NodeId
from sim_adapter.network import Network, SimNode


def lookups(net: Network, nodes: list[SimNode], n: int, seed: int) -> tuple[float, float]:
    """(fraction delivered to ``closest_live``, mean hops) for ``n`` random lookups."""
    rng = random.Random(seed)
    live = [x for x in nodes if x.alive]
    pairs = [(rng.choice(live), NodeId.random(rng)) for _ in range(n)]
    res = net.lookup_many(pairs)
    ok = sum(r.result == net.closest_live(k) for r, (_, k) in zip(res, pairs, strict=True))
    return ok / n, sum(r.hops for r in res) / n


def wrong_windows(
    nodes: list[SimNode],
    k: int | Callable[[SimNode], int],
    window: Callable[[SimNode], Iterable[NodeHandle]],
) -> int:
    """How many live nodes' ring windows (``window(node)``: the Pastry leaf set, the small-world
    near connections) differ from the k live nodes on each side of them (oracle). ``k`` may be
    per node: a small-world node widens its window while it sees short sessions
    (:func:`sw_width`)."""
    live = [x for x in nodes if x.alive]
    ids = sorted(int(x.id) for x in live)
    pos = {v: i for i, v in enumerate(ids)}
    m = len(ids)
    wrong = 0
    for x in live:
        i = pos[int(x.id)]
        w = k if isinstance(k, int) else k(x)
        want = {ids[(i + d) % m] for d in range(-w, w + 1) if d}
        if {int(h.id) for h in window(x)} != want:
            wrong += 1
    return wrong


def sw_width(x: SimNode) -> int:
    """The near connections a side small-world node ``x`` keeps now (its churn estimate may
    have widened them: ``overlay/smallworld/churn.py``)."""
    return int(x.core.table.near)  # type: ignore[attr-defined]
