"""Shared benchmark helpers: resource readings, percentiles, JSON output, the bench registry.

Benchmarks are run by hand (``flockring bench NAME ...``) or by CI only in small sizes; they
print one JSON document. Time-based assertions do not belong in unit tests (DESIGN §4), so the
targets are checked here and reported, never asserted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import resource
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

#: modules that contribute ``flockring bench`` subcommands: each has ``register(subparsers)``
#: adding a parser whose ``func`` default is ``run(args) -> dict``.
BENCH_MODULES = (
    "sim_adapter.bench.pastry",
    "sim_adapter.bench.smallworld",
    "sim_adapter.bench.multicast",
    "sim_adapter.bench.live",
    "sim_adapter.bench.flock",
    "sim_adapter.bench.query",
    "sim_adapter.bench.failover",
)


def register_all(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    register_modules(subparsers, BENCH_MODULES)


def register_modules(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], names: Sequence[str]
) -> None:
    """Call ``register(subparsers)`` of each module in ``names`` that exists (a module not built
    yet in this checkout is skipped; an import error inside an existing one is raised)."""
    for name in names:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue  # not built yet in this checkout
        mod.register(subparsers)


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def rss_mib() -> float:
    """Current resident set size from /proc (falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return peak_rss_mib()


def percentile(xs: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (p in 0..100); NaN for an empty sample."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


@contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    """``with stopwatch() as elapsed: ...; elapsed()`` — wall seconds (perf_counter)."""
    t0 = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - t0
    end.append(time.perf_counter())


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def r(x: float, nd: int = 3) -> float:
    """Round for JSON (keeps NaN as NaN)."""
    return x if math.isnan(x) else round(x, nd)


def emit(result: dict[str, Any], as_json: bool, out: str | None = None) -> None:
    """Print a result: JSON with ``--json``, otherwise aligned ``key: value`` lines."""
    text = json.dumps(result, indent=1, sort_keys=False, default=str)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    if as_json:
        print(text)
    else:
        width = max((len(k) for k in result), default=0)
        for k, v in result.items():
            print(f"{k:<{width}}  {v}")
    sys.stdout.flush()


class Progress:
    """A minimal stderr progress bar (no dependency); silent when stderr is not a tty."""

    def __init__(self, label: str, enabled: bool | None = None) -> None:
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._last = -1

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        pct = int(100 * done / total)
        if pct == self._last and done != total:
            return
        self._last = pct
        bar = "#" * (pct // 4)
        sys.stderr.write(f"\r{self.label} [{bar:<25}] {pct:3d}% ({done}/{total})")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
