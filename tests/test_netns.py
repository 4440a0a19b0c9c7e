"""Three "hosts" (Linux network namespaces joined by veth pairs to a bridge) each run one
``flockring node``; they form one ring across the hosts and route to the oracle's node.

Nodes that listen on a wildcard (``0.0.0.0``) advertise the address given with ``--advertise``:
on both overlays and both transports, two hosts hold each other in their leaf sets under that
address (never ``0.0.0.0``), and ``flockring status`` / ``route`` from a third host — a client
bound to ``0.0.0.0`` that no node can dial — get their answers (on TCP, over the connection the
request came on).

Addresses are 198.18.0.0/24 (RFC 2544's benchmarking range) inside namespaces this test creates
and deletes itself; nothing leaves the machine. Skips with the reason where namespaces cannot be
created (not root, no iproute2, no CAP_SYS_ADMIN in a container).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flockring.cmd_live import stop_processes
from overlay.ids import NodeId, closer

pytestmark = pytest.mark.netns

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
TAG = f"fr{os.getpid() % 100000}"
HUB = f"{TAG}hub"
HOSTS = [f"{TAG}h{i}" for i in range(3)]
ADDRS = [f"198.18.0.{i + 1}" for i in range(3)]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


def _cleanup() -> None:
    for ns in [*HOSTS, HUB]:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[str]]:
    if sys.platform != "linux" or shutil.which("ip") is None:
        pytest.skip("needs Linux with iproute2 (`ip`)")
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root")
    try:
        ip("netns", "add", HUB)
        ip("-n", HUB, "link", "add", "br0", "type", "bridge")
        ip("-n", HUB, "link", "set", "br0", "up")
        for i, ns in enumerate(HOSTS):
            ip("netns", "add", ns)
            ip("link", "add", f"{TAG}v{i}", "type", "veth", "peer", "name", f"{TAG}p{i}")
            ip("link", "set", f"{TAG}v{i}", "netns", ns)
            ip("link", "set", f"{TAG}p{i}", "netns", HUB)
            ip("-n", HUB, "link", "set", f"{TAG}p{i}", "master", "br0")
            ip("-n", HUB, "link", "set", f"{TAG}p{i}", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "addr", "add", f"{ADDRS[i]}/24", "dev", f"{TAG}v{i}")
            ip("-n", ns, "link", "set", f"{TAG}v{i}", "up")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        _cleanup()
        err = getattr(exc, "stderr", "") or str(exc)
        pytest.skip(f"cannot create network namespaces here: {err.strip()[:200]}")
    try:
        yield HOSTS
    finally:
        _cleanup()


def in_ns(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, "-m", "flockring", *args]


def test_three_hosts_form_one_ring(hosts: list[str]) -> None:
    procs: list[subprocess.Popen[str]] = []
    nodes: list[tuple[int, str]] = []
    try:
        for ns, addr in zip(hosts, ADDRS, strict=True):
            args = ["node", "--listen", f"udp://{addr}:0", "--status-interval", "0"]
            if nodes:
                args += ["--join", nodes[0][1]]
            p = subprocess.Popen(
                in_ns(ns, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV
            )
            procs.append(p)
            assert p.stdout is not None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                line = p.stdout.readline()
                if not line:
                    err = p.stderr.read() if p.stderr else ""
                    pytest.fail(f"node in {ns} exited: {err[-400:]}")
                if line.startswith("NODE "):
                    _, nid, a = line.split()
                    nodes.append((int(nid, 16), a))
                    break
        assert [a.rsplit(":", 1)[0] for _, a in nodes] == [f"udp://{x}" for x in ADDRS]
        ids = [i for i, _ in nodes]
        for j in range(9):
            key = NodeId.hash_of(b"netns-%d" % j)
            want = ids[0]
            for x in ids:
                if closer(key, x, want):
                    want = x
            ns, (_, entry) = hosts[j % 3], nodes[j % 3]
            r = subprocess.run(
                in_ns(ns, "route", entry, str(key), "--json"),
                capture_output=True,
                text=True,
                timeout=30,
                env=ENV,
            )
            assert r.returncode == 0, r.stderr
            assert int(json.loads(r.stdout)["responsible"], 16) == want
        r = subprocess.run(
            in_ns(hosts[2], "status", nodes[0][1], "--json"),
            capture_output=True,
            text=True,
            timeout=30,
            env=ENV,
        )
        assert r.returncode == 0, r.stderr
        assert len(json.loads(r.stdout)["leaf_set"]) == 2  # both other hosts
    finally:
        stop_processes(procs)


def _start(ns: str, args: list[str]) -> tuple[subprocess.Popen[str], tuple[int, str]]:
    """Start ``flockring node`` in ``ns``; wait for its NODE line (fail with its stderr)."""
    p = subprocess.Popen(
        in_ns(ns, "node", "--status-interval", "0", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert p.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("NODE "):
            _, nid, a = line.split()
            return p, (int(nid, 16), a)
    p.kill()
    err = p.stderr.read() if p.stderr else ""
    pytest.fail(f"node in {ns} did not come up: {err[-400:]}")


def _cli(ns: str, *calls: tuple[str, ...]) -> list[dict[str, object]]:
    """Run CLI client commands in ``ns`` at once (each a process); their JSON answers."""
    procs = [
        subprocess.Popen(
            in_ns(ns, *c, "--json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for c in calls
    ]
    out: list[dict[str, object]] = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=30)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout))
    return out


@pytest.mark.parametrize("scheme", ["udp", "tcp"])
@pytest.mark.parametrize("overlay", ["pastry", "smallworld"])
def test_wildcard_listeners_advertise_their_address(
    hosts: list[str], overlay: str, scheme: str
) -> None:
    procs: list[subprocess.Popen[str]] = []
    try:
        common = ["--overlay", overlay, "--listen", f"{scheme}://0.0.0.0:0"]
        pa, (ida, addr_a) = _start(hosts[0], [*common, "--advertise", ADDRS[0]])
        procs.append(pa)
        pb, (idb, addr_b) = _start(hosts[1], [*common, "--advertise", ADDRS[1], "--join", addr_a])
        procs.append(pb)
        assert addr_a.startswith(f"{scheme}://{ADDRS[0]}:") and not addr_a.endswith(":0")
        assert addr_b.startswith(f"{scheme}://{ADDRS[1]}:")
        # asked from a third host, by a client bound to 0.0.0.0 (nobody can dial it back)
        deadline = time.monotonic() + 20
        while True:
            sa, sb = _cli(hosts[2], ("status", addr_a), ("status", addr_b))
            if (sa["leaf_set"] and sb["leaf_set"]) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert sa["leaf_set"] == [[f"{idb:040x}", addr_b]], sa["leaf_set"]
        assert sb["leaf_set"] == [[f"{ida:040x}", addr_a]], sb["leaf_set"]
        assert sa["ready"] and sb["ready"]
        keys = [NodeId.hash_of(b"advertise-%d" % j) for j in range(4)]
        entries = [(addr_a, addr_b)[j % 2] for j in range(4)]
        asks = [("route", e, str(k)) for e, k in zip(entries, keys, strict=True)]
        answers = _cli(hosts[2], *asks)
        for key, r in zip(keys, answers, strict=True):
            want = ida if closer(key, ida, idb) else idb
            assert int(str(r["responsible"]), 16) == want
            assert r["responsible_address"] == (addr_a if want == ida else addr_b)
    finally:
        stop_processes(procs)
