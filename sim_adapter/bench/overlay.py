"""The overlay routing benchmark shared by ``flockring bench pastry`` and ``... smallworld``.

Phases: build (real joins or oracle) → a quiet period with no traffic (maintenance msg/s/node)
→ M lookups from random live nodes to random keys, launched in batches, each checked against
the brute-force oracle ``closest_live`` (correct fraction), with hops, route stretch (RDP =
overlay path latency / direct one-way latency from source to the answering node) and routing
messages per lookup (RouteMsg + per-hop RouteAck datagrams + custody notices, HandedOff;
maintenance is reported apart).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from overlay.errors import ConfigError
from overlay.ids import NodeId
from sim_adapter import bench
from sim_adapter.network import Network

ROUTING_TYPES = ("RouteMsg", "RouteAck", "HandedOff")


def add_common_arguments(p: argparse.ArgumentParser, default_nodes: int) -> None:
    """Add the options shared by the Pastry and small-world benchmarks (size, lookups, build,
    latency, loss, quiet period, seed, output)."""
    p.add_argument("--nodes", type=int, default=default_nodes, help="number of nodes N")
    p.add_argument("--lookups", type=int, default=2000, help="number of lookups M")
    p.add_argument("--build", choices=("joins", "oracle"), default="joins")
    p.add_argument(
        "--latency",
        default="uniform",
        help="latency model: uniform, sphere, transit-stub, pondsim, matrix:PATH",
    )
    p.add_argument("--loss", type=float, default=0.0, help="message loss rate in [0, 1)")
    p.add_argument(
        "--join-interval-s",
        type=float,
        default=None,
        help="overlapping joins, one every S virtual seconds (default: one at a time)",
    )
    p.add_argument("--quiet-s", type=float, default=3600.0, help="quiet period (virtual s)")
    p.add_argument(
        "--no-maintenance",
        action="store_true",
        help="static ring: overlay maintenance off (as PondSim measures; small-world only)",
    )
    p.add_argument("--batch", type=int, default=1000, help="lookups launched at once")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="also write the JSON to this file")
    p.add_argument("--progress", action="store_true", help="progress bar on stderr")


def make_latency(spec: str, seed: int) -> Any:
    """The latency model named by ``spec`` (``matrix:PATH`` loads a matrix file)."""
    from sim_adapter import latency

    if spec.startswith("matrix:"):
        return latency.Matrix.from_file(spec.split(":", 1)[1])
    return latency.by_name(spec, seed=seed)


def _config(args: argparse.Namespace, overlay: str) -> Any:
    """The overlay config: the default, or with maintenance off for a static-ring run."""
    if not args.no_maintenance:
        return None
    if overlay != "smallworld":
        raise ConfigError(f"--no-maintenance is supported for smallworld only, not {overlay}")
    from overlay.smallworld import SmallWorldConfig

    return SmallWorldConfig(maintenance_enabled=False)


def run_overlay(args: argparse.Namespace, overlay: str) -> dict[str, Any]:
    """Build ``overlay`` (``pastry`` or ``smallworld``), idle, then run the oracle-checked lookups;
    return the figures as a dict."""
    config = _config(args, overlay)
    lat = make_latency(args.latency, args.seed)
    net = Network(seed=args.seed, latency=lat, loss=args.loss)
    res: dict[str, Any] = {
        "bench": overlay,
        "nodes": args.nodes,
        "build": args.build,
        "latency": args.latency,
        "loss": args.loss,
        "join_interval_s": args.join_interval_s,
        "maintenance": not args.no_maintenance,
        "seed": args.seed,
        **bench.environment(),
    }
    rss0 = bench.rss_mib()
    prog = bench.Progress(f"build {overlay}", args.progress or None)
    with bench.stopwatch() as t_build:
        net.spawn(
            args.nodes,
            overlay=overlay,
            build=args.build,
            progress=prog,
            join_interval_s=args.join_interval_s,
            config=config,
        )
    res["build_wall_s"] = bench.r(t_build(), 2)
    res["build_virtual_s"] = bench.r(net.now, 1)
    res["build_messages"] = net.message_count
    res["build_messages_per_node"] = bench.r(net.message_count / max(1, args.nodes), 1)
    res["rss_after_build_mib"] = bench.r(bench.rss_mib(), 1)
    res["rss_per_node_kib"] = bench.r((bench.rss_mib() - rss0) * 1024 / max(1, args.nodes), 2)
    not_ready = sum(1 for n in net.nodes if not n.core.ready)
    res["not_ready_after_build"] = not_ready

    # quiet period: maintenance only
    if args.quiet_s > 0:
        m0 = net.message_count
        with bench.stopwatch() as t_quiet:
            net.run(args.quiet_s)
        live = len(net.live_nodes())
        res["quiet_virtual_s"] = args.quiet_s
        res["quiet_wall_s"] = bench.r(t_quiet(), 2)
        res["maintenance_msgs_per_s_per_node"] = bench.r(
            (net.message_count - m0) / args.quiet_s / max(1, live), 4
        )

    # lookups
    rng = net.rng
    live_nodes = net.live_nodes()
    hops: list[float] = []
    rdp: list[float] = []
    lat_s: list[float] = []
    correct = delivered = 0
    routing0 = sum(net.msg_by_type[t] for t in ROUTING_TYPES)
    all0 = net.message_count
    prog = bench.Progress("lookups", args.progress or None)
    with bench.stopwatch() as t_look:
        done = 0
        while done < args.lookups:
            k = min(args.batch, args.lookups - done)
            pairs = [(rng.choice(live_nodes), NodeId.random(rng)) for _ in range(k)]
            results = net.lookup_many(pairs)
            for (src, key), lk in zip(pairs, results, strict=True):
                if lk.result is None:
                    continue
                delivered += 1
                if lk.result == net.closest_live(key):
                    correct += 1
                hops.append(lk.hops)
                lat_s.append(lk.latency_s)
                dst = net.node_by_id(lk.result)
                if dst is not src:
                    direct = lat.one_way_s(src.index, dst.index)
                    if direct > 0:
                        rdp.append(lk.latency_s / direct)
            done += k
            prog(done, args.lookups)
    m = args.lookups
    routing = sum(net.msg_by_type[t] for t in ROUTING_TYPES) - routing0
    res.update(
        {
            "lookups": m,
            "lookup_wall_s": bench.r(t_look(), 2),
            "lookup_wall_us_each": bench.r(t_look() / max(1, m) * 1e6, 1),
            "delivered_fraction": bench.r(delivered / max(1, m), 5),
            "correct_fraction": bench.r(correct / max(1, m), 5),
            "hops_mean": bench.r(bench.mean(hops), 3),
            "hops_p99": bench.r(bench.percentile(hops, 99), 1),
            "hops_max": max(hops) if hops else None,
            "log16_n": bench.r(math.log(max(2, args.nodes), 16), 3),
            "lookup_latency_ms_p50": bench.r(bench.percentile(lat_s, 50) * 1e3, 1),
            "lookup_latency_ms_p95": bench.r(bench.percentile(lat_s, 95) * 1e3, 1),
            "rdp_mean": bench.r(bench.mean(rdp), 3),
            "rdp_p50": bench.r(bench.percentile(rdp, 50), 3),
            "routing_msgs_per_lookup": bench.r(routing / max(1, m), 2),
            "all_msgs_per_lookup": bench.r((net.message_count - all0) / max(1, m), 2),
            "peak_rss_mib": bench.r(bench.peak_rss_mib(), 1),
            "events": net.engine.events,
            "dropped_loss": net.dropped_loss,
        }
    )
    return res
