"""CondorPool on the shipped real-format ad files (hand-written; see tests/data/condor/README).

The counts are checked twice: against the numbers the README states for the files, and against
an oracle that evaluates HTCondor constraint expressions with ``classad2`` over every parsed ad
(independent of the pool's own attribute reading).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import classad2
import pytest

from discovery.condor_pool import count_slots, parse_ad_text
from discovery.condor_syntax import CondorError
from discovery.pool import CondorPool, PoolState

DATA = Path(__file__).parent / "data" / "condor"
STATUS = DATA / "condor_status_long.txt"
QUEUE = DATA / "condor_q_long.txt"


def pool(**kw: Any) -> CondorPool:
    return CondorPool.from_files("cs", "cm.example.org:9618", STATUS, QUEUE, **kw)


def count(ads: list[Any], expr: str) -> int:
    e = classad2.ExprTree(expr)
    return sum(1 for ad in ads if e.eval(ad) is True)


def total(ads: list[Any], expr: str, value: str) -> int:
    e, v = classad2.ExprTree(expr), classad2.ExprTree(value)
    return sum(int(v.eval(ad)) for ad in ads if e.eval(ad) is True)


def test_counts_match_the_files() -> None:
    p = pool()
    assert isinstance(p, PoolState)
    s = p.refresh()
    # README: exec01 4 static + exec05 1 + exec06 2 = 7 static machines, 1 free (exec01 slot1);
    # exec02 16 cpus (10 free), exec03 8 cpus (6 left but 2 GiB: 2 free); exec04 is absent
    assert (s.machines, s.free_machines) == (7 + 16 + 8, 1 + 10 + 2)
    assert (s.idle_jobs, s.running_jobs, s.held_jobs) == (3, 2, 1)
    assert s.slots == {"static": 7, "partitionable": 2, "dynamic": 3, "absent": 1}
    assert p.utilization == pytest.approx((31 - 13) / 31)
    assert sorted((a["ClusterId"], a["ProcId"]) for a in p.idle_job_ads()) == [
        (101, 0),
        (101, 1),
        (103, 0),
    ]


def test_counts_match_a_classad_oracle() -> None:
    slots = parse_ad_text(STATUS.read_text())
    jobs = parse_ad_text(QUEUE.read_text())
    assert len(slots) == 13 and len(jobs) == 7
    present = "(Absent =!= true)"
    static = f'{present} && SlotType == "Static"'
    pslot = f'{present} && PartitionableSlot == true && State == "Unclaimed"'
    for mem in (1024, 4096):
        want_machines = count(slots, static) + total(
            slots, f"{present} && PartitionableSlot == true", "TotalSlotCpus"
        )
        want_free = count(slots, f'{static} && State == "Unclaimed" && Activity == "Idle"') + total(
            slots, pslot, f"min({{ Cpus, Memory / {mem} }})"
        )
        s = pool(job_memory_mb=mem).refresh()
        assert (s.machines, s.free_machines) == (want_machines, want_free)
    s = pool().refresh()
    assert s.idle_jobs == count(jobs, "JobStatus == 1")
    assert s.running_jobs == count(jobs, "JobStatus == 2")
    assert s.held_jobs == count(jobs, "JobStatus == 5")


def test_memory_per_job_limits_partitionable_slots() -> None:
    # exec02 has 10 cpus and 40 GiB left, exec03 6 cpus and 2 GiB: at 4 GiB a job, 10 + 0
    assert pool(job_memory_mb=4096).refresh().free_machines == 1 + 10 + 0
    assert pool(job_cpus=4).refresh().free_machines == 1 + 2 + 1
    assert pool(job_cpus=4).refresh().machines == 7 + 4 + 2


def test_partitionable_claimed_state_is_not_free() -> None:
    ad = classad2.ClassAd(
        {
            "SlotType": "Partitionable",
            "PartitionableSlot": True,
            "State": "Claimed",
            "Activity": "Busy",
            "Cpus": 4,
            "Memory": 8192,
            "TotalSlotCpus": 8,
        }
    )
    assert count_slots([ad]) == (8, 0, {"partitionable": 1})


def test_refresh_wraps_source_failures_and_keeps_the_old_snapshot() -> None:
    calls = {"n": 0}

    def flaky() -> list[Any]:
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("Failed communication with collector.")
        return parse_ad_text(STATUS.read_text())

    p = CondorPool("cs", "cm.example.org", startd_ads=flaky, job_ads=list)
    first = p.refresh()
    with pytest.raises(CondorError, match="Failed communication"):
        p.refresh()
    assert p.snapshot is first and p.free_machines == 13 and p.idle_jobs == 0


def test_malformed_ad_text_names_the_line() -> None:
    text = 'MyType = "Machine"\nState = "Unclaimed"\n\nMyType = "Machine"\nState = Unclaimed"\n'
    with pytest.raises(CondorError, match=r"status\.txt, line 5"):
        parse_ad_text(text, source="status.txt")
    assert len(parse_ad_text(text.split("\n\n")[0])) == 1
    for bad in ("State =\n", "State Unclaimed\n", "State = (1 +\n"):
        with pytest.raises(CondorError, match="line 2"):
            parse_ad_text('MyType = "Machine"\n' + bad)


def test_invalid_collector_is_refused() -> None:
    with pytest.raises(CondorError):
        CondorPool("cs", "cm.example.org\nALLOW_WRITE = *", startd_ads=list, job_ads=list)


def test_live_sources_report_an_unreachable_collector_as_condor_error() -> None:
    # the live path (htcondor2.Collector.query / locateAll) against a closed port: no daemon
    # runs here, but the calls are made for real; in a child so the bindings' configuration
    # and ClassAd semantics stay out of this process
    code = (
        "from discovery.pool import CondorPool\n"
        "from discovery.condor_syntax import CondorError\n"
        "p = CondorPool('x', '127.0.0.1:1')\n"
        "try:\n    p.refresh()\nexcept CondorError as e:\n    print('CondorError', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.startswith("CondorError reading pool x (127.0.0.1:1)")
