"""Invariants of ``pond-jobs`` (PonD §4.3, Fig. 8) on a small job stream over the 240 machines.

Never the paper's numbers: every task runs exactly once, on a machine whose ad satisfies it
(brute force with ``classad2``) and — in ponds — that carried its autocluster's pond stamp when
the run started; utilisation is in [0, 1] and equals a brute-force recomputation from the job
log; the Condor baseline obeys the same checks; traces in GWA/SWF format are read and filtered;
the same seed gives identical output.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from overlay.errors import ConfigError
from sim_adapter.experiments.pond_jobs import check_log, replicate
from sim_adapter.experiments.pond_jobs_model import (
    JobsConfig,
    machine_ads,
    make_jobs,
    simulate_condor,
    simulate_pond,
    site_rtt_ms,
)
from sim_adapter.experiments.pond_queue import Run, TaskLog
from sim_adapter.experiments.pond_workload import Das2Model, TraceJobs, read_trace

CFG = JobsConfig(rates_per_min=(2.0,), duration_s=600.0)
MODEL = Das2Model(max_log2=3, runtime_median_s=120.0, runtime_sigma=0.6, runtime_max_s=900.0)


@pytest.fixture(scope="module")
def world() -> dict[str, Any]:
    ads = machine_ads(CFG, 4)
    present = {int(a["ZipfAttribute"]) for a in ads}
    tasks, jobs, _skipped = make_jobs(CFG, MODEL, 2.0, 4, present)
    plog, lat, counters, _ = simulate_pond(CFG, ads, tasks, 4)
    clog, _, _ = simulate_condor(CFG, ads, tasks, 4)
    return {"ads": ads, "tasks": tasks, "jobs": jobs, "pond": plog, "lat": lat,
            "counters": counters, "condor": clog}  # fmt: skip


def brute_utilisation(log: TaskLog, machines: int) -> float:
    """Independent recomputation: busy machine-seconds over the experiment's span."""
    t0 = min(t.submit_s for t in log.tasks.values())
    t1 = max(r.end_s for r in log.runs if r.end_s is not None)
    busy = 0.0
    for m in range(machines):
        for r in log.runs:
            if r.machine == m and r.end_s is not None:
                busy += r.end_s - r.start_s
    return busy / (machines * (t1 - t0))


@pytest.mark.parametrize("system", ["pond", "condor"])
def test_every_task_runs_once_on_a_machine_that_fits(world: dict[str, Any], system: str) -> None:
    log = world[system]
    assert len(world["tasks"]) > 20 and world["jobs"] > 5
    chk = check_log(log, world["ads"], ponds=system == "pond")
    assert chk["tasks"] == len(world["tasks"]) == len(log.completed())
    # no machine ran two tasks at once
    by_machine: dict[int, list[Run]] = {}
    for r in log.runs:
        by_machine.setdefault(r.machine, []).append(r)
    for runs in by_machine.values():
        runs.sort(key=lambda r: r.start_s)
        for a, b in itertools.pairwise(runs):
            assert a.end_s is not None and a.end_s <= b.start_s + 1e-9


@pytest.mark.parametrize("system", ["pond", "condor"])
def test_utilisation_matches_a_brute_force_recomputation(
    world: dict[str, Any], system: str
) -> None:
    from sim_adapter.experiments.pond_jobs_model import utilisation

    u = utilisation(world[system], len(world["ads"]))
    assert 0.0 < u <= 1.0
    assert u == pytest.approx(brute_utilisation(world[system], len(world["ads"])), rel=1e-12)


def test_ponds_were_formed_and_queried(world: dict[str, Any]) -> None:
    c = world["counters"]
    assert c["ponds_formed"] > 0 and c["ponds_released"] == c["ponds_formed"]
    assert world["lat"] and all(0.0 < x < 5.0 for x in world["lat"])


def test_check_log_catches_violations(world: dict[str, Any]) -> None:
    log = world["pond"]
    ads = world["ads"]
    twice = TaskLog()
    twice.tasks = dict(log.tasks)
    twice.runs = [*list(log.runs), log.runs[0]]
    with pytest.raises(AssertionError, match="exactly once"):
        check_log(twice, ads, ponds=True)
    r0 = log.runs[0]
    z = log.tasks[r0.task_id].zipf
    wrong = next(i for i, a in enumerate(ads) if int(a["ZipfAttribute"]) != z)
    bad = TaskLog()
    bad.tasks = dict(log.tasks)
    first = Run(r0.task_id, wrong, r0.start_s, r0.end_s, stamp=r0.stamp, pond_job_id=r0.pond_job_id)
    bad.runs = [first, *log.runs[1:]]
    with pytest.raises(AssertionError, match="rejects"):
        check_log(bad, ads, ponds=True)
    unstamped = TaskLog()
    unstamped.tasks = dict(log.tasks)
    first = Run(r0.task_id, r0.machine, r0.start_s, r0.end_s, stamp="", pond_job_id="x")
    unstamped.runs = [first, *log.runs[1:]]
    with pytest.raises(AssertionError, match="stamped"):
        check_log(unstamped, ads, ponds=True)


def test_sites_and_rtts() -> None:
    ads = machine_ads(CFG, 1)
    assert len(ads) == 240
    sites = [a["Site"] for a in ads]
    assert [sites.count(s) for s in ("UChicago", "TACC", "SDSC", "UFL")] == [80, 80, 70, 10]
    rtt = site_rtt_ms(CFG)
    assert 10 < rtt["UChicago-TACC"] < rtt["UChicago-SDSC"] < 100


def test_trace_reader(tmp_path: Path) -> None:
    p = tmp_path / "das2.gwf"
    p.write_text(
        "# JobID SubmitTime WaitTime RunTime NProc AvgCPU UsedMem ReqNProcs ...\n"
        "1 0 5 120 4 100 20480 4 -1 -1 1\n"
        "2 30 2 600 1 590 -1 1 -1 -1 1\n"
        "3 60 0 50 512 40 1024 512 -1 -1 1\n"  # more tasks than machines: skipped
        "4 90 0 0 2 0 1024 2 -1 -1 0\n"  # no run time: skipped
        "5 95 0 70 -1 0 4096 8 -1 -1 1\n"  # NProc unknown: ReqNProcs
    )
    rows = read_trace(p)
    assert rows[0] == (0.0, 120.0, 4, 20.0)
    tj = TraceJobs(p, max_tasks=240, memory_max_mb=1024)
    assert tj.skipped == 2 and [j.tasks for j in tj.rows] == [4, 1, 8]
    bad = tmp_path / "bad.swf"
    bad.write_text("; SWF header\n1 0 5 x 4 100 20480 4\n")
    with pytest.raises(ConfigError, match=r"bad\.swf:2"):
        read_trace(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        read_trace(tmp_path / "missing")


def test_same_seed_same_output() -> None:
    cfg = JobsConfig(rates_per_min=(3.0,), duration_s=240.0)
    a = replicate(cfg, None, 9, model=MODEL)
    b = replicate(cfg, None, 9, model=MODEL)

    def clean(x: object) -> object:
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in ("wall_s", "peak_rss_mib")}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    assert json.dumps(clean(a), sort_keys=True) == json.dumps(clean(b), sort_keys=True)
    row = a["rates"][0]
    assert 0.0 <= row["pond"]["utilisation"] <= 1.0 and 0.0 <= row["condor"]["utilisation"] <= 1.0
