"""Leaving is not crashing: a leaving node tells the nodes it knows, which repair at once.

After a graceful leave every leaf set / near window is exact within seconds and lookups are
oracle-correct, with no lease or probe timeout to wait out; after a crash of the same nodes the
neighbour sets are not yet repaired (the control that shows the test can fail).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from sim_oracles import lookups, sw_width, wrong_windows

from sim_adapter import Network, SimNode


@pytest.mark.parametrize("overlay", ["pastry", "smallworld"])
def test_neighbours_repair_at_once_after_a_graceful_leave(overlay: str) -> None:
    # a small-world node that lost several connections at once may widen its window (churn.py)
    k: int | Callable[[SimNode], int] = 8 if overlay == "pastry" else sw_width
    wrong = {}
    for how in ("leave", "crash"):
        net = Network(seed=12)
        nodes = net.spawn(120, overlay=overlay, build="oracle")
        net.run(30.0)
        gone = random.Random(3).sample(nodes, 12)
        if how == "leave":
            net.leave(gone)
        else:
            net.crash(gone)
        # far less than the lease and probe timeouts a crash has to wait out; the small-world
        # ring re-links two adjacent leavers' neighbours through its next stabilization round
        net.run(5.0 if overlay == "pastry" else 20.0)
        wrong[how] = wrong_windows(nodes, k, _window(overlay))
        if how == "leave":
            ok, _ = lookups(net, nodes, 400, seed=4)
            assert ok == 1.0
            assert sum(x.core.stats["leaves_heard"] for x in nodes if x.alive) > 0
    assert wrong["leave"] == 0
    assert wrong["crash"] > 0  # the same departures unannounced are not repaired this fast


def _window(overlay: str):  # type: ignore[no-untyped-def]
    if overlay == "pastry":
        return lambda x: x.core.leaf.nodes()
    return lambda x: x.core.near_connections()
