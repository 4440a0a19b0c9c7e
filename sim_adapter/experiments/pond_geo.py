"""``flockring sim pond-geo``: C-PonD with geographic requirements on 440 churning nodes
(PonD §4.4, Fig. 9).

Theory of operation: the model is :mod:`.pond_geo_model`. Each replicate (seed) places the nodes,
draws churn and jobs, and runs the four request phases. It reports, per phase, the jobs, the
task waits and where the runs went (by continent), and samples every ``sample_s`` the
available (up and in no pond) nodes per continent and the running tasks — the two curves of
PonD Fig. 9 (the figure plots the first replicate). Every replicate checks, by brute force,
that each task completed exactly once and that *every* run — evicted ones too — was on a node
inside the job's region (its coordinates against the region's box) that satisfies the task's
ad (``classad2``) and carried the task's pond stamp; a failed check aborts the run.

Waits under churn (:func:`wait_parts`). A task whose machine fails restarts from scratch (no
checkpoints, as a vanilla-universe HTCondor job), so the time from its submission to the start
of the run that completed it (the *time to final start*) holds two different things: the time
it sat idle in the queue, eligible to start — what discovery and the pond scheduler are
responsible for, the **queue wait** — and the time lost to evictions (the evicted runs, plus
``detect_s`` each before the shadow notices and re-queues the task). The two add up exactly to
the time to final start; both are reported per phase, with the evicted runs and the lost time.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from collections import Counter, defaultdict
from typing import Any, NamedTuple

from discovery.classads import MATCH, JobAd, evaluate
from sim_adapter.bench import peak_rss_mib
from sim_adapter.experiments import common
from sim_adapter.experiments.pond_geo_model import (
    PHASES,
    REGIONS,
    GeoConfig,
    GeoRun,
    in_region,
    simulate_geo,
)
from sim_adapter.experiments.pond_queue import Run

__all__ = ["NAME", "WaitParts", "check_run", "register", "replicate", "run", "wait_parts"]

NAME = "pond-geo"

PAPER = (
    "440 PlanetLab nodes, 65 hours; in Req.2/3/4 jobs ran on America/Europe/Asia nodes "
    "respectively; 'flawless operation' of pond creation and job execution; more running jobs "
    "than claimed machines because multi-core nodes ran one job per core"
)


def check_run(g: GeoRun) -> dict[str, int]:
    """Brute-force checks (module docstring); raises AssertionError on a violation."""
    log = g.log
    done = Counter(r.task_id for r in log.runs if r.end_s is not None and not r.evicted)
    bad = [t for t in log.tasks if done.get(t, 0) != 1]
    if bad:
        raise AssertionError(f"{len(bad)} tasks did not complete exactly once, e.g. {bad[:5]}")
    cache: dict[tuple[str, int], bool] = {}
    outside = 0
    for r in log.runs:
        task = log.tasks[r.task_id]
        ad = g.ads[r.machine]
        if task.region and not in_region(
            float(ad["Latitude"]), float(ad["Longitude"]), task.region
        ):
            outside += 1
        key = (task.ad, r.machine)
        if key not in cache:
            cache[key] = evaluate(JobAd.from_text(task.ad), ad)[0] == MATCH
        if not cache[key]:
            raise AssertionError(f"task {r.task_id} ran on node {r.machine}, which rejects it")
        if not r.pond_job_id or r.stamp != r.pond_job_id:
            raise AssertionError(f"task {r.task_id} started on a node not stamped for its pond")
    if outside:
        raise AssertionError(f"{outside} runs outside their job's region")
    return {"tasks": len(log.tasks), "runs": len(log.runs), "outside_region": outside}


class WaitParts(NamedTuple):
    """One task's waits (module docstring): ``final_start_s = queue_s + lost_s``."""

    final_start_s: float  #: submission to the start of the run that completed the task
    queue_s: float  #: time idle in the queue, eligible to start (submission or re-queue to a start)
    lost_s: float  #: evicted runs' durations plus ``detect_s`` per eviction
    evictions: int


def wait_parts(g: GeoRun, detect_s: float) -> dict[int, WaitParts]:
    """Every completed task's :class:`WaitParts`, from the run log by brute force."""
    runs: dict[int, list[Run]] = defaultdict(list)
    for r in g.log.runs:
        runs[r.task_id].append(r)
    out = {}
    for tid, task in g.log.tasks.items():
        ready = task.submit_s
        queue = lost = 0.0
        ev = 0
        final = None
        for r in sorted(runs.get(tid, ()), key=lambda r: r.start_s):
            queue += r.start_s - ready
            if r.evicted:
                end = r.end_s if r.end_s is not None else r.start_s
                lost += end - r.start_s + detect_s
                ready = end + detect_s
                ev += 1
            elif r.end_s is not None:
                final = r.start_s
        if final is not None:
            out[tid] = WaitParts(final - task.submit_s, queue, lost, ev)
    return out


def replicate(cfg: GeoConfig, seed: int) -> dict[str, Any]:
    """One seed: the whole four-phase run, its checks, per-phase figures and the samples."""
    t0 = time.perf_counter()
    g = simulate_geo(cfg, seed)
    checks = check_run(g)
    waits = g.log.waits()
    parts = wait_parts(g, cfg.detect_s)
    done = g.log.completed()
    phases = []
    for p, (label, region) in enumerate(PHASES):
        lo, hi = p * cfg.phase_s, (p + 1) * cfg.phase_s
        tids = [t for t, s in g.log.tasks.items() if lo <= s.submit_s < hi]
        where: Counter[str] = Counter(str(g.ads[done[t].machine]["Continent"]) for t in tids)
        w = [waits[t] for t in tids]
        wp = [parts[t] for t in tids]
        phases.append(
            {
                "phase": label,
                "region": region,
                "jobs": len({g.log.tasks[t].job_id for t in tids}),
                "tasks": len(tids),
                # time to final start (the measure the first runs reported as "task wait")
                "task_wait_s": common.summary(w),
                "queue_wait_s": common.summary([x.queue_s for x in wp]),
                "lost_s": sum(x.lost_s for x in wp),
                "evicted_runs": sum(x.evictions for x in wp),
                "evicted_tasks": sum(1 for x in wp if x.evictions),
                "max_runtime_s": max((g.log.tasks[t].duration_s for t in tids), default=0.0),
                "runs_by_continent": dict(where),
            }
        )
    return {
        "seed": seed,
        "checks": checks,
        "phases": phases,
        "failures": g.failures,
        "restarts": g.restarts,
        "counters": g.counters,
        "end_s": g.end_s,
        "samples": g.samples,
        "wall_s": round(time.perf_counter() - t0, 2),
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }


def aggregate(cfg: GeoConfig, reps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per phase: jobs, wait and share of runs per continent, mean ± 95% over replicates."""
    conts = [c for c, _ in cfg.nodes]
    rows = []
    for p, (label, region) in enumerate(PHASES):
        pr = [r["phases"][p] for r in reps]
        share = defaultdict(list)
        for x in pr:
            tot = sum(x["runs_by_continent"].values()) or 1
            for c in conts:
                share[c].append(x["runs_by_continent"].get(c, 0) / tot)
        avail = defaultdict(list)
        for r in reps:
            for s in r["samples"]:
                if p * cfg.phase_s <= s["t"] < (p + 1) * cfg.phase_s:
                    for c in conts:
                        avail[c].append(s[c]["available"])
        rows.append(
            {
                "phase": label,
                "region": region,
                "jobs": common.interval95([float(x["jobs"]) for x in pr]),
                "task_wait_s": common.interval95(
                    [x["task_wait_s"]["mean"] for x in pr if x["tasks"]]
                ),
                "task_wait_max_s": max(
                    (x["task_wait_s"]["max"] for x in pr if x["tasks"]), default=math.nan
                ),
                "queue_wait_s": common.interval95(
                    [x["queue_wait_s"]["mean"] for x in pr if x["tasks"]]
                ),
                "queue_wait_max_s": max(
                    (x["queue_wait_s"]["max"] for x in pr if x["tasks"]), default=math.nan
                ),
                "evicted_runs": common.interval95([float(x["evicted_runs"]) for x in pr]),
                "lost_h": common.interval95([x["lost_s"] / 3600 for x in pr]),
                "max_runtime_h": max(x["max_runtime_s"] for x in pr) / 3600,
                "share": {c: common.interval95(share[c]) for c in conts},
                "available_mean": {
                    c: sum(avail[c]) / len(avail[c]) if avail[c] else math.nan for c in conts
                },
            }
        )
    return rows


_c = common.fmt_interval


def _num(x: float | None, nd: int = 1) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.{nd}f}"


def markdown(cfg: GeoConfig, rows: list[dict[str, Any]], reps: list[dict[str, Any]]) -> str:
    """Per-phase table and the run's totals."""
    conts = [c for c, _ in cfg.nodes]
    lines = [
        f"### {NAME} — Fig. 9: per request phase, ours over {len(reps)} seed(s)",
        "",
        "Queue wait: time a task sat idle in the queue, eligible to start; time to final start: "
        "submission to the start of the run that completed it (queue wait plus the time lost to "
        "evictions). Means over seeds (± 95 % half-interval); maxima over every task of every "
        "seed.",
        "",
        "| phase | jobs | queue wait mean (s) | queue wait max (s) | to final start mean (s) | "
        "to final start max (s) | evicted runs | run time lost (h) | longest task (h) | "
        + " | ".join(f"runs in {c}" for c in conts)
        + " | "
        + " | ".join(f"available {c} (mean)" for c in conts)
        + " |",
        "|" + "---|" * (8 + 2 * len(conts)),
    ]
    for r in rows:
        lines.append(
            f"| {r['phase']} | {_c(r['jobs'], 0)} | {_c(r['queue_wait_s'])} | "
            f"{_num(r['queue_wait_max_s'], 0)} | {_c(r['task_wait_s'])} | "
            f"{_num(r['task_wait_max_s'], 0)} | {_c(r['evicted_runs'], 1)} | "
            f"{_c(r['lost_h'], 1)} | {_num(r['max_runtime_h'], 1)} | "
            + " | ".join(f"{_c(r['share'][c], 3)}" for c in conts)
            + " | "
            + " | ".join(_num(r["available_mean"][c]) for c in conts)
            + " |"
        )
    outside = sum(r["checks"]["outside_region"] for r in reps)
    lines += [
        "",
        f"Runs outside their region: {outside} (checked by brute force on every run). "
        f"Node failures: {sum(r['failures'] for r in reps)}, evicted runs: "
        f"{sum(r['counters']['evicted_runs'] for r in reps)}, tasks: "
        f"{sum(r['counters']['tasks'] for r in reps)} (all completed exactly once).",
        f"Regions (lat lo, lat hi, lon lo, lon hi): {REGIONS}.",
        "",
        f"Paper (§4.4): {PAPER}.",
        "",
    ]
    return "\n".join(lines)


def _figure(cfg: GeoConfig, rep: dict[str, Any]) -> Any:
    def draw(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        ts = [s["t"] / 3600 for s in rep["samples"]]
        for c, _ in cfg.nodes:
            ax.plot(ts, [s[c]["available"] for s in rep["samples"]], lw=1, label=f"available {c}")
        ax.set_xlabel("time (h)")
        ax.set_ylabel("available nodes")
        ax2 = ax.twinx()
        ax2.bar(ts, [s["running"] for s in rep["samples"]], width=cfg.sample_s / 3600,
                color="grey", alpha=0.4, label="running tasks")  # fmt: skip
        ax2.set_ylabel("running tasks")
        for p, (label, _) in enumerate(PHASES):
            x = p * cfg.phase_s / 3600
            ax.axvline(x, color="k", lw=0.5)
            ax.text(
                x + cfg.phase_s / 3600 * 0.03, ax.get_ylim()[1] * 0.97, label, fontsize=6, va="top"
            )
        ax.legend(loc="center left", fontsize=6)
        ax2.legend(loc="center right", fontsize=6)
        ax.set_title(f"PonD Fig. 9 (ours, seed {rep['seed']})", fontsize=9)

    return draw


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the experiment; write outputs; return the document."""
    cfg = GeoConfig(phase_s=args.hours * 3600 / len(PHASES), overlay=args.overlay)
    seeds, reps, wall = common.run_seeded(functools.partial(replicate, cfg), args, NAME)
    rows = aggregate(cfg, reps)
    rss = common.peak_rss_of(reps)
    doc = {
        "experiment": NAME,
        "source": "Lee et al. 2012 (PonD) §4.4, Fig. 9",
        "config": cfg.as_dict(),
        "regions": REGIONS,
        "seeds": seeds,
        "wall_s": round(wall, 2),
        "peak_rss_mib": rss,
        "rows": rows,
        "paper": PAPER,
        "replicates": reps,
    }
    md = markdown(cfg, rows, reps)
    cmd = f"flockring sim {NAME} --seeds {args.seeds} --seed {args.seed} --hours {args.hours:g}"
    md += f"\nCommand: `{cmd}`; wall time {wall:.1f} s; peak RSS {rss:.0f} MiB.\n"
    doc["files"] = [
        str(p) for p in common.write_outputs(args.out, NAME, doc, md, [("", _figure(cfg, reps[0]))])
    ]
    return doc


def _main(args: argparse.Namespace) -> int:
    doc = run(args)
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(
            markdown(
                GeoConfig(phase_s=args.hours * 3600 / len(PHASES)), doc["rows"], doc["replicates"]
            )
        )
        print(f"wall {doc['wall_s']} s; wrote {', '.join(doc['files'])}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``pond-geo``."""
    p = sub.add_parser(NAME, help="PonD Fig. 9: geographic queries on 440 churning nodes")
    common.add_common_args(p)
    p.add_argument("--hours", type=float, default=65.0, help="length of the four phases (PonD: 65)")
    p.add_argument("--overlay", choices=("smallworld", "pastry"), default=GeoConfig().overlay)
    p.set_defaults(func=_main)
