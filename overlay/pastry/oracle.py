"""Oracle build: compute a Pastry ring's steady state directly (no messages).

Theory of operation (``Network.spawn(..., build="oracle")``; FreePastry's direct simulator builds
rings by joins, which is what ``build="joins"`` reproduces — this module is the shortcut for 10^5+
nodes). With the ids sorted:

* **Leaf sets** are the L/2 successors and L/2 predecessors of each node in sorted order
  (wrapping round the ring) — exactly what a converged ring holds.
* **Routing tables, pass 1 (sampled PNS).** Ids sharing a prefix form one contiguous run of the
  sorted list, so the candidates for slot R[l][c] of node x are the ids in
  ``[prefix_l(x)·c·0…, prefix_l(x)·c·f…]``, found with two bisections. Proximity neighbour
  selection (Castro et al. 2002) picks the lowest ``rtt_s(x, y)`` from a bounded
  random sample of ``oracle_pns_sample`` candidates. Rows stop at the first one where x is alone
  in its prefix run.
* **Pass 2 (nearby-node refinement, ``oracle_refine_rounds``).** A random sample rarely holds
  the best entry of a big slot (row 0 has N/16 candidates). What the protocol does instead is
  what this pass replays: a node joins through a node *near it in the network* and takes the
  rows of the nodes along the route to its own id, which are near it too (each picked its
  entries by PNS) — Castro, Druschel, Hu & Rowstron 2002, "Exploiting network proximity in
  peer-to-peer overlay networks" §4; FreePastry ``PNSApplication`` plus the row exchange of
  ``StandardRouteSetProtocol``. For every node x, starting from each of its
  ``oracle_refine_seeds`` nearest routing-table entries y, the pass walks y → y.R[l][x_l] → …
  (the route from y towards x) and offers every row entry of every node on that walk that is a
  valid entry of x (rows up to the prefix the walker shares with x); a candidate replaces an
  entry only when its RTT is lower. The candidates are network-near by construction, so the
  set stays small: O(seeds · rows · 2^b) RTT calls per node and round, no O(N^2) anywhere.

The result is what joins plus periodic row exchange converge to, give or take the sampling.
Every core is marked ready. No message is sent, no timer armed (the driver calls ``start()``).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable

from overlay.handle import NodeHandle
from overlay.ids import ID_BITS

from .core import PastryCore

_INF = float("inf")

RttFn = Callable[[NodeHandle, NodeHandle], float]


def build_oracle(cores: list[PastryCore], rtt_s: RttFn) -> None:
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
    # RTT of every installed entry, row-major per node (freed at the end of the build)
    costs: list[array[float]] = []
    for i, c in enumerate(order):
        costs.append(_build_table(c, i, ids, handles, rtt_s))
    rounds = order[0].config.oracle_refine_rounds if n > 1 else 0
    if rounds:
        pos = {h: i for i, h in enumerate(handles)}
        for _ in range(rounds):
            for i, c in enumerate(order):
                _refine(c, i, order, pos, costs, rtt_s)
    for c in order:
        c.joiner.mark_ready()


def _build_table(
    c: PastryCore,
    i: int,
    ids: list[int],
    handles: list[NodeHandle],
    rtt_s: RttFn,
) -> array[float]:
    table = c.table
    b = table.b
    cols = table.cols
    sample = max(1, c.config.oracle_pns_sample)
    rng = c.runtime.rng
    me = c.handle
    x = ids[i]
    cost = array("d")
    lo, hi = 0, len(ids)  # run of ids sharing the first `row` digits with x
    for row in range(table.nrows):
        if hi - lo <= 1:
            break
        shift = ID_BITS - (row + 1) * b
        base = (x >> (shift + b)) << (shift + b)
        own = (x >> shift) & (cols - 1)
        entries: list[NodeHandle | None] = [None] * cols
        rc = [_INF] * cols
        start = lo
        next_lo, next_hi = lo, hi
        for col in range(cols):
            end = bisect_left(ids, base + ((col + 1) << shift), start, hi)
            if col == own:
                next_lo, next_hi = start, end
            elif end > start:
                cnt = end - start
                run = range(start, end)
                picks = run if cnt <= sample else rng.sample(run, sample)
                best, bc = -1, _INF
                for j in picks:
                    d = rtt_s(me, handles[j])
                    if d < bc:
                        best, bc = j, d
                entries[col] = handles[best]
                rc[col] = bc
            start = end
        table.install_row(row, entries)
        cost.extend(rc)
        lo, hi = next_lo, next_hi
    return cost


def _refine(
    c: PastryCore,
    i: int,
    order: list[PastryCore],
    pos: dict[NodeHandle, int],
    costs: list[array[float]],
    rtt_s: RttFn,
) -> None:
    """Offer x the rows met on routes towards x from its nearest entries (see module doc)."""
    table = c.table
    rows = table.rows
    b = table.b
    cols = table.cols
    mask = cols - 1
    x = table.oid
    me = c.handle
    cost = costs[i]
    ncost = len(cost)
    seeds = c.config.oracle_refine_seeds
    ranked = sorted(
        (cost[r * cols + col], r * cols + col)
        for r in range(min(2, ncost // cols))
        for col in range(cols)
        if cost[r * cols + col] < _INF
    )
    tried: set[NodeHandle] = {me}
    for _, k in ranked[:seeds]:
        row0 = rows[k // cols]
        y = row0[k % cols] if row0 is not None else None
        done_rows = -1
        while y is not None and y != me:
            yi = pos[y]
            yc = order[yi]
            ytab = yc.table
            lcp = (ID_BITS - (x ^ ytab.oid).bit_length()) // b
            for r in range(done_rows + 1, lcp + 1):
                if r * cols >= ncost:
                    break
                yrow = ytab.rows[r]
                cands = [y] if r == lcp else []
                if yrow is not None:
                    cands.extend(h for h in yrow if h is not None)
                for h in cands:
                    if h in tried:
                        continue
                    tried.add(h)
                    hx = int(h.id) ^ x
                    hr = (ID_BITS - hx.bit_length()) // b
                    slot = hr * cols + ((int(h.id) >> (ID_BITS - (hr + 1) * b)) & mask)
                    if slot >= ncost:
                        continue  # beyond our last row: we are alone in that prefix run
                    d = rtt_s(me, h)
                    if d < cost[slot]:
                        cost[slot] = d
                        table.put(hr, slot - hr * cols, h)
            done_rows = max(done_rows, lcp)
            if lcp >= len(ytab.rows) or ytab.rows[lcp] is None:
                break
            nxt = ytab.rows[lcp][(x >> (ID_BITS - (lcp + 1) * b)) & mask]  # type: ignore[index]
            y = nxt
