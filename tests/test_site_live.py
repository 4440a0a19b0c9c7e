"""The site live: the manager pushes its flocking decision to submit machines on other processes,
each applies it to a real ``config.d`` fragment, and a rebooted submit machine refuses a replayed
older decision (Butt et al. 2006 §3.3, §4.1). Loopback UDP, every datagram and push signed.

Processes: pool A's manager (``--pool-ring poolA --manager --pool simulated:4:3.0``: overloaded,
so it flocks), four submit machines (``--pool-ring poolA --submit --condor-config-dir DIR``;
four, so that after the manager's death a replacement still has a quorum of 3 replica holders
that run faultD)
and two idle pools (``--pool simulated:30:0.05``), all on one overlay (the live simplification:
pool ring = flock ring). Ids are chosen by first hex digit: pool A's machines sit next to the
manager's id (so faultD's replica holders are pool A's machines) and every node is in row 0 of
every other node's routing table (TTL-1 announcements reach every pool).

Oracles: each submit machine's ``FLOCK_TO`` file equals the manager's published decision, at the
manager's version; after SIGKILL and restart a submit machine starts at the version it had
applied (read back from the dot file beside the fragment); a genuine, manager-signed decision
older than that version, sent to it after the restart, is refused and counted and changes
neither its version nor its file. Then the manager is SIGKILLed: exactly one submit machine
takes the flock role with a higher epoch, and every surviving submit machine's file equals the
replacement's decision (which still flocks to both idle pools) at the replacement's version.
"""

from __future__ import annotations

import random
import secrets
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from test_discovery_live import procs, start, wait_until

from discovery.condor import FLOCK_CONFIG_FILE, applied_state_path, read_applied_state
from discovery.condor_syntax import parse_config
from discovery.control import ManagerInfoRequest
from discovery.decision import FlockDecision
from discovery.signing import Ed25519Signer, sign_message
from discovery.submit import DOMAIN, FlockPush, encode_decision
from flockring.cmd_discovery import _ask
from overlay.handle import NodeHandle
from overlay.identity import Identity
from overlay.live.node import Node
from transports import open_udp

__all__ = ["procs"]

pytestmark = pytest.mark.slow

ALIVE = "1"  # faultD's alive period and the push's re-broadcast period, seconds


def key_with_digit(tmp_path: Path, name: str, digit: str, rng: random.Random) -> Path:
    """A key file whose node id starts with hex ``digit``."""
    while True:
        ident = Identity.from_rng(rng)
        if f"{int(ident.id):040x}"[0] == digit:
            p = tmp_path / f"{name}.key"
            ident.save(p)
            return p


def info(address: str) -> Any:
    return trio.run(_ask, address, ManagerInfoRequest(secrets.randbits(62)), 20.0)


def flock_to(conf_dir: Path) -> str | None:
    p = conf_dir / FLOCK_CONFIG_FILE
    return parse_config(p.read_text()).get("FLOCK_TO", "") if p.exists() else None


def test_submit_machines_follow_the_manager_and_a_reboot_never_goes_back(
    procs: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    rng = random.Random(20261124)
    km = key_with_digit(tmp_path, "manager", "8", rng)
    ks = [key_with_digit(tmp_path, f"submit{i}", d, rng) for i, d in enumerate("79a6")]
    kp = [key_with_digit(tmp_path, f"idle{i}", d, rng) for i, d in enumerate("2d")]
    udp = ("--listen", "udp://127.0.0.1:0")
    ring = ("--pool-ring", "poolA", "--alive-period", ALIVE)
    pm, (mgr,) = start(
        *udp, "--identity", str(km), *ring, "--manager", "--pool", "simulated:4:3.0",
        "--flock-period", "1",
    )  # fmt: skip
    procs.append(pm)
    dirs = [tmp_path / f"config.d-{i}" for i in range(len(ks))]
    subs: list[str] = []

    def submit_node(i: int, listen: str = "udp://127.0.0.1:0") -> tuple[subprocess.Popen[str], str]:
        p, (a,) = start(
            "--listen", listen, "--join", mgr, "--identity", str(ks[i]), *ring, "--submit",
            "--condor-config-dir", str(dirs[i]), "--condor-reconfig", "none",
        )  # fmt: skip
        procs.append(p)
        return p, a

    sub_procs = []
    for i, d in enumerate(dirs):
        d.mkdir()
        p, a = submit_node(i)
        sub_procs.append(p)
        subs.append(a)
    for k in kp:
        p, _ = start(
            *udp, "--join", mgr, "--identity", str(k), "--pool", "simulated:30:0.05",
            "--flock-period", "1",
        )  # fmt: skip
        procs.append(p)

    def converged() -> Any:
        m = info(mgr)["site"]
        if not m["serving"] or len(m["applied_flock_to"]) != 2:
            return None
        want = ", ".join(m["applied_flock_to"])
        views = [info(a)["site"] for a in subs]
        ok = all(
            tuple(v["applied_version"] or ()) == tuple(m["applied_version"]) and flock_to(d) == want
            for v, d in zip(views, dirs, strict=True)
        )
        return (m, views) if ok else None

    m, _views = wait_until(
        converged, 90, "every submit machine applies the manager's decision", lambda: info(mgr)
    )
    assert not any(v["serving"] for v in _views)  # only the manager holds the flock role
    version = tuple(m["applied_version"])

    # -------- SIGKILL submit machine 0; it restarts from what it had applied
    sub_procs[0].send_signal(signal.SIGKILL)
    sub_procs[0].wait()
    kept = read_applied_state(applied_state_path(dirs[0] / FLOCK_CONFIG_FILE))
    assert kept is not None and kept.version == version
    text_before = (dirs[0] / FLOCK_CONFIG_FILE).read_text()
    # a rebooted host comes back at its address (its peers' tables still name that address)
    _p, back = submit_node(0, subs[0])
    assert back == subs[0]
    got = info(back)["site"]
    # it started from the kept decision (not from a pull that may have been answered since)
    assert (
        got["applier"].get("state_loaded") == 1 and got["applier"].get("state_unreadable", 0) == 0
    )
    assert got["applied_version"] is not None and tuple(got["applied_version"]) >= version

    # -------- a genuine, manager-signed, older decision replayed to it: refused and counted
    e, q = version
    older = FlockDecision(False, (), 0.0, *((e, q - 1) if q > 0 else (e - 1, 0)))
    mgr_ident = Identity.load(km)
    push = sign_message(
        FlockPush(
            mgr_ident.id,
            NodeHandle(mgr_ident.id, mgr),
            older.epoch,
            older.seq,
            encode_decision(older),
        ),
        Ed25519Signer(mgr_ident.private_key),
        DOMAIN,
    )
    back_id = Identity.load(ks[0]).id

    async def replay() -> None:
        ident = Identity.from_rng(rng)
        async with open_udp("udp://127.0.0.1:0") as t, Node(t, "pastry", ident) as n:
            await n.join([mgr])
            for _ in range(3):  # a datagram may be lost: the count only grows
                n.send_message(back, push, back_id)
                await trio.sleep(0.3)

    stale_before = info(back)["site"]["sync"]["stats"].get("stale", 0)
    trio.run(replay)
    after = wait_until(
        lambda: (s := info(back)["site"])["sync"]["stats"].get("stale", 0) > stale_before and s,
        20,
        "the replayed older decision is counted as stale",
    )
    now_version = tuple(after["applied_version"])
    assert now_version >= version
    assert after["sync"]["stats"].get("applied", 0) == 0 or now_version > version
    # the file never went back: it is the one from before the restart, or a newer decision's
    now = (dirs[0] / FLOCK_CONFIG_FILE).read_text()
    assert now == text_before or now_version > version

    # -------- the manager dies: a submit machine takes the flock role and pushes (§3.3)
    pm.send_signal(signal.SIGKILL)
    pm.wait()
    alive = [back, *subs[1:]]

    def taken_over() -> Any:
        views = [info(a)["site"] for a in alive]
        serving = [v for v in views if v["serving"]]
        if len(serving) != 1 or len(serving[0]["applied_flock_to"]) != 2:
            return None
        rep = serving[0]
        if rep["applied_version"][0] <= version[0]:
            return None
        want = ", ".join(rep["applied_flock_to"])
        ok = all(
            tuple(v["applied_version"] or ()) == tuple(rep["applied_version"])
            and flock_to(d) == want
            for v, d in zip(views, dirs, strict=True)
        )
        return rep if ok else None

    rep = wait_until(
        taken_over,
        60,
        "one replacement holds the flock role and every submit machine applied its decision",
        lambda: [(info(a)["role"], info(a)["stats"], info(a)["site"]) for a in alive],
    )
    assert rep["collector"] == "cm.poolA.flockring.test:9618"  # the pool's name, replicated
