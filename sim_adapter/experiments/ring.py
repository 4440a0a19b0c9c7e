"""``flockring sim ring``: build a simulated ring by real joins, route, crash, route again.

A readable tour of the overlay in virtual time: what a user sees first (``make demo`` runs it
until the live demo is available). Every lookup is checked against the brute-force oracle.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from overlay.ids import NodeId
from sim_adapter import bench
from sim_adapter.network import Network


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build a ring by real joins, check lookups against the oracle, crash 20 %, check again."""
    from sim_adapter import latency

    lat = latency.by_name(args.latency, seed=args.seed)
    net = Network(seed=args.seed, latency=lat, loss=args.loss)
    say = print if not args.json else (lambda *a, **k: None)
    say(f"building a {args.overlay} ring of {args.nodes} nodes by real joins ({lat.name} latency)")
    with bench.stopwatch() as t:
        net.spawn(args.nodes, overlay=args.overlay, progress=bench.Progress("joins"))
    say(
        f"  {args.nodes} nodes ready after {net.now:.0f} virtual s ({t():.1f} s wall), "
        f"{net.message_count} messages"
    )

    def check(label: str) -> dict[str, Any]:
        live = net.live_nodes()
        pairs = [(net.rng.choice(live), NodeId.random(net.rng)) for _ in range(args.lookups)]
        res = net.lookup_many(pairs, timeout_s=120)
        ok = sum(r.result == net.closest_live(k) for (_, k), r in zip(pairs, res, strict=True))
        hops = [r.hops for r in res if r.result is not None]
        ms = [r.latency_s * 1e3 for r in res if r.result is not None]
        row = {
            "phase": label,
            "live": len(live),
            "correct": ok,
            "lookups": len(pairs),
            "hops_mean": round(bench.mean(hops), 2),
            "latency_ms_p50": round(bench.percentile(ms, 50), 1),
        }
        say(
            f"  {label:<22} {ok}/{len(pairs)} lookups reached the numerically closest live "
            f"node; mean {row['hops_mean']} hops (log16 N = {math.log(len(live), 16):.2f}), "
            f"p50 {row['latency_ms_p50']} ms"
        )
        return row

    rows = [check("steady state")]
    victims = net.rng.sample(net.live_nodes(), int(len(net.nodes) * args.crash))
    net.crash(victims)
    say(f"crashing {len(victims)} nodes ({args.crash:.0%}) at once; repairing for 60 virtual s")
    net.run(60.0)
    rows.append(check("after crash + 60 s"))
    return {"overlay": args.overlay, "nodes": args.nodes, "phases": rows}


def _main(args: argparse.Namespace) -> int:
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``flockring sim ring``."""
    p = sub.add_parser("ring", help="build a ring by joins, route, crash 20%%, route again")
    p.add_argument("--overlay", choices=("pastry", "smallworld"), default="pastry")
    p.add_argument("--nodes", type=int, default=300)
    p.add_argument("--lookups", type=int, default=500)
    p.add_argument("--crash", type=float, default=0.2, help="fraction crashed at once")
    p.add_argument("--latency", default="transit-stub")
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_main)
