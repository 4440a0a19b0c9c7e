"""``flockring bench smallworld``: the small-world ring in the simulator (docs/smallworld.md).

Same phases and fields as ``flockring bench pastry`` (see :mod:`sim_adapter.bench.overlay`): build
(real joins or the oracle), an optional quiet period (maintenance msg/s/node), then M lookups
checked against the brute-force oracle, with hops, RDP and messages per lookup.
"""

from __future__ import annotations

import argparse
from typing import Any

from sim_adapter import bench
from sim_adapter.bench.overlay import add_common_arguments, run_overlay


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The overlay routing benchmark on the small-world ring."""
    return run_overlay(args, "smallworld")


def _main(args: argparse.Namespace) -> int:
    bench.emit(run(args), args.json, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``smallworld`` benchmark parser."""
    p = sub.add_parser(
        "smallworld", help="small-world ring: build, lookups vs oracle, hops, RDP, maintenance"
    )
    add_common_arguments(p, default_nodes=1000)
    p.set_defaults(func=_main)
