"""``flockring bench chaos``: live node processes killed and restarted while lookups run.

Theory of operation. ``--processes`` P processes of ``flockring node --nodes K`` (signed UDP on
loopback, the code users run) form one ring. A seeded schedule then, every ``--kill-every-s``,
SIGKILLs one random running process (no goodbye, its K nodes vanish at once) and restarts it
``--down-s`` later with fresh identities, joining through a random node of another running
process. Throughout, lookups for random keys are asked of random nodes (of processes that have
been up for ``--settle-s``) at ``--rate`` per second through the control protocol
(``ControlClient.lookup``, what ``flockring route`` does). Each answer is checked against the
brute-force oracle — the node, among those of the processes running at the moment the answer
arrives, numerically closest to the key (the one at the moment it was asked is accepted too: a
kill between the two may move responsibility). A process prints ``JOINING <id>`` as each node
starts its join and ``NODE <id>`` once it has joined; a node counts from its NODE line. A node
delivers what reached it while joining right as its join ends, before it prints that line, so
an answer from a node whose line has not come yet waits up to ``_READY_GRACE_S`` for it and is
then judged with the node counted (``correct_answered_as_join_ended``; logged in ``misses``
as ``answered_as_join_ended`` either way). Reported per ``--window-s``: lookups asked,
correct, wrong, timed out; and every lookup that timed out or was answered wrongly (``misses``:
when, how long after the last kill, of which node and whether its process still ran, the key,
the oracle's root before and after, the answer and, for a wrong one, when the answering node's
join started and ended), with the time-outs of lookups asked of a node
whose process was being killed counted apart too (``timeout_asked_node_killed``).

After the last kill the ring is given ``--final-s`` of quiet, then checked as one ring: every
node's status is read and each node's nearest clockwise leaf must be its true successor among
the live nodes (one cycle through every node: not two rings, not a broken one), and a final
batch of lookups must all be correct. A benchmark, never a test: the wall clock decides.
"""

from __future__ import annotations

import argparse
import bisect
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from overlay.errors import ConfigError
from overlay.ids import NodeId, closer
from sim_adapter import bench


class _Proc:
    """One node process and the nodes it reported."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.p: subprocess.Popen[str] | None = None
        self.nodes: list[tuple[int, str]] = []  # (id, address)
        self.up_since = 0.0
        self.restarts = 0

    @property
    def running(self) -> bool:
        return self.p is not None and self.p.poll() is None and bool(self.nodes)


def _spawn(args: argparse.Namespace, join: str | None) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "flockring", "node", "--listen", "udp://127.0.0.1:0"]
    cmd += ["--nodes", str(args.nodes_per_process), "--overlay", args.overlay]
    cmd += ["--status-interval", "0"]
    if join:
        cmd += ["--join", join]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _read_nodes(
    p: subprocess.Popen[str],
    k: int,
    out: list[tuple[int, str]],
    seen: dict[int, dict[str, float]],
    slot: int,
) -> None:
    """Append to ``out`` each node the process reports, as it reports it (a node is reported
    once its join has completed), until ``k`` are in. Runs in a worker thread; ``out`` is the
    list the oracle reads, so each node counts from the moment it is ready, as the simulated
    churn bench counts a node live once its join completes (MSPastry's active nodes). ``seen``
    records, by id, the process slot and when the node's ``JOINING`` and ``NODE`` lines were
    read (monotonic clock): what a wrong answer from a node not yet in the oracle is traced by."""
    assert p.stdout is not None
    while len(out) < k:
        line = p.stdout.readline()
        if not line:
            err = p.stderr.read() if p.stderr is not None else ""
            raise ConfigError(f"a node process exited: {err.strip().splitlines()[-1:]}")
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("JOINING", "NODE"):
            i = int(NodeId.from_hex(parts[1]))
            seen.setdefault(i, {"slot": slot})[parts[0]] = time.monotonic()
            if parts[0] == "NODE":
                out.append((i, parts[2]))


#: how long an answer from a node still joining waits for that node's NODE line (see
#: ``one_lookup``): the line follows the join's end within milliseconds on an idle machine
_READY_GRACE_S = 0.5


def _oracle(ids: list[int], key: int) -> int:
    i = bisect.bisect_left(ids, key)
    a, b = ids[i % len(ids)], ids[(i - 1) % len(ids)]
    return a if closer(key, a, b) else b


async def _chaos(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    from overlay.live.control import ControlClient
    from transports import open_udp

    rng = random.Random(args.seed)
    procs = [_Proc(i) for i in range(args.processes)]
    windows: list[dict[str, int]] = []
    kills: list[dict[str, Any]] = []
    #: every lookup that timed out, was answered wrongly or was answered by a node as its
    #: join ended (``miss``), in the order seen
    misses: list[dict[str, Any]] = []
    kill_times: list[float] = []  # at the kill (``kills`` is appended after the restart)
    seen: dict[int, dict[str, float]] = {}  # every node reported: see ``_read_nodes``
    t_start = time.monotonic()

    def live_ids() -> list[int]:
        return sorted(i for pr in procs if pr.running for i, _ in pr.nodes)

    async def start(pr: _Proc, join: str | None) -> None:
        # Its nodes enter the oracle one by one as they finish joining (until this version all
        # five entered only once the last had joined, so an answer from one of the first four
        # counted as wrong); lookups are asked of them only ``settle_s`` after the last.
        pr.up_since = math.inf
        pr.nodes = []
        pr.p = await trio.to_thread.run_sync(_spawn, args, join)
        await trio.to_thread.run_sync(
            _read_nodes, pr.p, args.nodes_per_process, pr.nodes, seen, pr.slot
        )
        pr.up_since = time.monotonic()

    def window() -> dict[str, int]:
        w = int((time.monotonic() - t_start) // args.window_s)
        while len(windows) <= w:
            windows.append({"asked": 0, "correct": 0, "wrong": 0, "timeout": 0})
        return windows[w]

    async def one_lookup(c: ControlClient, tally: dict[str, int] | None) -> bool:
        now = time.monotonic()
        ready = [pr for pr in procs if pr.running and now - pr.up_since >= args.settle_s]
        if not ready:
            return False
        pr = rng.choice(ready)
        asked, addr = rng.choice(pr.nodes)
        key = NodeId.random(rng)
        before = live_ids()
        w = tally if tally is not None else window()
        w["asked"] += 1
        t_ask = time.monotonic()
        try:
            r = await c.lookup(addr, key, args.lookup_timeout_s)
        except Exception:  # a timeout, or the asked node's process was just killed
            w["timeout"] += 1
            misses.append(miss("timeout", t_ask, pr, asked, key, before, None, tally))
            return False
        got = int(r.responsible.id)
        t_answer = time.monotonic()
        after = live_ids()
        ok = bool(after) and got in (_oracle(after, int(key)), _oracle(before, int(key)))
        kind = "wrong"
        if not ok and "JOINING" in seen.get(got, {}) and "NODE" not in seen[got]:
            # The answer came from a node whose join was under way when its lines were last
            # read. A node becomes active in its process (the join's callback) before it
            # delivers what reached it while linking, and prints its NODE line only after:
            # the answer can overtake the line. Wait a moment for the line, then judge with
            # the node counted if it came (still wrong if it did not, or another is closer).
            until = t_answer + _READY_GRACE_S
            while "NODE" not in seen[got] and time.monotonic() < until:
                await trio.sleep(0.005)
            if "NODE" in seen[got]:
                kind = "answered_as_join_ended"
                ok = got == _oracle(live_ids(), int(key))
        w["correct" if ok else "wrong"] += 1
        if not ok or kind != "wrong":
            m = miss(kind, t_ask, pr, asked, key, before, got, tally)
            m["answered_at_s"] = round(t_answer - t_start, 3)
            m["correct"] = ok
            misses.append(m)
        return ok

    def miss(
        kind: str,
        t_ask: float,
        pr: _Proc,
        asked: int,
        key: NodeId,
        before: list[int],
        got: int | None,
        tally: dict[str, int] | None,
    ) -> dict[str, Any]:
        """What a lookup that failed was, for tracing it: when (and how long after the last
        kill) it was asked, of which node, whether that node's process still ran when the
        failure was seen, and the oracle's root before and after."""
        after = live_ids()
        last_kill = kill_times[-1] if kill_times else None
        t = t_ask - t_start
        return {
            "kind": kind,
            "final_check": tally is not None,
            "asked_at_s": round(t, 2),
            "after_kill_s": None if last_kill is None else round(t - last_kill, 2),
            "asked": f"{asked:040x}",
            "asked_slot": pr.slot,
            "asked_still_running": pr.running and any(i == asked for i, _ in pr.nodes),
            "key": f"{int(key):040x}",
            "root_before": f"{_oracle(before, int(key)):040x}" if before else None,
            "root_after": f"{_oracle(after, int(key)):040x}" if after else None,
            "got": None if got is None else f"{got:040x}",
            # where the answering node was when the answer was checked: its process slot and
            # whether the oracle counted it (when its JOINING and NODE lines came is filled
            # in at the end of the run, :func:`_when_joined`)
            **(
                {}
                if got is None
                else {"got_slot": seen.get(got, {}).get("slot"), "got_in_oracle": got in after}
            ),
        }

    async def lookups(c: ControlClient, until: float) -> None:
        async with trio.open_nursery() as n:
            while time.monotonic() < until:
                n.start_soon(one_lookup, c, None)
                await trio.sleep(rng.expovariate(args.rate))

    async def killer(until: float) -> None:
        while True:
            await trio.sleep(args.kill_every_s)
            if time.monotonic() >= until:
                return
            running = [pr for pr in procs if pr.running]
            if len(running) < 2:
                continue
            victim = rng.choice(running)
            assert victim.p is not None
            victim.p.send_signal(signal.SIGKILL)
            await trio.to_thread.run_sync(victim.p.wait)
            t_kill = time.monotonic() - t_start
            kill_times.append(t_kill)
            await trio.sleep(args.down_s)
            others = [pr for pr in procs if pr.running and pr is not victim]
            seed = rng.choice(rng.choice(others).nodes)[1]
            victim.restarts += 1
            t_restart = time.monotonic() - t_start
            await start(victim, seed)
            kills.append(
                {
                    "slot": victim.slot,
                    "killed_at_s": round(t_kill, 1),
                    "restarted_at_s": round(t_restart, 1),
                    "rejoined_via": seed,
                    # each restarted node's join, from its JOINING line to its NODE line
                    "joins_s": [
                        round(seen[i]["NODE"] - seen[i]["JOINING"], 3)
                        for i, _ in victim.nodes
                        if "JOINING" in seen.get(i, {})
                    ],
                }
            )

    try:
        await start(procs[0], None)
        for pr in procs[1:]:
            await start(pr, procs[0].nodes[0][1])
        await trio.sleep(args.settle_s)
        async with open_udp("udp://127.0.0.1:0") as t, ControlClient(t) as c:
            until = time.monotonic() + args.minutes * 60.0
            async with trio.open_nursery() as n:
                n.start_soon(killer, until)
                n.start_soon(lookups, c, until)
            await trio.sleep(args.final_s)
            final = await _final_check(args, c, procs, one_lookup)
    finally:
        for pr in procs:
            if pr.p is not None and pr.p.poll() is None:
                pr.p.send_signal(signal.SIGTERM)
        for pr in procs:
            if pr.p is not None:
                try:
                    pr.p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pr.p.kill()
    asked = sum(w["asked"] for w in windows)
    correct = sum(w["correct"] for w in windows)
    return {
        "asked": asked,
        "correct": correct,
        "wrong": sum(w["wrong"] for w in windows),
        "timeout": sum(w["timeout"] for w in windows),
        # of those, lookups asked of a node whose process was killed before it could answer
        # (counted in ``timeout`` all the same: the caller saw no answer)
        "timeout_asked_node_killed": sum(
            1
            for m in misses
            if m["kind"] == "timeout" and not m["final_check"] and not m["asked_still_running"]
        ),
        # of ``correct``: answers from a node whose NODE line came only after its answer
        # (within ``_READY_GRACE_S``), by then the node closest to the key
        "correct_answered_as_join_ended": sum(
            1
            for m in misses
            if m["kind"] == "answered_as_join_ended" and m["correct"] and not m["final_check"]
        ),
        "success_fraction": bench.r(correct / asked, 4) if asked else None,
        "kills": len(kills),
        "kill_log": kills,
        "misses": [_when_joined(m, seen, t_start) for m in misses],
        "windows": windows,
        **final,
    }


def _when_joined(m: dict[str, Any], seen: dict[int, dict[str, float]], t0: float) -> dict[str, Any]:
    """``m`` with, for a wrong answer, when the answering node's ``JOINING`` and ``NODE``
    lines were read (seconds into the run; None: never) — read at the end of the run, so a
    line that came after the answer is there too."""
    if m.get("got") is None:
        return m
    rec = seen.get(int(m["got"], 16), {})
    return {
        **m,
        "got_joining_at_s": round(rec["JOINING"] - t0, 3) if "JOINING" in rec else None,
        "got_ready_at_s": round(rec["NODE"] - t0, 3) if "NODE" in rec else None,
    }


async def _final_check(
    args: argparse.Namespace, c: Any, procs: list[_Proc], one_lookup: Any
) -> dict[str, Any]:
    ids = sorted(i for pr in procs if pr.running for i, _ in pr.nodes)
    addrs = [a for pr in procs if pr.running for _, a in pr.nodes]
    bad_successor = 0
    unreachable = 0
    internal = 0
    for addr in addrs:
        try:
            st = await c.status(addr, args.lookup_timeout_s)
        except Exception:
            unreachable += 1
            continue
        internal += bench.internal_errors(dict(st.stats))
        me = int(st.handle.id)
        leaves = sorted(int(h.id) for h in st.leaf_set if int(h.id) != me)
        true_succ = ids[(ids.index(me) + 1) % len(ids)] if me in ids else None
        # nearest clockwise leaf: the smallest id above us, else wrap around
        above = [x for x in leaves if x > me]
        succ = above[0] if above else (leaves[0] if leaves else None)
        if succ != true_succ:
            bad_successor += 1
    tally = {"asked": 0, "correct": 0, "wrong": 0, "timeout": 0}
    for _ in range(args.final_lookups):
        await one_lookup(c, tally)
    return {
        "final_nodes": len(ids),
        "final_unreachable": unreachable,
        "final_bad_successor": bad_successor,
        "one_ring": unreachable == 0 and bad_successor == 0,
        # exceptions the nodes up at the end counted and survived (a killed process's are
        # gone with it)
        "final_internal_errors": internal,
        "final_lookups": tally,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the chaos schedule and return the figures."""
    import trio

    if args.processes < 2 or args.nodes_per_process < 1 or args.rate <= 0:
        raise ConfigError("need --processes >= 2, --nodes-per-process >= 1, --rate > 0")
    with bench.stopwatch() as wall:
        res = trio.run(_chaos, args)
    out: dict[str, Any] = {
        "bench": "chaos",
        "overlay": args.overlay,
        "processes": args.processes,
        "nodes_per_process": args.nodes_per_process,
        "minutes": args.minutes,
        "kill_every_s": args.kill_every_s,
        "down_s": args.down_s,
        "rate_per_s": args.rate,
        "window_s": args.window_s,
        "seed": args.seed,
        **res,
        "wall_s": bench.r(wall(), 1),
        **bench.environment(),
    }
    if args.png:
        _plot(out, args.png)
    return out


def _plot(res: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ws = res["windows"]
    w_s = res["window_s"]
    t = [i * w_s for i in range(len(ws))]
    frac = [w["correct"] / w["asked"] if w["asked"] else float("nan") for w in ws]
    fig, ax = plt.subplots(figsize=(7.5, 3.5), dpi=110)
    ax.plot(t, frac, drawstyle="steps-post", label="correct fraction")
    for k in res["kill_log"]:
        ax.axvline(k["killed_at_s"], c="red", alpha=0.3)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("wall time (s); red: a process SIGKILLed")
    ax.set_ylabel("lookups correct")
    size = f"{res['processes']}x{res['nodes_per_process']}"
    ax.set_title(f"live chaos: {res['overlay']}, {size} nodes")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _main(args: argparse.Namespace) -> int:
    bench.emit(run(args), args.json, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``chaos`` benchmark parser."""
    p = sub.add_parser("chaos", help="live processes SIGKILLed and restarted under lookups")
    p.add_argument("--overlay", choices=("pastry", "smallworld"), default="pastry")
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--nodes-per-process", type=int, default=5)
    p.add_argument("--minutes", type=float, default=5.0, help="wall minutes of chaos")
    p.add_argument("--kill-every-s", type=float, default=20.0)
    p.add_argument("--down-s", type=float, default=5.0, help="a killed process stays down")
    p.add_argument("--settle-s", type=float, default=5.0, help="new nodes are asked after")
    p.add_argument("--rate", type=float, default=5.0, help="lookups per second")
    p.add_argument("--lookup-timeout-s", type=float, default=5.0)
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--final-s", type=float, default=20.0, help="quiet before the ring check")
    p.add_argument("--final-lookups", type=int, default=200)
    p.add_argument("--png", help="write the success-over-time figure here")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="also write the JSON to this file")
    p.set_defaults(func=_main)
