"""Invariants of ``pond-scaling`` (PonD Fig. 6) on a small configuration.

Never the paper's numbers (docs/experiments.md compares those): the negotiator follows PonD
Fig. 2's rule, the flock simulation agrees with equation 2 (its own analytic model), the
event-driven query protocol and the analytic tree walk give the same latency without loss,
the model curves have their stated shapes, and the same seed gives identical output.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from sim_adapter.experiments.pond_common import crossing, zipf_pmf
from sim_adapter.experiments.pond_scaling import (
    Negotiator,
    ScalingConfig,
    condor_linear_s,
    flock_eq2_s,
    flock_simulate_s,
    replicate,
    run,
)

SMALL = ScalingConfig(
    ns=(100, 400),
    events_max_n=400,
    event_queries=2,
    analytic_queries=2,
    flock_trials=4,
)


def test_negotiator_follows_the_minimum_interval_rule() -> None:
    # cycles at 10, 70, 130, ...: T_d = 60, T_i = 20 (PonD Fig. 2)
    neg = Negotiator(60.0, 20.0, phase_s=10.0)
    assert neg.request(45.0) == 45.0  # 35 s since the cycle at 10: at once
    assert neg.request(50.0) == 65.0  # 5 s after the cycle at 45: waits until 45 + 20
    neg = Negotiator(60.0, 20.0, phase_s=10.0)
    assert neg.request(75.0) == 90.0  # the periodic cycle at 70 ran; 70 + 20
    assert neg.request(200.0) == 200.0  # periodic cycles at 150 (= 90 + 60): 50 s ago


def test_flock_simulation_agrees_with_equation_2() -> None:
    cfg = ScalingConfig(flock_trials=4)
    n = 200_000  # 2,000 pools: the mean wait per pool is tight
    sim = flock_simulate_s(cfg, n, random.Random(3))
    per_pool = [s / 2_000 for s in sim]
    eq2 = flock_eq2_s(cfg, n) / 2_000  # 20^2 / 120
    mm = condor_linear_s(cfg, cfg.flock_pool_size)
    assert eq2 == pytest.approx(400 / 120)
    for x in per_pool:
        assert x == pytest.approx(eq2 + mm, rel=0.05)


def test_model_curves_have_their_stated_shape() -> None:
    cfg = ScalingConfig()
    assert condor_linear_s(cfg, 10_000) == pytest.approx(1.0)
    assert condor_linear_s(cfg, 1_000_000) == pytest.approx(100 * condor_linear_s(cfg, 10_000))
    assert flock_eq2_s(cfg, 1_000_000) == pytest.approx(10_000 * 400 / 120)
    # crossing(): where the first curve rises above the second, interpolated in log-log
    assert crossing([1.0, 100.0], [1.0, 100.0], [10.0, 10.0]) == pytest.approx(10.0)
    assert crossing([1.0, 100.0], [1.0, 2.0], [10.0, 10.0]) is None
    assert sum(zipf_pmf()) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def rep() -> dict[str, Any]:
    return replicate(SMALL, 5)


def test_event_driven_query_equals_the_analytic_walk(rep: dict[str, Any]) -> None:
    for p in rep["points"]:
        assert p["events"], "both sizes are under events_max_n"
        for e in p["events"]:
            assert e["visited"] == p["n"]  # the whole ring answered
            assert e["joined"] == SMALL.k  # the pond formed with k machines
            assert e["query_s"] == pytest.approx(e["analytic_same_root_s"], rel=1e-9)
            assert e["formation_s"] > e["query_s"]  # invitations cost a round trip more
        for a in p["analytic"]:
            assert a["count"] == p["n"]


def test_latency_grows_slowly_with_n(rep: dict[str, Any]) -> None:
    small, big = rep["points"]
    lat = [sum(a["latency_s"] for a in p["analytic"]) / len(p["analytic"]) for p in rep["points"]]
    depth = [sum(a["depth"] for a in p["analytic"]) / len(p["analytic"]) for p in (small, big)]
    # four times the nodes: deeper tree, but far less than four times the latency
    assert lat[1] > lat[0] * 0.9 and lat[1] < 4 * lat[0]
    assert depth[1] >= depth[0]
    assert all(x > 0 for x in lat)


def test_same_seed_same_output(rep: dict[str, Any]) -> None:
    again = replicate(SMALL, 5)
    strip = ("wall_s", "build_wall_s", "events_wall_s", "analytic_wall_s", "peak_rss_mib")

    def clean(x: object) -> object:
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in strip}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    assert json.dumps(clean(again), sort_keys=True) == json.dumps(clean(rep), sort_keys=True)


def test_run_writes_its_outputs(tmp_path: Path) -> None:
    args = argparse.Namespace(
        ns="100,300", events_max_n=100, event_queries=1, analytic_queries=1, flock_trials=2,
        seeds=2, seed=1, workers=1, dask=None, json=True, out=str(tmp_path),
    )  # fmt: skip
    doc = run(args)
    names = {Path(p).name for p in doc["files"]}
    assert names == {"pond-scaling.json", "pond-scaling.md", "pond-scaling.png"}
    rows = doc["rows"]
    assert rows[0]["mode"] == "events+analytic" and rows[1]["mode"] == "analytic"
    assert all(r["flock_sim_s"]["n"] == 2 for r in rows)
    assert not math.isnan(rows[1]["cpond_analytic_s"]["mean"])
    json.loads((tmp_path / "pond-scaling.json").read_text())
