"""``flockring bench pastry``: Pastry routing in the simulator (docs/pastry.md)."""

from __future__ import annotations

import argparse
from typing import Any

from sim_adapter import bench
from sim_adapter.bench.overlay import add_common_arguments, run_overlay


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The overlay routing benchmark on Pastry."""
    return run_overlay(args, "pastry")


def _main(args: argparse.Namespace) -> int:
    bench.emit(run(args), args.json, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``pastry`` benchmark parser."""
    p = sub.add_parser("pastry", help="Pastry: build, lookups vs oracle, hops, RDP, maintenance")
    add_common_arguments(p, default_nodes=1000)
    p.set_defaults(func=_main)
