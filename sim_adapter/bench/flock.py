"""``flockring bench flock``: the self-organizing flock on a simulated ring of pools.

Set-up (Butt et al. 2006 §5.2.1): ``--pools`` central managers on a static ring (oracle build)
over ``--latency`` (default the GT-ITM-like transit-stub model), each with U[25, 225] machines
of which U[1, machines] are free, so every pool announces (the most traffic a round can cause).
Two announcement rounds run back to back: the first also probes every newly heard origin; the
second is the steady state (RTTs known), which is what one announcement period costs.

Reported: announcement messages per pool per period (sent by origins and forwarded, round 2),
probe messages of round 1, willing-list size per sublist (mean entries per pool), mean probed
RTT of sublist i (Butt §3.2.1: sublist i+1 is "exponentially" farther than sublist i), wall
time of each round and of one Flocking Manager pass over every pool, resident memory. Nothing
here is asserted; see ``tests/test_flock_network.py`` for the oracle checks.
"""

from __future__ import annotations

import argparse
import gc
from typing import Any

from discovery.announce import FlockConfig
from sim_adapter import bench
from sim_adapter.bench.overlay import make_latency
from sim_adapter.network import Network
from sim_adapter.plugins.flock import FixedPool, FlockSim, spawn_signed


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the two announcement rounds and a manager pass; return the figures as a dict."""
    gc.collect()
    rss0 = bench.rss_mib()
    lat = make_latency(args.latency, args.seed)
    net = Network(seed=args.seed, latency=lat)
    res: dict[str, Any] = {
        "bench": "flock",
        "pools": args.pools,
        "overlay": args.overlay,
        "latency": args.latency,
        "ttl": args.ttl,
        "signed": args.signed,
        "seed": args.seed,
        **bench.environment(),
    }
    with bench.stopwatch() as t_build:
        if args.signed:
            nodes, idents = spawn_signed(net, args.pools, overlay=args.overlay)
        else:
            nodes = net.spawn(args.pools, overlay=args.overlay, build="oracle")
            idents = None
    res["build_wall_s"] = bench.r(t_build(), 2)
    gc.collect()
    rss_built = bench.rss_mib()
    res["rss_ring_mib"] = bench.r(rss_built - rss0, 1)
    rng = net.rng
    pools: dict[int, FixedPool] = {}
    for x in nodes:
        m = rng.randint(25, 225)
        pools[x.index] = FixedPool(m, rng.randint(1, m))
    cfg = FlockConfig(ttl=args.ttl, max_ttl=max(4, args.ttl), require_signatures=args.signed)
    sim = FlockSim(net, pools, cfg, identities=idents)
    res["announce_period_s"] = cfg.announce_period_s
    res["validity_s"] = cfg.validity_s
    res["rtt_tolerance_s"] = cfg.rtt_tolerance_s

    rounds = []
    for i in range(2):
        by0 = net.msg_by_type
        sent0 = sum(f.stats["sent"] for f in sim.flocks.values())
        with bench.stopwatch() as t_round:
            total = sim.round(args.settle_s)
        by1 = net.msg_by_type
        sent = sum(f.stats["sent"] for f in sim.flocks.values()) - sent0
        probes = (by1["Ping"] - by0["Ping"]) + (by1["Pong"] - by0["Pong"])
        rounds.append(
            {
                "round": i + 1,
                "wall_s": bench.r(t_round(), 3),
                "announce_msgs_per_pool": bench.r(total / args.pools, 2),
                "sent_by_origin_per_pool": bench.r(sent / args.pools, 2),
                "forwarded_per_pool": bench.r((total - sent) / args.pools, 2),
                "probe_msgs_per_pool": bench.r(probes / args.pools, 2),
            }
        )
    res["rounds"] = rounds
    res["announce_msgs_per_pool_per_period"] = rounds[1]["announce_msgs_per_pool"]
    res["round_wall_s"] = rounds[1]["wall_s"]

    sizes: dict[int, int] = {}
    rtts: dict[int, list[float]] = {}
    total_entries = 0
    for x in nodes:
        for r, sub in enumerate(sim[x].willing_list()):
            sizes[r] = sizes.get(r, 0) + len(sub)
            rtts.setdefault(r, []).extend(e.rtt_s for e in sub if e.rtt_s is not None)
            total_entries += len(sub)
    rows = sorted(sizes)
    res["willing_list_size_mean"] = bench.r(total_entries / args.pools, 2)
    res["willing_list_size_per_row"] = [bench.r(sizes[r] / args.pools, 2) for r in rows]
    res["mean_rtt_ms_per_row"] = [bench.r(bench.mean(rtts[r]) * 1e3, 2) for r in rows]
    res["unprobed_entries"] = sum(
        1 for x in nodes for e in sim[x].willing_entries() if e.rtt_s is None
    )
    rejected = ("forged", "tampered", "unsigned", "replayed", "expired", "malformed")
    res["rejected"] = {k: sum(f.stats[k] for f in sim.flocks.values()) for k in rejected}

    # one Flocking Manager pass with a random half of the pools overloaded
    for p in pools.values():
        if rng.random() < 0.5:
            p.idle_jobs = p.free_machines + rng.randint(1, 50)
    with bench.stopwatch() as t_dec:
        decisions = sim.decide_all()
    on = [d for d in decisions.values() if d.enabled]
    res["manager_pass_wall_s"] = bench.r(t_dec(), 3)
    res["flocking_pools"] = len(on)
    res["targets_per_flocking_pool"] = bench.r(bench.mean([len(d.targets) for d in on]), 2)
    res["rss_mib"] = bench.r(bench.rss_mib(), 1)
    gc.collect()
    res["rss_flock_mib"] = bench.r(bench.rss_mib() - rss_built, 1)
    res["rss_flock_kib_per_pool"] = bench.r((bench.rss_mib() - rss_built) * 1024 / args.pools, 1)
    res["peak_rss_mib"] = bench.r(bench.peak_rss_mib(), 1)
    res["events"] = net.engine.events
    return res


def _main(args: argparse.Namespace) -> int:
    bench.emit(run(args), args.json, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``flock`` benchmark parser."""
    p = sub.add_parser(
        "flock", help="self-organizing flock: announcements, willing lists, manager pass"
    )
    p.add_argument("--pools", type=int, default=1000, help="number of pools (ring nodes)")
    p.add_argument("--overlay", choices=("pastry", "smallworld"), default="pastry")
    p.add_argument(
        "--latency",
        default="transit-stub",
        help="latency model: uniform, sphere, transit-stub, pondsim, matrix:PATH",
    )
    p.add_argument("--ttl", type=int, default=1, help="announcement TTL (paper: 1)")
    p.add_argument("--signed", action="store_true", help="sign and verify (Ed25519) as live")
    p.add_argument(
        "--settle-s", type=float, default=5.0, help="virtual seconds each round runs after sending"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="also write the JSON to this file")
    p.set_defaults(func=_main)
