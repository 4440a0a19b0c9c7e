"""Recursive-partition multicast and aggregation on both overlays (PonD §2.3, §3.1).

Static rings of 2,000 nodes built by each overlay's oracle; every check is against an oracle
over *all* nodes (the sorted ids), never a hand-picked expectation.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
import trio

from overlay import NodeId
from overlay.multicast import (
    MULTICAST_APP,
    Multicast,
    MulticastConfig,
    MulticastResult,
    UnknownAggregatorError,
)
from overlay.multicast.ranges import contains
from sim_adapter.latency import Uniform
from sim_adapter.network import Network, SimNode

N = 2000
OVERLAYS = ("smallworld", "pastry")


def ring(
    overlay: str, n: int = N, seed: int = 7, loss: float = 0.0
) -> tuple[Network, list[SimNode]]:
    net = Network(seed=seed, latency=Uniform(0.01, 0.05, seed=seed), loss=loss)
    nodes = net.spawn(n, overlay=overlay, build="oracle")
    return net, nodes


def mc(node: SimNode) -> Multicast:
    app = node.core.apps[MULTICAST_APP]
    assert isinstance(app, Multicast)
    return app


def run_query(net: Network, root: SimNode, agg: str, arg: Any = None, **kw: Any) -> MulticastResult:
    out: list[MulticastResult] = []

    def done(r: MulticastResult) -> None:
        out.append(r)
        net.engine.stop()

    mc(root).aggregate(agg, arg, on_done=done, **kw)
    while not out:
        assert not net.engine.run_until(net.now + 3600.0) or out, "no answer"
    return out[0]


def set_config(nodes: list[SimNode], config: MulticastConfig) -> None:
    for n in nodes:
        mc(n).config = config


class Visits:
    """Counts map() calls per node id (a node must map exactly once per tree)."""

    def __init__(self) -> None:
        self.calls: Counter[int] = Counter()

    def map(self, m: Multicast, arg: Any) -> int:
        self.calls[int(m.core.id)] += 1
        return 1

    def reduce(self, arg: Any, acc: int, child: int) -> int:
        return acc + child

    def done(self, arg: Any, acc: int) -> bool:
        return False

    def merge(self, arg: Any, a: int, b: int) -> int:
        return max(a, b)


def assert_exact(r: MulticastResult, nodes: list[SimNode], fresh: bool = True) -> set[int]:
    """The oracle check over all nodes: a live node is either counted or inside a missing
    range, never both, never neither; nobody is counted twice; a crashed node is never counted
    and, while the overlay has not yet noticed the crash (``fresh``), it is inside a missing
    range. Returns the counted ids."""
    counted = [int(x) for x in r.value]
    assert len(counted) == len(set(counted)), "a node was counted twice"
    got = set(counted)
    assert r.nodes <= len(got)  # merged trees: the larger tree's count, a lower bound
    for n in nodes:
        if n.alive:
            assert contains(r.missing, n.id) != (int(n.id) in got), n
        else:
            assert int(n.id) not in got, n
            assert not fresh or contains(r.missing, n.id), n
    return got


# ---------------------------------------------------------------------- static rings
@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("direction", ["cw", "ccw"])
def test_each_tree_visits_every_node_exactly_once(overlay: str, direction: str) -> None:
    net, nodes = ring(overlay)
    visits = Visits()
    for n in nodes:
        mc(n).add_aggregator("visits", visits)
    r = run_query(net, nodes[3], "visits", direction=direction)
    assert r.value == N and r.nodes == N
    assert r.missing == () and r.complete
    assert set(visits.calls) == {int(n.id) for n in nodes}
    assert set(visits.calls.values()) == {1}
    assert 1 <= r.depth <= 2 * math.log2(N)
    net.run(60.0)
    assert all(mc(n).active_sessions == 0 for n in nodes)  # nothing leaks


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_count_nodes_equals_n_and_depth_is_logarithmic(overlay: str) -> None:
    net, nodes = ring(overlay)
    for redundant in (False, True):
        a = net.count_nodes(nodes[11], redundant=redundant)
        assert a.value == N
        assert a.missing == []
        assert 1 <= a.depth <= 2 * math.log2(N)
        assert 0 < a.latency_s < 60


# ---------------------------------------------------------------------- crashes
@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("repair", [True, False])
def test_missing_ranges_hold_exactly_the_uncounted_nodes(overlay: str, repair: bool) -> None:
    net, nodes = ring(overlay, seed=11)
    set_config(nodes, MulticastConfig(repair=repair))
    root = nodes[0]
    dead = net.rng.sample(nodes[1:], N // 20)  # 5%, just before the query: nobody knows yet
    net.crash(dead)
    r = run_query(net, root, "ids")
    got = assert_exact(r, nodes)
    assert not got & {int(d.id) for d in dead}
    assert r.missing  # the crashes were noticed and reported
    # Network.count_nodes agrees with the same oracle
    net2, nodes2 = ring(overlay, seed=11)
    set_config(nodes2, MulticastConfig(repair=repair))
    net2.crash([nodes2[d.index] for d in dead])
    a = net2.count_nodes(nodes2[0])
    in_missing = sum(1 for n in nodes2 if contains(a.missing, n.id))
    assert a.value + in_missing == N
    if repair:  # repaired: only the crashed nodes themselves are missing
        assert a.value == N - len(dead)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_redundant_trees_count_99_percent_with_2_percent_crashes(overlay: str) -> None:
    net, nodes = ring(overlay, seed=5)
    dead = net.rng.sample(nodes[1:], N // 50)
    net.crash(dead)
    live = N - len(dead)
    a = net.count_nodes(nodes[0], redundant=True)
    assert a.value >= 0.99 * live
    assert a.value <= live


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_redundant_missing_only_if_missing_in_both_trees(overlay: str) -> None:
    """Without repair each tree loses whole subtrees; merged by node id (``ids`` is a union),
    a node is missing only if both trees missed it, and the ranges say exactly which."""
    net, nodes = ring(overlay, seed=23)
    set_config(nodes, MulticastConfig(repair=False))
    dead = net.rng.sample(nodes[1:], N // 20)
    net.crash(dead)
    one = run_query(net, nodes[0], "ids", direction="cw")
    # the first query made the overlay suspect the crashed nodes; start afresh for the second
    net2, nodes2 = ring(overlay, seed=23)
    set_config(nodes2, MulticastConfig(repair=False))
    net2.crash([nodes2[d.index] for d in dead])
    both = run_query(net2, nodes2[0], "ids", direction="both")
    got_one = assert_exact(one, nodes)
    assert one.nodes == len(got_one)
    got_both = assert_exact(both, nodes)
    assert got_one < got_both


# ---------------------------------------------------------------------- First-Fit
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_reduce_that_is_done_answers_earlier(overlay: str) -> None:
    net, nodes = ring(overlay)
    full = run_query(net, nodes[9], "count")
    ff = run_query(net, nodes[9], "count", 25)
    assert full.value == N and not full.early
    assert ff.early and ff.value >= 25
    assert ff.elapsed_s < full.elapsed_s
    net.run(60.0)
    assert all(mc(n).active_sessions == 0 for n in nodes)


# ---------------------------------------------------------------------- regions, loss, API
@pytest.mark.parametrize("direction", ["cw", "ccw", "both"])
def test_region_query_from_outside_and_inside(direction: str) -> None:
    net, nodes = ring("smallworld", n=600)
    ids = sorted(int(n.id) for n in nodes)
    for lo_i, hi_i, root in ((100, 250, nodes[0]), (590, 20, nodes[1])):
        b, e = NodeId(ids[lo_i]), NodeId(ids[hi_i])
        want = {x for x in ids if contains([(b, e)], x)}
        r = run_query(net, root, "ids", begin=b, end=e, direction=direction)
        assert set(map(int, r.value)) == want and not r.missing
        # and from a node inside the region, not at its start
        inside = net.node_by_id(ids[(lo_i + 30) % len(ids)])
        r = run_query(net, inside, "ids", begin=b, end=e, direction=direction)
        assert set(map(int, r.value)) == want and not r.missing


def test_message_loss_never_loses_a_node_silently() -> None:
    net, nodes = ring("smallworld", n=800, loss=0.03)
    for i in range(3):
        r = run_query(net, nodes[i], "ids", direction="both" if i else "cw")
        assert_exact(r, nodes)
        assert r.nodes >= 0.95 * len(nodes)  # lost queries and replies are retransmitted


def test_broadcast_reaches_every_listener_once() -> None:
    net, nodes = ring("pastry", n=300)
    got: Counter[int] = Counter()
    for n in nodes:
        mc(n).add_listener(
            lambda payload, i=int(n.id): got.update([i]) if payload == "hi" else None
        )
    r = run_query(net, nodes[0], "deliver", "hi")
    assert r.value == 300 and set(got.values()) == {1} and len(got) == 300


def test_api_misuse_raises_at_once() -> None:
    _net, nodes = ring("smallworld", n=50)
    m = mc(nodes[0])
    with pytest.raises(UnknownAggregatorError):
        m.aggregate("nope", on_done=lambda r: None)
    with pytest.raises(Exception, match="direction"):
        m.aggregate("count", on_done=lambda r: None, direction="up")
    with pytest.raises(Exception, match="begin and end"):
        m.aggregate("count", on_done=lambda r: None, begin=nodes[1].id)


def test_unknown_aggregator_at_a_node_is_reported_missing() -> None:
    net, nodes = ring("smallworld", n=300)
    root = nodes[0]
    mc(root).add_aggregator("local-only", Visits())
    r = run_query(net, root, "local-only")
    assert r.value == 1 and r.nodes == 1
    # everything but the root is reported missing, not dropped
    assert all(contains(r.missing, n.id) for n in nodes if n is not root)
    assert not contains(r.missing, root.id)


# ---------------------------------------------------------------------- live nodes
async def test_aggregation_over_live_nodes_through_the_codec(autojump_clock: Any) -> None:
    """Multicast messages travel as top-level wire messages (signed frames, the codec at the
    trust boundary) between real ``overlay.Node`` objects, not only in the simulator."""
    from overlay.testing import open_swarm

    async with open_swarm(12, overlay="smallworld", seed=4) as swarm:
        m = swarm[0].multicast
        assert m is not None
        out: list[MulticastResult] = []
        m.aggregate("ids", on_done=out.append, direction="both")
        while not out:
            await trio.sleep(0.5)
        want = {int(n.handle.id) for n in swarm.live}
        assert set(map(int, out[0].value)) == want and out[0].complete
