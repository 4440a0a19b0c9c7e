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
With ``oracle_measured_rtts`` each node also holds one RTT sample per leaf member and table
entry: what its own probes measured when it chose them. Every core is marked ready. No message is
sent, no timer armed (the driver calls ``start()``).

:func:`table_quality` is the brute-force check of any ring's tables, however built: for each
examined node and slot, the live candidate with the lowest RTT, against the entry held (what
``flockring bench pastry --slots`` reports and tests/test_pastry_pns.py asserts on).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable, Sequence

import attrs

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
    if order[0].config.oracle_measured_rtts:
        # A ring built by joins has measured every node it holds — PNS chose each table entry
        # by probing it, and leaf members are probed on insertion — so the steady state holds
        # those samples too: the RTT a probe measures on the network model (its round trip).
        # Without them every row swap and repair of the first minutes under churn probes the
        # occupant it compares a candidate with, traffic no converged ring sends.
        for c in order:
            me = c.handle
            sample = c.prox.sample
            for h in (*c.leaf.nodes(), *c.table.entries()):
                sample(h, rtt_s(me, h))
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


@attrs.frozen
class RowQuality:
    """How a routing-table row compares with the best possible entry of each slot."""

    #: the row index
    row: int
    #: slots for which at least one live candidate exists (over the nodes examined)
    slots: int
    #: such slots left empty
    empty: int
    #: filled slots whose entry has the lowest RTT of all candidates (ties count)
    best: int
    #: filled slots whose entry's RTT is at most 1.5 times the best candidate's
    within_1_5: int
    #: filled slots whose entry is not a live node (stale)
    stale: int
    #: sum over filled slots of (entry RTT - best RTT), seconds
    excess_s: float

    @property
    def filled(self) -> int:
        """Filled slots that hold a live node."""
        return self.slots - self.empty - self.stale

    def as_dict(self) -> dict[str, float | int]:
        """Counts and the derived fractions (best, within 1.5x) and mean excess in ms."""
        f = max(1, self.filled)
        return {
            "row": self.row,
            "slots": self.slots,
            "empty": self.empty,
            "stale": self.stale,
            "best_fraction": round(self.best / f, 4),
            "within_1_5x_fraction": round(self.within_1_5 / f, 4),
            "excess_ms_mean": round(self.excess_s / f * 1e3, 3),
        }


def table_quality(
    cores: Sequence[PastryCore], rtt_s: RttFn, examined: Sequence[PastryCore]
) -> list[RowQuality]:
    """Brute-force oracle of proximity neighbour selection: for every node in ``examined`` and
    every slot of its routing table, the live candidate (among ``cores``) with the lowest
    ``rtt_s``, compared with the entry the node holds. O(len(examined) * len(cores)) RTT calls.
    """
    live = {c.handle for c in cores}
    acc: dict[int, list[float]] = {}
    for x in examined:
        table = x.table
        me = x.handle
        best: dict[tuple[int, int], float] = {}
        for y in cores:
            slot = table.slot_of(y.id)
            if slot is None:
                continue
            d = rtt_s(me, y.handle)
            if d < best.get(slot, _INF):
                best[slot] = d
        for (row, col), bd in best.items():
            a = acc.setdefault(row, [0, 0, 0, 0, 0, 0.0])
            a[0] += 1
            e = table.get(row, col)
            if e is None:
                a[1] += 1
                continue
            if e not in live:
                a[4] += 1
                continue
            d = rtt_s(me, e)
            a[2] += d <= bd
            a[3] += d <= 1.5 * bd
            a[5] += d - bd
    return [
        RowQuality(r, int(a[0]), int(a[1]), int(a[2]), int(a[3]), int(a[4]), a[5])
        for r, a in sorted(acc.items())
    ]
