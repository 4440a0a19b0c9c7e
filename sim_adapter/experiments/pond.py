"""The PonD experiments (Lee et al. 2012 §4): ``pond-scaling`` (Fig. 6), ``pond-staleness``
(Fig. 7), ``pond-jobs`` (§4.3, Fig. 8) and ``pond-geo`` (§4.4, Fig. 9).

Each lives in its own module (``pond_scaling``, ``pond_staleness``, ``pond_jobs``,
``pond_geo``); :func:`register` adds them all to ``flockring sim``.
"""

from __future__ import annotations

import argparse
import importlib

__all__ = ["MODULES", "register"]

#: the modules whose ``register(sub)`` adds one PonD experiment each
MODULES = (
    "sim_adapter.experiments.pond_scaling",
    "sim_adapter.experiments.pond_staleness",
    "sim_adapter.experiments.pond_jobs",
    "sim_adapter.experiments.pond_geo",
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add every PonD experiment."""
    for name in MODULES:
        importlib.import_module(name).register(sub)
