"""Invariants of ``butt-1000`` (Butt et al. 2006 §5.2) on a tiny configuration, every series.

Never the paper's numbers: every job runs exactly once and machines are never over-committed
(brute force over the job log), queues are FIFO and local jobs go first, no job waits while a
machine its policy admits stays idle for longer than one cycle, without flocking no job leaves
its pool, locality is 0 exactly for local jobs, the stepper agrees job for job with the
project's event-driven pool model, and the same seed gives the same output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from discovery.pool import JobLedger, SimulatedPool
from sim_adapter.experiments.butt_1000 import run
from sim_adapter.experiments.butt_1000_model import (
    DEFAULT_SERIES,
    Butt1000Config,
    announce_reach,
    parse_series,
    run_series,
)
from sim_adapter.experiments.butt_stepper import (
    Grid,
    NoFlocking,
    make_grid_traces,
    static_lists,
    symmetric_neighbours,
)

TINY = Butt1000Config(
    pools=24,
    transit_routers=4,
    transit_domains=2,
    stub_domain_size=4,
    machines=(2, 6),
    sequences=(1, 9),
    seq_len=8,
)
VOLATILE = ("wall_s", "cpu_s", "peak_rss_mib", "build_wall_s")


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    return {s: run_series(TINY, (3, s), keep_grid=True) for s in DEFAULT_SERIES}


def _occupancy(grid: Grid) -> np.ndarray:
    """busy[p, t]: machines of pool p running a job during unit t (from the job log only)."""
    end = int((grid.start + grid.dur).max()) + 1
    busy = np.zeros((grid.pools, end + 1), dtype=np.int64)
    for j in range(len(grid.start)):
        busy[grid.ran[j], grid.start[j] : grid.start[j] + grid.dur[j]] += 1
    return busy


def _waiting(grid: Grid) -> np.ndarray:
    """wait[p, t]: jobs of pool p that arrived by t and had not started by the end of t."""
    end = int((grid.start + grid.dur).max()) + 1
    wait = np.zeros((grid.pools, end + 1), dtype=np.int64)
    origin = grid.traces.pool_of_job()
    for j in range(len(grid.start)):
        wait[origin[j], grid.sub[j] : grid.start[j]] += 1
    return wait


@pytest.mark.parametrize("series", DEFAULT_SERIES)
def test_every_job_runs_exactly_once(results: dict[str, dict[str, Any]], series: str) -> None:
    g = results[series]["grid"]
    assert len(g.start) == int(np.diff(g.off).sum()) == results[series]["jobs"]
    assert (g.start >= g.sub).all()  # started once, never before it was submitted
    assert ((g.ran >= 0) & (g.ran < g.pools)).all()
    busy = _occupancy(g)
    assert (busy <= g.machines[:, None]).all()  # never more jobs than machines
    assert g.done()


@pytest.mark.parametrize("series", DEFAULT_SERIES)
def test_fifo_and_local_first(results: dict[str, dict[str, Any]], series: str) -> None:
    g = results[series]["grid"]
    busy = _occupancy(g)
    origin = g.traces.pool_of_job()
    for p in range(g.pools):
        starts = g.start[g.off[p] : g.off[p + 1]]
        assert (np.diff(starts) >= 0).all()  # the queue is FIFO, wherever the head runs
    # a job leaves its pool only at a unit when every machine of its pool is busy
    for j in np.flatnonzero(g.ran != origin):
        assert busy[origin[j], g.start[j]] == g.machines[origin[j]]


def _admitted(
    series: str, res: dict[str, Any], seed: int
) -> tuple[list[set[int]], int, list[list[set[int]]] | None]:
    """The pools each policy may flock to, its cycle in units (the longest a machine it admits
    may stay idle while a job waits) and, for the self-organized policy, the pools whose
    announcements reach each pool at each unit (Pastry keeps maintaining its tables)."""
    spec = parse_series(series)
    n = TINY.pools
    if spec["kind"] == "none":
        return [set() for _ in range(n)], 0, None
    if spec["kind"] == "self":
        # announcement period + manager period + the unit the jobs move in
        cyc = int(np.ceil(TINY.announce_period_units + TINY.manager_period_units)) + 1
        every = [set().union(*(log[p] for log in res["reach_log"])) for p in range(n)]
        return every, cyc, res["reach_log"]
    if spec["kind"] == "static":
        lists = static_lists(res["dist"], spec["k"], spec["choice"], seed)
        return [set(x) for x in lists], 0, None
    nb = symmetric_neighbours(res["dist"], spec["k"])
    # a list is at most `period` old; each stale neighbour costs one refused unit
    return [set(x) for x in nb], spec["period"] + max(len(x) for x in nb), None


@pytest.mark.parametrize("series", DEFAULT_SERIES)
def test_no_wait_while_an_admitted_machine_idles(
    results: dict[str, dict[str, Any]], series: str
) -> None:
    """No machine of an admitted pool stays idle for more than the policy's cycle while a job
    waits. The log has no machine identities, so "a machine idle from the end of unit a to the
    end of unit a + c" is bounded from below: of the machines idle at a, at most one per job
    started there in (a, a + c] can have been used, so idle(a) - starts(a, a + c] >= 1 proves
    one stayed idle throughout."""
    res = results[series]
    g = res["grid"]
    busy = _occupancy(g)
    wait = _waiting(g)
    admitted, cycle, reach_log = _admitted(series, res, 3)
    idle = g.machines[:, None] - busy
    horizon = busy.shape[1]
    starts = np.zeros((g.pools, horizon + 1), dtype=np.int64)
    np.add.at(starts, (g.ran, g.start), 1)
    for p in range(g.pools):
        # local machines: a job never waits at the end of a unit while one of its own is idle
        assert not (wait[p] > 0)[idle[p] > 0].any()
        for q in admitted[p]:
            for a in range(horizon - cycle):
                window = range(a, a + cycle + 1)
                if not all(wait[p, u] > 0 for u in window):
                    continue
                if reach_log is not None and not all(
                    u < len(reach_log) and q in reach_log[u][p] for u in window
                ):
                    continue
                still_idle = idle[q, a] - starts[q, a + 1 : a + cycle + 1].sum()
                assert still_idle < 1, (
                    f"{series}: pool {p} waited from unit {a} to {a + cycle} while a machine "
                    f"of admitted pool {q} stayed idle"
                )


def test_without_flocking_no_job_leaves_and_locality(results: dict[str, dict[str, Any]]) -> None:
    g = results["none"]["grid"]
    origin = g.traces.pool_of_job()
    assert (g.ran == origin).all()
    assert results["none"]["frac_local"] == 1.0 and results["none"]["max_locality"] == 0.0
    for series in DEFAULT_SERIES:
        res = results[series]
        g = res["grid"]
        remote = g.ran != origin
        loc = res["dist"][origin, g.ran] / res["diameter_s"]
        assert (loc[~remote] == 0).all()  # locality is 0 for local jobs...
        assert (loc[remote] > 0).all()  # ...and only for them
        assert res["frac_local"] == pytest.approx(1 - remote.mean())
        assert res["moved"] == int(remote.sum())
        if series != "none":
            assert res["moved"] > 0
            assert res["max_locality"] == pytest.approx(loc.max())


def test_self_organized_uses_the_flock_plugin(results: dict[str, dict[str, Any]]) -> None:
    for s in ("self-joins", "self-oracle"):
        res = results[s]
        assert res["decisions"] > 0 and res["announcements"] > 0
        g = res["grid"]
        origin = g.traces.pool_of_job()
        log = res["reach_log"]
        # a job only ever moves to a pool whose announcements reached its own (TTL 1) within
        # the last validity + manager period
        for j in np.flatnonzero(g.ran != origin):
            t = int(g.start[j])
            assert any(int(g.ran[j]) in log[u][origin[j]] for u in range(max(0, t - 2), t + 1))
        assert announce_reach(res["nodes"])  # the final tables are readable too


def test_stepper_matches_the_event_driven_pool() -> None:
    tr = make_grid_traces(6, 9, machines=(1, 4), sequences=(1, 5), seq_len=12)
    g = Grid(tr, 9)
    g.run(NoFlocking())
    led = JobLedger()
    for p in range(tr.pools):
        pool = SimulatedPool(f"p{p}", int(tr.machines[p]), ledger=led)
        a, b = int(tr.off[p]), int(tr.off[p + 1])
        pool.load_trace([float(x) for x in tr.sub[a:b]], [float(x) for x in tr.dur[a:b]])
        while (t := pool.next_event_s()) is not None:
            pool.advance(t)
    assert list(led.start) == [float(x) for x in g.start]


def test_same_seed_same_output() -> None:
    def strip(r: dict[str, Any]) -> str:
        return json.dumps({k: v for k, v in r.items() if k not in VOLATILE}, sort_keys=True)

    for s in ("self-joins", "gateway-4-1-1"):
        assert strip(run_series(TINY, (5, s))) == strip(run_series(TINY, (5, s)))
    a = run_series(TINY, (5, "none"))
    b = run_series(TINY, (6, "none"))
    assert a["per_pool_mean_wait"] != b["per_pool_mean_wait"]


def test_cli_writes_outputs(tmp_path: Path) -> None:
    args = argparse.Namespace(
        seeds=1,
        seed=2,
        workers=1,
        dask=None,
        json=True,
        out=str(tmp_path),
        pools=30,
        seq_len=4,
        unit_s=10.0,
        series="none,self-oracle,static-nearest-2",
    )
    doc = run(args)
    names = {Path(p).name for p in doc["files"]}
    assert {"butt-1000.json", "butt-1000.md", "butt-1000-fig6.png"} <= names
    assert set(doc["aggregate"]) == {"none", "self-oracle", "static-nearest-2"}
    assert ">0.70" in (tmp_path / "butt-1000.md").read_text()


def test_bad_series_refused() -> None:
    for bad in ("static-far-2", "gateway-1-2", "selfish"):
        with pytest.raises(Exception, match="unknown series"):
            parse_series(bad)
