"""The chaos bench's final check against made-up status replies: a ring's successors are
judged by brute force over the ids up, and the exceptions the nodes counted and survived are
summed (``bench.internal_errors``)."""

from __future__ import annotations

import argparse
import types
from typing import Any

import trio

from overlay import NodeHandle, NodeId
from sim_adapter.bench import chaos, internal_errors


class _Up(chaos._Proc):
    running = True


class _Client:
    def __init__(self, replies: dict[str, Any]) -> None:
        self.replies = replies

    async def status(self, addr: str, timeout_s: float) -> Any:
        return self.replies[addr]


def _reply(me: int, leaves: list[int], stats: dict[str, int]) -> Any:
    h = [NodeHandle(NodeId(i), f"udp://127.0.0.1:{i}") for i in (me, *leaves)]
    return types.SimpleNamespace(handle=h[0], leaf_set=tuple(h[1:]), stats=tuple(stats.items()))


def test_the_final_check_sums_what_the_nodes_survived_and_judges_successors() -> None:
    ids = [10, 20, 30]
    pr = _Up(0)
    pr.nodes = [(i, f"a{i}") for i in ids]
    stats = [{"handler_errors": 2}, {"node.timer_errors": 1, "delivered": 9}, {}]
    replies = {
        "a10": _reply(10, [20, 30], stats[0]),
        "a20": _reply(20, [10, 30], stats[1]),
        "a30": _reply(30, [20], stats[2]),  # its successor (10, wrapping) is missing
    }

    async def no_lookup(c: object, tally: dict[str, int]) -> None:
        tally["asked"] += 1

    args = argparse.Namespace(lookup_timeout_s=1.0, final_lookups=2)
    procs: list[chaos._Proc] = [pr]
    out = trio.run(chaos._final_check, args, _Client(replies), procs, no_lookup)
    assert out["final_internal_errors"] == sum(internal_errors(s) for s in stats) == 3
    assert out["final_bad_successor"] == 1 and not out["one_ring"]
    assert out["final_lookups"]["asked"] == 2
