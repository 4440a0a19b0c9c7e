"""``flockring bench fuzz``: a campaign of hostile inputs against the decoder and a live node.

Two targets, each fed ``--inputs`` inputs, every one counted and none allowed to crash: the
decoder in process (:mod:`sim_adapter.bench.fuzz_decoder`: hypothesis-drawn seed messages of every
registered kind, mutated) and a node on loopback UDP (:mod:`sim_adapter.bench.fuzz_live`:
captured traffic replayed and mutated, forged, unsigned, spoofed, oversized, deep). The method
and the measured figures are in docs/security.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from sim_adapter import bench
from sim_adapter.bench.fuzz_decoder import atheris_main, run_decoder
from sim_adapter.bench.fuzz_live import run_live

__all__ = ["register", "run"]


def _main(args: argparse.Namespace) -> int:
    if args.engine == "atheris":
        atheris_main(args.inputs, args.seed)
        return 0
    bench.emit(run(args), args.json, args.out)
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the campaign on the chosen targets and return their counts."""
    out: dict[str, Any] = {"bench": "fuzz", "inputs_per_target": args.inputs, "seed": args.seed}
    ok = True
    with bench.stopwatch() as wall:
        if args.target in ("decoder", "both"):
            d = out["decoder"] = run_decoder(args.inputs, args.seed, args.seeds)
            ok = ok and d["crashes"] == 0 and d["balanced"]
        if args.target in ("live", "both"):
            live = out["live"] = run_live(args.inputs, args.seed, args.seeds)
            ok = ok and live["crashes"] == 0 and live["balanced"] and live["still_serves"]
    out["total_inputs"] = sum(out[k]["inputs"] for k in ("decoder", "live") if k in out)
    out["zero_crashes_and_balanced"] = ok
    out["wall_s"] = bench.r(wall(), 1)
    out["rss_peak_mib"] = bench.r(bench.peak_rss_mib(), 1)
    out["environment"] = bench.environment()
    return out


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``fuzz`` benchmark parser."""
    p = sub.add_parser("fuzz", help="fuzz the decoder and a live node; count every input")
    p.add_argument("--inputs", type=int, default=100_000, help="inputs per target")
    p.add_argument("--target", choices=("decoder", "live", "both"), default="both")
    p.add_argument("--engine", choices=("mutator", "atheris"), default="mutator")
    p.add_argument("--seeds", type=int, default=2000, help="hypothesis-drawn seed messages")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="also write the JSON to this file")
    p.set_defaults(func=_main)
