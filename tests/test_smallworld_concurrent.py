"""Concurrent joins on the small-world ring converge, checked by the brute-force oracle.

Nodes that join into the same gap at the same time cannot learn of each other from their JOIN
replies; without more, the ring splits into interleaved strands, each consistent on its own, and
a one-sided near-repair walk never leaves its strand (measured before the near-list exchange:
300 nodes joining 0.1 s apart left 223 of 300 near windows wrong and 58 % of lookups at the
closest node; 145 and 79 % after 120 s more). With Brunet's neighbour exchange
(``NearList``, overlay/smallworld/maintenance.py) every near window is the oracle's and every
lookup reaches ``closest_live`` as soon as the last join has completed.
"""

from __future__ import annotations

import random

from sim_oracles import lookups, wrong_windows

from overlay import NodeHandle, NodeId
from overlay.smallworld import SmallWorldConfig, SmallWorldCore
from overlay.smallworld.messages import NearList, NearReply
from sim_adapter.network import Network, SimNode

#: virtual seconds allowed after the last join completed (lookups themselves take a few more)
SETTLE_S = 5.0


def _core(x: SimNode) -> SmallWorldCore:
    assert isinstance(x.core, SmallWorldCore)
    return x.core


def _wrong_near(nodes: list[SimNode]) -> int:
    return wrong_windows(nodes, 2, lambda x: _core(x).near_connections())


def _overlapping(n: int, interval_s: float, seed: int) -> tuple[Network, list[SimNode]]:
    net = Network(seed=seed)
    nodes = net.spawn(n, overlay="smallworld", join_interval_s=interval_s)
    assert all(x.core.ready for x in nodes)
    # the joins overlapped: spawning took about n * interval, far less than n joins in a row
    assert net.now < n * interval_s + 10.0
    net.run(SETTLE_S)
    return net, nodes


def test_1000_nodes_joining_a_tenth_of_a_second_apart_route_every_lookup_correctly() -> None:
    net, nodes = _overlapping(1000, 0.1, seed=1)
    assert _wrong_near(nodes) == 0
    ok, hops = lookups(net, nodes, 1000, seed=1)
    assert ok == 1.0
    assert hops < 8


def test_300_nodes_joining_twenty_a_second_route_every_lookup_correctly() -> None:
    net, nodes = _overlapping(300, 0.05, seed=2)
    assert _wrong_near(nodes) == 0
    ok, _ = lookups(net, nodes, 1000, seed=2)
    assert ok == 1.0


def test_nodes_joining_into_one_gap_at_once_end_up_linked_to_each_other() -> None:
    """The root cause in miniature: six nodes join at the same instant, through different seeds,
    into the gap between two neighbours of an existing ring; no JOIN reply can name the others."""
    net = Network(seed=3)
    ring = net.spawn(40, overlay="smallworld", build="oracle")
    ids = sorted(int(x.id) for x in ring)
    lo, hi = ids[7], ids[8]
    gap = [NodeId(lo + (hi - lo) * (j + 1) // 7) for j in range(6)]
    joiners = net.spawn(6, overlay="smallworld", ids=gap, join_interval_s=0.001)
    net.run(SETTLE_S)
    nodes = ring + joiners
    assert _wrong_near(nodes) == 0
    for i, x in enumerate(joiners):  # each holds its neighbours inside the gap
        near = set(_core(x).near_connections())
        assert {j.handle for j in joiners[max(0, i - 2) : i + 3] if j is not x} <= near
    ok, _ = lookups(net, nodes, 400, seed=3)
    assert ok == 1.0


def test_a_near_list_links_its_sender_but_hearsay_only_once_it_answers() -> None:
    """A near list (or a walk's answer) may name handles nobody answers for (stale, or made up):
    they are sent a Link and enter the table only when their LinkAck comes back."""
    net = Network(seed=4)
    nodes = net.spawn(60, overlay="smallworld", build="oracle")
    net.run(10.0)
    x = _core(nodes[5])
    ids = sorted(int(n.id) for n in nodes)
    me = ids.index(int(x.id))
    right = ids[(me + 1) % len(ids)]
    # a made-up node between x and its successor, at an address nobody listens on
    ghost = NodeHandle(NodeId(int(x.id) + (right - int(x.id)) // 2), 10**6)
    # a real node outside x's window, sent x as if it were a neighbour (its list: the ghost)
    far = net.node_by_id(ids[(me + 20) % len(ids)])
    net.inject(far.handle, nodes[5], NearList((ghost,), True, net.now, -1.0, 0.0))
    net.inject(far.handle, nodes[5], NearReply(1, (ghost,)))  # the repair walk's answer too
    net.run(SETTLE_S)
    assert ghost not in x.table  # no LinkAck from the ghost: never a connection
    assert x.stats["near_proposals"] >= 1
    assert far.handle not in x.near_connections()  # the sender is linked only if it fits
    assert _wrong_near(nodes) == 0


def test_the_exchange_answers_a_node_missing_part_of_its_window() -> None:
    """A node whose window lost a member it should hold gets it back from its neighbours'
    answers at the next exchange, without a walk (stabilization walks are rare now)."""
    cfg = SmallWorldConfig(stabilize_interval_s=10_000.0)
    net = Network(seed=5)
    nodes = net.spawn(80, overlay="smallworld", build="oracle", config=cfg)
    net.run(10.0)
    rng = random.Random(5)
    victims = rng.sample(nodes, 8)
    for v in victims:
        c = _core(v)
        lost = c.near_connections()[0]
        c.table.remove(lost)  # forgotten, with no Unlink: only the exchange can restore it
    net.run(cfg.near_exchange_s + cfg.maintenance_interval_s)
    assert _wrong_near(nodes) == 0
    assert sum(_core(x).stats["near_news"] for x in nodes) >= 1
