"""Shared benchmark helpers: resource readings, percentiles, JSON output, the bench registry.

Benchmarks are run by hand (``flockring bench NAME ...``) or by CI only in small sizes; they
print one JSON document. Time-based assertions do not belong in unit tests (docs/design.md), so the
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
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    "sim_adapter.bench.pools",
    "sim_adapter.bench.churn_rss",
    "sim_adapter.bench.churn",
    "sim_adapter.bench.chaos",
    "sim_adapter.bench.flood",
    "sim_adapter.bench.fuzz",
)


#: a live node's counters of exceptions it counted and survived: a core's message handler
#: raising outside its input checks (``KbrCore.receive``), the receive loop's last resort, a
#: timer callback's — each a bug, which a bench reports rather than reads as work saved
INTERNAL_ERROR_STATS = ("handler_errors", "node.receive_errors", "node.timer_errors")


def internal_errors(stats: Mapping[str, int]) -> int:
    """How many exceptions a live node counted and survived (:data:`INTERNAL_ERROR_STATS`)."""
    return sum(int(stats.get(k, 0)) for k in INTERNAL_ERROR_STATS)


def module_of(name: str) -> str | None:
    """The module of :data:`BENCH_MODULES` whose subcommand is ``name`` (``churn-rss`` is
    ``sim_adapter.bench.churn_rss``), or None."""
    mod = f"{__name__}.{name.replace('-', '_')}"
    return mod if mod in BENCH_MODULES else None


def register_all(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the subcommand of every benchmark module in :data:`BENCH_MODULES` that exists."""
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
    """Arithmetic mean; NaN for an empty sample."""
    return sum(xs) / len(xs) if xs else math.nan


@contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    """``with stopwatch() as elapsed: ...; elapsed()`` — wall seconds (perf_counter)."""
    t0 = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - t0
    end.append(time.perf_counter())


def environment() -> dict[str, Any]:
    """Python version, machine type and CPU count, recorded with each benchmark's figures."""
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
    """A progress bar with ETA for one long phase (joins, builds, lookups, queries).

    Called as ``progress(done, total)`` — the callback shape ``Network.spawn`` and the benches
    take, so the simulator itself never depends on a terminal library. On a terminal it draws a
    ``rich`` bar on stderr (stdout stays clean for ``--json``); elsewhere (a pipe, CI, a log
    file) it prints a plain line at the start, every quarter and at the end. ``enabled=False``
    silences it; ``None`` (the default) draws only when stderr is a terminal and prints the
    plain lines only when asked (``enabled=True``).
    """

    def __init__(self, label: str, enabled: bool | None = None) -> None:
        self.label = label
        tty = sys.stderr.isatty()
        self.enabled = tty if enabled is None else enabled
        self._rich = self.enabled and tty
        self._bar: Any = None
        self._task: Any = None
        self._quarter = -1
        self._t0 = 0.0

    def __call__(self, done: int, total: int) -> None:
        """Report that ``done`` of ``total`` items are finished (a no-op when disabled)."""
        if not self.enabled or total <= 0:
            return
        if self._rich:
            self._rich_update(done, total)
        else:
            self._plain_update(done, total)

    def _rich_update(self, done: int, total: int) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=total)
        self._bar.update(self._task, completed=done, total=total)
        if done >= total:
            self.close()

    def _plain_update(self, done: int, total: int) -> None:
        if self._quarter < 0:
            self._t0 = time.perf_counter()
        q = 4 * done // total
        if q == self._quarter:
            return
        self._quarter = q
        t = time.perf_counter() - self._t0
        eta = t * (total - done) / done if done else math.nan
        tail = "" if done >= total or math.isnan(eta) else f", ETA {eta:.0f} s"
        print(f"{self.label}: {done}/{total} ({t:.1f} s{tail})", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Stop drawing (idempotent); a bar that reached its total closes itself."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
