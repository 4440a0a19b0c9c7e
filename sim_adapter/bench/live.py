"""``flockring bench live``: a live swarm on loopback UDP in one process, beside bmuller's kademlia.

Theory of operation (docs/design.md, "Performance targets"): each configuration runs in a
fresh worker process (``python -m sim_adapter.bench.live --worker``) so that RSS baselines are
clean. A worker binds N UDP sockets on 127.0.0.1 (port 0), starts N :class:`overlay.Node`
objects in one trio loop and joins them one at a time, each through up to three random earlier
nodes — the shape of the project's peer script ``benchmarks/peers/kademlia_bench.py``, which
measures kademlia 2.2.3 (asyncio, one ``Server`` per socket, sequential bootstrap from up to 3
earlier nodes) beside ours. Then M lookups run one at a time from random nodes for random keys;
each is checked against the brute-force oracle (the numerically closest id) and the datagrams
sent by all nodes while it ran are counted (kademlia's script counts the same way, so periodic
maintenance traffic during a lookup is included on both sides).

Our overlay runs twice: with signatures off (kademlia authenticates nothing, so that is the
like-for-like comparison) and authenticated (the default: Noise sessions between peers with
sustained traffic, Ed25519-signed datagrams otherwise); ``--signing all`` adds a third run with
an Ed25519 signature on every datagram (sessions off), the scheme sessions replace. kademlia is
installed into a throwaway venv (default ``/tmp/flockring-kademlia-venv``), never into the
project's; if it cannot be installed or its script is absent, the JSON says so and why.

Diagnostics of one worker: ``bringup_by_tenth`` gives, per tenth of the bring-up, the wall and
CPU milliseconds, datagrams and pair-key derivations per join (how a join's cost grows with the
ring); ``--trace-memory TOP`` (worker only) adds ``memory_per_node``: tracemalloc from the
baseline on, by source line and by file, and an object census by type, per node
(docs/transports.md, "Memory").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sim_adapter import bench
from sim_adapter.bench.live_memory import census, memory_report

KADEMLIA_VERSION = "2.2.3"
DEFAULT_KADEMLIA_VENV = "/tmp/flockring-kademlia-venv"
TARGET_RSS_KIB = 28.0


def _kademlia_script() -> Path | None:
    env = os.environ.get("FLOCKRING_KADEMLIA_BENCH")
    cands = [Path(env)] if env else []
    # the project's own peer script: <repo>/benchmarks/peers/kademlia_bench.py
    root = Path(__file__).resolve().parents[2]
    cands += [root / "benchmarks" / "peers" / "kademlia_bench.py"]
    for c in cands:
        if c.is_file():
            return c
    return None


def _rss_kib() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return int(bench.peak_rss_mib() * 1024)


# --------------------------------------------------------------------------- our worker
def _msg_kind(msg: Any) -> str:
    """A message's type name; a routed message is named after its payload (``RouteMsg/X``)."""
    name = type(msg).__name__
    payload = getattr(msg, "payload", None)
    if name in ("RouteMsg", "DirectMsg") and payload is not None:
        name += "/" + type(payload).__name__
    return name


async def _worker(
    n: int,
    lookups: int,
    seed: int,
    signing: bool,
    boot: int,
    by_type: bool = False,
    sessions: bool = True,
    trace_memory: int = 0,
    gc_freeze: bool = False,
) -> dict[str, Any]:
    import gc
    from collections import Counter
    from contextlib import AsyncExitStack

    # Everything a node will import is imported before the baseline, as kademlia's script
    # imports its package before its own baseline (the Pastry core is otherwise imported
    # lazily by the first Node and would be charged to the nodes; cryptography loads its
    # OpenSSL backend module lazily, at the first key object it needs: ~0.2 MiB once per
    # process, which at 300 nodes read as ~0.8 KiB per node).
    import cryptography.hazmat.backends.openssl.backend  # noqa: F401
    import trio

    import overlay.multicast
    import overlay.pastry.core  # noqa: F401
    from overlay.identity import Identity
    from overlay.ids import NodeId, closer
    from overlay.live.node import Node
    from transports.udp import open_udp

    rng = random.Random(seed)
    # One generator for every node in this process (Node(rng=...)): a random.Random is 2.5 KiB
    # of Mersenne-Twister state; kademlia's nodes share the global `random` too.
    node_rng = random.Random(rng.getrandbits(64))
    kinds: Counter[str] = Counter()
    if by_type:
        orig_send = Node.send_message
        orig_member = Node.send_to_member

        def counting_send(self: Any, address: Any, msg: Any, peer: Any) -> None:
            kinds[_msg_kind(msg)] += 1
            orig_send(self, address, msg, peer)

        def counting_member(self: Any, address: Any, msg: Any, peer: Any) -> None:
            kinds[_msg_kind(msg)] += 1
            orig_member(self, address, msg, peer)

        Node.send_message = counting_send  # type: ignore[method-assign]
        Node.send_to_member = counting_member  # type: ignore[method-assign]
    gc.collect()
    census0 = census() if trace_memory else None
    if trace_memory:
        import tracemalloc

        tracemalloc.start(1)
    rss0 = _rss_kib()
    nodes: list[Node] = []

    def sent_total() -> int:
        return sum(x.transport.stats["sent"] for x in nodes)

    async with AsyncExitStack() as stack:
        nursery = await stack.enter_async_context(trio.open_nursery())

        async def start_node() -> Node:
            # Each node's transport and nursery are entered straight into this task's exit
            # stack: no hosting task per node (a trio task, its coroutine and cancel status cost
            # ~1.5 KiB, which the node itself does not need). The key is made here, so that
            # each node's identity counts in its memory.
            t = await stack.enter_async_context(open_udp("udp://127.0.0.1:0", rcvbuf_bytes=1 << 20))
            node = Node(
                t,
                "pastry",
                Identity.from_rng(rng),
                rng=node_rng,
                signing=signing,
                sessions=sessions,
            )
            return await stack.enter_async_context(node)

        t0 = time.perf_counter()
        c0 = time.process_time()
        join_fail = 0
        join_ms: list[float] = []
        # how the cost of one join grows with the ring: per tenth of the bring-up, the wall and
        # CPU time, datagrams and pair-key derivations per join (the whole process's, so the
        # maintenance of the nodes already up counts too)
        tenths: list[dict[str, float]] = []
        mark = (t0, c0, 0, 0)
        # the collector's pauses: a full collection walks every object of every node, and
        # while it runs no datagram is read and every retransmission timer keeps running
        pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        gc_t0 = [0.0]

        def on_gc(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                gc_t0[0] = time.perf_counter()
            else:
                pauses[info["generation"]].append(time.perf_counter() - gc_t0[0])

        gc.callbacks.append(on_gc)

        def derivations() -> int:
            return sum(x.stats.get("node.pair_derivations", 0) for x in nodes)

        def health() -> dict[str, int]:
            # what a struggling process shows first: retried hops, probes, suspected peers
            out = {"reroutes": 0, "probes_sent": 0, "suspected_or_dead": 0}
            for x in nodes:
                core = x.running_core
                if core is not None:
                    out["reroutes"] += core.stats.get("reroutes", 0)
                    out["probes_sent"] += core.prox.probes_sent
                    out["suspected_or_dead"] += len(core.prox.bad)
            return out

        for i in range(n):
            node = await start_node()
            seeds = [x.address for x in rng.sample(nodes, min(boot, len(nodes)))]
            tj = time.perf_counter()
            try:
                await node.join(seeds, timeout_s=30)
            except Exception:
                join_fail += 1
            join_ms.append((time.perf_counter() - tj) * 1e3)
            nodes.append(node)
            if gc_freeze:
                # the nodes up so far leave the collector's view: a full collection then walks
                # only what was made since, and its pause stops growing with the ring
                gc.freeze()
            if (i + 1) % max(1, n // 10) == 0 or i + 1 == n:
                now = (time.perf_counter(), time.process_time(), sent_total(), derivations())
                k = max(1, i + 1 - int(tenths[-1]["joined"]) if tenths else i + 1)
                tenths.append(
                    {
                        "joined": i + 1,
                        "wall_ms_per_join": round((now[0] - mark[0]) / k * 1e3, 1),
                        "cpu_ms_per_join": round((now[1] - mark[1]) / k * 1e3, 1),
                        "datagrams_per_join": round((now[2] - mark[2]) / k, 1),
                        "pair_derivations_per_join": round((now[3] - mark[3]) / k, 1),
                        **health(),
                        "gc_full_collections": len(pauses[2]),
                        "gc_max_pause_ms": round(
                            max(max(p, default=0.0) for p in pauses.values()) * 1e3, 1
                        ),
                    }
                )
                mark = now
                # streamed too: a run killed before the end still shows where it slowed down
                print(json.dumps(tenths[-1]), file=sys.stderr, flush=True)
        gc.callbacks.remove(on_gc)
        t_boot = time.perf_counter() - t0
        cpu_boot = time.process_time() - c0
        boot_dgrams = sent_total()
        boot_kinds = dict(kinds)
        boot_stats: Counter[str] = Counter()
        if by_type:
            from sim_adapter.bench.pastry import JOIN_STATS

            for nd in nodes:
                core = nd.running_core
                if core is not None:
                    boot_stats.update({k: core.stats.get(k, 0) for k in JOIN_STATS})
        await trio.sleep(0.5)
        gc.collect()
        rss_boot = _rss_kib()
        memory = memory_report(n, census0, trace_memory) if trace_memory else None
        idle0, t_idle = sent_total(), time.perf_counter()
        kinds.clear()
        await trio.sleep(1.0)
        idle_s = time.perf_counter() - t_idle
        idle_rate = (sent_total() - idle0) / idle_s
        idle_kinds = {k: round(v / idle_s / n, 4) for k, v in kinds.most_common()}

        ids = [x.id for x in nodes]
        lat: list[float] = []
        dgrams: list[int] = []
        ok = 0
        failed = 0
        for _ in range(lookups):
            src = rng.choice(nodes)
            key = NodeId.random(rng)
            best = ids[0]
            for x in ids:
                if closer(key, x, best):
                    best = x
            d0 = sent_total()
            t = time.perf_counter()
            try:
                h = await src.lookup(key, timeout_s=6.0)
            except Exception:
                failed += 1
                continue
            lat.append((time.perf_counter() - t) * 1e3)
            dgrams.append(sent_total() - d0)
            ok += h.id == best
        rss_end = _rss_kib()
        stats = [dict(x.stats) for x in nodes]
        leaf = [len(x.leaf_set) for x in nodes]
        rt = [sum(len(r) for r in x.routing_table) for x in nodes]
        for nd in nodes:
            nd.leave()
        nursery.cancel_scope.cancel()

    def tot(k: str) -> int:
        return sum(s.get(k, 0) for s in stats)

    return {
        "impl": "flockring pastry (trio, loopback UDP)",
        "signing": signing,
        "sessions": signing and sessions,
        "N": n,
        "lookups": lookups,
        "seed": seed,
        "boot_contacts": boot,
        "bringup_s": round(t_boot, 3),
        "bringup_ms_per_node": round(t_boot / n * 1e3, 2),
        "bringup_cpu_s": round(cpu_boot, 3),
        "bringup_datagrams_total": boot_dgrams,
        "bringup_datagrams_per_join": round(boot_dgrams / max(1, n - 1), 1),
        "join_ms_p50": round(bench.percentile(join_ms, 50), 2),
        "join_ms_p95": round(bench.percentile(join_ms, 95), 2),
        "join_failures": join_fail,
        "bringup_by_tenth": tenths,
        "gc_freeze": gc_freeze,
        "bringup_gc": {
            f"gen{g}": {
                "collections": len(p),
                "total_s": round(sum(p), 3),
                "max_ms": round(max(p, default=0.0) * 1e3, 1),
            }
            for g, p in pauses.items()
        },
        "ready_nodes": sum(1 for x in nodes if x.ready),
        "leaf_set_mean": round(statistics.mean(leaf), 1),
        "routing_table_mean": round(statistics.mean(rt), 1),
        "lookup_ms_mean": round(statistics.mean(lat), 2) if lat else None,
        "lookup_ms_p50": round(bench.percentile(lat, 50), 2),
        "lookup_ms_p95": round(bench.percentile(lat, 95), 2),
        "datagrams_per_lookup_mean": round(statistics.mean(dgrams), 2) if dgrams else None,
        "datagrams_per_lookup_p95": bench.percentile([float(d) for d in dgrams], 95),
        "lookup_success": f"{ok}/{lookups}",
        "lookup_success_rate": round(ok / lookups, 4) if lookups else None,
        "lookup_no_answer": failed,
        "idle_datagrams_per_s": round(idle_rate, 1),
        "rss_baseline_MiB": round(rss0 / 1024, 1),
        "rss_after_boot_MiB": round(rss_boot / 1024, 1),
        "rss_per_node_KiB": round((rss_boot - rss0) / n, 1),
        "rss_per_node_end_KiB": round((rss_end - rss0) / n, 1),
        # a handler or timer that raised: counted and logged by the node, which goes on — a
        # bench must show them, or a bug that silently skips work reads as a speed-up
        "internal_errors": sum(bench.internal_errors(st) for st in stats),
        "dropped_forged": tot("auth.forged") + tot("session.forged"),
        "dropped_replayed": tot("auth.replayed") + tot("session.replayed"),
        "signed_frames_accepted": tot("auth.accepted"),
        "session_records_accepted": tot("session.accepted"),
        "session_handshakes_per_node": round(tot("session.handshakes_started") / n, 2),
        "sessions_held_per_node": round(tot("session.held") / n, 1),
        "pair_frames_sent": tot("node.pair_sent"),
        "pair_key_derivations_per_node": round(tot("node.pair_derivations") / n, 1),
        "dropped_malformed": tot("auth.malformed") + tot("wire.malformed"),
        "send_buffer_full": tot("transport.send_buffer_full"),
        "reroutes": tot("reroutes"),
        "route_dropped": tot("route_dropped"),
        **({"memory_per_node": memory} if memory is not None else {}),
        **(
            {
                "bringup_datagrams_by_type_per_join": {
                    k: round(v / max(1, n - 1), 2)
                    for k, v in sorted(boot_kinds.items(), key=lambda kv: -kv[1])
                },
                "idle_datagrams_by_type_per_node_per_s": idle_kinds,
                # where the probes come from (the Pastry core's counters, as bench pastry --slots)
                "bringup_counters_per_join": {
                    k: round(v / max(1, n - 1), 2) for k, v in boot_stats.items() if v
                },
            }
            if by_type
            else {}
        ),
    }


def _worker_main(argv: list[str]) -> int:
    import trio

    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--lookups", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--boot", type=int, default=3)
    ap.add_argument("--signing", choices=("on", "off"), default="on")
    ap.add_argument("--sessions", choices=("on", "off"), default="on")
    ap.add_argument("--by-type", action="store_true", help="count bring-up datagrams by type")
    ap.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after each join")
    ap.add_argument(
        "--trace-memory",
        type=int,
        default=0,
        metavar="TOP",
        help="report the TOP allocation sites, files and object types per node (slow)",
    )
    a = ap.parse_args(argv)
    import logging

    logging.disable(logging.WARNING)
    res = trio.run(
        _worker,
        a.nodes,
        a.lookups,
        a.seed,
        a.signing == "on",
        a.boot,
        a.by_type,
        a.sessions == "on",
        a.trace_memory,
        a.gc_freeze,
    )
    print(json.dumps(res))
    return 0


# --------------------------------------------------------------------------- orchestration
def _run_child(cmd: list[str], timeout_s: float) -> dict[str, Any]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the repository root
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the whole child (start-up, bring-up and lookups): unlike wall time it does
    # not depend on how much of the machine other processes take
    cpu = round((ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime), 2)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {p.returncode}: {' | '.join(tail)}"}
    try:
        start = p.stdout.index("{")
        out: dict[str, Any] = json.loads(p.stdout[start:])
        out["process_cpu_s"] = cpu
        return out
    except ValueError:
        return {"error": "no JSON in output"}


def _ensure_kademlia(venv: Path) -> tuple[Path | None, str]:
    py = venv / "bin" / "python"
    check = [str(py), "-c", "import kademlia; print(kademlia.__version__)"]
    if py.exists():
        p = subprocess.run(check, capture_output=True, text=True)
        if p.returncode == 0 and p.stdout.strip() == KADEMLIA_VERSION:
            return py, "reused"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", f"kademlia=={KADEMLIA_VERSION}"],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        err = getattr(exc, "stderr", b"") or b""
        text = err.decode(errors="replace") if isinstance(err, bytes) else str(err)
        last = text.strip().splitlines()[-1:] or [str(exc)]
        return None, f"could not install kademlia {KADEMLIA_VERSION}: {last[0]}"
    p = subprocess.run(check, capture_output=True, text=True)
    if p.returncode != 0:
        return None, "kademlia installed but does not import"
    return py, "installed"


def _ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return round(a / b, 3)
    return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the configured workers (and kademlia) and return one result document.

    With ``--repeat R`` (R > 1) the whole set runs R times in turn, each round against the
    kademlia run of the same round, and the document holds every round (``rounds``) and their
    summary at the top: the median of each figure, the median of the rounds' ratios to kademlia
    (a ratio within one round cancels the load the machine was under then), and the targets
    judged on those (lookups and errors on the worst round)."""
    repeat = max(1, getattr(args, "repeat", 1))
    rounds = [_round(args) for _ in range(repeat)]
    if repeat == 1:
        return rounds[0]
    keys = [k for k in rounds[0] if k.startswith("flockring_") or k == "kademlia"]
    result: dict[str, Any] = {"bench": "live", "env": bench.environment(), "N": args.nodes}
    for k in keys:
        result[k] = _median_figures([r.get(k) or {} for r in rounds])
    if all("ratios_vs_kademlia" in r for r in rounds):
        result["ratios_vs_kademlia"] = _median_figures([r["ratios_vs_kademlia"] for r in rounds])
        result["ratios_vs_kademlia"]["note"] = (
            f"median over {repeat} rounds of each round's ours / kademlia (lower is better)"
        )
    result["targets"] = _targets(result)
    result["rounds"] = rounds
    result["repeat"] = repeat
    return result


#: figures whose summary over rounds is the worst round's, not the median: a target on them
#: must hold in every round
_WORST_MIN = ("lookup_success_rate", "ready_nodes", "set_success_rate", "get_success_rate")
_WORST_MAX = ("join_failures", "internal_errors", "lookup_no_answer", "dropped_malformed")


def _median_figures(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One figure document from several rounds': each numeric figure's median (the worst
    round's for the figures in ``_WORST_MIN`` / ``_WORST_MAX``), anything else the first
    round's; nested documents and lists are left to ``rounds``."""
    out: dict[str, Any] = {}
    for k, v in docs[0].items():
        vals = [d.get(k) for d in docs]
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vals):
            nums = [float(x) for x in vals]  # type: ignore[arg-type]
            if k in _WORST_MIN:
                m = min(nums)
            elif k in _WORST_MAX:
                m = max(nums)
            else:
                m = round(statistics.median(nums), 3)
            # counts stay integers (N, seed, failures), as in a single round's document
            out[k] = int(m) if all(type(x) is int for x in vals) and m.is_integer() else m
        elif not isinstance(v, (dict, list)):
            out[k] = v
    if "lookup_success" in docs[0]:
        out["lookup_success"] = [d.get("lookup_success") for d in docs]
    return out


def _round(args: argparse.Namespace) -> dict[str, Any]:
    """One round: each configured worker, then kademlia, with their ratios and targets."""
    me = [sys.executable, "-m", "sim_adapter.bench.live", "--worker"]
    common = ["--nodes", str(args.nodes), "--lookups", str(args.lookups), "--seed", str(args.seed)]
    result: dict[str, Any] = {"bench": "live", "env": bench.environment(), "N": args.nodes}
    modes = {
        "both": ["off", "on"],
        "on": ["on"],
        "off": ["off"],
        "all": ["off", "on", "datagram"],
        "datagram": ["datagram"],
    }[args.signing]
    for m in modes:
        key = {
            "off": "flockring_unsigned",
            "on": "flockring_signed",
            "datagram": "flockring_signed_per_datagram",
        }[m]
        flags = ["--signing", "off" if m == "off" else "on"]
        flags += ["--sessions", "off" if m == "datagram" else "on"]
        flags += ["--gc-freeze"] if args.gc_freeze else []
        result[key] = _run_child([*me, *common, *flags], args.timeout)
    kad: dict[str, Any]
    if args.no_kademlia:
        kad = {"available": False, "reason": "skipped (--no-kademlia)"}
    else:
        script = _kademlia_script()
        if script is None:
            kad = {
                "available": False,
                "reason": "benchmarks/peers/kademlia_bench.py not found "
                "(set FLOCKRING_KADEMLIA_BENCH)",
            }
        else:
            py, how = _ensure_kademlia(Path(args.kademlia_venv))
            if py is None:
                kad = {"available": False, "reason": how}
            else:
                kad = _run_child(
                    [
                        str(py),
                        str(script),
                        str(args.nodes),
                        "--ops",
                        str(2 * args.lookups),
                        "--seed",
                        str(args.seed),
                    ],
                    args.timeout,
                )
                kad["available"] = "error" not in kad
                # how, not where: the path is the user's machine's, not a figure
                kad["venv"] = f"throwaway kademlia venv ({how})"
    result["kademlia"] = kad
    ours = result.get("flockring_unsigned") or result.get("flockring_signed") or {}
    signed = result.get("flockring_signed", {})
    if kad.get("available"):
        kd = kad.get("remote_get_datagrams_mean", kad.get("get_datagrams_mean"))
        result["ratios_vs_kademlia"] = {
            "note": "ours / kademlia (lower is better); lookups vs kademlia get()",
            "bringup_s": _ratio(ours.get("bringup_s"), kad.get("bringup_s")),
            "bringup_s_signed": _ratio(signed.get("bringup_s"), kad.get("bringup_s")),
            "process_cpu_s": _ratio(ours.get("process_cpu_s"), kad.get("process_cpu_s")),
            "rss_per_node": _ratio(ours.get("rss_per_node_KiB"), kad.get("rss_per_node_KiB")),
            "rss_per_node_signed": _ratio(
                signed.get("rss_per_node_KiB"), kad.get("rss_per_node_KiB")
            ),
            "lookup_ms_p50": _ratio(ours.get("lookup_ms_p50"), kad.get("get_ms_p50")),
            "lookup_ms_p95": _ratio(ours.get("lookup_ms_p95"), kad.get("get_ms_p95")),
            "datagrams_per_lookup": _ratio(ours.get("datagrams_per_lookup_mean"), kd),
            "datagrams_per_lookup_signed": _ratio(signed.get("datagrams_per_lookup_mean"), kd),
        }
    result["targets"] = _targets(result)
    return result


def _targets(result: dict[str, Any]) -> dict[str, bool | None]:
    """The goals, for each mode measured: the signed one is what users run by default."""
    kad = result.get("kademlia") or {}
    signed = result.get("flockring_signed", {})
    ratios = result.get("ratios_vs_kademlia") or {}
    kad_ok = bool(kad.get("available"))
    targets: dict[str, bool | None] = {}
    for mode, fig in (("", result.get("flockring_unsigned")), ("_signed", signed or None)):
        if not fig:
            continue
        ratio = ratios.get("bringup_s" + mode)  # "bringup_s": the unsigned run's, here
        targets["bringup_faster_than_kademlia" + mode] = (
            (ratio < 1.0 if ratio is not None else fig.get("bringup_s", 1e9) < kad["bringup_s"])
            if kad_ok
            else None
        )
        targets["rss_per_node_le_28KiB" + mode] = fig.get("rss_per_node_KiB", 1e9) <= TARGET_RSS_KIB
        targets["rss_per_node_below_kademlia" + mode] = (
            fig.get("rss_per_node_KiB", 1e9) < kad["rss_per_node_KiB"] if kad_ok else None
        )
        targets["success_100pct" + mode] = fig.get("lookup_success_rate") == 1.0
        targets["no_internal_errors" + mode] = fig.get("internal_errors") == 0
        targets["fewer_datagrams_per_lookup" + mode] = (
            (fig.get("datagrams_per_lookup_mean") or 1e9) < (kad.get("get_datagrams_mean") or 0)
            if kad_ok
            else None
        )
    return targets


def _main(args: argparse.Namespace) -> int:
    bench.emit(run(args), args.json, getattr(args, "out", None))
    return 0


def register(sub: Any) -> None:
    """Add ``live`` to the ``flockring bench`` subparsers."""
    p = sub.add_parser("live", help="live swarm on loopback UDP, side by side with kademlia")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--lookups", type=int, default=100, help="lookups (kademlia: as many gets)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--signing",
        choices=("both", "on", "off", "all", "datagram"),
        default="both",
        help="off: unsigned; on: sessions + signatures (the default node); datagram: an "
        "Ed25519 signature on every datagram (sessions off); both: off and on; all: the three",
    )
    p.add_argument("--no-kademlia", action="store_true", help="skip the kademlia comparison")
    p.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() after each join (one process hosting thousands of nodes: keeps the "
        "collector's full pauses from growing with the ring; see bringup_gc)",
    )
    p.add_argument("--kademlia-venv", default=DEFAULT_KADEMLIA_VENV, metavar="DIR")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per worker")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="R",
        help="run the whole set R times in turn and report medians (each round's ratios "
        "against that round's kademlia run)",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", metavar="FILE", help="also write the JSON here")
    p.set_defaults(func=_main)


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
