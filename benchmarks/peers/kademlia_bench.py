#!/usr/bin/env python3
"""Measure bmuller's ``kademlia`` (PyPI) on loopback UDP, the way ``flockring bench live``
measures our own nodes, so the two can be put side by side in one run.

Run by ``flockring bench live`` with the interpreter of a throwaway virtualenv that has
``kademlia`` installed (never the project's own environment). Standalone use::

    /tmp/kad-venv/bin/python benchmarks/peers/kademlia_bench.py 300 --ops 200 --seed 1

What it does, in one process and one asyncio loop:

1. **Bring-up.** N ``kademlia.network.Server`` nodes, each on its own UDP socket on 127.0.0.1
   (port chosen by the OS). Node i bootstraps from up to ``--boot`` random earlier nodes, one
   node after the other. Wall time and the growth of the process's resident set are recorded.
2. **Operations.** ``--ops`` operations run one at a time so that the datagrams each one causes
   can be counted exactly: first half ``set`` of fresh random keys from random nodes, then as
   many ``get`` of those keys from other random nodes (a get is kademlia's lookup).

Datagrams are counted by wrapping each node's datagram transport after ``listen``; that counts
requests and responses of every node, i.e. the same thing the flockring worker counts from its
transports' ``sent`` counters. Output: one JSON document on stdout (keys used by
``sim_adapter/bench/live.py``: ``bringup_s``, ``rss_per_node_KiB``, ``get_ms_p50``,
``get_ms_p95``, ``get_datagrams_mean``, ``remote_get_datagrams_mean``, ``get_success_rate``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import random
import statistics
import sys
import time
from typing import Any


class _CountingTransport:
    """Wraps an asyncio datagram transport; counts every datagram and byte sent through it."""

    totals = [0, 0]  # datagrams, bytes (shared by every node of the process)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def sendto(self, data: bytes, addr: Any = None) -> None:
        _CountingTransport.totals[0] += 1
        _CountingTransport.totals[1] += len(data)
        self._inner.sendto(data, addr)

    def __getattr__(self, name: str) -> Any:  # close(), get_extra_info(), ...
        return getattr(self._inner, name)


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    i = min(len(s) - 1, max(0, round(q / 100.0 * (len(s) - 1))))
    return s[i]


async def _measure(n: int, ops: int, boot: int, seed: int) -> dict[str, Any]:
    import gc

    import kademlia
    from kademlia.network import Server

    rng = random.Random(seed)
    random.seed(seed)  # kademlia draws its node ids from the global generator
    gc.collect()
    rss0 = _rss_kib()
    servers: list[Server] = []
    ports: list[int] = []
    t0 = time.perf_counter()
    for i in range(n):
        s = Server()
        await s.listen(0, interface="127.0.0.1")
        s.protocol.transport = _CountingTransport(s.transport)
        ports.append(s.transport.get_extra_info("sockname")[1])
        if i:
            peers = rng.sample(range(i), min(boot, i))
            await s.bootstrap([("127.0.0.1", ports[j]) for j in peers])
        servers.append(s)
    bringup_s = time.perf_counter() - t0
    gc.collect()
    rss1 = _rss_kib()
    boot_datagrams = _CountingTransport.totals[0]

    n_set = max(1, ops // 2)
    keys = [f"key-{seed}-{i}-{rng.getrandbits(32):08x}" for i in range(n_set)]
    owners: dict[str, int] = {}
    set_ms: list[float] = []
    set_dg: list[int] = []
    set_ok = 0
    for key in keys:
        i = rng.randrange(n)
        owners[key] = i
        before = _CountingTransport.totals[0]
        t = time.perf_counter()
        ok = await servers[i].set(key, "v")
        set_ms.append((time.perf_counter() - t) * 1e3)
        set_dg.append(_CountingTransport.totals[0] - before)
        set_ok += bool(ok)

    get_ms: list[float] = []
    get_dg: list[int] = []
    remote_dg: list[int] = []
    get_ok = 0
    for key in keys:
        i = rng.randrange(n)
        before = _CountingTransport.totals[0]
        t = time.perf_counter()
        value = await servers[i].get(key)
        get_ms.append((time.perf_counter() - t) * 1e3)
        sent = _CountingTransport.totals[0] - before
        get_dg.append(sent)
        if sent:  # served from another node, not from the asking node's own storage
            remote_dg.append(sent)
        get_ok += value == "v"

    for s in servers:
        s.stop()
    return {
        "impl": f"kademlia {getattr(kademlia, '__version__', '?')}",
        "python": platform.python_version(),
        "N": n,
        "boot_contacts": boot,
        "ops": ops,
        "seed": seed,
        "bringup_s": round(bringup_s, 3),
        "bringup_datagrams_total": boot_datagrams,
        "rss_per_node_KiB": round((rss1 - rss0) / n, 1),
        "set_ms_mean": round(statistics.mean(set_ms), 2),
        "set_datagrams_mean": round(statistics.mean(set_dg), 1),
        "set_success_rate": round(set_ok / n_set, 3),
        "get_ms_p50": round(_percentile(get_ms, 50), 2),
        "get_ms_p95": round(_percentile(get_ms, 95), 2),
        "get_datagrams_mean": round(statistics.mean(get_dg), 1),
        "remote_get_n": len(remote_dg),
        "remote_get_datagrams_mean": (round(statistics.mean(remote_dg), 1) if remote_dg else None),
        "get_success_rate": round(get_ok / n_set, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nodes", type=int)
    ap.add_argument("--ops", type=int, default=200, help="sets + gets (half each)")
    ap.add_argument("--boot", type=int, default=3, help="earlier nodes each node bootstraps from")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    if a.nodes < 2 or a.ops < 2:
        print("kademlia_bench: need at least 2 nodes and 2 ops", file=sys.stderr)
        return 2
    logging.disable(logging.CRITICAL)  # kademlia logs every RPC at INFO
    print(json.dumps(asyncio.run(_measure(a.nodes, a.ops, a.boot, a.seed))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
