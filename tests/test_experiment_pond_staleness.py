"""Invariants of ``pond-staleness`` (PonD Fig. 7) on small configurations.

Never the paper's numbers: the simulated Condor collector agrees with its analytic model —
equation 3-4 and their exact form — within a stated tolerance; so does the attribute-dynamics
model; the per-node query timeline (``sim_adapter.fastquery.query_timeline``) is exactly when
the event-driven protocol evaluates each node; the pond plugin's claim-time re-check declines
stale matches and never lets one join; the same seed gives identical output.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from discovery.machine import DictProvider, MachineAd, random_machine_ad
from overlay.smallworld import SmallWorldConfig
from sim_adapter.experiments import pond_staleness_model as m
from sim_adapter.experiments.pond_common import zipf_pmf
from sim_adapter.experiments.pond_staleness import (
    StalenessConfig,
    cpond_attr_events,
    cpond_churn_events,
    replicate,
)
from sim_adapter.fastquery import count_analytic, query_timeline
from sim_adapter.latency import Uniform
from sim_adapter.network import Network
from sim_adapter.plugins import query as pq

#: stated tolerance between simulated and analytic Condor staleness: 0.015 absolute, about 5
#: standard errors of a fraction over 40,000 workers (sd <= 0.5/sqrt(40000) = 0.0025 per side)
TOL = 0.015
N = 40_000


@pytest.mark.parametrize("mean_s", [300.0, 1500.0])
@pytest.mark.parametrize("delta_s", [0.0, 100.0])
def test_condor_churn_simulation_agrees_with_the_analytic_model(
    mean_s: float, delta_s: float
) -> None:
    sim = m.condor_churn_sim(N, mean_s, 300.0, 900.0, (0.0, delta_s), np.random.default_rng(7))
    thr = m.condor_churn_analytic(mean_s, 300.0, 900.0, delta_s)
    got = sim["by_delta"][str(delta_s)]
    assert sim["up_fraction"] == pytest.approx(0.5, abs=TOL)
    assert got["eq4"] == pytest.approx(thr["eq4_exact"], abs=TOL)
    assert got["per_schedule"] == pytest.approx(thr["per_schedule_exact"], abs=TOL)
    # equation 3 itself (update age uniform) is within the tolerance of the exact form too
    assert thr["eq4_eq3"] == pytest.approx(thr["eq4_exact"], abs=TOL)
    # every up worker is listed, so a listed worker is up with P(up) / P(listed) at most
    assert got["per_schedule"] <= sim["up_fraction"] / sim["listed_fraction"] + 1e-12


def test_equation_3_closed_form() -> None:
    lam, td, ts = 1 / 1500, 300.0, 900.0
    # the integral of equation 3 by brute-force quadrature
    h = 0.01
    acc = 0.0
    t = h / 2
    while t < ts:
        w = 1.0 if t <= ts - td else (ts - t) / td
        acc += lam * math.exp(-lam * t) * w * h
        t += h
    assert m.p_stl_eq3(lam, td, ts) == pytest.approx(acc, rel=1e-4)
    assert m.p_stl_exact(lam, td, ts) > m.p_stl_eq3(lam, td, ts)  # short sessions age less


@pytest.mark.parametrize("mean_s", [60.0, 300.0, 1500.0])
def test_attribute_simulation_agrees_with_the_analytic_model(mean_s: float) -> None:
    sim = m.attr_sim(N, mean_s, 300.0, (0.0, 100.0), np.random.default_rng(3))
    assert sim["by_delta"]["0.0"] == pytest.approx(m.attr_analytic(mean_s, 300.0, 0.0), abs=TOL)
    assert sim["by_delta"]["100.0"] == pytest.approx(m.attr_analytic(mean_s, 300.0, 100.0), abs=TOL)
    assert sim["value1_fraction"] == pytest.approx(zipf_pmf()[0], abs=TOL)
    assert sim["changes"] > 0


def test_timeline_is_when_the_protocol_evaluates_each_node() -> None:
    net = Network(seed=4, latency=Uniform(0.05, 0.30, seed=4))
    nodes = net.spawn(
        400,
        overlay="smallworld",
        build="oracle",
        config=SmallWorldConfig(maintenance_enabled=False),
    )
    seen: dict[int, float] = {}

    class Recording(DictProvider):
        def __init__(self, i: int) -> None:
            super().__init__()
            self.i = i

        def dynamic(self):  # type: ignore[no-untyped-def]
            seen.setdefault(self.i, net.now)
            return self.values

    pq.attach(
        net,
        seed=2,
        pond=False,
        machine_ad=lambda n, rng: MachineAd(
            random_machine_ad(rng, f"n{n.index}"), Recording(n.index)
        ),
    )
    t0 = net.now
    res = pq.query(net, nodes[9], "TARGET.Memory >= 1024", "TARGET.KFlops", k=5)
    tl = query_timeline(net, nodes[9])
    assert tl.visited == res.visited == 400
    assert tl.latency_s == pytest.approx(res.elapsed_s, rel=1e-12)
    assert tl.latency_s == pytest.approx(count_analytic(net, nodes[9], loss=0.0).latency_s)
    assert len(seen) == 400
    for i, t in seen.items():
        assert tl.arrival_s[i] == pytest.approx(t - t0, abs=1e-9)
    w, lat, visited = m.cpond_windows(net, 9)
    assert visited == 400 and lat == tl.latency_s
    assert float(w.min()) >= 0.0 and float(w.max()) <= 2 * lat


TINY = StalenessConfig(
    means_s=(300.0,),
    attr_means_s=(20.0, 1e9),
    workers=5_000,
    analytic_roots=1,
    events_n=200,
    event_queries=3,
    k=5,
)


def test_claim_time_recheck_declines_stale_matches() -> None:
    fast = cpond_attr_events(TINY, 2.0, 11)  # values change every 2 s: many matches go stale
    assert fast["stale_declined"] > 0
    assert fast["joined"] + fast["stale_declined"] + fast["lost"] > 0
    frozen = cpond_attr_events(TINY, 1e9, 11)  # never changes: nothing can be stale
    assert frozen["stale_declined"] == 0 and frozen["non_stale"] == 1.0
    assert frozen["joined"] == TINY.k * TINY.event_queries


def test_departed_nodes_lose_their_invitations() -> None:
    churn = cpond_churn_events(TINY, 5.0, 3)  # sessions of 5 s: nodes leave mid-query
    assert churn["lost"] > 0 and churn["non_stale"] < 1.0
    calm = cpond_churn_events(TINY, 1e9, 3)
    assert calm["lost"] == 0 and calm["non_stale"] == 1.0


def test_same_seed_same_output() -> None:
    a = replicate(TINY, 2)
    b = replicate(TINY, 2)
    for r in (a, b):
        r.pop("wall_s")
        r.pop("peak_rss_mib")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    c = replicate(TINY, 3)
    c.pop("wall_s")
    c.pop("peak_rss_mib")
    assert json.dumps(a, sort_keys=True) != json.dumps(c, sort_keys=True)
    assert 0.0 <= a["cpond_analytic"]["churn"]["300.0"] <= 1.0
