"""``flockring sim pond-jobs``: jobs running inside ponds, against one central Condor pool
(PonD §4.3, Fig. 8a–c).

Theory of operation: the model is :mod:`.pond_jobs_model` (240 machines at four sites,
queue-driven ponds, the Condor baseline), the jobs :mod:`.pond_workload`. Each replicate (seed)
draws the machines' ``ZipfAttribute``, then for every submission rate one job stream of two hours
that both systems run. Per rate it reports (a) the mean task wait — submission to the start of
the run that completed the task, each task being one HTCondor job — and the utilisation
ΣRunTime/(T·N); (b) the min / mean / max latency of the queries the pond schedulers started; (c)
the mean wait by the job's Zipf target. Every replicate checks that each task ran exactly once,
on a machine whose ad satisfies the task (``classad2``) and — in ponds — that carried the pond
stamp of the task's autocluster when the run started; a failed check aborts the run.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections import defaultdict
from typing import Any

from discovery.classads import MATCH, ClassAd, JobAd, evaluate
from sim_adapter.bench import peak_rss_mib
from sim_adapter.experiments import common
from sim_adapter.experiments.pond_jobs_model import (
    SITES,
    JobsConfig,
    machine_ads,
    make_jobs,
    simulate_condor,
    simulate_pond,
    site_rtt_ms,
    utilisation,
)
from sim_adapter.experiments.pond_queue import TaskLog
from sim_adapter.experiments.pond_workload import Das2Model, TraceJobs

__all__ = ["NAME", "check_log", "metrics", "register", "replicate", "run"]

NAME = "pond-jobs"

PAPER = {
    "8a": "wait time and utilisation rise with the submission rate",
    "8b": "query latency under one second over 240 WAN resources, no strong correlation with "
    "the rate; occasional longer queries",
    "8c": "wait grows with the Zipf target (fewer machines satisfy it)",
}


def check_log(log: TaskLog, ads: list[ClassAd], *, ponds: bool) -> dict[str, int]:
    """Brute-force checks of a run's log; raises AssertionError on a violation."""
    done: dict[int, int] = defaultdict(int)
    for r in log.runs:
        if r.end_s is not None and not r.evicted:
            done[r.task_id] += 1
    bad = [t for t in log.tasks if done.get(t, 0) != 1]
    if bad:
        raise AssertionError(f"{len(bad)} tasks did not complete exactly once, e.g. {bad[:5]}")
    cache: dict[tuple[str, int], bool] = {}
    for r in log.runs:
        ad = log.tasks[r.task_id].ad
        key = (ad, r.machine)
        if key not in cache:
            cache[key] = evaluate(JobAd.from_text(ad), ads[r.machine])[0] == MATCH
        if not cache[key]:
            raise AssertionError(f"task {r.task_id} ran on machine {r.machine}, which rejects it")
        if ponds and (not r.pond_job_id or r.stamp != r.pond_job_id):
            raise AssertionError(f"task {r.task_id} started on a machine not stamped for its pond")
        if r.start_s < log.tasks[r.task_id].submit_s:
            raise AssertionError(f"task {r.task_id} started before it was submitted")
    return {"tasks": len(log.tasks), "runs": len(log.runs), "pairs_checked": len(cache)}


def metrics(log: TaskLog, machines: int) -> dict[str, Any]:
    """Wait (per task and per job), utilisation, and wait by Zipf target of one run."""
    waits = log.waits()
    done = log.completed()
    per_job: dict[int, float] = {}
    for t, r in done.items():
        spec = log.tasks[t]
        per_job[spec.job_id] = max(per_job.get(spec.job_id, 0.0), r.start_s - spec.submit_s)
    by_z: dict[int, list[float]] = defaultdict(list)
    for t, w in waits.items():
        by_z[log.tasks[t].zipf].append(w)
    return {
        "task_wait_s": common.summary(list(waits.values())),
        "job_wait_s": common.summary(list(per_job.values())),
        "utilisation": utilisation(log, machines),
        "wait_by_zipf_s": {z: sum(v) / len(v) for z, v in sorted(by_z.items())},
        "tasks_by_zipf": {z: len(v) for z, v in sorted(by_z.items())},
    }


def replicate(
    cfg: JobsConfig, trace: str | None, seed: int, *, model: Das2Model | None = None
) -> dict[str, Any]:
    """One seed: every rate through C-PonD and through the central Condor pool (jobs from
    ``trace`` if given, else from ``model``, by default :class:`Das2Model`)."""
    ads = machine_ads(cfg, seed)
    present = {int(a["ZipfAttribute"]) for a in ads}
    jobs_from: Any = (
        TraceJobs(trace, max_tasks=len(ads), memory_max_mb=cfg.memory_mb)
        if trace
        else model or Das2Model()
    )
    out: dict[str, Any] = {
        "seed": seed,
        "zipf_machines": {z: sum(1 for a in ads if a["ZipfAttribute"] == z) for z in range(1, 11)},
        "workload": jobs_from.describe(),
        "rates": [],
    }
    for rate in cfg.rates_per_min:
        tasks, jobs, skipped = make_jobs(cfg, jobs_from, rate, seed, present)
        row: dict[str, Any] = {"rate_per_min": rate, "jobs": jobs, "tasks": len(tasks),
                               "skipped_jobs": skipped}  # fmt: skip
        t0 = time.perf_counter()
        log, lat, counters, end = simulate_pond(cfg, ads, tasks, seed)
        row["pond"] = metrics(log, len(ads)) | {
            "checks": check_log(log, ads, ponds=True),
            "query_latency_s": common.summary(lat),
            "queries": len(lat),
            "counters": counters,
            "end_s": end,
            "wall_s": round(time.perf_counter() - t0, 2),
        }
        t1 = time.perf_counter()
        clog, ccount, cend = simulate_condor(cfg, ads, tasks, seed)
        row["condor"] = metrics(clog, len(ads)) | {
            "checks": check_log(clog, ads, ponds=False),
            "counters": ccount,
            "end_s": cend,
            "wall_s": round(time.perf_counter() - t1, 2),
        }
        out["rates"].append(row)
    out["peak_rss_mib"] = round(peak_rss_mib(), 1)
    return out


# ---------------------------------------------------------------------- aggregate, output
def aggregate(cfg: JobsConfig, reps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rate: each figure's values as mean ± 95% interval over the replicates."""
    rows = []
    for i, rate in enumerate(cfg.rates_per_min):
        rr = [r["rates"][i] for r in reps]
        row: dict[str, Any] = {"rate_per_min": rate}
        for sysname in ("pond", "condor"):
            row[sysname] = {
                "task_wait_s": common.interval95([x[sysname]["task_wait_s"]["mean"] for x in rr]),
                "job_wait_s": common.interval95([x[sysname]["job_wait_s"]["mean"] for x in rr]),
                "utilisation": common.interval95([x[sysname]["utilisation"] for x in rr]),
                "wait_by_zipf_s": {
                    z: common.interval95(
                        [
                            x[sysname]["wait_by_zipf_s"][z]
                            for x in rr
                            if z in x[sysname]["wait_by_zipf_s"]
                        ]
                    )
                    for z in range(1, 11)
                },
            }
        row["pond"]["query_latency_s"] = {
            s: common.interval95(
                [x["pond"]["query_latency_s"][s] for x in rr if x["pond"]["queries"]]
            )
            for s in ("min", "mean", "max")
        }
        row["pond"]["queries"] = sum(x["pond"]["queries"] for x in rr)
        row["tasks"] = sum(x["tasks"] for x in rr) / len(rr)
        rows.append(row)
    return rows


_c = common.fmt_interval


def markdown(rows: list[dict[str, Any]], k: int) -> str:
    """Figures 8a-c as tables, ours over ``k`` seeds."""
    lines = [
        f"### {NAME} — Fig. 8a/8b: by submission rate, ours over {k} seed(s)",
        "",
        "| rate (jobs/min) | tasks | C-PonD task wait (s) | C-PonD job wait (s) | C-PonD util. | "
        "Condor task wait (s) | Condor job wait (s) | Condor util. | query min (s) | "
        "query mean (s) | query max (s) |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        p, c, q = r["pond"], r["condor"], r["pond"]["query_latency_s"]
        lines.append(
            f"| {r['rate_per_min']:g} | {r['tasks']:.0f} | {_c(p['task_wait_s'])} | "
            f"{_c(p['job_wait_s'])} | {_c(p['utilisation'], 3)} | {_c(c['task_wait_s'])} | "
            f"{_c(c['job_wait_s'])} | {_c(c['utilisation'], 3)} | {_c(q['min'], 3)} | "
            f"{_c(q['mean'], 3)} | {_c(q['max'], 3)} |"
        )
    lines += [
        "",
        f"### {NAME} — Fig. 8c: C-PonD mean task wait (s) by Zipf target",
        "",
        "| rate | " + " | ".join(f"z={z}" for z in range(1, 11)) + " |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        cells = [_c(r["pond"]["wait_by_zipf_s"][z]) for z in range(1, 11)]
        lines.append(f"| {r['rate_per_min']:g} | " + " | ".join(cells) + " |")
    lines += ["", f"Paper (§4.3): (a) {PAPER['8a']}; (b) {PAPER['8b']}; (c) {PAPER['8c']}.", ""]
    return "\n".join(lines)


def _figures(rows: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    xs = [r["rate_per_min"] for r in rows]

    def a(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        ax.plot(xs, [r["pond"]["task_wait_s"]["mean"] for r in rows], "r.-", label="C-PonD wait")
        ax.plot(xs, [r["condor"]["task_wait_s"]["mean"] for r in rows], "b.-", label="Condor wait")
        ax.set_xlabel("submission rate (jobs/min)")
        ax.set_ylabel("mean task wait (s)")
        ax2 = ax.twinx()
        ax2.plot(xs, [r["pond"]["utilisation"]["mean"] for r in rows], "r^--", label="C-PonD util.")
        ax2.plot(
            xs, [r["condor"]["utilisation"]["mean"] for r in rows], "bv--", label="Condor util."
        )
        ax2.set_ylabel("utilisation")
        ax2.set_ylim(0, 1)
        ax.legend(loc="upper left", fontsize=7)
        ax2.legend(loc="lower right", fontsize=7)
        ax.set_title("PonD Fig. 8a (ours)")

    def b(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        for s, st in (("min", "g.-"), ("mean", "k.-"), ("max", "r.-")):
            ax.plot(xs, [r["pond"]["query_latency_s"][s]["mean"] for r in rows], st, label=s)
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_xlabel("submission rate (jobs/min)")
        ax.set_ylabel("query latency (s)")
        ax.legend(fontsize=7)
        ax.set_title("PonD Fig. 8b (ours): C-PonD query latency")

    def c(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        for r in rows:
            ys = [r["pond"]["wait_by_zipf_s"][z]["mean"] for z in range(1, 11)]
            ax.plot(range(1, 11), ys, ".-", label=f"{r['rate_per_min']:g} jobs/min")
        ax.set_xlabel("ZipfAttribute target")
        ax.set_ylabel("mean task wait (s)")
        ax.legend(fontsize=7)
        ax.set_title("PonD Fig. 8c (ours): C-PonD wait by Zipf target")

    return [("-8a", a), ("-8b", b), ("-8c", c)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the experiment; write outputs; return the document."""
    rates = (
        tuple(float(x) for x in args.rates.split(",")) if args.rates else JobsConfig().rates_per_min
    )
    cfg = JobsConfig(
        rates_per_min=rates,
        duration_s=args.duration_s,
        overlay=args.overlay,
        ring_maintenance=args.ring_maintenance,
    )
    seeds, reps, wall = common.run_seeded(functools.partial(replicate, cfg, args.trace), args, NAME)
    rows = aggregate(cfg, reps)
    rss = common.peak_rss_of(reps)
    doc = {
        "experiment": NAME,
        "source": "Lee et al. 2012 (PonD) §4.3, Fig. 8a-c",
        "config": cfg.as_dict(),
        "sites": [list(s) for s in SITES],
        "rtt_ms": site_rtt_ms(cfg),
        "trace": args.trace,
        "seeds": seeds,
        "wall_s": round(wall, 2),
        "peak_rss_mib": rss,
        "rows": rows,
        "paper": PAPER,
        "replicates": reps,
    }
    md = markdown(rows, len(seeds))
    cmd = f"flockring sim {NAME} --seeds {args.seeds} --seed {args.seed}"
    if args.rates:
        cmd += f" --rates {args.rates}"
    if args.ring_maintenance:
        cmd += " --ring-maintenance"
    if args.trace:
        cmd += f" --trace {args.trace}"
    md += (
        f"\nCommand: `{cmd}`; wall time {wall:.1f} s; peak RSS {rss:.0f} MiB. "
        f"Inter-site RTTs (ms): {doc['rtt_ms']}.\n"
    )
    doc["files"] = [str(p) for p in common.write_outputs(args.out, NAME, doc, md, _figures(rows))]
    return doc


def _main(args: argparse.Namespace) -> int:
    doc = run(args)
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(markdown(doc["rows"], len(doc["seeds"])))
        print(f"wall {doc['wall_s']} s; wrote {', '.join(doc['files'])}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``pond-jobs``."""
    p = sub.add_parser(NAME, help="PonD Fig. 8: jobs in ponds on 240 WAN machines vs Condor")
    common.add_common_args(p)
    d = JobsConfig()
    p.add_argument("--rates", default="", help="comma-separated jobs/min (default 0.25..3)")
    p.add_argument("--duration-s", type=float, default=d.duration_s)
    p.add_argument("--overlay", choices=("smallworld", "pastry"), default=d.overlay)
    p.add_argument(
        "--ring-maintenance",
        action="store_true",
        help="run the ring's periodic maintenance (off: no machine fails in this experiment)",
    )
    p.add_argument("--trace", default=None, help="a GWA (GWF) or SWF trace to draw jobs from")
    p.set_defaults(func=_main)
