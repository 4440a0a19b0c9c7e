"""Oracle build: compute a Pastry ring's steady state directly (no messages).

Theory of operation (DESIGN §3 ``build="oracle"``; FreePastry's direct simulator builds rings
by joins, which is what ``build="joins"`` reproduces — this module is the shortcut for 10^5+
nodes). With the ids sorted:

* **Leaf sets** are the L/2 successors and L/2 predecessors of each node in sorted order
  (wrapping round the ring) — exactly what a converged ring holds.
* **Routing tables**: ids sharing a prefix form one contiguous run of the sorted list, so the
  candidates for slot R[l][c] of node x are the ids in ``[prefix_l(x)·c·0…, prefix_l(x)·c·f…]``,
  found with two bisections. Proximity neighbour selection (Castro et al. 2002, DESIGN §2.2)
  picks the lowest ``rtt_s(x, y)`` from a bounded random sample of ``oracle_pns_sample``
  candidates (16 by default), which bounds the work to O(N · rows · 2^b · sample) RTT calls.
  Rows stop at the first one where x is alone in its prefix run.

The result is what joins plus periodic row exchange converge to, give or take the sampling.
Every core is marked ready. No message is sent, no timer armed (the driver calls ``start()``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from overlay.handle import NodeHandle
from overlay.ids import ID_BITS

from .core import PastryCore


def build_oracle(cores: list[PastryCore], rtt_s: Callable[[NodeHandle, NodeHandle], float]) -> None:
    """Install converged leaf sets and PNS routing tables on ``cores`` and mark them ready."""
    if not cores:
        return
    order = sorted(cores, key=lambda c: int(c.id))
    ids = [int(c.id) for c in order]
    handles = [c.handle for c in order]
    n = len(order)
    for i, c in enumerate(order):
        half = c.leaf.half
        k = min(half, n - 1)
        cw = [handles[(i + j) % n] for j in range(1, k + 1)]
        ccw = [handles[(i - j) % n] for j in range(1, k + 1)]
        c.leaf.install(cw, ccw)
    for i, c in enumerate(order):
        _build_table(c, i, ids, handles, rtt_s)
        c.joiner.mark_ready()


def _build_table(
    c: PastryCore,
    i: int,
    ids: list[int],
    handles: list[NodeHandle],
    rtt_s: Callable[[NodeHandle, NodeHandle], float],
) -> None:
    table = c.table
    b = table.b
    cols = table.cols
    sample = max(1, c.config.oracle_pns_sample)
    rng = c.runtime.rng
    me = c.handle
    x = ids[i]
    lo, hi = 0, len(ids)  # run of ids sharing the first `row` digits with x
    for row in range(table.nrows):
        if hi - lo <= 1:
            break
        shift = ID_BITS - (row + 1) * b
        base = (x >> (shift + b)) << (shift + b)
        own = (x >> shift) & (cols - 1)
        entries: list[NodeHandle | None] = [None] * cols
        start = lo
        next_lo, next_hi = lo, hi
        for col in range(cols):
            end = bisect_left(ids, base + ((col + 1) << shift), start, hi)
            if col == own:
                next_lo, next_hi = start, end
            elif end > start:
                cnt = end - start
                if cnt == 1:
                    entries[col] = handles[start]
                else:
                    run = range(start, end)
                    picks = run if cnt <= sample else rng.sample(run, sample)
                    best = min(picks, key=lambda j: rtt_s(me, handles[j]))
                    entries[col] = handles[best]
            start = end
        table.install_row(row, entries)
        lo, hi = next_lo, next_hi
