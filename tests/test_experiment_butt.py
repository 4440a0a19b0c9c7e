"""Invariants of the Butt et al. 2006 Tables 2-3 experiment on a small configuration, with the
ideal pool model (a job starts the instant a machine is free; the Condor machinery model has its
own file, test_experiment_butt_condor.py).

Never the paper's numbers (docs/experiments.md compares those): every job runs exactly once,
no job leaves its pool without flocking, configuration III runs the same jobs as I, flocking
really moves jobs of the overloaded pool and only while the Flock plugin's decision says so,
and the same seed gives the same output, inline or on a process pool.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections import Counter
from pathlib import Path

import pytest

from sim_adapter.experiments import common
from sim_adapter.experiments.butt import replicate, run
from sim_adapter.experiments.butt_condor import Machinery
from sim_adapter.experiments.butt_model import (
    CONFIGURATIONS,
    ButtConfig,
    ConfRun,
    make_traces,
    simulate,
    site_rtt_ms,
)

SMALL = ButtConfig(jobs_per_sequence=12)
MACH = Machinery()


@pytest.fixture(scope="module")
def runs() -> dict[str, ConfRun]:
    return {c: simulate(SMALL, 7, c) for c in CONFIGURATIONS}


def _jobs(r: ConfRun) -> Counter[tuple[float, float]]:
    led = r.ledger
    return Counter((round(r.true_submit[j] - r.t0_s, 6), led.duration[j]) for j in range(len(led)))


@pytest.mark.parametrize("conf", CONFIGURATIONS)
def test_every_job_runs_exactly_once(runs: dict[str, ConfRun], conf: str) -> None:
    r = runs[conf]
    chk = r.ledger.check()
    assert chk.jobs == SMALL.sequences * SMALL.jobs_per_sequence
    assert chk.exactly_once, chk
    # no job starts before it was submitted (waits are measured from the true submit time)
    assert min(r.waits_min()) >= 0.0


def test_no_flocking_keeps_jobs_home(runs: dict[str, ConfRun]) -> None:
    for conf in ("I", "III"):
        led = runs[conf].ledger
        assert all(led.ran_at[j] == led.origin[j] for j in range(len(led)))
        assert runs[conf].flocked_out == 0


def test_single_pool_runs_the_same_jobs(runs: dict[str, ConfRun]) -> None:
    assert _jobs(runs["III"]) == _jobs(runs["I"]) == _jobs(runs["II"]) == _jobs(runs["II-D"])
    # and the traces split 2/2/3/5 in configuration I
    led = runs["I"].ledger
    per = Counter(led.pool_names[led.origin[j]] for j in range(len(led)))
    assert [per[p] for p in "ABCD"] == [n * SMALL.jobs_per_sequence for n in SMALL.split]


def test_flocking_moves_jobs_through_decisions(runs: dict[str, ConfRun]) -> None:
    for conf in ("II", "II-D"):
        r = runs[conf]
        led = r.ledger
        moved = [j for j in range(len(led)) if led.ran_at[j] != led.origin[j]]
        assert r.flocked_out == len(moved) > 0
        assert r.decisions > 0  # targets came from the Flock plugin's published decisions
    led = runs["II-D"].ledger
    assert {led.pool_names[led.origin[j]] for j in range(len(led))} == {"D"}


def test_load_at_d_without_flocking_would_wait_longer(runs: dict[str, ConfRun]) -> None:
    # a flocked job started on a free remote machine: D's jobs in II wait less than in I
    d = runs["I"].waits_min("D")
    assert sum(runs["II"].waits_min("D")) / len(d) < sum(d) / len(d)


def test_same_seed_same_output() -> None:
    a = replicate(SMALL, MACH, "ideal", "planetlab-2006", ("I", "II"), 3)
    b = replicate(SMALL, MACH, "ideal", "planetlab-2006", ("I", "II"), 3)
    for x in (a, b):
        for c in ("I", "II"):
            x[c].pop("wall_s")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert make_traces(SMALL, 3) != make_traces(SMALL, 4)


def test_rtts_symmetric_and_ordered() -> None:
    for a in range(4):
        for b in range(4):
            assert site_rtt_ms(a, b) == pytest.approx(site_rtt_ms(b, a))
    # New York - Houston is nearer than Frankfurt - Berkeley
    assert site_rtt_ms(2, 3) < site_rtt_ms(0, 1)


def test_interval95() -> None:
    iv = common.interval95([1.0, 2.0, 3.0])
    assert iv["mean"] == 2.0
    assert iv["hi"] - 2.0 == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-6)
    assert common.interval95([5.0])["lo"] == 5.0


@pytest.mark.parametrize(
    ("name", "model", "paper"),
    [
        ("butt-table3", "ideal", ("[27.47]", "[27.4]")),
        ("butt-table3", "condor", ("[27.47]", "[27.4]")),
        ("butt-2003-table1", "condor", ("279.48", "106.2")),
    ],
)
def test_cli_writes_outputs(tmp_path: Path, name: str, model: str, paper: tuple[str, str]) -> None:
    m = Machinery()
    args = argparse.Namespace(
        experiment_name=name,
        seeds=2,
        seed=1,
        workers=1,
        dask=None,
        json=True,
        out=str(tmp_path),
        model=model,
        cycle_s=60.0,
        overhead_s=0.0,
        dispatch_fixed_s=m.dispatch_fixed_s,
        dispatch_rtts=m.dispatch_rtts,
        no_claim_reuse=False,
    )
    doc = run(args)
    names = {Path(p).name for p in doc["files"]}
    assert names == {f"{name}.json", f"{name}.md", f"{name}.png"}
    table = (tmp_path / f"{name}.md").read_text()
    assert all(v in table for v in paper)
    stored = json.loads((tmp_path / f"{name}.json").read_text())
    assert stored["seeds"] == [1, 2]
    assert len(stored["replicates"]) == 2
    assert stored["model"] == model


def test_process_pool_gives_inline_results() -> None:
    fn = functools.partial(replicate, SMALL, MACH, "condor", "planetlab-2006", ("I", "III"))
    inline = common.run_replicates(fn, [1, 2], workers=1, progress=False)
    pooled = common.run_replicates(fn, [1, 2], workers=2, progress=False)
    for reps in (inline, pooled):
        for r in reps:
            for c in ("I", "III"):
                r[c].pop("wall_s")
    assert [r["seed"] for r in pooled] == [1, 2]
    assert json.dumps(inline, sort_keys=True) == json.dumps(pooled, sort_keys=True)
