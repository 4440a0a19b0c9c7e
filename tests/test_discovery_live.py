"""The discovery plugins live, through the CLI, between processes on loopback UDP (signed).

* Flock: pools announce; a loaded pool's willing list holds exactly the pools with free
  machines that announced to it, and its decision flocks to them (``flockring flock``).
* Query / PonD: ``flockring query`` returns the top-k of every node's ad, checked against
  ``classad2`` over the ads the nodes report; ``flockring pond`` forms and releases a pond.
* Failover (4 processes): SIGKILL the manager's process, the others elect a replacement;
  restart it under its identity, it preempts (Butt et al. 2006 §4.2).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cli_live import ENV, flockring

from flockring.cmd_live import stop_processes
from overlay.identity import Identity

pytestmark = pytest.mark.slow


def start(*args: str, n: int = 1) -> tuple[subprocess.Popen[str], list[str]]:
    cmd = [sys.executable, "-m", "flockring", "node", "--status-interval", "0", "--nodes", str(n)]
    cmd += args
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    addrs: list[str] = []
    assert p.stdout is not None
    deadline = time.monotonic() + 90  # a loaded machine (CI) starts processes slowly
    while len(addrs) < n and time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        parts = line.split()
        if parts[:1] == ["NODE"]:
            addrs.append(parts[2])
    if len(addrs) < n:
        p.kill()
        pytest.fail(f"node process did not come up: {(p.stderr.read() if p.stderr else '')[-800:]}")
    return p, addrs


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    ps: list[subprocess.Popen[str]] = []
    yield ps
    stop_processes(ps)


def ask(*args: str) -> Any:
    r = flockring(*args, "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_until(
    fn: Callable[[], Any], timeout_s: float, what: str, seen: Callable[[], Any] | None = None
) -> Any:
    """Poll ``fn`` until it returns something truthy; on timeout fail with what ``seen`` shows."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.5)
    shown = seen() if seen is not None else last
    pytest.fail(f"{what}: not within {timeout_s} s (last: {shown!r})")


def distinct_digit_identities(tmp_path: Path, n: int) -> list[str]:
    """Key files for ``n`` nodes whose ids all differ in their first hex digit.

    TTL-1 announcements reach exactly the announcer's routing-table entries (Butt et al. 2006
    §5.1.1). Two nodes that share a first digit compete for one row-0 slot of every other
    node's table, so with random ids (about one 5-node ring in six) a pool can be absent from
    another's table and its announcements never reach it. With distinct first digits every
    node sits in row 0 of every other node's table, so the oracle is simply "every idle pool".
    """
    rng = random.Random(20261123)
    paths: list[str] = []
    digits: set[str] = set()
    while len(paths) < n:
        ident = Identity.from_rng(rng)
        d = f"{int(ident.id):040x}"[0]
        if d in digits:
            continue
        digits.add(d)
        p = tmp_path / f"node{len(paths)}.key"
        ident.save(p)
        paths.append(str(p))
    return paths


def test_flock_query_and_pond_across_processes(
    procs: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    keys = distinct_digit_identities(tmp_path, 5)
    common = ("--listen", "udp://127.0.0.1:0", "--machine-ad", "random")
    p0, (loaded,) = start(
        *common, "--identity", keys[0], "--pool", "simulated:4:3.0", "--flock-period", "2"
    )
    procs.append(p0)
    idle: list[str] = []
    for key in keys[1:]:
        p, (addr,) = start(
            *common,
            "--identity",
            key,
            "--join",
            loaded,
            "--pool",
            "simulated:30:0.05",
            "--flock-period",
            "1",
        )
        procs.append(p)
        idle.append(addr)

    def flocking() -> Any:
        info = ask("flock", loaded, "--condor-config")
        d = info["decision"]
        return info if d and d["enabled"] and len(d["targets"]) == len(idle) else None

    def flock_views() -> Any:
        return {a: ask("flock", a) for a in [loaded, *idle]}

    info = wait_until(flocking, 90, "the loaded pool flocks to every idle pool", flock_views)
    listed = {e["collector"] for row in info["willing"] for e in row}
    assert info["decision"]["targets"] and set(info["decision"]["targets"]) == listed
    assert "FLOCK_TO = " in info["condor_config"]
    # each idle pool is announcing but not flocking (it has free machines)
    other = ask("flock", idle[0])
    assert other["decision"] is None or not other["decision"]["enabled"]

    # a query from one node sees every node's ad: top-k by Memory equals the brute force over
    # the ads the nodes answer with (each node's own ad, asked of it with k = 1)
    everyone = [loaded, *idle]
    ads = {}
    for a in everyone:
        r = ask("query", a, "TARGET.Memory > 0", "--rank", "TARGET.Memory", "-k", "5")
        assert r["visited"] == len(everyone) and not r["missing"]
        for m in r["matches"]:
            ads[m["node"]] = m["ad"]["Memory"]
    r = ask("query", idle[1], "TARGET.Memory >= 0", "--rank", "TARGET.Memory", "-k", "3")
    got = [m["rank"] for m in r["matches"]]
    assert got == sorted(ads.values(), reverse=True)[:3]
    bad = flockring("query", loaded, "Memory > ", timeout=30)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "parse" in bad.stderr

    pond = ask("pond", idle[0], "TARGET.Memory > 0", "-k", "2", "--hold", "0.5")
    assert len(pond["members"]) == 2 and pond["release"]["acked"] == 2


def test_failover_live_sigkill_and_preemption(
    procs: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    key = tmp_path / "manager.key"
    ring = ("--pool-ring", "poolA", "--alive-period", "1")
    pm, (maddr,) = start(
        "--listen", "udp://127.0.0.1:0", "--identity", str(key), "--manager", *ring
    )
    procs.append(pm)
    others = []
    for _ in range(3):
        p, (a,) = start("--listen", "udp://127.0.0.1:0", "--join", maddr, *ring)
        procs.append(p)
        others.append(a)
    mid = wait_until(
        lambda: ask("manager", maddr)["role"] == "manager" and ask("manager", maddr)["manager"],
        30,
        "the original claims the manager role",
    )
    pm.send_signal(signal.SIGKILL)
    pm.wait()

    def replaced() -> Any:
        views = [ask("manager", a) for a in others]
        ms = {v["manager"] for v in views}
        serving = [v for v in views if v["role"] == "manager"]
        return (
            views
            if len(ms) == 1 and None not in ms and mid not in ms and len(serving) == 1
            else None
        )

    wait_until(replaced, 40, "exactly one replacement, known to every listener")
    # the original returns under its identity (on a fresh port) and preempts
    pr, (raddr,) = start(
        "--listen",
        "udp://127.0.0.1:0",
        "--join",
        others[0],
        "--identity",
        str(key),
        "--manager",
        *ring,
    )
    procs.append(pr)

    def preempted() -> Any:
        views = [ask("manager", a) for a in [raddr, *others]]
        ok = all(v["manager"] == mid for v in views)
        return views if ok and sum(v["role"] == "manager" for v in views) == 1 else None

    wait_until(preempted, 60, "the original takes the role back; one manager")
