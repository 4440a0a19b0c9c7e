"""What a live node's traffic leaves behind: no cyclic garbage, and no memory parked on freelists.

CPython keeps dead tuples of 1-19 items on per-length freelists (up to 2000 each) for the next
tuple of the same length; only a full collection empties them. ``tuple(<generator>)`` and
``f(*<generator>)`` allocate a 10-slot tuple and resize it to the final length, so each such
transient takes its block from the 10-slot list (or the allocator) and, when it dies, gives it
to the final length's list: done on every decoded datagram, that fills the freelists towards
2000 blocks per length, memory that then serves no other object until a full collection, which
a long-running process rarely runs (at N = 300 on loopback UDP: ~5 KiB of RSS per node). A full
collection that finds no garbage frees exactly the blocks parked on freelists: these tests count
them, and check that a node's bring-up leaves no reference cycles either. Each measures in a
fresh interpreter (:func:`delegated`), where nothing else makes garbage meanwhile.
"""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager

import pytest
import trio

from overlay.handle import NodeHandle
from overlay.identity import Identity
from overlay.ids import NodeId
from overlay.live.node import Node
from overlay.pastry.messages import JoinReply, NearbyReply
from overlay.wire import Wire, encode_message
from transports import open_udp

pytestmark = pytest.mark.skipif(
    sys.implementation.name != "cpython", reason="counts CPython's freelists"
)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Automatic collections off (each full one would empty the freelists as it goes)."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def full_collection() -> tuple[list[str], int]:
    """Type names of the cyclic garbage one full collection finds, and the blocks it frees
    (with no garbage: the blocks that were parked on freelists)."""
    blocks = sys.getallocatedblocks()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        kinds = [type(o).__qualname__ for o in gc.garbage]
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
    gc.collect()  # the saved garbage, if any, is cyclic: free it too
    return kinds, blocks - sys.getallocatedblocks()


#: set in the interpreter the measurements run in (see :func:`delegated`)
_FRESH = "FLOCKRING_MEMORY_TEST_FRESH"


def delegated(name: str) -> bool:
    """Run test ``name`` of this module again in a fresh interpreter and check it passed (True:
    the caller returns at once); False inside that interpreter, where the test measures.

    A full collection counts *every* cyclic object and freed block of the process: in a test
    worker that ran other tests first, threads they left behind (Dask's and tornado's event
    loops, after the experiment tests) make garbage meanwhile, which this module would count
    as its own — it failed that way once the suite's files were dealt to the workers in
    another order."""
    if os.environ.get(_FRESH) == "1":
        return False
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         f"{__file__}::{name}"],
        env={**os.environ, _FRESH: "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return True


def _handles(rng: random.Random, n: int) -> tuple[NodeHandle, ...]:
    return tuple(NodeHandle(NodeId.random(rng), f"udp://10.0.0.{i}:4000") for i in range(n))


def test_decoding_parks_no_tuples_on_freelists() -> None:
    if delegated("test_decoding_parks_no_tuples_on_freelists"):
        return
    rng = random.Random(3)
    w = Wire()
    frames = [
        encode_message(
            JoinReply(7, _handles(rng, 16), _handles(rng, 16), tuple(0.01 * i for i in range(16)))
        ),
        encode_message(NearbyReply(9, 2, _handles(rng, 13), tuple(0.02 * i for i in range(13)))),
    ]
    with collector_paused():
        for _ in range(500):
            for f in frames:
                assert w.decode(f) is not None
        garbage, freed = full_collection()
    assert garbage == []
    # before: each decode parked ~4 tuples (the message's fields, each handle list, the hints):
    # ~4000 blocks here; now only the working set of one decode
    assert freed < 200, f"{freed} blocks were parked on freelists"


async def test_bring_up_leaves_no_cycles_and_parks_no_tuples() -> None:
    if delegated("test_bring_up_leaves_no_cycles_and_parks_no_tuples"):
        return
    rng = random.Random(5)
    node_rng = random.Random(6)
    with collector_paused():
        async with AsyncExitStack() as stack:
            nodes: list[Node] = []
            for _ in range(24):
                t = await stack.enter_async_context(open_udp("udp://127.0.0.1:0"))
                node = Node(t, "pastry", Identity.from_rng(rng), rng=node_rng, signing=False)
                await stack.enter_async_context(node)
                seeds = [x.address for x in rng.sample(nodes, min(3, len(nodes)))]
                await node.join(seeds, timeout_s=20)
                nodes.append(node)
            await trio.sleep(0.3)  # some steady-state traffic too
            ready = sum(x.ready for x in nodes)
            garbage, freed = full_collection()
    assert ready == len(nodes)
    assert garbage == [], f"reference cycles left by the bring-up: {sorted(set(garbage))}"
    # what stays is the working set (growing leaf sets leave one dead tuple per length, the
    # dict, dict-keys and float freelists fill to their small caps): ~500 blocks; before, every
    # decoded datagram parked tuples too: ~2250
    assert freed < 1000, f"{freed} blocks were parked on freelists"
