"""A near window that follows the churn (``overlay/smallworld/churn.py``).

The estimate is checked against the sessions it was drawn from (exponential lifetimes of known
mean); the ring under churn against the brute-force windows of each node's own width and the
brute-force closest live node (``Network.closest_live``).
"""

from __future__ import annotations

import math
import random

import attrs
import pytest
from sim_oracles import lookups, sw_width, wrong_windows

from overlay.smallworld import SmallWorldConfig, SmallWorldCore
from overlay.smallworld.churn import fold, unsure, wanted_near
from sim_adapter.network import Network, SimNode

#: the defaults: three near neighbours a side while a node sees short sessions, else two
CFG = SmallWorldConfig()


def _core(x: SimNode) -> SmallWorldCore:
    assert isinstance(x.core, SmallWorldCore)
    return x.core


def _watch(
    mean_s: float, seed: int, conns: int = 12, hours: float = 1.0
) -> list[tuple[float, int]]:
    """A node with ``conns`` connections whose peers live exponential sessions of ``mean_s``
    (each one that dies replaced at once): the width the estimate asks for after each death
    and at every 5-s tick, as ``(time, width)``."""
    rng = random.Random(seed)
    deaths = sorted(t for _ in range(conns) for t in _renewals(rng, mean_s, hours * 3600.0))
    state: list[float] | None = None
    width = CFG.near_per_side
    out: list[tuple[float, int]] = []
    ticks = [5.0 * i for i in range(1, int(hours * 720) + 1)]
    events = sorted([(t, 1) for t in deaths] + [(t, 0) for t in ticks])
    for t, dead in events:
        if state is None and not dead:
            continue
        state = fold(state, t, 0.0, conns, dead, CFG.churn_horizon_s)
        width = wanted_near(state, width, CFG)
        out.append((t, width))
    return out


def _renewals(rng: random.Random, mean_s: float, until_s: float) -> list[float]:
    """Death times of one connection slot whose occupant is replaced at each death."""
    t = 0.0
    out: list[float] = []
    while True:
        t += rng.expovariate(1.0 / mean_s)
        if t >= until_s:
            return out
        out.append(t)


def _wide_share(mean_s: float, seeds: range) -> float:
    """The share of the time (ticks and deaths) the estimate keeps the window wide."""
    shares = []
    for seed in seeds:
        w = _watch(mean_s, seed)
        shares.append(sum(x == CFG.churn_near_per_side for _t, x in w) / len(w))
    return sum(shares) / len(shares)


@pytest.mark.parametrize("seed", range(1, 6))
def test_under_5_minute_sessions_the_estimate_widens_within_minutes_and_stays_wide(
    seed: int,
) -> None:
    short = _watch(300.0, seed)
    first_wide = next(t for t, w in short if w == CFG.churn_near_per_side)
    assert first_wide < 300.0
    late = [w for t, w in short if t > 600.0]
    assert sum(w == CFG.churn_near_per_side for w in late) / len(late) > 0.99


def test_under_30_minute_sessions_the_estimate_is_seldom_wide() -> None:
    """A young node's first deaths can come close together by chance (3 in its first minutes
    make a short mean): measured over 40 nodes' first hour, about 0.4 % of the time, all of it
    in the first minutes, against ~97 % at 5-minute sessions."""
    assert _wide_share(1800.0, range(1, 41)) < 0.01
    assert _wide_share(300.0, range(1, 41)) > 0.95


def test_the_estimate_is_the_mean_session() -> None:
    """Time at risk over deaths, after an hour: its median error within twice what the deaths
    of one horizon allow (relative spread 1/sqrt(deaths): ~36 deaths at 5-minute sessions, ~6
    at 30-minute ones; a median absolute error of 0.675 spreads)."""
    for mean_s in (300.0, 1800.0):
        bound = 2 * 0.675 / math.sqrt(12 * CFG.churn_horizon_s / mean_s)
        errs = []
        for seed in range(1, 11):
            rng = random.Random(seed)
            deaths = sorted(t for _ in range(12) for t in _renewals(rng, mean_s, 3600.0))
            state: list[float] | None = None
            for t in deaths:
                state = fold(state, t, 0.0, 12, 1, CFG.churn_horizon_s)
            assert state is not None
            state = fold(state, 3600.0, 0.0, 12, 0, CFG.churn_horizon_s)
            errs.append(abs(state[0] / state[1] / mean_s - 1.0))
        assert sorted(errs)[len(errs) // 2] < bound, (mean_s, errs)


def test_a_young_node_is_unsure_and_a_quiet_minute_does_not_narrow_it() -> None:
    s = fold(None, 60.0, 0.0, 12, 0, CFG.churn_horizon_s)  # a minute, no death
    assert unsure(s, CFG)
    wide = CFG.churn_near_per_side
    assert wanted_near(s, wide, CFG) == wide  # adopted from a neighbour: kept
    s = fold(s, 1200.0, 0.0, 12, 0, CFG.churn_horizon_s)  # twenty quiet minutes
    assert not unsure(s, CFG)
    assert wanted_near(s, wide, CFG) == CFG.near_per_side
    # never wider than configured, nor at all when the wide width is not wider
    off = SmallWorldConfig(churn_near_per_side=2)
    assert wanted_near([10.0, 100.0, 0.0], 2, off) == 2


def _churn(net: Network, nodes: list[SimNode], every_s: float, for_s: float, seed: int) -> None:
    """Crash a random live node and let a new one arrive every ``every_s``: mean sessions of
    ``len(nodes) * every_s``."""
    rng = random.Random(seed)
    t = 0.0
    while t < for_s:
        live = [x for x in nodes if x.alive]
        net.crash([rng.choice(live)])
        nodes.append(net.arrive(config=CFG))
        net.run(every_s)
        t += every_s


def _churned_ring(every_s: float, seed: int) -> tuple[Network, list[SimNode], list[SimNode]]:
    """A 120-node ring after 8 minutes of one crash and one arrival every ``every_s`` and one
    quiet minute (the last crashes detected and repaired): the network, every node, the live
    ones — whose windows must be exact at each node's own width, and whose lookups reach the
    closest live node."""
    net = Network(seed=seed)
    nodes = net.spawn(120, overlay="smallworld", build="oracle", config=CFG)
    net.run(30.0)
    _churn(net, nodes, every_s, 480.0, seed=seed)
    net.run(60.0)
    live = [x for x in nodes if x.alive]
    assert wrong_windows(live, sw_width, lambda x: _core(x).near_connections()) == 0
    ok, _ = lookups(net, live, 400, seed=seed)
    assert ok == 1.0
    return net, nodes, live


def test_a_ring_under_short_sessions_widens_its_windows_and_stays_exact() -> None:
    _net, nodes, live = _churned_ring(2.5, seed=21)  # 5-minute sessions
    wide = [x for x in live if _core(x).table.near == CFG.churn_near_per_side]
    assert len(wide) / len(live) > 0.8, len(wide)
    # arrivals took the width of the ring at their join, before any estimate of their own
    assert sum(_core(x).stats["near_adopted"] for x in nodes) > 20


def test_a_ring_under_long_sessions_keeps_two_near_neighbours_a_side() -> None:
    _net, nodes, live = _churned_ring(15.0, seed=22)  # 30-minute sessions
    assert sum(_core(x).stats["connections_lost"] for x in nodes) > 100  # deaths were seen
    wide = [x for x in live if _core(x).table.near != CFG.near_per_side]
    assert len(wide) / len(live) < 0.1, len(wide)


def test_connect_requests_get_no_custody_and_one_way_messages_still_do() -> None:
    """The link application's requests are retried end to end (a join asks again, a missing
    shortcut is asked for on a later tick): forwarding them keeps no custody copy and sends no
    HandedOff notice. One-way lookups still get both."""
    net = Network(seed=23)
    nodes = net.spawn(40, overlay="smallworld", join_interval_s=0.5)
    net.run(30.0)
    assert sum(_core(x).stats["forwarded"] for x in nodes) > 20  # requests went over hops
    assert net.msg_by_type["HandedOff"] == 0
    assert sum(_core(x).stats["custody_held"] for x in nodes) == 0
    ok, _ = lookups(net, nodes, 200, seed=23)
    assert ok == 1.0
    assert net.msg_by_type["HandedOff"] > 0


@pytest.mark.parametrize("recheck_s", [30.0, 1e6])
def test_a_wide_node_takes_back_a_neighbour_restarted_under_its_old_id(recheck_s: float) -> None:
    """A node restarted with its old id and address links only its own (narrow) window; the
    wide node whose third neighbour it is held it DEAD and is never contacted by it. Its
    closest neighbour's lists name the node again: one recheck ping (``Proximity.recheck``,
    after ``dead_recheck_s``) and it is back in the wide window within 90 s. Without rechecks
    (1e6 s) it stays out for ``dead_memory_s``, as it did before (seed 33 is such a case: in
    half the seeds tried the restarted node's own messages reach the wide node anyway)."""
    prox = attrs.evolve(CFG.proximity, dead_recheck_s=recheck_s)
    # keep the wide node wide throughout; no partition healing: the probes of the other nodes
    # that lost the restarted one bring it back by another way (maintenance.heal_partition)
    cfg = attrs.evolve(CFG, churn_narrow_factor=1000.0, proximity=prox, gone_history_size=0)
    net = Network(seed=33)
    nodes = net.spawn(40, overlay="smallworld", build="oracle", config=cfg)
    net.run(10.0)
    w = _core(nodes[0])
    w.adopt_near(3)  # a young node takes a wider width (as from its JOIN responder)
    net.run(10.0)
    assert w.table.near == 3
    third = w.table.right()[2]
    x = net.node_by_id(third.id)
    net.crash([x])
    for _ in range(40):
        net.run(5.0)
        if w.prox.is_dead(third):
            break
    assert w.prox.is_dead(third) and third not in w.table
    back = net.restart(x, config=cfg)
    net.run(90.0)
    assert back.core.ready and _core(back).table.near == 2  # narrow: W is outside its window
    assert w.table.near == 3
    live = [y for y in net.nodes if y.alive]
    if recheck_s < cfg.proximity.dead_memory_s:
        assert third in w.table.near_nodes()
        assert w.stats["dead_rechecks"] >= 1
        assert wrong_windows(live, sw_width, lambda y: _core(y).near_connections()) == 0
    else:
        assert third not in w.table
        assert w.stats["dead_rechecks"] == 0
