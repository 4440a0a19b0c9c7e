"""``flockring bench failover``: faultD failover and preemption times vs the alive period.

For each alive period of the sweep and each trial (its own seed): build a pool ring of N nodes
by real joins, attach failover everywhere (node 0 the original), wait until it serves and
everyone agrees, commit a few states, measure the **steady-state traffic** over ten alive
periods (all messages, and the failover part: the alive multicast and the state pushes), then
crash the manager at a random phase of its alive cycle and measure the **failover time**
(crash → a replacement serves; crash → every live listener knows it), restart the original
and measure the **preemption time** (restart → the original serves again; → everyone knows).
Every run is checked: exactly one manager at the end and the last committed state survived;
the invariant observer runs after every event. Virtual time; nothing is asserted, the bounds
of ``sim_adapter.plugins.failover`` are reported next to the figures.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from discovery.failover import FailoverConfig
from sim_adapter import bench
from sim_adapter.latency import Uniform
from sim_adapter.network import Network
from sim_adapter.plugins.failover import (
    FailoverPool,
    failover_bound_s,
    observe,
    preempt_bound_s,
)

#: message classes of the alive multicast and of replication (steady-state failover traffic)
FAILOVER_TYPES = (
    "McQuery",
    "McAck",
    "McReply",
    "McReplyAck",
    "Alive",
    "StatePush",
    "StateAck",
)


def _trial(args: argparse.Namespace, period: float, seed: int) -> dict[str, Any]:
    net = Network(
        seed=seed,
        latency=Uniform(args.lat_lo_ms / 1000.0, args.lat_hi_ms / 1000.0, seed=seed),
        loss=args.loss,
    )
    observe(net)
    nodes = net.spawn(args.nodes, overlay=args.overlay, join_interval_s=0.5)
    cfg = FailoverConfig(alive_period_s=period)
    pool = FailoverPool(net, nodes, original=nodes[0], config=cfg)
    pool.start()
    t_boot = pool.run_until(pool.agreed, 600.0)
    out: dict[str, Any] = {"seed": seed, "bootstrap_s": t_boot}
    committed: list[int] = []
    m = pool.the_manager()
    if m is None:
        out["error"] = "no manager after bootstrap"
        return out

    def record(k: int) -> Callable[[bool], None]:
        return lambda ok: committed.append(k) if ok else None

    for k in range(3):
        m[1].commit(b"v%06d" % k, record(k))
    net.run(max(5.0, period))
    # steady state: ten alive periods (at least 60 s) of an undisturbed pool
    quiet = max(60.0, 10 * period)
    before = Counter(net.msg_by_type)
    n0 = net.message_count
    net.run(quiet)
    delta = net.msg_by_type - before
    per = quiet * args.nodes
    out["msgs_per_s_node_total"] = (net.message_count - n0) / per
    out["msgs_per_s_node_failover"] = sum(delta[t] for t in FAILOVER_TYPES) / per
    # crash at a random phase of the alive cycle
    rng = random.Random(seed * 7919)
    net.run(rng.random() * period)
    old, _ = pool.the_manager() or (None, None)
    if old is None:
        out["error"] = "no single manager before the crash"
        return out
    pool.crash(old)
    t0 = net.now
    bound = failover_bound_s(cfg)
    out["failover_bound_s"] = bound
    out["failover_serving_s"] = pool.run_until(
        lambda: any(n.id != old.id for n, _ in pool.serving()), 3 * bound, step_s=0.05
    )
    out["failover_agreed_s"] = (net.now - t0) + pool.run_until(pool.agreed, 3 * bound, 0.05)
    new = pool.the_manager()
    out["state_kept"] = bool(new and new[1].state == b"v%06d" % max(committed, default=0))
    # restart the original once the takeover has settled (reports in flight are delivered)
    net.run(2 * cfg.detection_s)
    back = pool.restart(old)
    t1 = net.now
    pbound = preempt_bound_s(cfg)
    out["preempt_bound_s"] = pbound
    out["preempt_serving_s"] = pool.run_until(
        lambda: pool.app(back).is_manager, 3 * pbound, step_s=0.05
    )
    out["preempt_agreed_s"] = (net.now - t1) + pool.run_until(
        lambda: pool.agreed() and pool.app(back).is_manager, 3 * pbound, 0.05
    )
    fin = pool.the_manager()
    out["preempt_state_kept"] = bool(fin and fin[1].state == b"v%06d" % max(committed, default=0))
    out["violations"] = len(pool.violations)
    out["checks"] = pool.checks
    return out


def _summary(xs: list[float]) -> dict[str, float]:
    ok = [x for x in xs if x == x]
    return {
        "mean": bench.r(bench.mean(ok)),
        "p50": bench.r(bench.percentile(ok, 50)),
        "max": bench.r(max(ok) if ok else float("nan")),
        "missed": len(xs) - len(ok),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the sweep; returns the JSON document."""
    periods = [float(x) for x in str(args.periods).split(",") if x]
    rows = []
    with bench.stopwatch() as elapsed:
        for period in periods:
            trials = [_trial(args, period, args.seed + i) for i in range(args.trials)]
            good = [t for t in trials if "error" not in t]
            cfg = FailoverConfig(alive_period_s=period)
            rows.append(
                {
                    "alive_period_s": period,
                    "detection_s": cfg.detection_s,
                    "failover_bound_s": bench.r(failover_bound_s(cfg)),
                    "failover_serving_s": _summary([t["failover_serving_s"] for t in good]),
                    "failover_agreed_s": _summary([t["failover_agreed_s"] for t in good]),
                    "preempt_bound_s": bench.r(preempt_bound_s(cfg)),
                    "preempt_serving_s": _summary([t["preempt_serving_s"] for t in good]),
                    "preempt_agreed_s": _summary([t["preempt_agreed_s"] for t in good]),
                    "msgs_per_s_node_total": bench.r(
                        bench.mean([t["msgs_per_s_node_total"] for t in good]), 4
                    ),
                    "msgs_per_s_node_failover": bench.r(
                        bench.mean([t["msgs_per_s_node_failover"] for t in good]), 4
                    ),
                    "state_kept": sum(bool(t["state_kept"]) for t in good),
                    "preempt_state_kept": sum(bool(t["preempt_state_kept"]) for t in good),
                    "invariant_violations": sum(int(t["violations"]) for t in good),
                    "invariant_checks": sum(int(t["checks"]) for t in good),
                    "trials": len(trials),
                    "errors": [t["error"] for t in trials if "error" in t],
                }
            )
    return {
        "bench": "failover",
        "overlay": args.overlay,
        "nodes": args.nodes,
        "loss": args.loss,
        "latency_ms": [args.lat_lo_ms, args.lat_hi_ms],
        "sweep": rows,
        "wall_s": bench.r(elapsed()),
        "peak_rss_mib": bench.r(bench.peak_rss_mib(), 1),
        "env": bench.environment(),
    }


def _main(args: argparse.Namespace) -> int:
    bench.emit(run(args), args.json, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``failover`` bench parser."""
    p = sub.add_parser(
        "failover", help="faultD: failover and preemption time vs alive period, msg/s/node"
    )
    p.add_argument("--nodes", type=int, default=30, help="pool ring size N")
    p.add_argument("--overlay", choices=("pastry", "smallworld"), default="pastry")
    p.add_argument("--periods", default="2,5,10,20", help="alive periods to sweep, seconds")
    p.add_argument("--trials", type=int, default=5, help="crash/restart runs per period")
    p.add_argument("--loss", type=float, default=0.0, help="message loss rate in [0, 1)")
    p.add_argument("--lat-lo-ms", type=float, default=10.0, help="one-way latency, low end")
    p.add_argument("--lat-hi-ms", type=float, default=50.0, help="one-way latency, high end")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="also write the JSON to this file")
    p.set_defaults(func=_main)
