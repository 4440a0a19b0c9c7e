"""``flockring sim butt-1000``: Butt et al. 2006 §5.2 (Figs 6-10) with its baselines.

Theory of operation. Each replicate (seed) builds one transit-stub topology, one set of 1000
pools and one job trace per pool (:mod:`sim_adapter.experiments.butt_1000_model`), then runs
every series of ``--series`` on them: no flocking, the self-organized flock (the real Flock
plug-in over Pastry built by joins with PNS, and over an oracle-built ring), static ``FLOCK_TO``
lists and Epema gateways with their parameters swept. Series are independent, so they run on
the process pool (``--workers``; one series per worker process, so each one's peak RSS is its
own). Outputs, in the paper's terms:

* Fig 6 — CDF of the locality of scheduled jobs: distance from the submitting pool to the
  executing one over the network's diameter (0 for a job run at home);
* Figs 7/8 — total completion time at each pool, without / with flocking;
* Figs 9/10 — average wait in queue at each pool, without / with flocking;
* the same quantities for every baseline (sorted per-pool curves), and a table beside the
  paper's statements (>70% local, >80% within 0.2, >95% within 0.35, none beyond 0.7; average
  wait up to ~3500 units without flocking, under 500 with).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from sim_adapter.experiments import common
from sim_adapter.experiments.butt_1000_model import (
    DEFAULT_SERIES,
    Butt1000Config,
    parse_series,
    run_series,
)

__all__ = ["PAPER_1000", "register", "run"]

#: Butt et al. 2006 §5.2.2 (stated in the text; the figures have no tables)
PAPER_1000: dict[str, Any] = {
    "frac_local": ">0.70",
    "frac_within_0.2": ">0.80",
    "frac_within_0.35": ">0.95",
    "max_locality": "<=0.70",
    "max_pool_mean_wait_none": "~3500 units",
    "max_pool_mean_wait_flocking": "<500 units",
}


def _nth(fn: Callable[[Any], Any], items: Sequence[Any], i: int) -> Any:
    """``fn(items[i])``: lets a list of work items ride the replicate runner, which maps over
    integers (picklable, unlike a lambda)."""
    return fn(items[i])


_LABEL = {
    "none": "no flocking",
    "self-joins": "self-organized, Pastry by joins (PNS)",
    "self-oracle": "self-organized, oracle Pastry ring",
}


def label(name: str) -> str:
    """A readable name for a series."""
    if name in _LABEL:
        return _LABEL[name]
    spec = parse_series(name)
    if spec["kind"] == "static":
        return f"static FLOCK_TO, {spec['k']} {spec['choice']}"
    return f"gateway, {spec['k']} nearest, lists every {spec['period']} u, {spec['slots']} job(s)/u"


def _agg(reps: list[dict[str, Any]], key: str) -> dict[str, float]:
    return common.interval95([float(r[key]) for r in reps])


def _table(doc: dict[str, Any]) -> str:
    k = len(doc["seeds"])
    cols = (
        ("frac_local", "local", 3),
        ("frac_within_0.2", "≤0.2", 3),
        ("frac_within_0.35", "≤0.35", 3),
        ("max_locality", "max loc.", 3),
        ("max_pool_mean_wait", "max pool avg wait", 1),
        ("mean_wait", "mean wait", 1),
        ("completion_max", "last completion", 0),
        ("completion_stdev", "completion stdev", 0),
    )
    lines = [
        f"### butt-1000: {doc['config']['pools']} pools, {k} seed(s) (time in units)",
        "",
        "| series | " + " | ".join(c[1] for c in cols) + " | wall s | CPU s | peak RSS MiB |",
        "|" + "---|" * (len(cols) + 4),
        "| Butt et al. 2006 (text) | >0.70 | >0.80 | >0.95 | ≤0.70 | ~3500 none, <500 "
        "flocking | — | — | — | — | — | — |",
    ]
    for name, a in doc["aggregate"].items():
        cells = [common_cell(a[c[0]], c[2]) for c in cols]
        lines.append(
            f"| {label(name)} | "
            + " | ".join(cells)
            + f" | {common_cell(a['wall_s'], 0)} | {common_cell(a['cpu_s'], 0)}"
            + f" | {common_cell(a['peak_rss_mib'], 0)} |"
        )
    return "\n".join(lines) + "\n"


def common_cell(iv: dict[str, float], nd: int) -> str:
    """``mean ±half`` (or the mean alone for one replicate)."""
    if iv["n"] <= 1:
        return f"{iv['mean']:.{nd}f}"
    return f"{iv['mean']:.{nd}f} ±{(iv['hi'] - iv['lo']) / 2:.{nd}f}"


def _first(doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    for r in doc["replicates"]:
        if r["series"] == name and r["seed"] == doc["seeds"][0]:
            found: dict[str, Any] = r
            return found
    return None


def _figures(doc: dict[str, Any]) -> list[tuple[str, Any]]:
    import numpy as np

    names = list(doc["aggregate"])
    flocking = [n for n in names if n != "none"]
    so = "self-joins" if "self-joins" in names else (flocking[0] if flocking else None)

    def fig6(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        for n in flocking:
            r = _first(doc, n)
            if r is None:
                continue
            h = np.asarray(r["locality_hist"], dtype=float)
            xs = np.concatenate([[0.0], (np.arange(len(h)) + 1) * r["locality_bin"]])
            ys = np.concatenate([[r["frac_local"]], r["frac_local"] + np.cumsum(h) / r["jobs"]])
            style = "-" if n.startswith("self") else ":"
            ax.step(xs, ys, where="post", linestyle=style, label=label(n))
        ax.plot([0.0, 0.2, 0.35, 0.7], [0.70, 0.80, 0.95, 1.0], "k^", label="paper (text bounds)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.01)
        ax.set_xlabel("locality: distance submit -> execute pool / network diameter")
        ax.set_ylabel("fraction of jobs")
        ax.set_title("Fig 6: locality of scheduled jobs (CDF)")
        ax.legend(fontsize=6, loc="lower right")

    def per_pool(key: str, title: str, ylabel: str) -> Any:
        def draw(fig: Any) -> None:
            panels = [("none", "without flocking")] + ([(so, "with flocking")] if so else [])
            top = 0.0
            axes = []
            for i, (n, sub) in enumerate(panels):
                r = _first(doc, n)
                ax = fig.add_subplot(1, len(panels), i + 1)
                axes.append(ax)
                if r is None:
                    continue
                ys = r[key]
                top = max(top, max(ys))
                ax.scatter(range(len(ys)), ys, s=2)
                ax.set_xlabel("pool")
                ax.set_ylabel(ylabel)
                ax.set_title(f"{title} {sub} ({label(n)})", fontsize=7)
            for ax in axes:
                ax.set_ylim(0, top * 1.05 if top else 1)

        return draw

    def sorted_curves(fig: Any) -> None:
        for i, (key, yl) in enumerate(
            (
                ("per_pool_completion", "completion time (units)"),
                ("per_pool_mean_wait", "average wait (units)"),
            )
        ):
            ax = fig.add_subplot(1, 2, i + 1)
            for n in names:
                r = _first(doc, n)
                if r is None:
                    continue
                style = "-" if n.startswith("self") or n == "none" else ":"
                ax.plot(sorted(r[key]), linestyle=style, label=label(n))
            ax.set_yscale("symlog", linthresh=10)
            ax.set_xlabel("pools, sorted")
            ax.set_ylabel(yl)
            if i == 1:
                ax.legend(fontsize=5)
        fig.suptitle("per-pool completion and wait, every series (sorted)")

    return [
        ("-fig6", fig6),
        ("-fig7-8", per_pool("per_pool_completion", "total completion time", "units")),
        ("-fig9-10", per_pool("per_pool_mean_wait", "average wait in queue", "units")),
        ("-baselines", sorted_curves),
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every series of every replicate; write outputs; return the document."""
    cfg = Butt1000Config(pools=args.pools, seq_len=args.seq_len, unit_s=args.unit_s)
    series = [s.strip() for s in args.series.split(",") if s.strip()]
    for s in series:
        parse_series(s)
    seeds = common.seeds_of(args.seed, args.seeds)
    items = [(seed, s) for seed in seeds for s in series]
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    fn = functools.partial(run_series, cfg)
    workers = min(args.workers, len(items))
    executor = None
    if workers > 1 and not args.dask:
        # one series per worker process: its peak RSS is its own, and memory is returned
        executor = ProcessPoolExecutor(max_workers=workers, max_tasks_per_child=1)
    try:
        reps = common.run_replicates(
            functools.partial(_nth, fn, items),
            range(len(items)),
            workers=workers,
            label="butt-1000 series",
            progress=None if not args.json else False,
            executor=executor,
            dask=args.dask,
        )
    finally:
        if executor is not None:
            executor.shutdown()
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()[0]
    keys = (
        "frac_local", "frac_within_0.2", "frac_within_0.35", "frac_within_0.7", "max_locality",
        "mean_locality_flocked", "max_pool_mean_wait", "mean_wait", "max_wait",
        "completion_max", "completion_min", "completion_stdev", "units", "moved",
        "wall_s", "cpu_s", "peak_rss_mib",
    )  # fmt: skip
    agg = {s: {k: _agg([r for r in reps if r["series"] == s], k) for k in keys} for s in series}
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    kids_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    doc: dict[str, Any] = {
        "experiment": "butt-1000",
        "source": "Butt et al. 2006 §5.2, Figs 6-10; Butt et al. 2003 §5",
        "config": cfg.as_dict(),
        "series": series,
        "seeds": seeds,
        "wall_s": round(wall, 1),
        "peak_rss_mib": {"main": round(self_rss, 1), "largest_worker": round(kids_rss, 1)},
        # the machine is shared: the 1-minute load average before and after says how much of
        # the wall time was waiting for a core (compare with the series' CPU seconds)
        "load_avg_1min": [round(load0, 2), round(load1, 2)],
        "cpu_s_total": round(sum(float(r["cpu_s"]) for r in reps), 1),
        "paper": PAPER_1000,
        "aggregate": agg,
        "replicates": reps,
    }
    md = _table(doc)
    cmd = f"flockring sim butt-1000 --seeds {args.seeds} --seed {args.seed}"
    if args.pools != 1000 or args.seq_len != 100:
        cmd += f" --pools {args.pools} --seq-len {args.seq_len}"
    if args.series != ",".join(DEFAULT_SERIES):
        cmd += f" --series {args.series}"
    md += (
        f"\nCommand: `{cmd} --workers {args.workers}`; wall time {wall:.0f} s; peak RSS "
        f"{kids_rss:.0f} MiB (largest worker), {self_rss:.0f} MiB (main); CPU time of all "
        f"series {doc['cpu_s_total']:.0f} s; 1-minute load average {load0:.1f} at the start, "
        f"{load1:.1f} at the end ({os.cpu_count()} cores).\n"
    )
    doc["files"] = [
        str(p) for p in common.write_outputs(args.out, "butt-1000", doc, md, _figures(doc))
    ]
    return doc


def _main(args: argparse.Namespace) -> int:
    doc = run(args)
    if args.json:
        print(json.dumps({k: v for k, v in doc.items() if k != "replicates"}, indent=1))
    else:
        print(_table(doc))
        print(f"wall {doc['wall_s']} s; wrote {', '.join(doc['files'])}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``butt-1000``."""
    p = sub.add_parser(
        "butt-1000", help="Butt et al. 2006 Figs 6-10: 1000 pools, self-organized vs baselines"
    )
    common.add_common_args(p)
    p.add_argument("--pools", type=int, default=1000, help="pools (= stub routers)")
    p.add_argument("--seq-len", type=int, default=100, help="jobs per sequence (paper: 100)")
    p.add_argument("--unit-s", type=float, default=10.0, help="virtual seconds per time unit")
    p.add_argument(
        "--series",
        default=",".join(DEFAULT_SERIES),
        help="comma list: none, self-joins, self-oracle, static-<nearest|random>-K, "
        "gateway-K-PERIOD-SLOTS",
    )
    p.set_defaults(func=_main)
