"""``flockring bench churn-rss``: is a live node's memory flat over hours of churn?

Theory of operation: ``N`` live :class:`overlay.Node` objects (signed envelopes, the real wire
and transports code) run in one trio loop on a :class:`transports.MemoryNetwork` under
``trio.testing.MockClock(autojump_threshold=0)``, so hours of virtual time take seconds. Every
``--churn-every-s`` a tenth of the nodes crash and as many fresh nodes (new identities, new
addresses) join through random survivors — the churn of the issue that found the leaks (10 %
every 5 min). After ``--warmup-min`` the process RSS (``/proc/self/status``), the wire's memo
bytes (``overlay.wire.memo_bytes``) and the mean proximity-table size per node are sampled every
``--sample-min``. Reported: the samples and ``rss_spread`` = (max − min) / min over the samples
after warm-up; the target is <= 0.10 (flat within 10 % over two hours). A benchmark, never a
test: RSS depends on the allocator and on everything else the process holds.
"""

from __future__ import annotations

import argparse
import gc
import random
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

from sim_adapter import bench

TARGET_SPREAD = 0.10


async def _swarm(args: argparse.Namespace, samples: list[dict[str, Any]]) -> dict[str, Any]:
    import trio

    from overlay.identity import Identity
    from overlay.ids import NodeId, closer
    from overlay.live.node import Node
    from overlay.wire import memo_bytes
    from transports import MemoryNetwork

    rng = random.Random(args.seed)
    net = MemoryNetwork(latency=(0.005, 0.05), seed=args.seed)
    node_rng = random.Random(rng.getrandbits(64))
    nodes: list[Node] = []
    counts = {"joined": 0, "join_failed": 0, "crashed": 0}

    async def host(seeds: list[str], task_status: trio.TaskStatus[Node]) -> None:
        async with AsyncExitStack() as stack:
            t = await stack.enter_async_context(net.endpoint())
            node = Node(t, args.overlay, Identity.from_rng(rng), rng=node_rng)
            await stack.enter_async_context(node)
            task_status.started(node)
            try:
                await node.join(seeds, timeout_s=60.0)
                counts["joined"] += 1
            except Exception:
                counts["join_failed"] += 1
                node.crash()
            await node.closed_event.wait()

    def live() -> list[Node]:
        return [x for x in nodes if not x.closed and x.ready]

    async def lookups_ok(n: int) -> float:
        ok = 0
        ring = live()
        for _ in range(n):
            key = NodeId.random(rng)
            want = ring[0].id
            for x in ring:
                if closer(key, x.id, want):
                    want = x.id
            try:
                got = await rng.choice(ring).lookup(key, timeout_s=10.0)
            except Exception:
                continue
            ok += got.id == want
        return ok / n

    def prox_mean() -> float:
        ring = live()
        return sum(len(x.core.prox.peers) for x in ring) / max(1, len(ring))

    async with trio.open_nursery() as nursery:
        for i in range(args.nodes):
            seeds = [rng.choice(nodes).address] if nodes else []
            nodes.append(await nursery.start(host, seeds))
            if i % 10 == 9:
                await trio.sleep(1.0)
        t0 = trio.current_time()
        total_s = args.warmup_min * 60 + args.hours * 3600
        next_churn = t0 + args.churn_every_s
        # samples fall between churn rounds, not on them (fresh joiners are not ready yet)
        next_sample = t0 + args.warmup_min * 60 + args.churn_every_s / 2
        while trio.current_time() - t0 < total_s:
            now = trio.current_time()
            if now >= next_churn:
                next_churn += args.churn_every_s
                ring = live()
                gone = rng.sample(ring, max(1, len(ring) // 10))
                for x in gone:
                    x.crash()
                    counts["crashed"] += 1
                survivors = [x for x in ring if x not in gone]
                for _ in gone:
                    nodes.append(await nursery.start(host, [rng.choice(survivors).address]))
                nodes[:] = [x for x in nodes if not x.closed]
            if now >= next_sample:
                next_sample += args.sample_min * 60
                gc.collect()
                samples.append(
                    {
                        "virtual_min": round((now - t0) / 60),
                        "rss_mib": bench.r(bench.rss_mib(), 1),
                        "wire_memo_mib": bench.r(memo_bytes() / 2**20, 2),
                        "prox_entries_per_node": bench.r(prox_mean(), 1),
                        "live_nodes": len(live()),
                    }
                )
                _progress(samples[-1])
            await trio.sleep(min(next_churn, next_sample) - trio.current_time())
        ok = await lookups_ok(args.lookups)
        for x in nodes:
            x.crash()
        nursery.cancel_scope.cancel()
    return {**counts, "lookups_correct": bench.r(ok)}


_progress: Callable[[dict[str, Any]], None] = lambda s: None  # noqa: E731


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the churned live swarm under a MockClock and return the RSS samples and spread."""
    import trio
    import trio.testing

    samples: list[dict[str, Any]] = []
    clock = trio.testing.MockClock(autojump_threshold=0)
    with bench.stopwatch() as wall:
        outcome = trio.run(_swarm, args, samples, clock=clock)
    rss = [s["rss_mib"] for s in samples]
    spread = (max(rss) - min(rss)) / min(rss) if rss else float("nan")
    return {
        "bench": "churn-rss",
        "overlay": args.overlay,
        "nodes": args.nodes,
        "churn": f"10% every {args.churn_every_s:g} s",
        "warmup_min": args.warmup_min,
        "hours_measured": args.hours,
        "samples": samples,
        "rss_first_mib": rss[0] if rss else None,
        "rss_last_mib": rss[-1] if rss else None,
        "rss_spread": bench.r(spread),
        "target_spread": TARGET_SPREAD,
        "meets_target": bool(rss) and spread <= TARGET_SPREAD,
        **outcome,
        "wall_s": bench.r(wall(), 1),
        "environment": bench.environment(),
    }


def _main(args: argparse.Namespace) -> int:
    bench.emit(run(args), args.json, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``churn-rss`` benchmark parser."""
    p = sub.add_parser("churn-rss", help="live nodes' RSS over hours of virtual churn")
    p.add_argument("--overlay", choices=("pastry", "smallworld"), default="pastry")
    p.add_argument("--nodes", type=int, default=30)
    p.add_argument("--hours", type=float, default=2.0, help="virtual hours measured")
    p.add_argument("--warmup-min", type=float, default=30.0, help="virtual minutes before")
    p.add_argument("--sample-min", type=float, default=10.0, help="virtual minutes between")
    p.add_argument("--churn-every-s", type=float, default=300.0)
    p.add_argument("--lookups", type=int, default=100, help="oracle-checked lookups at the end")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", help="also write the JSON to this file")
    p.set_defaults(func=_main)
