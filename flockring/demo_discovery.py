"""``flockring demo-discovery``: the discovery plugins live, in local processes on loopback UDP.

1. **Flock.** Three processes run pools' central managers on one overlay: one process's pools
   are overloaded (queues grow), the others have free machines. The idle pools announce; the
   loaded pool's willing list fills, nearest first, and its Flocking Manager turns flocking on
   with the ``FLOCK_TO`` it would give HTCondor (Butt et al. 2006 §3.2, §4.1).
2. **Query and Pool on Demand.** Every node has a (random) machine ClassAd; a node runs a
   First-Fit tree query with HTCondor's matchmaking, then forms a pond of two machines and
   releases it (PonD §3.1–3.2).
3. **Manager failover.** Four processes form a pool ring; the manager's process is killed
   (SIGKILL), the others elect a replacement; the original is restarted under its identity and
   preempts the replacement (Butt et al. 2006 §3.3, §4.2).

Each step prints what a user would look at; the demo exits non-zero if a step did not happen.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flockring.cli import CliError

__all__ = ["cmd_demo_discovery", "register"]


def _spawn(args: list[str], count: int = 1) -> tuple[subprocess.Popen[str], list[str]]:
    from flockring.cmd_live import _read_nodes, _spawn_node

    p = _spawn_node(count, [], extra=args)
    try:
        return p, [addr for _, addr in _read_nodes(p, count, 60)]
    except CliError:
        p.kill()
        raise


def _ask(address: str, msg: Any, timeout_s: float = 30.0) -> Any:
    from flockring.cmd_discovery import _ask as ask
    from flockring.cmd_live import _trio_run

    return _trio_run(ask, address, msg, timeout_s)


def _nonce() -> int:
    import secrets

    return secrets.randbits(62)


def _wait(fn: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.5)
    return None


def _flock_part(procs: list[subprocess.Popen[str]]) -> tuple[bool, list[str]]:
    from discovery.control import FlockInfoRequest, PondReleaseRequest, PondRequest, QueryRequest
    from flockring.cmd_discovery import _print_query, _table

    print("== 1. self-organizing flock: 3 processes, pools announce free machines")
    common = ["--machine-ad", "random", "--flock-period", "2"]
    p, loaded = _spawn(["--pool", "simulated:6:3.0", *common], 1)
    procs.append(p)
    everyone = list(loaded)
    for _ in range(2):
        p, addrs = _spawn(["--join", loaded[0], "--pool", "simulated:20:0.1", *common], 3)
        procs.append(p)
        everyone += addrs
    print(f"   {len(everyone)} pools up; pool at {loaded[0]} has 6 machines and a growing queue")

    def flocking() -> Any:
        info = _ask(loaded[0], FlockInfoRequest(_nonce(), True))
        d = info["decision"]
        return info if d and d["enabled"] and len(d["targets"]) >= len(everyone) - 1 else None

    info = _wait(flocking, 60)
    if info is None:
        print("   the loaded pool did not start flocking within 60 s")
        return False, everyone
    pool = info["pool"]
    print(
        f"   loaded pool: {pool['machines']} machines, {pool['free']} free, "
        f"{pool['idle_jobs']} idle jobs"
    )
    keys = ("row", "pool", "rtt_ms", "free", "expires_in_s")
    rows = [[e[k] for k in keys] for sub in info["willing"] for e in sub]
    _table(
        "   its willing list (RTT in 5 ms steps, then more free machines first)", list(keys), rows
    )
    print("   the HTCondor configuration it would apply (config.d fragment):")
    for line in (info["condor_config"] or "").splitlines():
        print("     " + line)

    print("\n== 2. ClassAd tree query and a Pool on Demand")
    req, rank = 'TARGET.Memory >= 2048 && TARGET.Arch == "X86_64"', "TARGET.Memory"
    print(f"   query from {everyone[1]}: Requirements = {req}, Rank = {rank}, k = 3, first-fit")
    _print_query(_ask(everyone[1], QueryRequest(_nonce(), req, rank, 3, "first_fit", False)))
    pond = _ask(everyone[2], PondRequest(_nonce(), "TARGET.Memory >= 1024", "", 2))
    members = ", ".join(n[:8] for n, _ in pond["members"])
    print(f"   pond {pond['pond_id']} formed by {everyone[2]}: members {members}")
    rel = _ask(everyone[2], PondReleaseRequest(_nonce(), pond["pond_id"]))
    print(f"   released: {rel['acked']} machines acknowledged")
    return len(pond["members"]) == 2 and rel["acked"] == 2, everyone


def _failover_part(procs: list[subprocess.Popen[str]], tmp: Path) -> bool:
    from discovery.control import ManagerInfoRequest

    print("\n== 3. manager failover on a pool ring of 4 processes (alive every second)")
    key = str(tmp / "manager.key")
    ring = ["--pool-ring", "demo-pool", "--alive-period", "1"]
    pm, (maddr,) = _spawn(["--identity", key, "--manager", *ring])
    procs.append(pm)
    others = []
    for _ in range(3):
        p, (a,) = _spawn(["--join", maddr, *ring])
        procs.append(p)
        others.append(a)

    def status(a: str) -> Any:
        return _ask(a, ManagerInfoRequest(_nonce()), 5.0)

    mid = _wait(
        lambda: status(maddr)["manager"] if status(maddr)["role"] == "manager" else None, 30
    )
    if not mid:
        print("   the original did not claim the manager role")
        return False
    print(f"   manager {mid[:8]} at {maddr}; killing its process (SIGKILL)")
    t0 = time.monotonic()
    pm.send_signal(signal.SIGKILL)
    pm.wait()

    def replaced() -> Any:
        views = [status(a) for a in others]
        ms = {v["manager"] for v in views}
        return views if len(ms) == 1 and None not in ms and mid not in ms else None

    views = _wait(replaced, 40)
    if views is None:
        print("   no replacement was elected")
        return False
    new = views[0]
    print(
        f"   replacement {new['manager'][:8]} serving after {time.monotonic() - t0:.1f} s "
        f"(term {new['epoch'][0]}); every listener agrees"
    )
    print("   restarting the original under its identity")
    t1 = time.monotonic()
    pr, (raddr,) = _spawn(["--join", others[0], "--identity", key, "--manager", *ring])
    procs.append(pr)

    def back() -> Any:
        vs = [status(a) for a in [raddr, *others]]
        return vs if all(v["manager"] == mid for v in vs) else None

    vs = _wait(back, 60)
    if vs is None:
        print("   the original did not take its role back")
        return False
    print(
        f"   original {mid[:8]} preempted the replacement after {time.monotonic() - t1:.1f} s "
        f"(term {vs[0]['epoch'][0]}); one manager again"
    )
    return True


def cmd_demo_discovery(args: argparse.Namespace) -> int:
    """Run the three parts; exit 1 if one of them did not show what it should."""
    from flockring.cmd_live import stop_processes

    procs: list[subprocess.Popen[str]] = []
    ok = True
    try:
        with tempfile.TemporaryDirectory(prefix="flockring-demo-") as tmp:
            if args.part in ("all", "flock"):
                good, _ = _flock_part(procs)
                ok &= good
                stop_processes(procs)
                procs.clear()
            if args.part in ("all", "failover"):
                ok &= _failover_part(procs, Path(tmp))
    finally:
        stop_processes(procs)
    print("\ndiscovery demo: " + ("every step happened" if ok else "a step did NOT happen"))
    return 0 if ok else 1


def register(sub: Any) -> None:
    """Add ``demo-discovery`` to the CLI."""
    d = sub.add_parser("demo-discovery", help="flock, query, pond and failover, live, locally")
    d.add_argument("--part", choices=("all", "flock", "failover"), default="all")
    d.set_defaults(func=cmd_demo_discovery)
