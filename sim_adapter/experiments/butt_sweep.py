"""``flockring sim butt-cycle-sweep`` and ``butt-calibrate``: the Condor machinery's knobs.

Theory of operation. Condor 6.4's negotiation cycle is in neither Butt paper, so
``butt-cycle-sweep`` reruns every configuration of both testbeds (2006 PlanetLab: I, II, III,
II-D; 2003 LAN: I, II, III, II-A) under the machinery model of
:mod:`sim_adapter.experiments.butt_condor` for each cycle of ``--cycles`` (default 20, 60,
300 s) and reports how each table's means move. The negotiator phases do not depend on the
cycle, so the instants of a cycle that is a multiple of another are a subset of the other's
(rule 1 of the model). The table reports in how many replicates the single pool's (III) mean
wait grows with the cycle: always on the LAN; on the WAN the machine drawn for a job, hence its
RTT-dependent dispatch, changes with the cycle, and claim reuse lets a job start earlier after a
later release, so only the mean over replicates is monotone there (tests check both).

``butt-calibrate`` fits the model's two dispatch constants (the only numbers the papers do not
give that the tables are sensitive to) to the two single-pool means the papers report — 13.02
min on the 2003 LAN, 27.47 min on the 2006 WAN — over ``--seeds`` replicates
(:func:`calibrate`); :class:`Machinery`'s defaults are the
values it printed for seeds 1001-1100.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from sim_adapter.experiments import common
from sim_adapter.experiments.butt import add_model_args, cell, machinery_of, replicate
from sim_adapter.experiments.butt_condor import TESTBEDS, Machinery, simulate_condor
from sim_adapter.experiments.butt_model import ButtConfig

__all__ = ["Mapper", "calibrate", "register", "run_calibrate", "run_sweep"]

SWEEP_CONFS: dict[str, tuple[str, ...]] = {
    "planetlab-2006": ("I", "II", "III", "II-D"),
    "lan-2003": ("I", "II", "III", "II-A"),
}
#: (testbed, configuration, pool) rows of the sweep table
ROWS: tuple[tuple[str, str, str], ...] = (
    *(("planetlab-2006", "I", p) for p in ("A", "B", "C", "D", "Overall")),
    *(("planetlab-2006", "II", p) for p in ("A", "B", "C", "D", "Overall")),
    ("planetlab-2006", "III", "Overall"),
    ("planetlab-2006", "II-D", "Overall"),
    ("lan-2003", "I", "Overall"),
    ("lan-2003", "II", "Overall"),
    ("lan-2003", "III", "Overall"),
    ("lan-2003", "II-A", "Overall"),
)


#: ``mapper(fn, seeds) -> [fn(seed) for seed in seeds]``, possibly in other processes
Mapper = Callable[[Callable[[int], list[float]], Sequence[int]], list[list[float]]]


def _single_pool_waits(cfg: ButtConfig, m: Machinery, testbed: str, seed: int) -> list[float]:
    """Configuration III's job waits (minutes) for one seed (picklable, for a mapper)."""
    return list(simulate_condor(cfg, m, seed, "III", testbed=testbed).waits_min())


def calibrate(
    cfg: ButtConfig,
    mach: Machinery,
    seeds: Sequence[int],
    *,
    target_lan_min: float = 13.02,
    target_wan_min: float = 27.47,
    iterations: int = 14,
    mapper: Mapper | None = None,
) -> tuple[float, float, dict[str, float]]:
    """Fit ``dispatch_fixed_s`` to the single pool's mean wait on the 2003 LAN, then
    ``dispatch_rtts`` to the single pool's mean wait on the 2006 WAN (bisection; the mean over
    ``seeds`` grows with each constant). Returns the two constants and the means they give.
    ``mapper(fn, seeds)`` runs the per-seed simulations (a process pool or Dask cluster; inline
    when None)."""

    def mean_iii(m: Machinery, testbed: str) -> float:
        fn = functools.partial(_single_pool_waits, cfg, m, testbed)
        per_seed = mapper(fn, seeds) if mapper is not None else [fn(s) for s in seeds]
        xs = [x for w in per_seed for x in w]
        return sum(xs) / len(xs)

    def bisect(f: Callable[[float], float], target: float, hi: float) -> float:
        lo = 0.0
        while f(hi) < target:
            lo, hi = hi, hi * 2.0
        for _ in range(iterations):
            mid = (lo + hi) / 2.0
            if f(mid) < target:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2.0

    def lan(fixed_s: float, rtts: float) -> float:
        return mean_iii(
            attrs.evolve(mach, dispatch_fixed_s=fixed_s, dispatch_rtts=rtts), "lan-2003"
        )

    def wan(fixed_s: float, rtts: float) -> float:
        m = attrs.evolve(mach, dispatch_fixed_s=fixed_s, dispatch_rtts=rtts)
        return mean_iii(m, "planetlab-2006")

    fixed, per_rtt = mach.dispatch_fixed_s, 0.0
    for _ in range(2):  # the LAN's RTT share is tiny: two alternations settle both constants
        fixed = bisect(functools.partial(lambda r, x: lan(x, r), per_rtt), target_lan_min, 30.0)
        per_rtt = bisect(functools.partial(wan, fixed), target_wan_min, 200.0)
    fitted = attrs.evolve(mach, dispatch_fixed_s=fixed, dispatch_rtts=per_rtt)
    means = {tb: mean_iii(fitted, tb) for tb in TESTBEDS}
    return fixed, per_rtt, means


def _nth(fn: Callable[[Any], Any], items: Sequence[Any], i: int) -> Any:
    """``fn(items[i])``: lets a list of work items ride the replicate runner, which maps over
    integers (picklable, unlike a lambda)."""
    return fn(items[i])


def _sweep_one(cfg: ButtConfig, mach: Machinery, item: tuple[float, str, int]) -> dict[str, Any]:
    cycle, testbed, seed = item
    m = attrs.evolve(mach, negotiation_cycle_s=cycle)
    return replicate(cfg, m, "condor", testbed, SWEEP_CONFS[testbed], seed)


def run_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Every configuration of both testbeds at every cycle; writes outputs, returns the doc."""
    cycles = [float(x) for x in args.cycles.split(",")]
    cfg = ButtConfig()
    mach = machinery_of(args)
    seeds = common.seeds_of(args.seed, args.seeds)
    items = [(c, tb, s) for c in cycles for tb in SWEEP_CONFS for s in seeds]
    t0 = time.perf_counter()
    reps = common.run_replicates(
        functools.partial(_nth, functools.partial(_sweep_one, cfg, mach), items),
        range(len(items)),
        workers=args.workers,
        label="butt-cycle-sweep runs",
        progress=None if not args.json else False,
        dask=args.dask,
    )
    wall = time.perf_counter() - t0
    by = {item: rep for item, rep in zip(items, reps, strict=True)}
    table: dict[str, dict[str, Any]] = {}
    for tb, conf, pool in ROWS:
        key = f"{tb} {conf} {pool}"
        table[key] = {
            f"{c:g}": common.interval95(
                [by[(c, tb, s)][conf]["pools"][pool]["mean"] for s in seeds]
            )
            for c in cycles
        }
    mono = {}
    for tb in SWEEP_CONFS:
        ok = 0
        for s in seeds:
            xs = [by[(c, tb, s)]["III"]["pools"]["Overall"]["mean"] for c in sorted(cycles)]
            ok += all(a <= b + 1e-9 for a, b in itertools.pairwise(xs))
        mono[tb] = {"replicates": len(seeds), "single_pool_mean_monotone": ok}
    doc = {
        "experiment": "butt-cycle-sweep",
        "cycles_s": cycles,
        "machinery": mach.as_dict(),
        "seeds": seeds,
        "wall_s": round(wall, 2),
        "table": table,
        "single_pool_monotone": mono,
        "replicates": [{"cycle_s": c, "testbed": tb, **rep} for (c, tb, _s), rep in by.items()],
    }
    lines = [
        f"### butt-cycle-sweep: mean wait (minutes) by negotiation cycle, {len(seeds)} seed(s)",
        "",
        "| testbed | conf. | pool | " + " | ".join(f"{c:g} s" for c in cycles) + " |",
        "|" + "---|" * (3 + len(cycles)),
    ]
    for tb, conf, pool in ROWS:
        row = table[f"{tb} {conf} {pool}"]
        cells = " | ".join(cell(row[f"{c:g}"]) for c in cycles)
        lines.append(f"| {tb} | {conf} | {pool} | {cells} |")
    lines += [
        "",
        "Single pool (III) mean non-decreasing in the cycle: "
        + ", ".join(
            f"{tb} {v['single_pool_mean_monotone']}/{v['replicates']} replicates"
            for tb, v in mono.items()
        ),
    ]
    cmd = f"flockring sim butt-cycle-sweep --seeds {args.seeds} --seed {args.seed} --cycles "
    cmd += args.cycles
    lines.append(f"\nCommand: `{cmd}`; wall time {wall:.1f} s.\n")
    md = "\n".join(lines)

    def draw(fig: Any) -> None:
        for i, tb in enumerate(SWEEP_CONFS):
            ax = fig.add_subplot(1, 2, i + 1)
            for conf in SWEEP_CONFS[tb]:
                row = table.get(f"{tb} {conf} Overall")
                if row is None:
                    continue
                ys = [row[f"{c:g}"] for c in cycles]
                ax.errorbar(
                    cycles,
                    [y["mean"] for y in ys],
                    yerr=[[y["mean"] - y["lo"] for y in ys], [y["hi"] - y["mean"] for y in ys]],
                    marker="o",
                    capsize=3,
                    label=conf,
                )
            ax.set_xscale("log")
            ax.set_xlabel("negotiation cycle (s)")
            ax.set_ylabel("overall mean wait (min)")
            ax.set_title(tb)
            ax.legend()

    doc["files"] = [
        str(p) for p in common.write_outputs(args.out, "butt-cycle-sweep", doc, md, [("", draw)])
    ]
    return doc


def run_calibrate(args: argparse.Namespace) -> dict[str, Any]:
    """Fit the dispatch constants; writes outputs, returns the doc."""
    seeds = common.seeds_of(args.seed, args.seeds)
    t0 = time.perf_counter()
    mach = attrs.evolve(Machinery(), negotiation_cycle_s=args.cycle_s)
    fixed, rtts, means = calibrate(
        ButtConfig(),
        mach,
        seeds,
        target_lan_min=args.target_lan_min,
        target_wan_min=args.target_wan_min,
        mapper=functools.partial(
            common.run_replicates,
            workers=args.workers,
            label="butt-calibrate seeds",
            progress=False,
            dask=args.dask,
        ),
    )
    wall = time.perf_counter() - t0
    doc = {
        "experiment": "butt-calibrate",
        "seeds": [seeds[0], seeds[-1]],
        "negotiation_cycle_s": args.cycle_s,
        "targets_min": {"lan-2003": args.target_lan_min, "planetlab-2006": args.target_wan_min},
        "dispatch_fixed_s": fixed,
        "dispatch_rtts": rtts,
        "single_pool_mean_min": means,
        "defaults": {
            "dispatch_fixed_s": Machinery().dispatch_fixed_s,
            "dispatch_rtts": Machinery().dispatch_rtts,
        },
        "wall_s": round(wall, 2),
    }
    md = (
        "### butt-calibrate: dispatch constants fitted to the single-pool means\n\n"
        "| constant | fitted | default in Machinery |\n|---|---|---|\n"
        f"| dispatch_fixed_s | {fixed:.2f} | {Machinery().dispatch_fixed_s} |\n"
        f"| dispatch_rtts | {rtts:.1f} | {Machinery().dispatch_rtts} |\n\n"
        f"Single-pool mean wait with them (min): LAN {means['lan-2003']:.2f} "
        f"(target {args.target_lan_min}), WAN {means['planetlab-2006']:.2f} "
        f"(target {args.target_wan_min}); seeds {seeds[0]}-{seeds[-1]}, cycle {args.cycle_s:g} "
        f"s.\n\nCommand: `flockring sim butt-calibrate --seeds {args.seeds} --seed {args.seed}`; "
        f"wall time {wall:.1f} s.\n"
    )
    doc["files"] = [str(p) for p in common.write_outputs(args.out, "butt-calibrate", doc, md)]
    return doc


def _main(args: argparse.Namespace) -> int:
    doc = run_sweep(args) if args.experiment_name == "butt-cycle-sweep" else run_calibrate(args)
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(Path(doc["files"][1]).read_text())
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``butt-cycle-sweep`` and ``butt-calibrate``."""
    p = sub.add_parser(
        "butt-cycle-sweep", help="Butt et al. tables under the Condor model, by negotiation cycle"
    )
    common.add_common_args(p)
    add_model_args(p)
    p.add_argument("--cycles", default="20,60,300", help="negotiation cycles to sweep, s")
    p.set_defaults(func=_main, experiment_name="butt-cycle-sweep")
    c = sub.add_parser(
        "butt-calibrate", help="fit the Condor model's dispatch constants to the single pools"
    )
    common.add_common_args(c)
    c.set_defaults(seeds=100, seed=1001)
    c.add_argument("--cycle-s", type=float, default=Machinery().negotiation_cycle_s)
    c.add_argument("--target-lan-min", type=float, default=13.02, help="2003 single pool mean")
    c.add_argument("--target-wan-min", type=float, default=27.47, help="2006 single pool mean")
    c.set_defaults(func=_main, experiment_name="butt-calibrate")
