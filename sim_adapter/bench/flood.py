"""``flockring bench flood``: do honest lookups survive one address flooding a live node?

Theory of operation: ``--nodes`` live Pastry (or small-world) nodes join on loopback UDP in this
process (signed envelopes, real sockets, real clock). Honest lookups (``Node.lookup``) run from
random nodes for random keys at ``--lookups-per-s`` throughout; each is checked against the
brute-force oracle (the node numerically closest to the key) and timed. After a quiet phase of
``--phase-s`` seconds, a *separate process* (so that the flood does not share this process's
interpreter with the honest nodes) binds one UDP address and sends the victim — one node of the
ring — fresh, validly signed routed messages (``RouteMsg`` for random keys), probes (``Ping``)
and joins (Pastry ``JoinRequest``) at ``--rate`` datagrams a second for ``--phase-s`` seconds,
all pre-signed so the flooder runs at full speed; then a last quiet phase. Reported per phase:
honest lookup success (reached the oracle's node), lookups lost or wrong, latency p50/p95/p99;
the flooder's datagrams sent and the victim's drops by reason (``rate.dropped_*``); rate drops
at every other node (honest traffic: should be 0); the victim's source table size and the
process RSS before and after. ``--compare`` runs the same again on a fresh ring with the limits
turned off (``RateLimits(enabled=False)``: counted, never dropped), the "without" column.

A benchmark, not a test: the figures depend on the machine (two shared cores here). The
suite's ``tests/test_hostile_flood.py`` checks the same property in virtual time.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

from sim_adapter import bench

__all__ = ["flood_frames", "register", "run"]

KINDS = ("routed", "probe", "join")


def flood_frames(
    kinds: tuple[str, ...],
    count: int,
    reply_to: str,
    victim_id: bytes | None,
    seed: int,
) -> list[bytes]:
    """``count`` fresh frames signed by a new key, cycling through ``kinds``: what a flooder
    holding one key sends (each passes the signature and replay checks exactly once)."""
    from overlay.handle import NodeHandle
    from overlay.identity import Identity
    from overlay.ids import NodeId
    from overlay.kbr import RouteMsg
    from overlay.pastry.messages import JoinRequest
    from overlay.proximity import Ping
    from overlay.wire import encode_message
    from transports.auth import Signer

    rng = random.Random(seed)
    ident = Identity.from_rng(rng)
    signer = Signer(ident.private_key)
    me = NodeHandle(ident.id, reply_to)
    out: list[bytes] = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        if kind == "routed":
            msg: Any = RouteMsg(NodeId.random(rng), "flood", b"x" * 32, me, rng.getrandbits(62), 0)
        elif kind == "probe":
            msg = Ping(rng.getrandbits(62), 0.0)
        elif kind == "join":
            msg = JoinRequest(rng.getrandbits(31))
        else:
            raise ValueError(f"unknown flood kind {kind!r}; choose from {', '.join(KINDS)}")
        out.append(signer.seal(reply_to, encode_message(msg), victim_id))
    return out


def _flooder(
    victim: tuple[str, int],
    victim_id: bytes,
    kinds: tuple[str, ...],
    rate: float,
    duration_s: float,
    seed: int,
) -> None:
    """The flooding process: one UDP socket, pre-signed frames, paced to ``rate`` a second.

    Talks to the bench over stdin/stdout: prints ``ready ADDRESS``, waits for a line, floods,
    prints ``done SENT SEND_ERRORS SECONDS``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    host, port = sock.getsockname()
    frames = flood_frames(kinds, int(rate * duration_s), f"udp://{host}:{port}", victim_id, seed)
    print(f"ready udp://{host}:{port}", flush=True)
    sys.stdin.readline()  # go
    sent = blocked = 0
    t0 = time.perf_counter()
    for f in frames:
        due = t0 + sent / rate
        while True:  # pace: sleep when ahead of schedule
            ahead = due - time.perf_counter()
            if ahead <= 0:
                break
            time.sleep(min(ahead, 0.002))
        try:
            sock.sendto(f, victim)
        except OSError:  # full send buffer (or ENOBUFS): the kernel dropped it on our side
            blocked += 1
        sent += 1
    print(f"done {sent} {blocked} {time.perf_counter() - t0}", flush=True)
    sock.close()


def _flooder_main() -> None:
    """Entry point of the flooding process (arguments as JSON in argv[1])."""
    a = json.loads(sys.argv[1])
    _flooder(tuple(a["victim"]), bytes.fromhex(a["id"]), tuple(a["kinds"]), a["rate"],
             a["duration_s"], a["seed"])  # fmt: skip


async def _lookups(
    nodes: list[Any],
    oracle: Any,
    rate: float,
    duration_s: float,
    timeout_s: float,
    rng: random.Random,
) -> dict[str, Any]:
    import trio

    from overlay.ids import NodeId

    lat: list[float] = []
    out: Counter[str] = Counter()

    async def one(src: Any, key: NodeId) -> None:
        t = trio.current_time()
        try:
            got = await src.lookup(key, timeout_s=timeout_s)
        except Exception:
            out["lost"] += 1
            return
        if got.id == oracle(key):
            out["ok"] += 1
            lat.append(trio.current_time() - t)
        else:
            out["wrong"] += 1

    async with trio.open_nursery() as nursery:
        n = int(rate * duration_s)
        t0 = trio.current_time()
        for i in range(n):
            await trio.sleep_until(t0 + i / rate)
            nursery.start_soon(one, rng.choice(nodes), NodeId.random(rng))
    total = sum(out.values())
    return {
        "lookups": total,
        "ok": out["ok"],
        "lost": out["lost"],
        "wrong": out["wrong"],
        "success": bench.r(out["ok"] / total if total else float("nan"), 4),
        "latency_ms_p50": bench.r(1e3 * bench.percentile(lat, 50), 2),
        "latency_ms_p95": bench.r(1e3 * bench.percentile(lat, 95), 2),
        "latency_ms_p99": bench.r(1e3 * bench.percentile(lat, 99), 2),
    }


def _drops(stats: Any) -> dict[str, int]:
    return {k: int(v) for k, v in sorted(stats.items()) if k.startswith("rate.dropped_")}


async def _ring(args: argparse.Namespace, limits_on: bool) -> dict[str, Any]:
    import trio

    from overlay.identity import Identity
    from overlay.ids import closer
    from overlay.live.node import Node
    from overlay.live.ratelimit import RateLimits
    from transports import open_udp

    rng = random.Random(args.seed)
    limits = RateLimits() if limits_on else RateLimits(enabled=False)
    nodes: list[Node] = []
    result: dict[str, Any] = {"limits": "on (defaults)" if limits_on else "off (counted only)"}
    async with AsyncExitStack() as stack:
        with bench.stopwatch() as build:
            for _ in range(args.nodes):
                t = await stack.enter_async_context(open_udp("udp://127.0.0.1:0"))
                node = Node(
                    t, args.overlay, Identity.from_rng(rng), seed=rng.getrandbits(32),
                    rate_limits=limits,
                )  # fmt: skip
                await stack.enter_async_context(node)
                await node.join([rng.choice(nodes).address] if nodes else [], timeout_s=30)
                nodes.append(node)
        await trio.sleep(2.0)  # let the last joins' maintenance settle
        result["build_s"] = bench.r(build(), 1)

        def oracle(key: int) -> Any:
            best = nodes[0].id
            for x in nodes:
                if closer(key, x.id, best):
                    best = x.id
            return best

        victim = nodes[len(nodes) // 2]
        lrng = random.Random(args.seed + 1)

        async def phase(name: str, flood: bool) -> None:
            rss0 = bench.rss_mib()
            before = dict(victim.stats)
            others_before = sum(sum(_drops(n.stats).values()) for n in nodes if n is not victim)
            fl: dict[str, Any] = {}
            proc: subprocess.Popen[str] | None = None
            if flood:
                host, _, port = victim.address.removeprefix("udp://").rpartition(":")
                spec = {
                    "victim": [host, int(port)], "id": victim.id.to_bytes_be().hex(),
                    "kinds": list(args.kinds), "rate": args.rate, "duration_s": args.phase_s,
                    "seed": args.seed + 7,
                }  # fmt: skip
                code = "from sim_adapter.bench.flood import _flooder_main; _flooder_main()"
                proc = subprocess.Popen(
                    [sys.executable, "-c", code, json.dumps(spec)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                )  # fmt: skip
                assert proc.stdin is not None and proc.stdout is not None
                line = await trio.to_thread.run_sync(proc.stdout.readline)
                fl["flooder_address"] = line.split()[-1] if line else None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            res = await _lookups(
                nodes, oracle, args.lookups_per_s, args.phase_s, args.timeout_s, lrng
            )
            if proc is not None:
                assert proc.stdout is not None
                done = (await trio.to_thread.run_sync(proc.stdout.readline)).split()
                await trio.to_thread.run_sync(proc.wait)
                if len(done) != 4:
                    fl["flooder_error"] = f"flooder exited with {proc.returncode} before reporting"
                else:
                    sent, errors, secs = int(done[1]), int(done[2]), float(done[3])
                    fl.update(flooder_sent=sent, flooder_send_s=bench.r(secs, 2))
                    fl["flooder_send_errors"] = errors
                    fl["flooder_rate_per_s"] = bench.r(sent / secs, 0) if secs else None
            after = dict(victim.stats)
            fl["victim_received"] = after.get("rate.frames", 0) - before.get("rate.frames", 0)
            fl["victim_drops"] = {
                k: v - before.get(k, 0) for k, v in _drops(after).items() if v - before.get(k, 0)
            }
            fl["victim_forged_or_replayed"] = sum(
                after.get(k, 0) - before.get(k, 0) for k in ("auth.forged", "auth.replayed")
            )
            others = sum(sum(_drops(n.stats).values()) for n in nodes if n is not victim)
            fl["rate_drops_at_other_nodes"] = others - others_before
            fl["victim_sources"] = after.get("rate.sources", 0)
            result[name] = {
                **res,
                **fl,
                "rss_before_mib": bench.r(rss0, 1),
                "rss_after_mib": bench.r(bench.rss_mib(), 1),
            }

        await phase("quiet", False)
        await phase("flood", True)
        await phase("after", False)
        for n in nodes:
            n.leave()
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the flood benchmark (and, with ``--compare``, again without limits)."""
    import trio

    for k in args.kinds:
        if k not in KINDS:
            raise SystemExit(f"unknown --kinds {k!r}; choose from {', '.join(KINDS)}")
    out: dict[str, Any] = {
        "bench": "flood",
        "overlay": args.overlay,
        "nodes": args.nodes,
        "flood": f"{args.rate:g}/s of {'+'.join(args.kinds)} from one address at one node",
        "honest_lookups_per_s": args.lookups_per_s,
        "phase_s": args.phase_s,
    }
    with bench.stopwatch() as wall:
        out["with_limits"] = trio.run(_ring, args, not args.no_limits)
        if args.compare and not args.no_limits:
            out["without_limits"] = trio.run(_ring, args, False)
    out["wall_s"] = bench.r(wall(), 1)
    out["environment"] = bench.environment()
    return out


def _main(args: argparse.Namespace) -> int:
    bench.emit(run(args), args.json, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``flood`` benchmark parser."""
    p = sub.add_parser("flood", help="honest lookups while one address floods a live node")
    p.add_argument("--overlay", choices=("pastry", "smallworld"), default="pastry")
    p.add_argument("--nodes", type=int, default=30)
    p.add_argument("--rate", type=float, default=5000.0, help="flood datagrams per second")
    p.add_argument(
        "--kinds", type=lambda s: s.split(","), default=list(KINDS),
        help="comma-separated: routed,probe,join",
    )  # fmt: skip
    p.add_argument("--phase-s", type=float, default=10.0, help="seconds per phase")
    p.add_argument("--lookups-per-s", type=float, default=20.0)
    p.add_argument("--timeout-s", type=float, default=3.0, help="per honest lookup")
    p.add_argument("--no-limits", action="store_true", help="turn the rate limits off")
    p.add_argument("--compare", action="store_true", help="also run without limits")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="also write the JSON to this file")
    p.set_defaults(func=_main)
