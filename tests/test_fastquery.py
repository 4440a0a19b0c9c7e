"""The analytic query mode (``sim_adapter.fastquery``, PondSim's method on our overlay state)
against the event-driven protocol, and the partition function both share.

Without loss the two must agree exactly (same tree from the same ``known_in_range`` state, same
edge latencies); with loss they charge a lost exchange differently (PondSim's closed-form
back-off vs the protocol's RTO timers), so only their latency distributions must agree.
"""

from __future__ import annotations

import random
import statistics

import pytest

from overlay.handle import NodeHandle
from overlay.ids import RING, NodeId
from overlay.multicast.ranges import CCW, CW, contains, in_region
from overlay.multicast.tree import partition
from overlay.smallworld import SmallWorldConfig
from sim_adapter.fastquery import count_analytic
from sim_adapter.latency import PondSim
from sim_adapter.network import Network, SimNode

N = 2000


def pond_ring(
    overlay: str = "smallworld", n: int = N, seed: int = 3
) -> tuple[Network, list[SimNode]]:
    lat = PondSim(seed=seed)
    net = Network(seed=seed, latency=lat, loss=0.0)
    cfg = SmallWorldConfig(maintenance_enabled=False) if overlay == "smallworld" else None
    return net, net.spawn(n, overlay=overlay, build="oracle", config=cfg)


@pytest.mark.parametrize("overlay", ["smallworld", "pastry"])
def test_lossless_analytic_equals_event_driven_exactly(overlay: str) -> None:
    net, nodes = pond_ring(overlay)
    pick = random.Random(5)
    for redundant in (False, True):
        for _ in range(2 if overlay == "smallworld" else 1):
            root = pick.choice(nodes)
            ev = net.count_nodes(root, redundant=redundant)
            an = count_analytic(net, root, redundant, loss=0.0)
            assert ev.value == an.value == N
            assert ev.missing == an.missing == []
            assert ev.depth == an.depth
            assert an.latency_s == pytest.approx(ev.latency_s, rel=1e-9)
            assert an.exchanges == (2 if redundant else 1) * (N - 1) and an.lost == 0


def test_lossy_latency_distributions_agree() -> None:
    net, nodes = pond_ring()
    net.loss = PondSim().loss_per_message  # 0.5 % per exchange, as PondSim
    pick, rng = random.Random(5), random.Random(9)
    ev, an, lost = [], [], 0
    for _ in range(16):
        root = pick.choice(nodes)
        ev.append(net.count_nodes(root).latency_s)
        r = count_analytic(net, root, rng=rng)
        assert r.value == N and r.missing == []
        an.append(r.latency_s)
        lost += r.lost
    assert lost > 0  # loss was really charged
    assert statistics.mean(an) == pytest.approx(statistics.mean(ev), rel=0.08)
    assert statistics.median(an) == pytest.approx(statistics.median(ev), rel=0.08)


def test_redraw_is_pondsim_verbatim_and_seeded() -> None:
    net, nodes = pond_ring(n=600)
    a = count_analytic(net, nodes[0], edges="redraw", loss=0.005, rng=random.Random(1))
    b = count_analytic(net, nodes[0], edges="redraw", loss=0.005, rng=random.Random(1))
    assert a == b  # deterministic for a seed
    # every edge is 200..599 ms and a child costs 2·edge: the latency is a whole number of ms
    # per level, at least 0.4 s per level of the tree
    assert a.value == 600 and a.latency_s >= 0.4 * a.depth
    with pytest.raises(Exception, match="edges"):
        count_analytic(net, nodes[0], edges="nope")


def test_crashed_children_are_missing_with_their_subregion() -> None:
    net, nodes = pond_ring(n=1000, seed=11)
    dead = random.Random(2).sample(nodes[1:], 50)
    net.crash(dead)
    r = count_analytic(net, nodes[0], loss=0.0)
    live = [n for n in nodes if n.alive]
    in_missing = [n for n in live if contains(r.missing, n.id)]
    assert r.value + len(in_missing) == len(live)  # every live node counted or missing
    assert all(contains(r.missing, d.id) for d in dead)
    # redundant trees: a node is missing only if missing in both
    both = count_analytic(net, nodes[0], redundant=True, loss=0.0)
    assert both.value >= r.value
    assert all(contains(r.missing, n.id) for n in live if contains(both.missing, n.id))


def test_network_count_nodes_analytic_method() -> None:
    net, nodes = pond_ring(n=500)
    ev = net.count_nodes(nodes[7])
    t = net.now
    an = net.count_nodes(nodes[7], method="analytic")
    assert net.now == t  # no virtual time passes
    assert (an.value, an.depth) == (ev.value, ev.depth) == (500, ev.depth)
    with pytest.raises(Exception, match="method"):
        net.count_nodes(nodes[7], method="magic")


def test_region_query_matches_oracle() -> None:
    net, nodes = pond_ring(n=600)
    ids = sorted(int(n.id) for n in nodes)
    b, e = NodeId(ids[100]), NodeId(ids[250])
    for root in (nodes[0], net.node_by_id(ids[120])):
        for red in (False, True):
            r = count_analytic(net, root, red, begin=b, end=e, loss=0.0)
            assert r.value == 150 and r.missing == []


# ---------------------------------------------------------------------- the shared partition
@pytest.mark.parametrize("d", [CW, CCW])
def test_partition_follows_the_spec(d: int) -> None:
    """PonD §2.3's partition restated as an oracle: members (and this node, when inside) sorted
    from the region's start in tree direction, n_j gets [n_j, n_{j+1}), the last gets [n_i, end),
    the first also the stretch from the start."""
    rng = random.Random(d)
    for _ in range(500):
        ids = [NodeId(x % RING) for x in rng.sample(range(-3000, 3000), rng.randint(1, 9))]
        me, b, e = ids[0], NodeId(rng.randrange(-3000, 3000) % RING), NodeId(rng.randrange(RING))
        if rng.random() < 0.3:
            b = me
        if rng.random() < 0.2:
            e = b
        pts = [NodeHandle(x, i) for i, x in enumerate(ids[1:]) if in_region(d, x, b, e)]
        kids = partition(me, d, b, e, pts)
        members = [h.id for h in pts] + ([me] if b == me or in_region(d, me, b, e) else [])
        seq = sorted(members, key=lambda x: (x - b) % RING if d > 0 else (b - x) % RING)
        want = []
        for j, m in enumerate(seq):
            if m != me:
                want.append((m, b if j == 0 else m, seq[j + 1] if j + 1 < len(seq) else e))
        assert [(h.id, sb, se) for h, sb, se in kids] == want
