"""A network partition and its healing, simulated: how long until the overlay is one ring again.

N nodes (joins-built) run a minute, are split into two sides — the two halves of the id space,
or interleaved (every other node by id, so every node's neighbours end up on the other side) —
for ``--cut-s`` seconds, then the network heals. Every ``--step-s`` seconds after the heal the
script checks every live node's ring window against the oracle (Pastry: leaf set; small world:
near connections) and runs ``--lookups`` lookups against the brute-force closest node, and it
counts the partition probes sent (FreePastry's ``PartitionHandler``; ``rejoins`` on Pastry,
``partition_probes`` on the small-world ring).

Usage: ``python benchmarks/partition_heal.py --overlay smallworld --split interleaved``; prints
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sim_oracles import lookups, sw_width, wrong_windows

from overlay.pastry import PastryConfig, PastryCore
from overlay.smallworld import SmallWorldCore
from sim_adapter.network import Network, SimNode


def _wrong(nodes: list[SimNode], overlay: str) -> int:
    """Live nodes whose ring window differs from the oracle's (tests/sim_oracles.py)."""
    if overlay == "pastry":
        k = PastryConfig().leaf_set_size // 2
        return wrong_windows(nodes, k, lambda x: cast(PastryCore, x.core).leaf.members)
    return wrong_windows(nodes, sw_width, lambda x: cast(SmallWorldCore, x.core).near_connections())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--overlay", choices=["pastry", "smallworld"], default="smallworld")
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--split", choices=["halves", "interleaved"], default="halves")
    ap.add_argument("--cut-s", type=float, default=300.0)
    ap.add_argument("--step-s", type=float, default=150.0)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lookups", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=24)
    a = ap.parse_args()
    t0 = time.perf_counter()
    net = Network(seed=a.seed)
    nodes = net.spawn(a.nodes, overlay=a.overlay)
    net.run(60.0)
    ordered = sorted(nodes, key=lambda x: x.id)
    half = len(ordered) // 2
    parts = (
        (ordered[:half], ordered[half:]) if a.split == "halves" else (ordered[::2], ordered[1::2])
    )
    net.partition([list(p) for p in parts])
    net.run(a.cut_s)
    cut = {
        "wrong_windows_per_side": [_wrong(list(p), a.overlay) for p in parts],
        "correct_lookups": lookups(net, nodes, a.lookups, seed=a.seed)[0],
    }
    net.heal()
    key = "rejoins" if a.overlay == "pastry" else "partition_probes"
    probes0 = sum(x.core.stats[key] for x in nodes)
    after = []
    for i in range(a.steps):
        net.run(a.step_s)
        after.append(
            {
                "s_after_heal": round((i + 1) * a.step_s),
                "wrong_windows": _wrong(nodes, a.overlay),
                "correct_lookups": lookups(
                    net, nodes, a.lookups, seed=random.Random(i).randrange(1 << 30)
                )[0],
                key: sum(x.core.stats[key] for x in nodes) - probes0,
            }
        )
    print(
        json.dumps(
            {
                "overlay": a.overlay,
                "nodes": a.nodes,
                "split": a.split,
                "cut_s": a.cut_s,
                "seed": a.seed,
                "during_cut": cut,
                "after_heal": after,
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
