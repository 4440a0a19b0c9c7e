"""The live CLI end to end: 4 processes x 5 nodes join one ring on loopback UDP through
``flockring node``; ``flockring route`` crosses processes and agrees with the oracle; after one
process is SIGKILLed the others still route correctly; user mistakes give one line on stderr.
The same ``status`` / ``route`` checks run against rings on ``tcp://`` and on TCP with TLS 1.3
(``node --tls``, ``status --tls``, ``route --tls``); a TLS node does not answer a plain client.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flockring.cmd_live import stop_processes
from overlay.ids import NodeId, closer

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def flockring(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flockring", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=ROOT,
    )


def start(
    n: int, join: list[str], listen: str = "udp://127.0.0.1:0", extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[str], list[tuple[int, str]]]:
    cmd = [sys.executable, "-m", "flockring", "node", "--listen", listen]
    cmd += ["--nodes", str(n), "--status-interval", "0", *extra]
    for j in join:
        cmd += ["--join", j]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    out: list[tuple[int, str]] = []
    assert p.stdout is not None
    deadline = time.monotonic() + 30
    while len(out) < n and time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        parts = line.split()
        if parts[:1] == ["NODE"]:
            out.append((int(parts[1], 16), parts[2]))
    if len(out) < n:
        p.kill()
        err = p.stderr.read() if p.stderr else ""
        pytest.fail(f"node process did not come up: {err[-500:]}")
    return p, out


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    ps: list[subprocess.Popen[str]] = []
    yield ps
    stop_processes(ps)


def oracle(ids: list[int], key: int) -> int:
    best = ids[0]
    for x in ids:
        if closer(key, x, best):
            best = x
    return best


def route(addr: str, key: NodeId, timeout: float = 10, extra: tuple[str, ...] = ()) -> int:
    r = flockring("route", addr, str(key), "--json", "--timeout", str(timeout), *extra)
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout)["responsible"], 16)


def test_four_processes_form_one_ring_and_survive_a_sigkill(
    procs: list[subprocess.Popen[str]],
) -> None:
    nodes: list[tuple[int, str]] = []
    groups: list[list[tuple[int, str]]] = []
    for _ in range(4):
        p, got = start(5, [nodes[0][1]] if nodes else [])
        procs.append(p)
        groups.append(got)
        nodes += got
    ids = [i for i, _ in nodes]
    keys = [NodeId.hash_of(b"cli-%d" % j) for j in range(8)]
    for j, key in enumerate(keys):
        entry = groups[j % 4][j % 5][1]  # every process serves as an entry point
        assert route(entry, key) == oracle(ids, key)
    st = flockring("status", nodes[0][1], "--json")
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert status["ready"] and len(status["leaf_set"]) >= 8
    assert {a for _, a in nodes} >= {a for _, a in status["leaf_set"]}

    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    live = [i for i, _ in nodes if (i, _) not in groups[1]]
    entries = [a for g in (groups[0], groups[2], groups[3]) for _, a in g]
    deadline = time.monotonic() + 45
    wrong: list[int] = []
    while time.monotonic() < deadline:
        wrong = [
            j
            for j, key in enumerate(keys)
            if route(entries[j % len(entries)], key, 15) != oracle(live, key)
        ]
        if not wrong:
            break
        time.sleep(2)
    assert not wrong, f"keys still routed to dead or wrong nodes: {wrong}"


def test_user_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    cases = [
        ("node", "--listen", "udp://127.0.0.1"),
        ("node", "--listen", "udp://no-such-host.invalid:1"),
        ("node", "--join", "udp://127.0.0.1:9", "--join-timeout", "1"),
        ("status", "udp://127.0.0.1:9", "--timeout", "0.5"),
        ("route", "bogus", "abc"),
        # overlay config overrides: no such field, no such nested config, not JSON, refused
        ("node", "--set", "nope=1"),
        ("node", "--set", "proximity.nope=1"),
        ("node", "--set", "leaf_set_size=eight"),
        ("node", "--overlay", "smallworld", "--set", "stabilize_interval_s=0"),
    ]
    key = tmp_path / "key"
    key.write_text("garbage")
    key.chmod(0o600)
    cases.append(("node", "--identity", str(key)))
    loose = tmp_path / "loose"
    loose.write_text("x")
    loose.chmod(0o644)
    cases.append(("node", "--identity", str(loose)))
    for args in cases:
        r = flockring(*args)
        assert r.returncode != 0, args
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, (args, r.stderr)
        assert lines[0].startswith("flockring: error:") or "usage" in lines[0], (args, lines)


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_status_and_route_over_tcp(procs: list[subprocess.Popen[str]], tls: bool) -> None:
    extra = ("--tls",) if tls else ()
    nodes: list[tuple[int, str]] = []
    for _ in range(2):
        p, got = start(4, [nodes[0][1]] if nodes else [], "tcp://127.0.0.1:0", extra)
        procs.append(p)
        nodes += got
    assert all(a.startswith("tcp://127.0.0.1:") for _, a in nodes)
    ids = [i for i, _ in nodes]
    for j in range(4):
        key = NodeId.hash_of(b"tcp-%d" % j)
        entry = nodes[(j * 3) % len(nodes)][1]  # entries in both processes
        assert route(entry, key, extra=extra) == oracle(ids, key)
    st = flockring("status", nodes[5][1], "--json", *extra)
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert status["ready"] and int(status["id"], 16) == nodes[5][0]
    assert status["address"] == nodes[5][1]
    assert {a for _, a in status["leaf_set"]} <= {a for _, a in nodes}
    assert len(status["leaf_set"]) == len(nodes) - 1
    if tls:
        # a client without TLS gets no answer from a TLS node, and says so in one line
        r = flockring("status", nodes[0][1], "--timeout", "1")
        assert r.returncode != 0 and r.stderr.startswith("flockring: error: no answer")
