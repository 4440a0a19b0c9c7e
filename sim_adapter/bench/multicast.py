"""``flockring bench multicast``: full-ring counting queries (docs/multicast.md, "Measured").

Builds a ring by oracle (steady state, nothing sent), then runs Q counting map-reduce queries
over the whole ring from random live roots with the real multicast protocol
(overlay/multicast/) and reports the virtual query latency (mean, p50, max), tree depth,
messages per query, correctness of the count and the wall time per query.

PonD's simulator (PondSim, Lee et al. HPDC 2012 §4.2.1) reports 11.0, 16.1, 21.6 and 26.9 s
for N = 10^3..10^6 with its latency model: per-parent edge latency 200 + U·400 ms, a child
costing a round trip, 0.5 % loss per exchange with randomised retransmission back-off. Its
number is the critical path of the recursion (max over children of child cost + child latency),
with no processing time and no maintenance. ``--latency pondsim`` (``sim_adapter.latency.
PondSim``) gives the same edge model; loss is applied per message at the rate that makes the
same per-exchange loss, and our protocol retransmits on its own RTO timers (query acks, reply
acks, cached leaf replies) instead of PondSim's closed-form back-off. Overlay maintenance is off
by default (PondSim has none), so the wall time is the query's own.

``--method analytic`` (or ``both``, side by side on the same roots) adds PondSim's own method
on our overlay state (``sim_adapter.fastquery``): no events, the same tree from the same
``known_in_range`` state, latency by critical-path recursion with PondSim's loss/back-off
formula. Its keys are prefixed ``analytic_``; it is not the protocol's cost, and the JSON
says so.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from typing import Any

from sim_adapter import bench
from sim_adapter.bench.overlay import make_latency
from sim_adapter.network import Network

#: PondSim's full-ring query latency (s) by N, 0.5 % loss (PonD §4.2.1, Fig. 6 inner graph).
PONDSIM_LATENCY_S = {1_000: 11.0, 10_000: 16.1, 100_000: 21.6, 1_000_000: 26.9}
#: PondSim's wall time per full query at N = 10^4 (C++, one core of this kind of machine).
PONDSIM_WALL_S_1E4 = 0.077


def _overlay_config(overlay: str, maintenance: bool) -> Any:
    if maintenance:
        return None
    if overlay == "smallworld":
        from overlay.smallworld import SmallWorldConfig

        return SmallWorldConfig(maintenance_enabled=False)
    return None  # Pastry's timers stay; they only run if the ring lives long enough


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the ring and run the counting queries; return the figures as a dict."""
    from overlay.multicast import Multicast, MulticastConfig

    lat = make_latency(args.latency, args.seed)
    loss = args.loss
    if loss is None:
        loss = float(getattr(lat, "loss_per_message", 0.0))
    Multicast.default_config = MulticastConfig(acks=not args.no_acks)
    net = Network(seed=args.seed, latency=lat, loss=0.0)
    res: dict[str, Any] = {
        "bench": "multicast",
        "overlay": args.overlay,
        "nodes": args.nodes,
        "latency": args.latency,
        "loss_per_message": loss,
        "redundant": args.redundant,
        "acks": not args.no_acks,
        "maintenance": args.maintenance,
        "crash": args.crash,
        "queries": args.queries,
        "method": args.method,
        "seed": args.seed,
        **bench.environment(),
    }
    rss0 = bench.rss_mib()
    prog = bench.Progress(f"build {args.overlay}", args.progress or None)
    with bench.stopwatch() as t_build:
        nodes = net.spawn(
            args.nodes,
            overlay=args.overlay,
            build="oracle",
            config=_overlay_config(args.overlay, args.maintenance),
            progress=prog,
        )
    res["build_wall_s"] = bench.r(t_build(), 2)
    res["rss_after_build_mib"] = bench.r(bench.rss_mib(), 1)
    res["rss_per_node_kib"] = bench.r((bench.rss_mib() - rss0) * 1024 / max(1, args.nodes), 2)
    net.loss = loss  # the oracle build sends nothing; loss applies to the queries
    pick = random.Random(args.seed + 1)
    if args.crash > 0:
        net.crash(pick.sample(nodes, int(args.crash * len(nodes))))
    live = net.live_nodes()
    roots = [pick.choice(live) for _ in range(args.queries)]
    gc.collect()
    gc.freeze()  # the built ring is long-lived: keep the cyclic collector off it
    if args.gc_threshold:
        gc.set_threshold(args.gc_threshold, *gc.get_threshold()[1:])
    res["gc_threshold"] = gc.get_threshold()[0]
    if args.method in ("events", "both"):
        res.update(_events(net, roots, len(live), args))
    if args.method in ("analytic", "both"):
        res.update(_analytic(net, roots, len(live), args))
    res.update(
        {
            "load_avg_1min": bench.r(_loadavg(), 2),
            "peak_rss_mib": bench.r(bench.peak_rss_mib(), 1),
        }
    )
    ref = PONDSIM_LATENCY_S.get(args.nodes)
    if ref is not None:
        res["pondsim_latency_s"] = ref
        for k in ("", "analytic_"):
            if f"{k}latency_mean_s" in res:
                res[f"{k}latency_vs_pondsim"] = bench.r(res[f"{k}latency_mean_s"] / ref, 3)
    if args.nodes == 10_000:
        res["pondsim_wall_per_query_s"] = PONDSIM_WALL_S_1E4
    return res


def _events(
    net: Network, roots: list[Any], n_live: int, args: argparse.Namespace
) -> dict[str, Any]:
    """The full protocol in the discrete-event simulator (messages, acks, timers, loss)."""
    lats: list[float] = []
    depths: list[int] = []
    walls: list[float] = []
    cpus: list[float] = []
    msgs: list[int] = []
    counted: list[float] = []
    missing: list[int] = []
    prog = bench.Progress("queries", args.progress or None)
    for i, root in enumerate(roots):
        m0 = net.message_count
        c0 = time.process_time()
        with bench.stopwatch() as t_q:
            a = net.count_nodes(root, redundant=args.redundant, level_s=args.level_s)
        walls.append(t_q())
        cpus.append(time.process_time() - c0)
        msgs.append(net.message_count - m0)
        prog(i + 1, len(roots))
        lats.append(a.latency_s)
        depths.append(a.depth)
        counted.append(a.value / n_live)
        missing.append(len(a.missing))
    return {
        "latency_mean_s": bench.r(bench.mean(lats), 2),
        "latency_p50_s": bench.r(bench.percentile(lats, 50), 2),
        "latency_max_s": bench.r(max(lats), 2),
        "depth_mean": bench.r(bench.mean([float(d) for d in depths]), 1),
        "depth_max": max(depths),
        "counted_fraction_min": bench.r(min(counted), 4),
        "missing_ranges_max": max(missing),
        "messages_per_query": bench.r(bench.mean([float(m) for m in msgs]), 0),
        "messages_per_node": bench.r(bench.mean([float(m) for m in msgs]) / n_live, 2),
        "wall_per_query_s": bench.r(bench.mean(walls), 3),
        "wall_per_query_min_s": bench.r(min(walls), 3),
        # CPU seconds of this process: robust when other jobs share the 2 cores
        "cpu_per_query_s": bench.r(bench.mean(cpus), 3),
        "cpu_per_query_p50_s": bench.r(bench.percentile(cpus, 50), 3),
        "cpu_per_query_min_s": bench.r(min(cpus), 3),
    }


def _analytic(
    net: Network, roots: list[Any], n_live: int, args: argparse.Namespace
) -> dict[str, Any]:
    """PondSim's method on our overlay state (sim_adapter/fastquery.py): the same tree from
    the same known_in_range state, latency by critical-path recursion, no events."""
    from sim_adapter.fastquery import count_analytic

    rng = random.Random(args.seed + 2)
    loss = None if args.exchange_loss is None else args.exchange_loss
    lats: list[float] = []
    depths: list[int] = []
    cpus: list[float] = []
    walls: list[float] = []
    counted: list[float] = []
    lost: list[int] = []
    for root in roots:
        c0 = time.process_time()
        with bench.stopwatch() as t_q:
            a = count_analytic(net, root, args.redundant, edges=args.edges, loss=loss, rng=rng)
        walls.append(t_q())
        cpus.append(time.process_time() - c0)
        lats.append(a.latency_s)
        depths.append(a.depth)
        counted.append(a.value / n_live)
        lost.append(a.lost)
    p = 1.0 - (1.0 - net.loss) ** 2 if loss is None else loss
    return {
        "analytic_method": "PondSim critical-path recursion on our overlay state",
        "analytic_edges": args.edges,
        "analytic_loss_per_exchange": bench.r(p, 5),
        "analytic_latency_mean_s": bench.r(bench.mean(lats), 2),
        "analytic_latency_p50_s": bench.r(bench.percentile(lats, 50), 2),
        "analytic_latency_max_s": bench.r(max(lats), 2),
        "analytic_depth_mean": bench.r(bench.mean([float(d) for d in depths]), 1),
        "analytic_depth_max": max(depths),
        "analytic_counted_fraction_min": bench.r(min(counted), 4),
        "analytic_lost_exchanges_per_query": bench.r(bench.mean([float(x) for x in lost]), 1),
        "analytic_wall_per_query_s": bench.r(bench.mean(walls), 4),
        "analytic_wall_per_query_min_s": bench.r(min(walls), 4),
        "analytic_cpu_per_query_s": bench.r(bench.mean(cpus), 4),
        "analytic_cpu_per_query_p50_s": bench.r(bench.percentile(cpus, 50), 4),
        "analytic_cpu_per_query_min_s": bench.r(min(cpus), 4),
    }


def _loadavg() -> float:
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def _main(args: argparse.Namespace) -> int:
    bench.emit(run(args), args.json, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``multicast`` benchmark parser."""
    p = sub.add_parser("multicast", help="full-ring counting query: latency, depth, wall")
    p.add_argument("--overlay", choices=("smallworld", "pastry"), default="smallworld")
    p.add_argument("--nodes", type=int, default=1000, help="number of nodes N")
    p.add_argument("--queries", type=int, default=5, help="full-ring queries Q")
    p.add_argument("--latency", default="pondsim", help="latency model (as bench pastry)")
    p.add_argument(
        "--loss",
        type=float,
        default=None,
        help="per-message loss (default: the model's, pondsim 0.25%% = 0.5%% per exchange)",
    )
    p.add_argument("--redundant", action="store_true", help="clockwise + counter-clockwise")
    p.add_argument("--no-acks", action="store_true", help="no acks/retransmission (lossless)")
    p.add_argument("--maintenance", action="store_true", help="keep overlay maintenance on")
    p.add_argument("--crash", type=float, default=0.0, help="fraction crashed before queries")
    p.add_argument("--level-s", type=float, default=None, help="per-level allowance (s)")
    p.add_argument(
        "--method",
        choices=("events", "analytic", "both"),
        default="events",
        help="events: the full protocol in the simulator; analytic: PondSim's critical-path "
        "recursion over the same tree (no events); both: side by side on the same roots",
    )
    p.add_argument(
        "--edges",
        choices=("model", "redraw"),
        default="model",
        help="analytic edge latencies: the latency model's (as events) or PondSim's per-visit "
        "redraw of 200+U*400 ms",
    )
    p.add_argument(
        "--exchange-loss",
        type=float,
        default=None,
        help="analytic: loss per parent-child exchange (default: from the per-message loss)",
    )
    p.add_argument(
        "--gc-threshold",
        type=int,
        default=0,
        help="generation-0 threshold of the cyclic GC during the queries (0: Python's 700)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="also write the JSON to this file")
    p.add_argument("--progress", action="store_true", help="progress bar on stderr")
    p.set_defaults(func=_main)
