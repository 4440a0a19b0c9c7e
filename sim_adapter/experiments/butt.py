"""``flockring sim butt-table2`` / ``butt-table3`` / ``butt-2003-table1``: the four-pool tables.

Theory of operation. Each replicate (one seed: new job traces and a new Pastry ring) runs the
configurations of one table and reduces each pool's job wait times to mean, min, max and stdev
(minutes):

* ``butt-table2`` — Butt et al. 2006 Table 2: I (no flocking) and II (self-organized
  flocking) on the PlanetLab sites of their Table 1;
* ``butt-table3`` — 2006 Table 3: III (one 12-machine pool) and II-D (II, all load at D);
* ``butt-2003-table1`` — Butt et al. 2003 Table 1, the same set-up on a LAN with jobs never on
  the central managers: I, II, III and II-A (II, all load at A, the 2003 variant). Only a few
  of its cells survive in the text; those are compared as the paper states them.

Two pool models: ``--model condor`` (default) is the Condor machinery of
:mod:`sim_adapter.experiments.butt_condor` (negotiators with their cycles, ``FLOCK_TO``
traversal, serial dispatch whose cost grows with RTT, claim reuse); ``--model ideal`` is
:mod:`sim_adapter.experiments.butt_model` (a job starts the instant a machine is free). Across
replicates every cell is a mean with a 95% interval; the paper's single-run values are printed
beside ours. Every replicate checks that each job ran exactly once and, in I and III, in its own
pool; a failed check aborts the run.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from typing import Any

import attrs

from sim_adapter.experiments import common
from sim_adapter.experiments.butt_condor import Machinery, simulate_condor
from sim_adapter.experiments.butt_model import SITES, ButtConfig, simulate, site_rtt_ms

__all__ = [
    "PAPER_2003",
    "PAPER_TABLE2",
    "PAPER_TABLE3",
    "TABLES",
    "add_model_args",
    "machinery_of",
    "register",
    "replicate",
    "run",
]

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
#: Butt et al. 2003 §5 (Table 1's cells the text states; minutes unless a ratio). "III" is
#: their Configuration 2 (single pool), "II" their Configuration 3 (flocking).
PAPER_2003: dict[str, tuple[float, str]] = {
    "D_I_mean": (279.48, "pool D mean wait without flocking"),
    "D_I_max": (554.82, "pool D max wait without flocking"),
    "III_mean": (13.02, "single 12-machine pool mean wait (fitted: see butt-calibrate)"),
    "max_II_over_I": (0.1062, "max wait with flocking / without"),
    "overall_I_minus_II": (106.2, "overall mean reduction by flocking"),
    "A_II_minus_I": (14.86, "pool A mean rise with flocking"),
    "B_II_minus_I": (15.09, "pool B mean rise with flocking"),
    "abs_II_minus_IIA": (2.46, "II mean vs II-A mean, absolute ('the 2.46 minute difference')"),
    "IIA_minus_III": (0.0, "II-A mean minus single pool mean ('almost the same')"),
}

TABLES: dict[str, tuple[tuple[str, ...], str]] = {
    "butt-table2": (("I", "II"), "planetlab-2006"),
    "butt-table3": (("III", "II-D"), "planetlab-2006"),
    "butt-2003-table1": (("I", "II", "III", "II-A"), "lan-2003"),
}


def _left_pool(run: Any) -> int:
    return sum(1 for o, r in zip(run.origin, run.ran_at, strict=True) if o != r)


def _check(conf: str, run: Any, model: str) -> dict[str, int]:
    if model == "ideal":
        chk = run.ledger.check()
        ok, jobs = chk.exactly_once, chk.jobs
        led = run.ledger
        left = sum(1 for j in range(len(led)) if led.ran_at[j] != led.origin[j])
    else:
        ok, jobs, left = run.exactly_once(), len(run.origin), _left_pool(run)
    if not ok:
        raise AssertionError(f"configuration {conf}: jobs did not run exactly once")
    if conf in ("I", "III") and left:
        raise AssertionError(f"configuration {conf}: {left} jobs left their pool")
    return {"jobs": jobs, "ran_elsewhere": left}


def replicate(
    cfg: ButtConfig,
    mach: Machinery,
    model: str,
    testbed: str,
    confs: tuple[str, ...],
    seed: int,
) -> dict[str, Any]:
    """One replicate: each configuration's per-pool wait statistics (minutes) and checks."""
    out: dict[str, Any] = {"seed": seed}
    for conf in confs:
        t0 = time.perf_counter()
        if model == "ideal":
            run: Any = simulate(cfg, seed, conf)
            names = run.ledger.pool_names
        else:
            run = simulate_condor(cfg, mach, seed, conf, testbed=testbed)
            names = run.pool_names
        rows = {n: common.summary(run.waits_min(n)) for n in names if run.waits_min(n)}
        rows["Overall"] = common.summary(run.waits_min())
        reach = getattr(run, "reach", None)
        out[conf] = {
            "pools": rows,
            # every pool hears every other's announcements (TTL 1 reaches routing tables only)
            "complete_flock": None if reach is None else all(len(r) == 3 for r in reach),
            "checks": _check(conf, run, model),
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


def _complete(reps: list[dict[str, Any]], confs: tuple[str, ...]) -> dict[str, Any]:
    """Per flocking configuration: how many replicates had a complete flock, and the overall
    mean wait over those only (a TTL-1 announcement reaches routing-table entries only, and a
    4-node Pastry ring's tables need not hold every other node)."""
    out: dict[str, Any] = {}
    for conf in confs:
        flags = [r[conf].get("complete_flock") for r in reps]
        if all(f is None for f in flags):
            continue
        good = [r for r, f in zip(reps, flags, strict=True) if f]
        out[conf] = {
            "replicates": len(reps),
            "complete": len(good),
            "overall_mean": common.interval95([r[conf]["pools"]["Overall"]["mean"] for r in good]),
        }
    return out


def derived_2003(rep: dict[str, Any]) -> dict[str, float]:
    """The 2003 quantities of :data:`PAPER_2003` from one replicate."""
    p = {c: rep[c]["pools"] for c in ("I", "II", "III", "II-A")}
    return {
        "D_I_mean": p["I"]["D"]["mean"],
        "D_I_max": p["I"]["D"]["max"],
        "III_mean": p["III"]["Overall"]["mean"],
        "max_II_over_I": p["II"]["Overall"]["max"] / p["I"]["Overall"]["max"],
        "overall_I_minus_II": p["I"]["Overall"]["mean"] - p["II"]["Overall"]["mean"],
        "A_II_minus_I": p["II"]["A"]["mean"] - p["I"]["A"]["mean"],
        "B_II_minus_I": p["II"]["B"]["mean"] - p["I"]["B"]["mean"],
        "abs_II_minus_IIA": abs(p["II"]["Overall"]["mean"] - p["II-A"]["Overall"]["mean"]),
        "IIA_minus_III": p["II-A"]["Overall"]["mean"] - p["III"]["Overall"]["mean"],
    }


def cell(iv: dict[str, float], nd: int = 2) -> str:
    """``mean ±half-interval`` (just the mean for one replicate)."""
    if iv["n"] <= 1:
        return f"{iv['mean']:.{nd}f}"
    return f"{iv['mean']:.{nd}f} ±{(iv['hi'] - iv['lo']) / 2:.{nd}f}"


def _pool_table(agg: dict[str, Any], confs: tuple[str, ...], paper: Any) -> list[str]:
    hdr = "| Pool | seq. | " + " | ".join(f"{c} {s}" for c in confs for s in STATS) + " |"
    lines = [hdr, "|" + "---|" * (2 + 4 * len(confs))]
    seqs = dict(zip("ABCD", ButtConfig().split, strict=True)) | {"Overall": 12}
    for pool in ("A", "B", "C", "D", "Overall"):
        cells = []
        for conf in confs:
            for i, s in enumerate(STATS):
                iv = agg[conf].get(pool)
                c = cell(iv[s]) if iv is not None else "—"
                if paper is not None:
                    c += f" [{paper[pool][conf][i]}]"
                cells.append(c)
        lines.append(f"| {pool} | {seqs[pool]} | " + " | ".join(cells) + " |")
    return lines


def markdown(name: str, doc: dict[str, Any]) -> str:
    """The table in the paper's layout: ours (mean ±95% half-interval over the seeds) and the
    paper's value in brackets."""
    agg, k = doc["aggregate"], len(doc["seeds"])
    lines = [f"### {name}: wait time in queue (minutes), ours over {k} seed(s) [paper]", ""]
    if name == "butt-table2":
        lines += _pool_table(agg, ("I", "II"), PAPER_TABLE2)
    elif name == "butt-table3":
        lines += ["| Configuration | seq. | " + " | ".join(STATS) + " |", "|" + "---|" * 6]
        label = {"III": "Single pool (Conf. III)", "II-D": "Conf. II (all load at D)"}
        for conf in ("III", "II-D"):
            cells = [
                f"{cell(agg[conf]['Overall'][s])} [{PAPER_TABLE3[conf][i]}]"
                for i, s in enumerate(STATS)
            ]
            lines.append(f"| {label[conf]} | 12 | " + " | ".join(cells) + " |")
    else:
        lines += _pool_table(agg, ("I", "II"), None)
        lines += ["", "| Configuration | mean | min | max | stdev |", "|---|---|---|---|---|"]
        for conf in ("III", "II-A"):
            o = agg[conf]["Overall"]
            lines.append(f"| {conf} | " + " | ".join(cell(o[s]) for s in STATS) + " |")
        lines += [
            "",
            "What the 2003 text states of its Table 1, beside ours:",
            "",
            "| quantity | ours | paper |",
            "|---|---|---|",
        ]
        for key, iv in doc["derived"].items():
            val, what = PAPER_2003[key]
            nd = 4 if key == "max_II_over_I" else 2
            lines.append(f"| {what} | {cell(iv, nd)} | {val} |")
    lines.append("")
    return "\n".join(lines)


def _figure(name: str, agg: dict[str, Any]) -> Any:
    """Mean wait per pool (ours with 95% interval; the paper's as hatched bars)."""

    def draw(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        paper: list[float]
        if name == "butt-table2":
            groups = [(p, c) for c in ("I", "II") for p in ("A", "B", "C", "D", "Overall")]
            paper = [PAPER_TABLE2[p][c][0] for p, c in groups]
        elif name == "butt-table3":
            groups = [("Overall", c) for c in ("III", "II-D")]
            paper = [PAPER_TABLE3[c][0] for _, c in groups]
        else:
            groups = [("D", "I"), ("Overall", "I"), ("Overall", "II"), ("Overall", "III")]
            paper = [PAPER_2003["D_I_mean"][0], float("nan"), float("nan"), 13.02]
        ours = [agg[c][p]["mean"] for p, c in groups]
        xs = list(range(len(groups)))
        m = [o["mean"] for o in ours]
        err = [[o["mean"] - o["lo"] for o in ours], [o["hi"] - o["mean"] for o in ours]]
        ax.bar([x - 0.2 for x in xs], m, 0.4, yerr=err, capsize=3, label="flockring (95% CI)")
        year = "2003" if name == "butt-2003-table1" else "2006"
        ax.bar([x + 0.2 for x in xs], paper, 0.4, hatch="//", fill=False, label=f"Butt {year}")
        ax.set_xticks(xs, [f"{c}\n{p}" for p, c in groups])
        ax.set_ylabel("mean wait in queue (min)")
        ax.set_title(f"{name}: mean job wait per pool and configuration")
        ax.legend()

    return draw


def machinery_of(args: argparse.Namespace) -> Machinery:
    """The :class:`Machinery` the command line asks for."""
    return attrs.evolve(
        Machinery(),
        negotiation_cycle_s=args.cycle_s,
        dispatch_fixed_s=args.dispatch_fixed_s,
        dispatch_rtts=args.dispatch_rtts,
        claim_reuse=not args.no_claim_reuse,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the experiment named ``args.experiment_name``; write outputs; return the document."""
    name = args.experiment_name
    confs, testbed = TABLES[name]
    if args.model == "ideal" and name == "butt-2003-table1":
        raise ValueError("the ideal model has no RTT, so it has no 2003 testbed: use condor")
    cfg = ButtConfig(negotiation_cycle_s=args.cycle_s, job_overhead_s=args.overhead_s)
    mach = machinery_of(args)
    seeds, reps, wall = common.run_seeded(
        functools.partial(replicate, cfg, mach, args.model, testbed, confs), args, name
    )
    rtts = {
        f"{SITES[a][0]}-{SITES[b][0]}": round(site_rtt_ms(a, b, cfg.rtt_overhead_ms), 1)
        for a in range(4)
        for b in range(a + 1, 4)
    }
    doc: dict[str, Any] = {
        "experiment": name,
        "source": {
            "butt-table2": "Butt et al. 2006 §5.1, Table 2",
            "butt-table3": "Butt et al. 2006 §5.1, Table 3",
            "butt-2003-table1": "Butt et al. 2003 §5, Table 1",
        }[name],
        "model": args.model,
        "testbed": testbed,
        "config": cfg.as_dict(),
        "machinery": mach.as_dict() if args.model == "condor" else None,
        "sites": [list(s) for s in SITES],
        "rtt_ms": rtts if testbed == "planetlab-2006" else {"all pairs": mach.lan_rtt_ms},
        "seeds": seeds,
        "wall_s": round(wall, 2),
        "aggregate": _aggregate(reps, confs),
        "paper": {
            "butt-table2": PAPER_TABLE2,
            "butt-table3": PAPER_TABLE3,
            "butt-2003-table1": PAPER_2003,
        }[name],
        "replicates": reps,
    }
    doc["complete_flock"] = _complete(reps, confs)
    if name == "butt-2003-table1":
        ds = [derived_2003(r) for r in reps]
        doc["derived"] = {k: common.interval95([d[k] for d in ds]) for k in PAPER_2003}
    md = markdown(name, doc)
    for conf, c in doc["complete_flock"].items():
        md += (
            f"\nConfiguration {conf}: {c['complete']} of {c['replicates']} replicates had a "
            "complete flock (every pool in every other's routing table)"
        )
        if c["complete"]:
            md += f"; overall mean over those: {cell(c['overall_mean'])} min"
        md += "."
    if doc["complete_flock"]:
        md += "\n"
    cmd = f"flockring sim {name} --seeds {args.seeds} --seed {args.seed} --model {args.model}"
    cmd += f" --cycle-s {args.cycle_s:g}"
    if args.model == "condor":
        cmd += (
            f" --dispatch-fixed-s {args.dispatch_fixed_s:g} --dispatch-rtts {args.dispatch_rtts:g}"
        )
        cmd += " --no-claim-reuse" if args.no_claim_reuse else ""
    else:
        cmd += f" --overhead-s {args.overhead_s:g}"
    md += f"\nCommand: `{cmd}`; wall time {wall:.1f} s. RTTs (ms): {doc['rtt_ms']}.\n"
    figs = [("", _figure(name, doc["aggregate"]))]
    doc["files"] = [str(p) for p in common.write_outputs(args.out, name, doc, md, figs)]
    return doc


def _main(args: argparse.Namespace) -> int:
    doc = run(args)
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(markdown(doc["experiment"], doc))
        print(f"wall {doc['wall_s']} s; wrote {', '.join(doc['files'])}")
    return 0


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The pool-model options shared by the four-pool experiments."""
    m = Machinery()
    p.add_argument(
        "--model",
        choices=("condor", "ideal"),
        default="condor",
        help="condor: negotiators, FLOCK_TO traversal, RTT-dependent dispatch (default); "
        "ideal: a job starts the instant a machine is free",
    )
    p.add_argument(
        "--cycle-s",
        type=float,
        default=m.negotiation_cycle_s,
        help="Condor negotiation cycle, s (not in the papers; PonD §2.1 reports 60)",
    )
    p.add_argument(
        "--dispatch-fixed-s",
        type=float,
        default=m.dispatch_fixed_s,
        help="condor model: fixed dispatch cost, s (fitted by butt-calibrate)",
    )
    p.add_argument(
        "--dispatch-rtts",
        type=float,
        default=m.dispatch_rtts,
        help="condor model: dispatch cost in round trips (fitted by butt-calibrate)",
    )
    p.add_argument(
        "--no-claim-reuse", action="store_true", help="condor model: every start is negotiated"
    )
    p.add_argument(
        "--overhead-s",
        type=float,
        default=0.0,
        help="ideal model: machine time each job costs beyond its length, s (default 0)",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``butt-table2``, ``butt-table3`` and ``butt-2003-table1``."""
    helps = {
        "butt-table2": "Butt et al. 2006 Table 2: 4 pools without / with self-organized flocking",
        "butt-table3": "Butt et al. 2006 Table 3: one 12-machine pool vs flocking, load at D",
        "butt-2003-table1": "Butt et al. 2003 Table 1: the same four pools on a LAN",
    }
    for name, text in helps.items():
        p = sub.add_parser(name, help=text)
        common.add_common_args(p)
        add_model_args(p)
        p.set_defaults(func=_main, experiment_name=name)
