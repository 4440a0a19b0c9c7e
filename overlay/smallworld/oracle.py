"""Oracle build: the steady-state small-world ring computed directly, for large simulations.

Theory of operation (``Network.spawn(..., build="oracle")``, docs/smallworld.md; PondSim builds its
10^6-node rings the same way): instead of N sequential joins, every node gets the connection table
the protocol converges to, without sending a message:

* **near connections**: the ``near_per_side`` nodes before and after it in sorted id order;
* **N̂**: from the spread of those near connections, with the protocol's own estimator;
* **shortcuts**: ceil(0.5·log2 N̂) targets drawn from the runtime's rng by the protocol's own
  :func:`~overlay.smallworld.estimate.draw_shortcut_target` (log-uniform distance, random
  direction); each connects to the node closest to the target (bisect over the sorted ids,
  ties by :func:`overlay.ids.closer` — exactly where greedy routing of the connect request
  would end). As in the protocol, a draw that lands on the node itself or inside its near
  window is wasted and redrawn; a repeat of an existing shortcut too;
* every shortcut is also installed as an *incoming* connection on the node it reached
  (connections are bidirectional);
* every node gets the same short list of bootstrap addresses as its seeds, so that a node
  whose connections all fail later can rejoin, as a joined node would through its seeds.

Memory is what limits 10^6 nodes, so the shortcut graph is built in flat ``array('l')`` edge
lists (CSR form) and each node's table ends as three tuples of shared handles. ``rtt_s`` is
accepted for the common oracle signature but unused: small-world connections are not chosen
by proximity, and priming RTT state for every connection would cost kilobytes per node.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from overlay.handle import NodeHandle
from overlay.ids import RING, closer
from overlay.smallworld.estimate import (
    desired_shortcuts,
    draw_shortcut_target,
    estimate_from_gaps,
)

if TYPE_CHECKING:
    from overlay.smallworld.core import SmallWorldCore

#: attempts per wanted shortcut before the oracle gives up on a node (tiny rings only).
_DRAWS_PER_SHORTCUT = 8
#: size of the shared bootstrap (seed) list given to oracle-built nodes.
_BOOTSTRAP = 8


def build_oracle(
    cores: Sequence[SmallWorldCore],
    rtt_s: Callable[[NodeHandle, NodeHandle], float] | None = None,
) -> None:
    """Install steady-state connection tables on ``cores`` (all live nodes) and mark them ready."""
    n = len(cores)
    if n == 0:
        return
    order = sorted(cores, key=lambda c: c.id)
    ids = [int(c.id) for c in order]  # plain ints: bisect compares them at C speed
    handles = [c.handle for c in order]

    # ---- shortcuts, as CSR: out_dst[out_start[i]:out_start[i+1]] are node i's own shortcuts
    out_start = array("l", [0])
    out_dst = array("l")
    for i, core in enumerate(order):
        cfg = core.config
        k = cfg.near_per_side
        if n - 1 <= 2 * k:
            n_hat = float(n)
        else:
            width = (ids[(i + k) % n] - ids[(i - k) % n]) % RING
            n_hat = estimate_from_gaps(width, 2 * k, 2 * k)
        want = desired_shortcuts(n_hat, cfg)
        if want:
            rng = core.runtime.rng
            me = ids[i]
            got: list[int] = []
            tries = 0
            limit = _DRAWS_PER_SHORTCUT * want
            while len(got) < want and tries < limit:
                tries += 1
                t = draw_shortcut_target(rng, me, n_hat)
                p = bisect.bisect_left(ids, t)
                a = p % n
                b = (p - 1) % n
                j = a if closer(t, ids[a], ids[b]) else b  # the shared tie rule
                d = (j - i) % n
                if d <= k or d >= n - k or j in got:
                    continue  # self or inside the near window or a repeat: wasted draw
                got.append(j)
            out_dst.extend(got)
        out_start.append(len(out_dst))

    # ---- incoming shortcuts: counting sort of the edges by destination
    inc_start = array("l", bytes(8 * (n + 1)))
    for j in out_dst:
        inc_start[j + 1] += 1
    for i in range(n):
        inc_start[i + 1] += inc_start[i]
    fill = array("l", inc_start[:n])
    inc_src = array("l", bytes(8 * len(out_dst)))
    for i in range(n):
        for e in range(out_start[i], out_start[i + 1]):
            j = out_dst[e]
            inc_src[fill[j]] = i
            fill[j] += 1
    del fill

    # ---- bootstrap list: every node is configured with the same few well-known addresses
    # (how deployments hand out seeds); an isolated node rejoins through them. One shared
    # tuple, so it costs nothing per node.
    boot_rng = order[0].runtime.rng
    boot = tuple(handles[j].address for j in boot_rng.sample(range(n), min(_BOOTSTRAP, n)))

    # ---- install the tables
    for i, core in enumerate(order):
        k = core.config.near_per_side
        if n - 1 <= 2 * k:
            idx = set(range(n))
            idx.discard(i)
        else:
            idx = {(i + d) % n for d in range(1, k + 1)}
            idx.update((i - d) % n for d in range(1, k + 1))
        outs = out_dst[out_start[i] : out_start[i + 1]]
        ins = inc_src[inc_start[i] : inc_start[i + 1]]
        idx.update(outs)
        idx.update(ins)
        all_cw = tuple(handles[j] for j in sorted(idx, key=lambda j: (j - i) % n))
        core.table.load(
            all_cw,
            tuple(handles[j] for j in outs),
            tuple(handles[j] for j in ins),
        )
        core.mark_built(boot)
