"""Shared pieces of the reproduced experiments: seeds, replicates, intervals, output files.

Theory of operation. The papers report single runs; an experiment here runs ``--seeds K``
replicates (replicate ``i`` uses seed ``--seed + i``: a different trace and topology each) and
reports every statistic as a mean with a 95% confidence interval (Student's t over the K
replicate values). Replicates are independent, so they run on a ``concurrent.futures``
executor: a local process pool (``--workers``), or inline with one worker (what the tests use).
Each run writes into ``--out``: ``NAME.json`` (parameters, every replicate, the aggregate),
``NAME.md`` (the table beside the paper's values) and ``NAME*.png`` (matplotlib, Agg backend,
so no display is needed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, TypeVar

from overlay.errors import ConfigError
from sim_adapter import bench

__all__ = [
    "Interval",
    "add_common_args",
    "dask_executor",
    "fmt_interval",
    "interval95",
    "peak_rss_of",
    "run_replicates",
    "run_seeded",
    "seeds_of",
    "summary",
    "write_outputs",
]

T = TypeVar("T")

# Two-sided 95% Student t quantiles t(0.975, df) for df = 1..30 (standard table values); for
# df > 30 the normal quantile 1.96 is within 2% of t.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip

Interval = dict[str, float]


def interval95(xs: Sequence[float]) -> Interval:
    """Mean and 95% confidence interval (Student's t) of replicate values.

    One value gives a zero-width interval (``n`` says how many replicates there were)."""
    n = len(xs)
    if n == 0:
        return {"mean": math.nan, "lo": math.nan, "hi": math.nan, "n": 0}
    m = statistics.fmean(xs)
    if n == 1:
        return {"mean": m, "lo": m, "hi": m, "n": 1}
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.96
    half = t * statistics.stdev(xs) / math.sqrt(n)
    return {"mean": m, "lo": m - half, "hi": m + half, "n": n}


def fmt_interval(iv: Interval | float, nd: int = 1) -> str:
    """A markdown cell: ``mean ±half-width`` with ``nd`` decimals; the mean alone for one
    replicate (or a bare float); an em dash when there is no value."""
    if isinstance(iv, float):
        return f"{iv:.{nd}f}"
    if iv["n"] == 0 or iv["mean"] is None or math.isnan(iv["mean"]):
        return "—"
    if iv["n"] <= 1:
        return f"{iv['mean']:.{nd}f}"
    return f"{iv['mean']:.{nd}f} ±{(iv['hi'] - iv['lo']) / 2:.{nd}f}"


def summary(xs: Sequence[float]) -> dict[str, float]:
    """mean / min / max / sample stdev / count of one sample (NaN where undefined)."""
    if not xs:
        return {"mean": math.nan, "min": math.nan, "max": math.nan, "stdev": math.nan, "n": 0}
    return {
        "mean": statistics.fmean(xs),
        "min": min(xs),
        "max": max(xs),
        "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "n": len(xs),
    }


def seeds_of(first: int, k: int) -> list[int]:
    """The seeds of ``k`` replicates starting at ``first``."""
    if k < 1:
        raise ValueError(f"--seeds must be >= 1, got {k}")
    return [first + i for i in range(k)]


#: how long to wait for a Dask scheduler before giving up with a clear error, seconds
DASK_CONNECT_TIMEOUT_S = 20.0


@contextlib.contextmanager
def dask_executor(address: str) -> Iterator[Executor]:
    """A ``concurrent.futures`` executor backed by the Dask scheduler at ``address``.

    The workers must be able to import ``sim_adapter`` (install the project on every worker).
    Raises :class:`ConfigError` (one line) when ``distributed`` is missing or the scheduler
    cannot be reached."""
    try:
        import distributed
    except ImportError as e:  # pragma: no cover - a dependency of the project
        raise ConfigError(f"--dask needs the 'distributed' package: {e}") from None
    dist: Any = distributed  # the package ships no type information for Client
    try:
        client = dist.Client(address, timeout=DASK_CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        raise ConfigError(f"cannot reach the Dask scheduler at {address}: {e}") from None
    try:
        yield client.get_executor(pure=False)
    finally:
        client.close()


def run_replicates(
    fn: Callable[[int], T],
    seeds: Iterable[int],
    *,
    workers: int = 1,
    label: str = "replicates",
    progress: bool | None = None,
    executor: Executor | None = None,
    dask: str | None = None,
) -> list[T]:
    """Run ``fn(seed)`` for every seed; results in seed order.

    ``fn`` must be picklable (a module-level function or a ``functools.partial`` of one) when
    it runs in a process pool or on Dask. ``dask`` (a scheduler address) runs the replicates on
    that cluster; otherwise ``workers <= 1`` without an ``executor`` runs inline. A ``rich``
    progress bar (:class:`sim_adapter.bench.Progress`) counts finished replicates."""
    if dask:
        with dask_executor(dask) as ex:
            return run_replicates(fn, seeds, label=label, progress=progress, executor=ex)
    seeds = list(seeds)
    bar = bench.Progress(label, enabled=progress)
    bar(0, len(seeds))
    if executor is None and workers <= 1:
        out = []
        for i, s in enumerate(seeds):
            out.append(fn(s))
            bar(i + 1, len(seeds))
        return out
    own = executor is None
    ex = executor if executor is not None else ProcessPoolExecutor(max_workers=workers)
    try:
        futs = {ex.submit(fn, s): i for i, s in enumerate(seeds)}
        res: list[Any] = [None] * len(seeds)
        for done, f in enumerate(as_completed(futs), start=1):
            res[futs[f]] = f.result()
            bar(done, len(seeds))
        return res
    finally:
        if own:
            ex.shutdown()
        bar.close()


def run_seeded(
    fn: Callable[[int], dict[str, Any]], args: argparse.Namespace, name: str
) -> tuple[list[int], list[dict[str, Any]], float]:
    """Run ``fn`` once per seed of the ``add_common_args`` options: (seeds, replicates, wall s).

    Workers are capped at the number of seeds; the progress bar is off under ``--json``."""
    seeds = seeds_of(args.seed, args.seeds)
    t0 = time.perf_counter()
    reps = run_replicates(
        fn,
        seeds,
        workers=min(args.workers, len(seeds)),
        dask=args.dask,
        label=f"{name} replicates",
        progress=None if not args.json else False,
    )
    return seeds, reps, time.perf_counter() - t0


def peak_rss_of(reps: Iterable[dict[str, Any]]) -> float:
    """The largest ``peak_rss_mib`` of the replicates and of this process so far (MiB)."""
    return float(max([r["peak_rss_mib"] for r in reps] + [bench.peak_rss_mib()]))


def add_common_args(p: argparse.ArgumentParser) -> None:
    """``--seeds --seed --workers --dask --json --out``, the same on every experiment."""
    p.add_argument("--seeds", type=int, default=1, help="replicates (seeds SEED..SEED+K-1)")
    p.add_argument("--seed", type=int, default=1, help="seed of the first replicate")
    p.add_argument(
        "--workers", type=int, default=2, help="processes of the local pool (1: run inline)"
    )
    p.add_argument(
        "--dask",
        metavar="ADDRESS",
        default=None,
        help="run replicates on the Dask scheduler at ADDRESS (tcp://HOST:PORT) instead",
    )
    p.add_argument("--json", action="store_true", help="print the JSON document on stdout")
    p.add_argument("--out", default="experiments-out", help="directory for JSON, PNG, markdown")


def _clean(x: Any) -> Any:
    """JSON has no NaN: write it as null."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def write_outputs(
    out_dir: str | Path,
    name: str,
    doc: dict[str, Any],
    markdown: str,
    figures: Sequence[tuple[str, Callable[[Any], None]]] = (),
) -> list[Path]:
    """Write ``NAME.json``, ``NAME.md`` and one PNG per ``(suffix, draw(figure))``; returns the
    paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / f"{name}.json", d / f"{name}.md"]
    paths[0].write_text(json.dumps(_clean(doc), indent=1) + "\n", encoding="utf-8")
    paths[1].write_text(markdown, encoding="utf-8")
    for suffix, draw in figures:
        fig = plt.figure(figsize=(7.5, 4.2), dpi=110)
        draw(fig)
        fig.tight_layout()
        p = d / f"{name}{suffix}.png"
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)
    return paths
