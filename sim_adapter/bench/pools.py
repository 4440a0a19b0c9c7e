"""``flockring bench pools``: SimulatedPool throughput and memory per job.

The load shape of Butt et al. 2006 §5.2: ``--pools`` pools of U[25,225] machines, each driven
by U[25,225] merged job sequences with inter-arrival and duration U[1,17] time units (integer,
so that events tie as in the paper's time units). Butt's sequences hold 100 jobs (about
1.25 x 10^7 jobs for 1000 pools); ``--seq-len`` scales the job count. Each pool flocks to
``--targets`` random other pools (a stand-in for a willing list: this measures the pool model,
not the discovery). Everything runs through one ``ManualRuntime`` (one timer per pool).

Reported: jobs, wall time of loading the traces and of the run, jobs per second of the run,
resident memory added per 10^6 jobs once the traces are loaded (ledger + traces), peak RSS,
the exactly-once check of the ledger, the fraction of jobs that ran in another pool, and the
mean and maximum queue wait in time units.
"""

from __future__ import annotations

import argparse
import gc
import random
from typing import Any

from discovery.pool import JobLedger, SimulatedPool
from overlay.runtime import ManualRuntime
from sim_adapter import bench


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load the pools and job traces, run them to completion; return the figures as a dict."""
    rng = random.Random(args.seed)
    gc.collect()
    base = bench.rss_mib()
    rt = ManualRuntime(seed=args.seed)
    ledger = JobLedger()
    with bench.stopwatch() as load_s:
        pools = [
            SimulatedPool(f"p{i}", rng.randint(25, 225), ledger=ledger, runtime=rt)
            for i in range(args.pools)
        ]
        for p in pools:
            jobs: list[tuple[float, float]] = []
            for _ in range(rng.randint(25, 225)):
                t = 0
                for _ in range(args.seq_len):
                    t += rng.randint(1, 17)
                    jobs.append((float(t), float(rng.randint(1, 17))))
            jobs.sort(key=lambda j: j[0])
            p.load_trace([s for s, _ in jobs], [d for _, d in jobs])
        for p in pools:
            others = rng.sample(range(args.pools - 1), min(args.targets, args.pools - 1))
            p.set_flock_targets([pools[i if i < p.index else i + 1] for i in others])
    gc.collect()
    loaded = bench.rss_mib()
    n = len(ledger)
    with bench.stopwatch() as run_s:
        rt.advance(1e12)
    check = ledger.check()
    start, sub, dur = ledger.start, ledger.submit, ledger.duration
    remote = sum(1 for a, b in zip(ledger.ran_at, ledger.origin, strict=True) if a != b)
    waits = [s - t for s, t in zip(start, sub, strict=True)]
    return {
        "pools": args.pools,
        "machines": sum(p.machines for p in pools),
        "jobs": n,
        "seq_len": args.seq_len,
        "exactly_once": check.exactly_once,
        "flocked_fraction": bench.r(remote / n, 4) if n else 0.0,
        "mean_wait": bench.r(bench.mean(waits)),
        "max_wait": max(waits, default=0.0),
        "virtual_end": max((s + d for s, d in zip(start, dur, strict=True)), default=0.0),
        "load_s": bench.r(load_s(), 2),
        "run_s": bench.r(run_s(), 2),
        "jobs_per_s": round(n / run_s()) if run_s() > 0 else None,
        "rss_per_1e6_jobs_mib": bench.r((loaded - base) / n * 1e6, 1) if n else None,
        "peak_rss_mib": bench.r(bench.peak_rss_mib(), 1),
        "env": bench.environment(),
    }


def _main(args: argparse.Namespace) -> int:
    bench.emit(run(args), args.json, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``pools`` benchmark parser."""
    p = sub.add_parser("pools", help="SimulatedPool throughput (jobs/s) and memory per job")
    p.add_argument("--pools", type=int, default=1000)
    p.add_argument("--seq-len", type=int, default=8, help="jobs per sequence (Butt: 100)")
    p.add_argument("--targets", type=int, default=3, help="flock targets per pool")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="also write the JSON to this file")
    p.set_defaults(func=_main)
