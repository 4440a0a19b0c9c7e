"""Invariants of the Condor machinery model behind the four-pool tables (small traces).

Never the paper's numbers: every job runs exactly once, machines never run two jobs at once,
every start paid its dispatch cost and one schedd ships one job at a time, FLOCK_TO is traversed
in order, jobs stay home without flocking, both testbeds come from one model, the negotiation
cycle sweep is monotone where the model says it must be, the calibration hits its target, and
the same seed gives the same output.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
from collections import defaultdict

import attrs
import pytest

from overlay.runtime import ManualRuntime
from sim_adapter.experiments.butt import replicate
from sim_adapter.experiments.butt_condor import (
    CONFIGURATIONS,
    CondorRun,
    Machinery,
    _Model,
    pair_rtt_ms,
    simulate_condor,
)
from sim_adapter.experiments.butt_model import ButtConfig
from sim_adapter.experiments.butt_sweep import calibrate

SMALL = ButtConfig(jobs_per_sequence=12)
MACH = Machinery()


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str], CondorRun]:
    out = {}
    for tb in ("planetlab-2006", "lan-2003"):
        for conf in CONFIGURATIONS:
            out[(tb, conf)] = simulate_condor(SMALL, MACH, 5, conf, testbed=tb)
    return out


def _dispatch_s(tb: str, run: CondorRun, j: int) -> float:
    rtt = pair_rtt_ms(tb, run.schedd_site[j], run.ran_site[j], MACH, SMALL.rtt_overhead_ms)
    return MACH.dispatch_fixed_s + MACH.dispatch_rtts * rtt / 1000.0


@pytest.mark.parametrize("tb", ["planetlab-2006", "lan-2003"])
@pytest.mark.parametrize("conf", CONFIGURATIONS)
def test_exactly_once_and_machines_never_shared(
    runs: dict[tuple[str, str], CondorRun], tb: str, conf: str
) -> None:
    r = runs[(tb, conf)]
    assert len(r.origin) == SMALL.sequences * SMALL.jobs_per_sequence
    assert r.exactly_once()
    by_machine: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for j in range(len(r.origin)):
        # the wait includes the dispatch this job paid (rule 4)
        assert r.start[j] - r.submit[j] >= _dispatch_s(tb, r, j) - 1e-9
        by_machine[r.ran_machine[j]].append(
            (r.start[j] - _dispatch_s(tb, r, j), r.start[j] + r.length[j])
        )
    for spans in by_machine.values():
        spans.sort()
        for (_, end), (begin, _) in itertools.pairwise(spans):
            assert begin >= end - 1e-6  # claimed from its dispatch to its end: never two jobs


@pytest.mark.parametrize("tb", ["planetlab-2006", "lan-2003"])
@pytest.mark.parametrize("conf", CONFIGURATIONS)
def test_no_job_waits_a_cycle_while_a_machine_of_its_pool_idles(
    runs: dict[tuple[str, str], CondorRun], tb: str, conf: str
) -> None:
    """A job idle at its schedd and an unclaimed machine of its own pool never coexist for
    longer than one negotiation cycle: the pool's negotiator runs every cycle and serves local
    submitters first (rules 1-2). Brute force over the claim log and the jobs' match times."""
    r = runs[(tb, conf)]
    end = max(c[3] for c in r.claims)
    claims: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for machine, pool, a, b in r.claims:
        assert r.machine_pool[machine] == pool and a <= b
        claims[machine].append((a, b))
    idle: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for machine, pool in enumerate(r.machine_pool):
        t = 0.0
        for a, b in sorted(claims[machine]):
            assert a >= t - 1e-9  # one claim at a time per machine
            if a > t:
                idle[pool].append((t, a))
            t = b
        idle[pool].append((t, end))
    worst = 0.0
    for j in range(len(r.origin)):
        q0, q1 = r.submit[j], r.matched[j]
        assert q0 <= q1 <= r.start[j]
        for a, b in idle[r.origin[j]]:
            worst = max(worst, min(q1, b) - max(q0, a))
    assert worst <= MACH.negotiation_cycle_s + 1e-6
    assert worst > 0  # jobs do meet idle machines: the bound is exercised


@pytest.mark.parametrize("conf", CONFIGURATIONS)
def test_one_dispatch_at_a_time_per_schedd(
    runs: dict[tuple[str, str], CondorRun], conf: str
) -> None:
    tb = "planetlab-2006"
    r = runs[(tb, conf)]
    by_schedd: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for j in range(len(r.origin)):
        by_schedd[r.origin[j]].append((r.start[j] - _dispatch_s(tb, r, j), r.start[j]))
    for spans in by_schedd.values():
        spans.sort()
        for (_, end), (begin, _) in itertools.pairwise(spans):
            assert begin >= end - 1e-6


def test_without_flocking_jobs_stay_home(runs: dict[tuple[str, str], CondorRun]) -> None:
    for tb in ("planetlab-2006", "lan-2003"):
        for conf in ("I", "III"):
            r = runs[(tb, conf)]
            assert all(o == p for o, p in zip(r.origin, r.ran_at, strict=True))
            assert r.flocked_out == 0
        for conf in ("II", "II-D", "II-A"):
            r = runs[(tb, conf)]
            moved = sum(o != p for o, p in zip(r.origin, r.ran_at, strict=True))
            assert moved == r.flocked_out > 0
            assert r.decisions > 0


def test_one_model_two_testbeds(runs: dict[tuple[str, str], CondorRun]) -> None:
    # without flocking every job is dispatched on its own LAN: the testbeds cannot differ
    a, b = runs[("planetlab-2006", "I")], runs[("lan-2003", "I")]
    assert a.start == b.start and a.ran_machine == b.ran_machine
    # the single pool ships jobs across the WAN on PlanetLab only: it waits longer there
    assert statistics.fmean(runs[("planetlab-2006", "III")].waits_min()) > statistics.fmean(
        runs[("lan-2003", "III")].waits_min()
    )


def test_flock_to_is_traversed_in_order() -> None:
    """Pool 0's schedd reaches FLOCK_TO[1] only after FLOCK_TO[0]'s negotiator left jobs idle."""
    mach = attrs.evolve(MACH, negotiation_cycle_s=60.0, dispatch_fixed_s=1.0, dispatch_rtts=0.0)
    rt = ManualRuntime(seed=1)
    model = _Model(
        rt, mach, lambda a, b: 0.5, [[0, 0], [1], [2] * 5], ["P", "Q", "R"], random.Random(1)
    )
    s = model.add_schedd(0, 0)
    s.flock_to = [1, 2]
    model.load(s, ([0.0] * 6, [3600.0] * 6), 0.0)
    model.arm_negotiator(0, 0.0)  # local cycle first: matches 2, level 0 -> 1
    model.arm_negotiator(2, 5.0)  # R's cycle comes before Q's: the schedd is not yet at level 2
    model.arm_negotiator(1, 10.0)  # Q matches 1, out of servers: level 1 -> 2
    rt.advance(4000.0)
    on_r = [model.start[j] for j in range(6) if model.ran_at[j] == 2]
    assert len(on_r) == 3
    assert min(on_r) >= 65.0  # R's next cycle, never its first one at 5 s
    assert sorted(model.ran_at) == [0, 0, 1, 2, 2, 2]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(("conf", "testbed"), [("I", "planetlab-2006"), ("III", "lan-2003")])
def test_longer_cycle_never_shortens_a_single_pools_wait_per_job(
    seed: int, conf: str, testbed: str
) -> None:
    """Where the model makes it a theorem: without claim reuse every start waits for a
    negotiation instant, and the instants of 60 s and 300 s cycles are subsets of those of 20 s;
    with one dispatch cost for every machine (a lone pool, or the single pool on one LAN) no job
    may then start earlier under a longer cycle."""
    base = attrs.evolve(MACH, claim_reuse=False)
    waits = []
    for cycle in (20.0, 60.0, 300.0):
        m = attrs.evolve(base, negotiation_cycle_s=cycle)
        waits.append(simulate_condor(SMALL, m, seed, conf, testbed=testbed).waits_min())
    for shorter, longer in itertools.pairwise(waits):
        assert all(b >= a - 1e-9 for a, b in zip(shorter, longer, strict=True))
    assert sum(waits[2]) > sum(waits[0])


def test_longer_cycle_never_shortens_the_single_pool_mean() -> None:
    """With claim reuse (the default) a job can start earlier under a longer cycle (a later
    release lets it ride a claim), and on the WAN the machine drawn for it, so its dispatch
    cost, changes with the cycle: the claim is on the mean over replicates, of the single pool
    (III) and of each lone pool (I), on both testbeds, with the full traces."""
    cfg = ButtConfig()
    seeds = range(1, 11)
    for tb in ("planetlab-2006", "lan-2003"):
        means = []
        for cycle in (20.0, 60.0, 300.0):
            m = attrs.evolve(MACH, negotiation_cycle_s=cycle)
            row = []
            for conf, pool in [("III", None), *(("I", p) for p in "ABCD")]:
                xs = [
                    statistics.fmean(simulate_condor(cfg, m, s, conf, testbed=tb).waits_min(pool))
                    for s in seeds
                ]
                row.append(statistics.fmean(xs))
            means.append(row)
        for shorter, longer in itertools.pairwise(means):
            assert all(b >= a - 1e-9 for a, b in zip(shorter, longer, strict=True)), (tb, means)


def test_calibration_hits_its_targets() -> None:
    fixed, rtts, means = calibrate(
        SMALL, MACH, [1, 2], target_lan_min=2.0, target_wan_min=4.0, iterations=14
    )
    assert fixed > 0 and rtts > 0
    assert means["lan-2003"] == pytest.approx(2.0, rel=0.05)
    assert means["planetlab-2006"] == pytest.approx(4.0, rel=0.05)


def test_same_seed_same_output() -> None:
    a = replicate(SMALL, MACH, "condor", "planetlab-2006", ("I", "II", "III"), 3)
    b = replicate(SMALL, MACH, "condor", "planetlab-2006", ("I", "II", "III"), 3)
    for x in (a, b):
        for c in ("I", "II", "III"):
            x[c].pop("wall_s")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    other = replicate(SMALL, MACH, "condor", "planetlab-2006", ("I",), 4)
    assert other["I"]["pools"]["Overall"]["mean"] != a["I"]["pools"]["Overall"]["mean"]


def test_bad_parameters_refused() -> None:
    with pytest.raises(ValueError):
        Machinery(negotiation_cycle_s=0.0)
    with pytest.raises(ValueError):
        Machinery(dispatch_rtts=-1.0)
    with pytest.raises(ValueError):
        simulate_condor(SMALL, MACH, 1, "IV")
    with pytest.raises(ValueError):
        simulate_condor(SMALL, MACH, 1, "I", testbed="moon")
