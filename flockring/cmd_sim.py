"""``flockring sim EXPERIMENT ...``: run a reproduced experiment in the simulator."""

from __future__ import annotations

import argparse
import importlib

from sim_adapter.experiments import EXPERIMENT_MODULES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``flockring sim`` with one subcommand per reproduced experiment."""
    p = sub.add_parser("sim", help="run a simulated experiment (virtual time)")
    esub = p.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    esub.required = True
    for name in EXPERIMENT_MODULES:
        importlib.import_module(name).register(esub)
