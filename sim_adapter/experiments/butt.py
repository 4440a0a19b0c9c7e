"""``flockring sim butt-table2`` / ``butt-table3``: Butt et al. 2006 §5.1, Tables 2 and 3.

Theory of operation. Each replicate (one seed: new job traces and a new Pastry ring) runs the
configurations of :mod:`sim_adapter.experiments.butt_model` — Table 2 compares I (no flocking)
with II (self-organized flocking), Table 3 compares III (one 12-machine pool) with II-D (II
with all 12 sequences at pool D) — and reduces each pool's job wait times to mean, min, max and
stdev (minutes). Across replicates every cell is a mean with a 95% interval; the paper's
single-run values are printed beside ours. Every replicate also checks that each job ran
exactly once and, without flocking, in its own pool; a failed check aborts the run.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from typing import Any

from sim_adapter.experiments import common
from sim_adapter.experiments.butt_model import SITES, ButtConfig, ConfRun, simulate, site_rtt_ms

__all__ = ["PAPER_TABLE2", "PAPER_TABLE3", "register", "replicate", "run"]

STATS = ("mean", "min", "max", "stdev")

#: Butt et al. 2006 Table 2 (minutes): pool -> configuration -> (mean, min, max, stdev)
PAPER_TABLE2: dict[str, dict[str, tuple[float, float, float, float]]] = {
    "A": {"I": (1.76, 0.03, 14.32, 2.65), "II": (20.15, 0.03, 72.10, 23.84)},
    "B": {"I": (3.30, 0.08, 19.85, 3.84), "II": (32.68, 0.13, 63.70, 17.74)},
    "C": {"I": (46.58, 0.03, 97.17, 23.00), "II": (38.68, 0.10, 64.48, 16.58)},
    "D": {"I": (284.91, 0.25, 557.55, 178.94), "II": (28.37, 0.10, 58.38, 25.38)},
    "Overall": {"I": (131.20, 0.03, 557.55, 175.01), "II": (30.30, 0.03, 72.10, 23.19)},
}
#: Butt et al. 2006 Table 3 (minutes): configuration -> (mean, min, max, stdev)
PAPER_TABLE3: dict[str, tuple[float, float, float, float]] = {
    "III": (27.47, 0.03, 55.62, 18.40),
    "II-D": (27.40, 0.03, 54.80, 18.51),
}

TABLES = {"butt-table2": ("I", "II"), "butt-table3": ("III", "II-D")}


def _check(run: ConfRun) -> dict[str, int]:
    led = run.ledger
    chk = led.check()
    if not chk.exactly_once:
        raise AssertionError(f"configuration {run.conf}: jobs did not run exactly once: {chk}")
    left = sum(1 for j in range(len(led)) if led.ran_at[j] != led.origin[j])
    if run.conf in ("I", "III") and left:
        raise AssertionError(f"configuration {run.conf}: {left} jobs left their pool")
    return {"jobs": chk.jobs, "ran_elsewhere": left}


def replicate(cfg: ButtConfig, confs: tuple[str, ...], seed: int) -> dict[str, Any]:
    """One replicate: each configuration's per-pool wait statistics (minutes) and checks."""
    out: dict[str, Any] = {"seed": seed}
    for conf in confs:
        t0 = time.perf_counter()
        run = simulate(cfg, seed, conf)
        pools = [n for n in run.ledger.pool_names if run.waits_min(n)]
        rows = {n: common.summary(run.waits_min(n)) for n in pools}
        rows["Overall"] = common.summary(run.waits_min())
        out[conf] = {
            "pools": rows,
            "checks": _check(run),
            "flocked_out": run.flocked_out,
            "decisions": run.decisions,
            "messages": run.messages,
            "wall_s": round(time.perf_counter() - t0, 3),
        }
    return out


def _aggregate(reps: list[dict[str, Any]], confs: tuple[str, ...]) -> dict[str, Any]:
    agg: dict[str, Any] = {}
    for conf in confs:
        agg[conf] = {}
        for pool in reps[0][conf]["pools"]:
            agg[conf][pool] = {
                s: common.interval95([r[conf]["pools"][pool][s] for r in reps]) for s in STATS
            }
    return agg


def _cell(iv: dict[str, float]) -> str:
    if iv["n"] <= 1:
        return f"{iv['mean']:.2f}"
    return f"{iv['mean']:.2f} ±{(iv['hi'] - iv['lo']) / 2:.2f}"


def markdown(name: str, agg: dict[str, Any], k: int) -> str:
    """The table in the paper's layout, ours (mean ±95% half-interval over ``k`` seeds) and
    the paper's value in brackets."""
    lines = [
        f"### {name}: wait time in queue (minutes), ours over {k} seed(s) [paper]",
        "",
    ]
    if name == "butt-table2":
        hdr = "| Pool | seq. | " + " | ".join(f"I {s}" for s in STATS)
        hdr += " | " + " | ".join(f"II {s}" for s in STATS) + " |"
        lines += [hdr, "|" + "---|" * 10]
        seqs = dict(zip("ABCD", ButtConfig().split, strict=True)) | {"Overall": 12}
        for pool in ("A", "B", "C", "D", "Overall"):
            cells = []
            for conf in ("I", "II"):
                for i, s in enumerate(STATS):
                    cells.append(f"{_cell(agg[conf][pool][s])} [{PAPER_TABLE2[pool][conf][i]}]")
            lines.append(f"| {pool} | {seqs[pool]} | " + " | ".join(cells) + " |")
    else:
        lines += ["| Configuration | seq. | " + " | ".join(STATS) + " |", "|" + "---|" * 6]
        label = {"III": "Single pool (Conf. III)", "II-D": "Conf. II (all load at D)"}
        for conf in ("III", "II-D"):
            cells = [
                f"{_cell(agg[conf]['Overall'][s])} [{PAPER_TABLE3[conf][i]}]"
                for i, s in enumerate(STATS)
            ]
            lines.append(f"| {label[conf]} | 12 | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def _figure(name: str, agg: dict[str, Any]) -> Any:
    """Mean wait per pool (ours with 95% interval; paper as hatched bars)."""

    def draw(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        if name == "butt-table2":
            groups = [(p, c) for c in ("I", "II") for p in ("A", "B", "C", "D", "Overall")]
            paper = [PAPER_TABLE2[p][c][0] for p, c in groups]
            ours = [agg[c][p]["mean"] for p, c in groups]
        else:
            groups = [("Overall", c) for c in ("III", "II-D")]
            paper = [PAPER_TABLE3[c][0] for _, c in groups]
            ours = [agg[c]["Overall"]["mean"] for _, c in groups]
        xs = list(range(len(groups)))
        m = [o["mean"] for o in ours]
        err = [[o["mean"] - o["lo"] for o in ours], [o["hi"] - o["mean"] for o in ours]]
        ax.bar([x - 0.2 for x in xs], m, 0.4, yerr=err, capsize=3, label="flockring (95% CI)")
        ax.bar([x + 0.2 for x in xs], paper, 0.4, hatch="//", fill=False, label="Butt et al. 2006")
        ax.set_xticks(xs, [f"{c}\n{p}" for p, c in groups])
        ax.set_ylabel("mean wait in queue (min)")
        ax.set_title(f"{name}: mean job wait per pool and configuration")
        ax.legend()

    return draw


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the experiment named ``args.experiment_name``; write outputs; return the document."""
    name = args.experiment_name
    confs = TABLES[name]
    cfg = ButtConfig(negotiation_cycle_s=args.cycle_s, job_overhead_s=args.overhead_s)
    seeds = common.seeds_of(args.seed, args.seeds)
    t0 = time.perf_counter()
    reps = common.run_replicates(
        functools.partial(replicate, cfg, confs),
        seeds,
        workers=min(args.workers, len(seeds)),
        dask=args.dask,
        label=f"{name} replicates",
        progress=None if not args.json else False,
    )
    wall = time.perf_counter() - t0
    agg = _aggregate(reps, confs)
    rtts = {
        f"{SITES[a][0]}-{SITES[b][0]}": round(site_rtt_ms(a, b, cfg.rtt_overhead_ms), 1)
        for a in range(4)
        for b in range(a + 1, 4)
    }
    doc = {
        "experiment": name,
        "source": "Butt et al. 2006 §5.1, " + ("Table 2" if name == "butt-table2" else "Table 3"),
        "config": cfg.as_dict(),
        "sites": [list(s) for s in SITES],
        "rtt_ms": rtts,
        "seeds": seeds,
        "wall_s": round(wall, 2),
        "aggregate": agg,
        "paper": PAPER_TABLE2 if name == "butt-table2" else PAPER_TABLE3,
        "replicates": reps,
    }
    md = markdown(name, agg, len(seeds))
    cmd = (
        f"flockring sim {name} --seeds {args.seeds} --seed {args.seed} "
        f"--cycle-s {args.cycle_s:g} --overhead-s {args.overhead_s:g}"
    )
    md += f"\nCommand: `{cmd}`; wall time {wall:.1f} s. RTTs (ms): {rtts}.\n"
    doc["files"] = [
        str(p) for p in common.write_outputs(args.out, name, doc, md, [("", _figure(name, agg))])
    ]
    return doc


def _main(args: argparse.Namespace) -> int:
    doc = run(args)
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(markdown(doc["experiment"], doc["aggregate"], len(doc["seeds"])))
        print(f"wall {doc['wall_s']} s; wrote {', '.join(doc['files'])}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``butt-table2`` and ``butt-table3``."""
    helps = {
        "butt-table2": "Butt et al. 2006 Table 2: 4 pools without / with self-organized flocking",
        "butt-table3": "Butt et al. 2006 Table 3: one 12-machine pool vs flocking, load at D",
    }
    for name, text in helps.items():
        p = sub.add_parser(name, help=text)
        common.add_common_args(p)
        p.add_argument(
            "--cycle-s",
            type=float,
            default=60.0,
            help="Condor negotiation cycle, s (not in the paper; PonD §4.2.1 uses 60)",
        )
        p.add_argument(
            "--overhead-s",
            type=float,
            default=0.0,
            help="machine time each job costs beyond its length, s (assumption; default 0)",
        )
        p.set_defaults(func=_main, experiment_name=name)
