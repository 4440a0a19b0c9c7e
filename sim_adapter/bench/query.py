"""``flockring bench query``: the ClassAd tree query at scale (PonD §3.1, §4.1, §4.2.1).

Builds a static small-world (or Pastry) ring by oracle, gives every node a random machine ad
(Memory, Cpus, Arch, PonD's ZipfAttribute), then runs Q queries from random live roots with the
real protocol (``discovery.query`` on ``overlay.multicast``) in the discrete-event simulator and
reports, per mode (``best``, ``first_fit``):

* virtual **latency** (mean, p50, max) next to the counting query's from the same roots (PonD's
  claim: the query costs what the tree costs) and PondSim's counting figures;
* **visited** nodes, matches found, tree depth, messages per query;
* **bytes per tree edge** (PonD §4.1: O(S_D + S_Q + S_A·k), flat in N), measured on a twin
  network with the wire codec on (encoding every message costs CPU, so latency and CPU come
  from the run without it);
* **CPU and wall time per query** (this process; the machine is shared);
* **classad2 matches per second** on this machine: ``symmetricMatch`` alone (the library) and
  the per-node evaluation (match, both ranks, the projection).
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from typing import Any

from sim_adapter import bench

#: PondSim's full-ring counting-query latency (s) by N (PonD §4.2.1, Fig. 6 inner graph)
PONDSIM_LATENCY_S = {1_000: 11.0, 10_000: 16.1, 100_000: 21.6, 1_000_000: 26.9}

DEFAULT_REQUIREMENTS = 'TARGET.Memory >= 4096 && TARGET.Arch == "X86_64"'
DEFAULT_RANK = "TARGET.Memory + TARGET.Cpus"


def _network(args: argparse.Namespace, codec: bool) -> tuple[Any, list[Any], float]:
    from sim_adapter import latency
    from sim_adapter.network import Network
    from sim_adapter.plugins import query as pq

    lat = latency.by_name(args.latency, seed=args.seed)
    loss = args.loss if args.loss is not None else float(getattr(lat, "loss_per_message", 0.0))
    net = Network(seed=args.seed, latency=lat, loss=0.0, codec=codec)
    config = None
    if args.overlay == "smallworld":
        from overlay.smallworld import SmallWorldConfig

        config = SmallWorldConfig(maintenance_enabled=False)  # a static ring, as PondSim
    nodes = net.spawn(args.nodes, overlay=args.overlay, build="oracle", config=config)
    pq.attach(net, seed=args.seed + 7, pond=False)
    net.loss = loss  # the oracle build sends nothing; loss applies to the queries
    return net, nodes, loss


def _modes(args: argparse.Namespace) -> list[str]:
    return ["best", "first_fit"] if args.mode == "both" else [args.mode]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the ring with machine ads and run the queries in each mode; return the figures as a
    dict."""
    from sim_adapter.plugins import query as pq

    res: dict[str, Any] = {
        "bench": "query",
        "overlay": args.overlay,
        "nodes": args.nodes,
        "latency": args.latency,
        "k": args.k,
        "modes": _modes(args),
        "redundant": args.redundant,
        "queries": args.queries,
        "requirements": args.requirements,
        "rank": args.rank,
        "seed": args.seed,
        **bench.environment(),
    }
    rss0 = bench.rss_mib()
    with bench.stopwatch() as t_build:
        net, nodes, loss = _network(args, codec=False)
    res["loss_per_message"] = loss
    res["build_and_ads_wall_s"] = bench.r(t_build(), 2)
    res["rss_per_node_kib"] = bench.r((bench.rss_mib() - rss0) * 1024 / max(1, args.nodes), 2)
    pick = random.Random(args.seed + 1)
    roots = [pick.choice(nodes) for _ in range(args.queries)]
    gc.collect()
    gc.freeze()
    counts = [net.count_nodes(r).latency_s for r in roots]
    res["count_latency_mean_s"] = bench.r(bench.mean(counts), 2)
    ref = PONDSIM_LATENCY_S.get(args.nodes)
    if ref is not None:
        res["pondsim_count_latency_s"] = ref
    for mode in _modes(args):
        lats, walls, cpus, visited, matched, depths, msgs = [], [], [], [], [], [], []
        edges: list[float] = []
        for root in roots:
            m0 = net.message_count
            e0 = net.msg_by_type["McQuery"]
            c0 = time.process_time()
            with bench.stopwatch() as t_q:
                r = pq.query(
                    net,
                    root,
                    args.requirements,
                    args.rank,
                    k=args.k,
                    mode=mode,
                    redundant=args.redundant,
                )
            walls.append(t_q())
            cpus.append(time.process_time() - c0)
            msgs.append(float(net.message_count - m0))
            edges.append(float(net.msg_by_type["McQuery"] - e0))
            lats.append(r.elapsed_s)
            visited.append(float(r.visited))
            matched.append(float(len(r.matches)))
            depths.append(float(r.depth))
        p = mode + "_"
        res[p + "latency_mean_s"] = bench.r(bench.mean(lats), 2)
        res[p + "latency_p50_s"] = bench.r(bench.percentile(lats, 50), 2)
        res[p + "latency_max_s"] = bench.r(max(lats), 2)
        res[p + "latency_vs_count"] = bench.r(bench.mean(lats) / bench.mean(counts), 3)
        res[p + "visited_mean"] = bench.r(bench.mean(visited), 1)
        res[p + "matches_mean"] = bench.r(bench.mean(matched), 1)
        res[p + "depth_mean"] = bench.r(bench.mean(depths), 1)
        res[p + "messages_per_query"] = bench.r(bench.mean(msgs), 0)
        res[p + "tree_edges_per_query"] = bench.r(bench.mean(edges), 0)
        res[p + "cpu_per_query_s"] = bench.r(bench.mean(cpus), 3)
        res[p + "cpu_per_query_min_s"] = bench.r(min(cpus), 3)
        res[p + "wall_per_query_s"] = bench.r(bench.mean(walls), 3)
    gc.unfreeze()
    del net, nodes
    gc.collect()
    res.update(_bytes(args, roots_idx=[r.index for r in roots[: args.byte_queries]]))
    res.update(_match_rate(args))
    res["peak_rss_mib"] = bench.r(bench.peak_rss_mib(), 1)
    return res


def _bytes(args: argparse.Namespace, roots_idx: list[int]) -> dict[str, Any]:
    """Bytes per tree edge on a twin network with the codec on (same seed: same ring/ads)."""
    from sim_adapter.plugins import query as pq

    net, nodes, _ = _network(args, codec=True)
    out: dict[str, Any] = {}
    for mode in _modes(args):
        per_edge = []
        for i in roots_idx:
            b0 = net.bytes_sent
            e0 = net.msg_by_type["McQuery"]
            pq.query(net, nodes[i], args.requirements, args.rank, k=args.k, mode=mode)
            # every tree edge carries one McQuery (down) and its ack/reply (up); First-Fit
            # stops waiting early but the subtrees already asked still answer their parents
            edges = net.msg_by_type["McQuery"] - e0
            per_edge.append((net.bytes_sent - b0) / max(1, edges))
        out[mode + "_bytes_per_edge"] = bench.r(bench.mean(per_edge), 1)
    return out


def _match_rate(args: argparse.Namespace) -> dict[str, Any]:
    """``classad2`` on this machine: symmetric matches/s, and our per-node evaluation/s."""
    from discovery.classads import JobAd, evaluate, job_ad
    from discovery.machine import random_machine_ad

    rng = random.Random(args.seed)
    ads = [random_machine_ad(rng, f"m{i}") for i in range(args.match_ads)]
    job = JobAd(job_ad(args.requirements, args.rank))
    t0 = time.perf_counter()
    for ad in ads:
        job.ad.symmetricMatch(ad)
    t1 = time.perf_counter()
    for ad in ads:
        evaluate(job, ad)
    t2 = time.perf_counter()
    return {
        "classad2_symmetric_matches_per_s": round(len(ads) / (t1 - t0)),
        "node_evaluations_per_s": round(len(ads) / (t2 - t1)),
    }


def _main(args: argparse.Namespace) -> int:
    bench.emit(run(args), args.json, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``query`` benchmark parser."""
    p = sub.add_parser("query", help="ClassAd tree query: latency, visited, bytes/edge, CPU")
    p.add_argument("--overlay", choices=("smallworld", "pastry"), default="smallworld")
    p.add_argument("--nodes", type=int, default=1000, help="number of nodes N")
    p.add_argument("--queries", type=int, default=5, help="queries per mode")
    p.add_argument("--latency", default="pondsim", help="latency model (as bench multicast)")
    p.add_argument(
        "--loss", type=float, default=None, help="per-message loss (default: the model's)"
    )
    p.add_argument("--mode", choices=("best", "first_fit", "both"), default="both")
    p.add_argument("-k", type=int, default=10, help="matches wanted")
    p.add_argument("--redundant", action="store_true", help="clockwise + counter-clockwise")
    p.add_argument("--requirements", default=DEFAULT_REQUIREMENTS)
    p.add_argument("--rank", default=DEFAULT_RANK)
    p.add_argument("--byte-queries", type=int, default=2, help="queries on the codec twin")
    p.add_argument("--match-ads", type=int, default=20_000, help="ads for the match rate")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="also write the JSON to this file")
    p.set_defaults(func=_main)
