"""Proximity neighbour selection of join-built Pastry rings, checked against brute force.

The oracle of every claim here is exhaustive: the best routing-table entry of a slot is the live
candidate with the lowest RTT among *all* nodes (``overlay.pastry.table_quality``), and the
nearest node a joiner could have joined through is the nearest of all nodes ready before it.
Small rings on the transit-stub latency model (the one the route-stretch figures use), a few
seconds each; the 2 000 / 10^4 figures are benchmarks (``flockring bench pastry --slots``).

Units (explicit time, ``ManualRuntime``) pin the rules that keep RTT hints harmless: a hint only
decides whether to probe, replies bind to requests, malformed hints are dropped and counted.
"""

from __future__ import annotations

import math
import random

import pytest

from overlay import NodeHandle, NodeId
from overlay.errors import ConfigError
from overlay.handle import Address
from overlay.ids import RING, shared_prefix_len
from overlay.messages import Message
from overlay.pastry import PastryConfig, PastryCore, table_quality
from overlay.pastry.messages import (
    JoinReply,
    JoinRequest,
    JoinRows,
    LeafSetReply,
    LeafSetRequest,
    NearbyReply,
    NearbyRequest,
    RowReply,
    TableAnnounce,
)
from overlay.pastry.routing_table import BOUND_STEP_S, RoutingTable
from overlay.proximity import Ping, Pong
from overlay.runtime import ManualRuntime
from sim_adapter.latency import TransitStub
from sim_adapter.network import Network, SimNode


def _h(i: int, addr: Address = None) -> NodeHandle:
    return NodeHandle(NodeId(i % RING), addr if addr is not None else i % 997)


def _ring(n: int, build: str, seed: int = 31, quiet_s: float = 600.0) -> Network:
    net = Network(seed=seed, latency=TransitStub(seed=seed))
    nodes = net.spawn(n, overlay="pastry", build=build)
    assert all(x.core.ready for x in nodes)
    net.run(quiet_s)
    return net


def _quality(net: Network) -> dict[int, tuple[float, float]]:
    """Per row: (fraction of filled slots holding the best candidate, mean excess RTT in ms)."""
    lat = net.latency
    cores = [x.core for x in net.live_nodes()]

    def rtt_s(a: NodeHandle, b: NodeHandle) -> float:
        return lat.rtt_s(a.address, b.address)  # type: ignore[arg-type]  # sim: int addresses

    rows = table_quality(cores, rtt_s, cores)  # type: ignore[arg-type]
    out = {}
    for q in rows:
        assert q.stale == 0  # no crash: every entry is a live node
        # an empty slot for which a candidate exists counts as a miss
        out[q.row] = (q.best / q.slots, q.excess_s / q.filled * 1e3)
    return out


def _stretch(net: Network, n: int = 1500, seed: int = 3) -> float:
    """Mean route stretch (overlay latency / direct one-way latency) of ``n`` lookups, each
    checked against the brute-force closest live node."""
    rng = random.Random(seed)
    live = net.live_nodes()
    pairs = [(rng.choice(live), NodeId.random(rng)) for _ in range(n)]
    rdp = []
    for (src, key), lk in zip(pairs, net.lookup_many(pairs), strict=True):
        assert lk.result == net.closest_live(key)
        dst = net.node_by_id(lk.result)
        if dst is not src:
            rdp.append(lk.latency_s / net.latency.one_way_s(src.index, dst.index))
    return sum(rdp) / len(rdp)


@pytest.fixture(scope="module")
def joined() -> Network:
    return _ring(300, "joins")


def test_join_built_tables_hold_the_best_candidate_of_almost_every_slot(joined: Network) -> None:
    # Before PNS-aware joins (nearby-node walk, RTT-hinted rows, row walks, row swaps) this
    # ring held the best entry in 59 % of row-0 slots (79 ms of excess RTT per filled slot)
    # and in 90 % of row-1 slots (16 slots empty though a candidate existed). Now 94 % of
    # row-1 slots (96 % when announcements also push rows to probe: ~25 datagrams more per
    # join for no measured change in route stretch, so they are off by default).
    # Over seeds 31-33 on this tree: row 0 best 0.895-0.937 with 3.4-9.3 ms of excess, row 1
    # 0.941-0.954; the tree before the hint probes gave 0.890-0.921, 6.8-8.9 ms and
    # 0.945-0.953. A run's course moves these by a few hundredths, so the bounds sit below it.
    q = _quality(joined)
    best0, excess0 = q[0]
    assert best0 >= 0.87 and excess0 < 12.0
    best1, _ = q[1]
    assert best1 >= 0.93


def test_join_built_route_stretch_is_within_ten_percent_of_the_oracle_build(
    joined: Network,
) -> None:
    oracle = _ring(300, "oracle", quiet_s=0.0)
    assert _stretch(joined) <= 1.1 * _stretch(oracle)


def test_joins_go_through_the_nearest_ready_node(joined: Network) -> None:
    # Sequential joins: node i joined while nodes 0..i-1 were ready. The discovery walk must
    # find the nearest of them (brute force) for most joins — early joins into a handful of
    # nodes included, where no path of near nodes exists yet.
    lat = joined.latency
    nodes: list[SimNode] = joined.nodes
    hits = total = 0
    for x in nodes[2:]:
        entry = x.core.joiner.entry  # type: ignore[attr-defined]
        assert entry is not None
        nearest = min(lat.rtt_s(x.index, j) for j in range(x.index))
        hits += lat.rtt_s(x.index, int(entry.address)) <= nearest
        total += 1
    # measured 0.849-0.923 over seeds 31-34 (seed 31: 254/298); the tree before the hint
    # probes gave 0.846-0.906 over seeds 31-33 — any change to a run's course moves one seed by
    # ±0.02, so the bound sits below that spread (a random ready node is the nearest of i with
    # probability 1/i: under 0.03 over these joins).
    assert hits / total >= 0.83


# ---------------------------------------------------------------------- hint rules (units)
def _core() -> tuple[ManualRuntime, PastryCore]:
    rt = ManualRuntime(seed=1)
    core = PastryCore(rt, _h(0x10 << 152, 0))
    core.joiner.mark_ready()
    return rt, core


def _pings(rt: ManualRuntime) -> list[tuple[NodeHandle, Ping]]:
    return [(d, m) for d, m in rt.take_sent() if isinstance(m, Ping)]  # type: ignore[misc]


def test_hints_prune_by_the_triangle_inequality_and_never_install() -> None:
    rt, core = _core()
    via = _h(0x30 << 152, 1)
    occupant = _h(0x20 << 152, 2)  # slot (0, 2)
    core.prox.sample(via, 0.010)
    core.prox.sample(occupant, 0.050)
    core.consider(occupant, probe=False)
    far, near = _h(0x21 << 152, 3), _h(0x22 << 152, 4)  # both for slot (0, 2)
    # far: |10 - 100| = 90 ms >= 50 ms: cannot win, no probe. near: 10 + 5 ms: probe it.
    used = core.offer_hinted(via, (far, near), (0.100, 0.005), budget=4)
    assert used == 1 and [d for d, _ in _pings(rt)] == [near]
    assert core.table.get(0, 2) == occupant  # a hint alone changes nothing
    # without our own RTT to the sender a hint bounds nothing: probes up to the budget
    unknown_via = _h(0x40 << 152, 5)
    other = _h(0x23 << 152, 6)
    assert core.offer_hinted(unknown_via, (other,), (0.100,), budget=1) == 1


def test_a_lying_hint_costs_one_probe_and_no_slot() -> None:
    rt, core = _core()
    via = _h(0x30 << 152, 1)
    occupant = _h(0x20 << 152, 2)
    core.prox.sample(via, 0.010)
    core.prox.sample(occupant, 0.050)
    core.consider(occupant, probe=False)
    liar = _h(0x21 << 152, 3)
    core.offer_hinted(via, (liar,), (0.0,), budget=4)  # "it is as near as you to me"
    ((dst, ping),) = _pings(rt)
    assert dst == liar
    rt.advance(0.080)
    core.receive(liar, Pong(ping.nonce, ping.sent_at))
    assert core.prox.rtt(liar) == pytest.approx(0.080)
    assert core.table.get(0, 2) == occupant
    # a truthful candidate that is nearer wins on our own measurement
    honest = _h(0x22 << 152, 4)
    core.offer_hinted(via, (honest,), (0.005,), budget=4)
    ((_, ping2),) = _pings(rt)
    rt.advance(0.012)
    core.receive(honest, Pong(ping2.nonce, ping2.sent_at))
    assert core.table.get(0, 2) == honest


def test_probe_budget_bounds_what_one_message_can_cost() -> None:
    rt, core = _core()
    via = _h(0x30 << 152, 1)
    core.prox.sample(via, 0.010)
    cands = tuple(_h((0x20 + i) << 152 | 7, 10 + i) for i in range(12))
    for i in range(12):  # occupy each slot with a slow measured node
        occ = _h((0x20 + i) << 152 | 9, 40 + i)
        core.prox.sample(occ, 0.4)
        core.consider(occ, probe=False)
    used = core.offer_hinted(via, cands, (0.001,) * 12, budget=3)
    assert used == 3 and len(_pings(rt)) == 3


def test_row_replies_bind_to_requests() -> None:
    rt, core = _core()
    stranger = _h(0x50 << 152, 5)
    offered = _h(0x60 << 152, 6)
    core.receive(stranger, RowReply(0, (offered,), (0.001,)))
    assert core.stats["row_reply_unsolicited"] == 1
    assert offered not in core.table and not _pings(rt)


def test_join_rows_and_walk_replies_bind_to_their_nonce() -> None:
    _, core = _core()
    stranger = _h(0x50 << 152, 5)
    offered = _h(0x60 << 152, 6)
    core.receive(stranger, JoinRows(12345, (offered,), (0.001,)))
    core.receive(stranger, JoinReply(12345, (), (offered,), (0.001,)))
    assert core.stats["join_rows_unsolicited"] == 1
    assert offered not in core.table


def test_an_announce_pushes_candidates_that_are_measured_before_they_enter() -> None:
    rt = ManualRuntime(seed=1)
    core = PastryCore(rt, _h(0x10 << 152, 0), PastryConfig(announce_probe_limit=1))
    core.joiner.mark_ready()
    newcomer = _h(0x50 << 152, 5)
    cand = _h(0x60 << 152, 6)  # slot (0, 6) is empty
    core.receive(newcomer, TableAnnounce(0.010, (cand,), (0.004,)))
    assert cand not in core.table  # unsolicited: not even an empty slot without a probe
    pings = {d: m for d, m in _pings(rt)}
    assert cand in pings
    rt.advance(0.012)
    core.receive(cand, Pong(pings[cand].nonce, pings[cand].sent_at))
    assert core.table.get(0, 6) == cand


def test_the_discovery_round_trip_measures_the_seed_and_prunes_its_leaf_set() -> None:
    # The request and its reply are a round trip of the joiner's own: the seed's RTT is known
    # without a probe, and it bounds the members' RTTs from the seed's hints at once.
    rt = ManualRuntime(seed=1)
    core = PastryCore(rt, _h(0x10 << 152, 0))
    core.join([99], None)
    ((dst, req),) = rt.take_sent()
    assert dst == 99 and isinstance(req, NearbyRequest) and req.row == -1
    seed = _h(0x70 << 152, 99)
    near, far = _h(0x71 << 152, 7), _h(0x72 << 152, 8)
    rt.advance(0.020)
    # near: |20 - 5| = 15 ms < 20 ms, may be nearer than the seed; far: |20 - 100| >= 20 ms
    core.receive(seed, NearbyReply(req.nonce, -1, (near, far), (0.005, 0.100)))
    assert core.prox.rtt(seed) == pytest.approx(0.020)
    assert [d for d, _ in _pings(rt)] == [near]
    assert core.stats["join_locate_pruned"] == 1


@pytest.mark.parametrize("near_enough", [0.0, 0.001])
def test_no_probe_to_beat_or_fill_with_a_node_near_enough(near_enough: float) -> None:
    # Within ``pns_near_enough_s`` (1 ms, a LAN) a node is near enough: an occupant that near
    # is not contested, by a hinted candidate or by an announce, and a candidate whose hints
    # put it that near fills an empty slot without a probe. (0 = off: all three probed.)
    rt = ManualRuntime(seed=1)
    core = PastryCore(rt, _h(0x10 << 152, 0), PastryConfig(pns_near_enough_s=near_enough))
    core.joiner.mark_ready()
    via, occupant = _h(0x30 << 152, 1), _h(0x20 << 152, 2)
    core.prox.sample(via, 0.0005)
    core.prox.sample(occupant, 0.0008)
    core.consider(occupant, probe=False)
    # cand: at least |0.5 - 0.1| = 0.4 ms, may beat the 0.8-ms occupant; filler: slot (0, 4)
    # is empty, and its hint puts it within 0.5 + 0.2 = 0.7 ms
    cand, filler, newcomer = _h(0x21 << 152, 3), _h(0x40 << 152, 4), _h(0x22 << 152, 5)
    core.offer_hinted(via, (cand, filler), (0.0001, 0.0002), budget=4)
    core.receive(newcomer, TableAnnounce(0.0003))
    probed = {d for d, _ in _pings(rt)}
    assert probed == (set() if near_enough else {cand, filler, newcomer})
    assert core.table.get(0, 4) == filler and core.table.get(0, 2) == occupant
    with pytest.raises(ConfigError):
        PastryConfig(pns_near_enough_s=-0.001)


def _seed_answers(
    rtt_s: float, hint_s: float, noise_s: float = 0.0
) -> tuple[PastryCore, NodeHandle, list[tuple[NodeHandle | Address, Message]]]:
    """A joiner whose seed answers its discovery request ``rtt_s`` later, naming four leaf-set
    members it holds ``hint_s`` away, on a runtime that reports ``noise_s`` of timing noise;
    returns what the joiner sent on that answer."""
    rt = ManualRuntime(seed=1)
    rt.timing_noise_s = noise_s
    core = PastryCore(rt, _h(0x10 << 152, 0))
    assert core.near_enough_s() == pytest.approx(core.config.pns_near_enough_s + noise_s)
    core.join([99], None)
    ((_, req),) = rt.take_sent()
    seed = _h(0x70 << 152, 99)
    members = tuple(_h((0x71 + i) << 152, 7 + i) for i in range(4))
    rt.advance(rtt_s)
    core.receive(seed, NearbyReply(req.nonce, -1, members, (hint_s,) * 4))  # type: ignore[attr-defined]
    return core, seed, rt.take_sent()


def test_a_discovery_ends_at_a_seed_near_enough() -> None:
    # On a flat network (a LAN, loopback) the seed answers within ``pns_near_enough_s``: its
    # leaf set is not probed, and the join goes through it at once.
    core, seed, sent = _seed_answers(0.0004, 0.0002)
    assert [(d, type(m)) for d, m in sent] == [(seed, JoinRequest)]
    assert core.joiner.entry == seed and core.stats["join_locate_probes"] == 0


@pytest.mark.parametrize("noise_s", [0.0, 0.02])
def test_timing_noise_widens_near_enough(noise_s: float) -> None:
    # A live driver whose RTT samples owe milliseconds to event-loop waiting says so
    # (``timing_noise_s``): a seed 5 ms away is then near enough and the walk ends there;
    # without noise the same seed is 5 times the 1-ms cutoff and its leaf set is probed.
    core, _, sent = _seed_answers(0.005, 0.003, noise_s)
    kinds = {type(m) for _, m in sent}
    if noise_s:
        assert kinds == {JoinRequest} and core.stats["join_locate_probes"] == 0
    else:
        assert Ping in kinds and core.stats["join_locate_probes"] > 0


def test_join_rows_spare_the_nodes_the_consistent_join_measures() -> None:
    """Rows the hops send while the join is routed wait for the root's reply; a hop or a
    candidate among the leaf-set members being asked gets no probe of its own — the member's
    reply to the leaf-set request is the RTT sample (a tenth to a quarter of a join's PNS
    probes went to such nodes)."""
    rt = ManualRuntime(seed=1)
    me = 0x10 << 152
    core = PastryCore(rt, _h(me, 0), PastryConfig(join_locate_rounds=0))
    core.join([99], None)
    ((_, req),) = rt.take_sent()
    nonce = req.nonce  # type: ignore[attr-defined]
    hop1 = _h(0x50 << 152, 1)  # a hop far from us in the id space: not a leaf-set member
    hop2, leafy, root = _h(me + 7, 2), _h(me + 5, 3), _h(me + 9, 4)  # leaf-set members
    cand_a, cand_b = _h(0x30 << 152, 5), _h(0x70 << 152, 6)
    core.receive(hop1, JoinRows(nonce, (cand_a, leafy), (0.010, 0.010)))
    core.receive(hop2, JoinRows(nonce, (cand_b,), (0.010,)))
    assert not rt.take_sent()  # held until the reply: no probe yet
    core.receive(root, JoinReply(nonce, (hop2, leafy), (), ()))
    sent = rt.take_sent()
    asked = {d for d, m in sent if isinstance(m, LeafSetRequest)}
    assert asked == {hop2, leafy, root}
    pings = {d: m for d, m in sent if isinstance(m, Ping)}
    assert set(pings) == {hop1}  # the one hop we do not ask is anchored by a probe
    rt.advance(0.020)
    core.receive(hop1, Pong(pings[hop1].nonce, pings[hop1].sent_at))
    assert [d for d, _ in _pings(rt)] == [cand_a]  # leafy: measured by its reply instead
    rt.advance(0.010)
    core.receive(hop2, LeafSetReply(nonce, (leafy, root)))
    assert core.prox.rtt(hop2) == pytest.approx(0.030)
    assert [d for d, _ in _pings(rt)] == [cand_b]  # hop2's rows, anchored on that reply
    for m in (leafy, root):
        core.receive(m, LeafSetReply(nonce, (hop2, leafy, root)))
    assert core.ready
    assert core.table.get(0, 3) == cand_a and core.table.get(0, 7) == cand_b
    assert leafy in core.table.members and core.prox.rtt(leafy) is not None


@pytest.mark.parametrize("limit", [0, 1])
def test_announces_carry_the_row_only_when_receivers_probe_it(limit: int) -> None:
    rt = ManualRuntime(seed=1)
    core = PastryCore(rt, _h(0x10 << 152, 0), PastryConfig(announce_probe_limit=limit))
    entries = [_h((0x20 + 0x10 * i) << 152, 1 + i) for i in range(3)]  # row 0, three slots
    for i, e in enumerate(entries):
        core.prox.sample(e, 0.01 * (i + 1))
        core.consider(e, probe=False)
    core.joiner.mark_ready()
    rt.take_sent()
    core.tables.on_ready()
    ann = {d: m for d, m in rt.take_sent() if isinstance(m, TableAnnounce)}
    assert set(ann) == set(entries)  # every entry hears of us, with our RTT to it
    for i, e in enumerate(entries):
        assert ann[e].rtt_s == pytest.approx(0.01 * (i + 1))
        rest = tuple(x for x in entries if x != e)
        assert ann[e].entries == (rest if limit else ())


@pytest.mark.parametrize(
    "msg",
    [
        JoinRows(1, (_h(5),), (0.1, 0.2)),  # one hint too many
        RowReply(0, (_h(5),), ("fast",)),  # type: ignore[arg-type]
        TableAnnounce(0.1, (_h(5),), (True,)),
        NearbyReply(1, 0, (_h(5),), (0.1,), "deep"),  # type: ignore[arg-type]
    ],
)
def test_malformed_hints_are_dropped_and_counted(msg: object) -> None:
    _, core = _core()
    core.receive(_h(77, 5), msg)  # type: ignore[arg-type]
    assert core.stats["dropped_malformed"] == 1


def test_wild_hint_values_read_as_unknown_or_clamped() -> None:
    from overlay.pastry.messages import MAX_HINT_S, check_hints

    got = check_hints((math.nan, -1.0, math.inf, 0.25, 3, -math.inf, -3, -0.002), 8)
    # a value in (-1, 0) is a sender's upper bound, negated: it goes through as it is
    assert got == (-1.0, -1.0, MAX_HINT_S, 0.25, 3.0, -1.0, -1.0, -0.002)


def test_an_entry_installed_on_its_bound_keeps_it_and_sends_it_on() -> None:
    # A candidate installed unprobed, near enough by the triangle inequality, keeps that bound
    # with its slot: later candidates for the slot do not probe it as "never measured", and
    # the rows we send carry the bound (negated) where they carried -1.
    rt, core = _core()
    via = _h(0x30 << 152, 1)
    core.prox.sample(via, 0.0005)
    filler = _h(0x40 << 152, 4)  # slot (0, 4), empty
    core.offer_hinted(via, (filler,), (0.0002,), budget=4)
    assert core.table.get(0, 4) == filler and not _pings(rt)
    bound = core.table.bound_of(filler)
    assert bound is not None and 0.0007 <= bound < 0.0007 + BOUND_STEP_S
    assert core.hints((filler, via, _h(0x50 << 152, 5))) == (-bound, 0.0005, -1.0)
    # a rival whose bound says nothing (no hint) contests neither by probing it nor the entry
    rival = _h(0x41 << 152, 6)
    assert core.offer_hinted(via, (rival,), (), budget=4) == 0
    assert core.table.get(0, 4) == filler and not _pings(rt)
    # our own measurement supersedes the bound, in hints and in contests
    core.prox.sample(filler, 0.004)
    assert core.hints((filler,)) == (0.004,)
    assert core.offer_hinted(via, (rival,), (), budget=4) == 1
    # the bound belongs to the occupant: gone with it
    core.table.remove(filler)
    core.table.put(0, 4, rival)
    assert core.table.bound_of(rival) is None and core.table.bound(0, 4) is None


@pytest.mark.parametrize(("sent_bound_s", "probed"), [(0.0003, False), (0.002, True)])
def test_a_senders_bound_bounds_the_candidate_from_above(sent_bound_s: float, probed: bool) -> None:
    # Hint -u: the sender holds the candidate within u, unmeasured; with our RTT a to the
    # sender, the candidate is within a + u of us (0.5 + 0.3 ms: near enough at 1 ms; 0.5 + 2
    # ms is not, and the empty slot's new entry is probed to be measured)
    rt, core = _core()
    via = _h(0x30 << 152, 1)
    core.prox.sample(via, 0.0005)
    cand = _h(0x40 << 152, 4)
    core.offer_hinted(via, (cand,), (-sent_bound_s,), budget=4)
    assert core.table.get(0, 4) == cand
    assert bool(_pings(rt)) is probed
    assert (core.table.bound_of(cand) is None) is probed


def test_slot_bounds_round_up_and_stay_with_their_entry() -> None:
    table = RoutingTable(0x10 << 152)
    a, b = _h(0x20 << 152, 2), _h(0x21 << 152, 3)
    table.put(0, 2, a, 0.0001)  # rounded up to one step: still an upper bound
    assert table.bound(0, 2) == BOUND_STEP_S and table.bound_of(a) == BOUND_STEP_S
    assert table.bound_of(b) is None  # not the entry there
    table.put(0, 2, b)  # another entry: the slot's bound went with the old one
    assert table.bound(0, 2) is None
    table.put(5, 3, a, 0.010)  # a deep row: the bound array grows to it
    assert table.bound(5, 3) == pytest.approx(0.010)
    table.put(0, 5, b, 0.1)  # beyond 255 steps: not worth keeping
    assert table.bound(0, 5) is None
    table.install_row(5, [None] * 16)
    assert table.bound(5, 3) is None


def test_row_swaps_skip_only_rows_whose_every_candidate_is_a_leaf_set_member() -> None:
    # Oracle: every live node sharing at least r digits with a node (so every candidate for its
    # rows r and deeper) is in its leaf set, for each r from where the swaps stop.
    net = _ring(300, "joins", quiet_s=60.0)
    cores = [x.core for x in net.live_nodes() if isinstance(x.core, PastryCore)]
    b = cores[0].config.b_bits
    skipped = 0
    for c in cores:
        deep = c.tables.first_row_in_leaf_range()
        assert 0 < deep <= c.table.nrows
        members = set(c.leaf.members)
        for o in cores:
            if o is not c and shared_prefix_len(o.id, c.id, b) >= deep:
                assert o.handle in members
        skipped += any(r >= deep for r in c.table.populated_rows())
    # N = 300: most nodes' row 2 (class of ~1.2 nodes) lies within the leaf set's range
    assert skipped > len(cores) // 2
    before = sum(c.stats["row_swaps_in_leaf_range"] for c in cores)
    net.run(700.0)  # past one row-exchange period
    assert sum(c.stats["row_swaps_in_leaf_range"] for c in cores) > before


def test_a_candidate_probe_retransmits_only_inside_the_leaf_sets_range() -> None:
    """A routing-table candidate outside the leaf set's range gets one ping (no
    retransmission); one that would enter the leaf set keeps the hint probe's retransmission,
    as a false verdict on it would hold a live member out of the leaf set."""
    rt, core = _core()
    base = 0x10 << 152
    for k in range(1, 9):  # a full leaf set: 8 members each side, 2^20 apart
        core.add_leaf(_h(base + (k << 20), 100 + k))
        core.add_leaf(_h(base - (k << 20), 200 + k))
    assert len(core.leaf) == 16
    far = _h(0x21 << 152, 3)
    inside = _h(base + (3 << 19), 4)  # between the members at 2^20 and 2^21
    assert not core.leaf.fits(far.id) and core.leaf.fits(inside.id)
    core.probe_candidate(far)
    core.probe_candidate(inside)
    rt.advance(60.0)
    pings = [d for d, _ in _pings(rt)]
    assert pings.count(far) == 1 + core.prox.config.candidate_probe_retries == 1
    assert pings.count(inside) == 1 + core.prox.config.hint_probe_retries == 2
    assert core.prox.is_dead(far) and core.prox.is_dead(inside)
