"""Queue-driven ponds live: ``flockring pond ADDR --from-queue`` across processes on loopback UDP.

A scheduler node (``--pool simulated:4:0 --queue-jobs 15:2``: 15 jobs of three autoclusters,
mean 2 s) and a process of 8 machines with random ads; all datagrams signed. The CLI runs the
node's :class:`~discovery.pond_scheduler.PondScheduler` until the queue is empty and every pond
released. Oracles, from both sides:

* the scheduler's queue: every submitted job was dispatched exactly once and finished exactly
  once, and each start was on a member of its autocluster's pond at that moment;
* the ponds: every pond formed was released by the scheduler itself once its autocluster had
  no idle and no running job (before the CLI's stop);
* each machine's own record (``flockring pond ADDR --member``): memberships alternate join /
  leave (never a join while in a pond: no machine in two ponds), every join is the scheduler's,
  every machine that ran a job joined that job's pond, and every machine ends in no pond.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections import Counter
from typing import Any

import pytest
import trio
from test_cli_live import flockring
from test_discovery_live import procs, start, wait_until

from discovery.control import PondMemberRequest, QueryRequest
from flockring.cmd_discovery import _ask

__all__ = ["procs"]  # the fixture, re-exported for pytest

pytestmark = pytest.mark.slow

JOBS = 15


def ask(address: str, msg: Any) -> Any:
    """A control request from this process (no CLI process per question: the test stays fast)."""
    return trio.run(_ask, address, msg, 20.0)


def test_queue_driven_ponds_across_processes(procs: list[subprocess.Popen[str]]) -> None:
    udp = ("--listen", "udp://127.0.0.1:0", "--machine-ad", "random")
    ps, (sched,) = start(*udp, "--pool", "simulated:4:0", "--queue-jobs", f"{JOBS}:2")
    procs.append(ps)
    pm, machines = start(*udp, "--join", sched, n=8)
    procs.append(pm)
    everyone = [sched, *machines]

    def all_answer() -> Any:
        r = ask(
            sched, QueryRequest(secrets.randbits(62), "TARGET.Memory > 0", "", 9, "best", False)
        )
        return r if r["visited"] == len(everyone) and len(r["matches"]) == len(everyone) else None

    # every node answers the scheduler's queries; their answers name each node's id
    seen = wait_until(all_answer, 60, "the scheduler's query reaches every node")
    ids = {m["address"]: m["node"] for m in seen["matches"]}
    assert set(ids) == set(everyone)
    r = flockring(
        "pond",
        sched,
        "--from-queue",
        "--interval",
        "1",
        "--until-empty",
        "--duration",
        "90",
        "--json",
        timeout=150,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ended"] == "empty", out["before_stop"]
    # every job dispatched once, finished once; none started outside its pond
    dispatched = Counter(j for j, _, _ in out["dispatched"])
    finished = Counter(j for j, _, _, _ in out["finished"])
    assert sorted(dispatched) == list(range(1, JOBS + 1)) and set(dispatched.values()) == {1}
    assert finished == dispatched
    assert out["violations"] == []
    # the scheduler released every pond as its autocluster emptied
    before = out["before_stop"]
    assert before["clusters"] == [] and before["queue_empty"] is True
    assert before["ponds_released"] == before["ponds_formed"] >= 1
    # each machine's own record
    ran_in: dict[str, set[str]] = {}
    for _job, machine, pond_job in out["dispatched"]:
        ran_in.setdefault(machine, set()).add(pond_job)
    assert set(ran_in) <= set(ids.values())
    for a, node_id in ids.items():
        m = ask(a, PondMemberRequest(secrets.randbits(62)))
        assert m["joined_while_in_pond"] == 0 and m["member_of"] is None
        hist = m["history"]
        joins, leaves = hist[0::2], hist[1::2]
        assert all(mgr == ids[sched] for _, mgr, _ in joins), hist
        assert all(mgr is None for _, mgr, _ in leaves), hist
        assert len(joins) == len(leaves)  # ended in no pond
        assert ran_in.get(node_id, set()) <= {job for _, _, job in joins}
