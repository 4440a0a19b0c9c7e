"""A node joining right after a crash of several nodes, which its root and members still list.

Traced live (``flockring bench chaos``: a process's five nodes SIGKILLed, restarted 5 s later
under fresh ids): each restarted node's consistent join waited out four requests to a dead
member at the 1-s initial RTO (15 s), while the members that had inserted it sent it lookups it
could only send back. Two rules end those waits early (``overlay/pastry/join.py``): a member
the joiner's own probes found dead is asked once, as a DEAD verdict is rechecked; a member
another member measured is asked on the RTO of the bound the triangle inequality gives. The
oracle, by brute force over the live nodes: when the join ends, the joiner's leaf set holds no
dead node and, on each side, the nearest live nodes with none skipped; 30 s later, every live
node (16 live, 8 a side).
"""

from __future__ import annotations

import pytest

from overlay.pastry.config import PastryConfig
from overlay.pastry.core import PastryCore
from sim_adapter import Network
from sim_adapter.latency import Uniform
from sim_adapter.simnode import SimNode

#: the old wait: four requests at the 1-s initial RTO, doubling (1 + 2 + 4 + 8 s)
_OLD_WAIT_S = 15.0


def _pc(n: SimNode) -> PastryCore:
    core = n.core
    assert isinstance(core, PastryCore)
    return core


def _crashed_ring(seed: int) -> tuple[Network, list[SimNode]]:
    """20 nodes with loopback-like delays, settled; then five crashed at once, 5 s ago."""
    net = Network(seed=seed, latency=Uniform(0.0005, 0.002, seed=seed))
    nodes = net.spawn(20, overlay="pastry")
    net.run(60.0)
    dead = net.rng.sample(nodes, 5)
    net.crash(dead)
    net.run(5.0)
    return net, nodes


def _join(net: Network, config: PastryConfig | None = None) -> SimNode:
    x = net._new_node("pastry", config, None)
    net._join_one(x, 300.0)
    assert _pc(x).ready
    return x


def _gapless(x: SimNode, nodes: list[SimNode]) -> bool:
    """True if the joiner's leaf set holds no dead node and, on each side, the nearest live
    nodes up to its farthest member there, with none skipped (brute force over the live
    nodes): what correct delivery needs. Members it has not heard of yet, beyond those, come
    with maintenance (the members' own lists still named the dead when they answered)."""
    me = int(x.core.id)
    ring = 1 << 160
    live = [n.core.handle for n in nodes if n.alive and n is not x]
    members = set(_pc(x).leaf.members)
    if not members <= set(live):
        return False
    covered: set[object] = set()
    for side in (1, -1):
        order = sorted(live, key=lambda h: (side * (int(h.id) - me)) % ring)
        for h in order:
            if h not in members:
                break
            covered.add(h)
    return members <= covered


def _complete(x: SimNode, nodes: list[SimNode]) -> bool:
    """True if the joiner's leaf set is every other live node (16 live: 8 a side covers all)."""
    live = {n.core.handle for n in nodes if n.alive and n is not x}
    return set(_pc(x).leaf.members) == live


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_first_join_after_a_crash_of_five_confirms_its_live_members_at_once(
    seed: int,
) -> None:
    net, nodes = _crashed_ring(seed)
    x = _join(net)
    j = _pc(x).joiner
    assert j.probing_at >= 0
    # measured: 15.0 s on each of these seeds before the rules, 0.05-1.0 s with them
    assert j.ready_at - j.probing_at < 2.0
    assert _gapless(x, nodes)
    net.run(30.0)
    assert _complete(x, nodes)


def test_a_dead_member_that_a_live_member_measured_is_dropped_on_the_bound() -> None:
    """Without the nearby-node discovery the joiner never probes the dead nodes itself, so
    only the members' RTT hints can hasten its requests."""
    hastened = 0
    for seed in (1, 2, 3, 4):
        net, nodes = _crashed_ring(seed)
        x = _join(net, PastryConfig(join_locate_rounds=0))
        j = _pc(x).joiner
        st = _pc(x).stats
        hastened += st["join_asks_hastened"]
        if st["join_asks_hastened"]:
            assert j.ready_at - j.probing_at < _OLD_WAIT_S / 2, seed
        assert _gapless(x, nodes), seed
        net.run(30.0)
        assert _complete(x, nodes), seed
    assert hastened > 0
