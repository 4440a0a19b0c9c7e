"""Nearby-node discovery (the LOCATING phase of a Pastry join): what it costs, and that joins
through it still build a correct ring.

Units (``ManualRuntime``, explicit time) pin the bounds of ``overlay/pastry/locate.py``: the
probe budget of a whole discovery, the per-round limit, the stop rule. A small ring on the
transit-stub latency model checks the cost per join (counted in the joiners' own counters and
in the Pings on the wire) together with the brute-force routing and leaf-set oracles.
"""

from __future__ import annotations

import pytest
from sim_oracles import lookups, wrong_windows

from overlay import NodeHandle, NodeId
from overlay.handle import Address
from overlay.ids import RING
from overlay.messages import Message
from overlay.pastry import PastryConfig, PastryCore
from overlay.pastry.join import JoinState
from overlay.pastry.messages import (
    JoinReply,
    JoinRequest,
    LeafSetRequest,
    NearbyReply,
    NearbyRequest,
)
from overlay.proximity import Ping, Pong
from overlay.runtime import ManualRuntime
from sim_adapter.latency import TransitStub
from sim_adapter.network import Network


def _h(i: int, addr: Address = None) -> NodeHandle:
    return NodeHandle(NodeId(i % RING), addr if addr is not None else i % 997)


def _sent(rt: ManualRuntime) -> list[tuple[NodeHandle, Message]]:
    """The messages sent to handles since the last call (not those to bare addresses)."""
    return [(d, m) for d, m in rt.take_sent() if isinstance(d, NodeHandle)]


def _joiner(cfg: PastryConfig) -> tuple[ManualRuntime, PastryCore, NearbyRequest]:
    rt = ManualRuntime(seed=1)
    core = PastryCore(rt, _h(0x10 << 152, 0), cfg)
    core.join([99], None)
    ((dst, req),) = rt.take_sent()
    assert dst == 99 and isinstance(req, NearbyRequest) and req.row == -1
    return rt, core, req


def _answer_pings(
    rt: ManualRuntime, core: PastryCore, sent: list[tuple[NodeHandle, Message]], delay_s: float
) -> int:
    """Answer every Ping in ``sent`` ``delay_s`` later; return how many there were."""
    pings = [(d, m) for d, m in sent if isinstance(m, Ping)]
    if not pings:
        return 0
    rt.advance(delay_s)
    for d, m in pings:
        core.receive(d, Pong(m.nonce, m.sent_at))
    return len(pings)


def _walk(cfg: PastryConfig, per_reply: int) -> tuple[PastryCore, int, int, list[Message]]:
    """Drive a discovery whose every reply lists ``per_reply`` fresh unhinted candidates (no
    bound prunes them) and every probe is answered, each batch a little sooner than the last
    (so every round finds a nearer node); return the core, the probes and the requests it
    sent, and the other messages."""
    rt, core, req = _joiner(cfg)
    seq = iter(range(1, 10_000))
    probes = requests = 0
    other: list[Message] = []
    replier = _h(0x70 << 152, 99)
    row = -1
    delay = 0.030
    for _ in range(50):
        cands = tuple(_h((0x80 + (k := next(seq))) << 150, 100 + k) for _ in range(per_reply))
        rt.advance(0.500)  # the repliers are far: the probed candidates are nearer
        core.receive(replier, NearbyReply(req.nonce, row, cands))
        while True:
            sent = _sent(rt)
            delay *= 0.9
            n = _answer_pings(rt, core, sent, delay)
            probes += n
            nxt = [(d, m) for d, m in sent if isinstance(m, NearbyRequest)]
            other += [m for _, m in sent if not isinstance(m, Ping | NearbyRequest)]
            if nxt:
                ((replier, req),) = nxt
                row = req.row
                requests += 1
                break
            if n == 0:
                other += [m for _, m in _sent(rt)]
                return core, probes, requests, other
    raise AssertionError("the discovery never ended")


def test_the_whole_discovery_stops_at_its_probe_budget() -> None:
    cfg = PastryConfig()
    core, probes, requests, other = _walk(cfg, per_reply=40)
    assert probes == cfg.join_locate_max_probes == core.stats["join_locate_probes"]
    assert requests + 1 == core.stats["join_locate_requests"]
    assert any(isinstance(m, JoinRequest) for m in other)  # it then joins
    assert core.joiner.state is JoinState.JOINING


@pytest.mark.parametrize("budget", [0, 5, 11])
def test_any_probe_budget_is_a_hard_bound(budget: int) -> None:
    cfg = PastryConfig(join_locate_max_probes=budget)
    core, probes, _, other = _walk(cfg, per_reply=40)
    assert probes == budget == core.stats["join_locate_probes"]
    assert any(isinstance(m, JoinRequest) for m in other)


def test_each_round_probes_at_most_its_per_round_limit() -> None:
    cfg = PastryConfig(join_locate_probes=3, join_locate_max_probes=1000, join_locate_rounds=2)
    _, probes, requests, _ = _walk(cfg, per_reply=40)
    # the seed's leaf set and two more rounds, three probes each
    assert requests == 2 and probes == 9


def test_the_join_goes_through_the_nearest_node_measured() -> None:
    rt, core, req = _joiner(PastryConfig())
    near, far = _h(0x71 << 152, 7), _h(0x72 << 152, 8)
    seed = _h(0x70 << 152, 99)
    rt.advance(0.200)
    core.receive(seed, NearbyReply(req.nonce, -1, (near, far)))
    pings = {d: m for d, m in _sent(rt) if isinstance(m, Ping)}
    assert set(pings) == {near, far}
    rt.advance(0.010)
    core.receive(near, Pong(pings[near].nonce, pings[near].sent_at))  # 10 ms
    rt.advance(0.090)
    core.receive(far, Pong(pings[far].nonce, pings[far].sent_at))  # 100 ms
    ((dst, ask),) = _sent(rt)
    assert dst == near and isinstance(ask, NearbyRequest) and ask.row == 0
    # near's rows hold nothing new: no nearer node; the runner-up is asked (a beam of two)
    rt.advance(0.010)
    core.receive(near, NearbyReply(req.nonce, 0, (far,)))
    ((dst, ask),) = _sent(rt)
    assert dst == far and isinstance(ask, NearbyRequest)
    # nothing nearer again: the walk ends and joins through the nearest node measured
    rt.advance(0.100)
    core.receive(far, NearbyReply(req.nonce, 0, ()))
    sent = _sent(rt)
    assert [(d, type(m)) for d, m in sent] == [(near, JoinRequest)]
    assert core.joiner.entry == near
    assert core.prox.rtt(near) == pytest.approx(0.010)


def test_a_slow_discovery_is_not_restarted_by_the_join_timer() -> None:
    # Probes answered after 0.6 s each: the discovery outlasts the 2-s join timeout. Its own
    # timers bound it, so the join timer must not restart it (a retry is a whole new
    # discovery: the seed's leaf set asked again, every round redone).
    cfg = PastryConfig(join_timeout_s=2.0)
    rt, core, req = _joiner(cfg)
    seed = _h(0x70 << 152, 99)
    cands = tuple(_h((0x80 + k) << 150, 100 + k) for k in range(16))
    rt.advance(0.2)
    core.receive(seed, NearbyReply(req.nonce, -1, cands))
    t0 = rt.now()
    every: list[Message] = []
    for _ in range(100):
        sent = _sent(rt)
        every += [m for _, m in sent]
        if any(isinstance(m, JoinRequest) for _, m in sent):
            break
        rt.advance(0.6)
        for d, m in sent:
            if isinstance(m, Ping):
                core.receive(d, Pong(m.nonce, m.sent_at))
            elif isinstance(m, NearbyRequest):
                core.receive(d, NearbyReply(m.nonce, m.row, ()))
    assert rt.now() - t0 > cfg.join_timeout_s
    assert not any(isinstance(m, NearbyRequest) and m.row == -1 for m in every)
    assert core.stats["join_retries"] == 0
    assert core.joiner.state is JoinState.JOINING
    # the routed join has its own timeout from now on: unanswered, it is retried
    rt.advance(cfg.join_timeout_s + 0.01)
    assert core.stats["join_retries"] == 1


def test_a_silent_seed_is_left_after_the_join_timeout() -> None:
    cfg = PastryConfig(join_timeout_s=2.0)
    rt = ManualRuntime(seed=1)
    core = PastryCore(rt, _h(0x10 << 152, 0), cfg)
    core.join([98, 99], None)
    assert [d for d, _ in rt.take_sent()] == [98]
    rt.advance(2.01)  # the attempt's timeout (the seed's resend would have come at 2 s too)
    assert [(d, type(m)) for d, m in rt.take_sent()] == [(99, NearbyRequest)]


def test_a_lost_seed_request_is_sent_again_and_its_answer_is_no_sample() -> None:
    """One lost datagram of the seed exchange must not stall the join for the attempt's whole
    timeout: the request goes again after ``join_locate_wait_s``, doubled each time. The answer
    to a request sent twice is no RTT sample (Karn's rule): the seed is probed like a
    candidate."""
    rt, core, req = _joiner(PastryConfig(join_timeout_s=20.0))
    rt.advance(1.99)
    assert not rt.take_sent()
    rt.advance(0.02)
    ((dst, again),) = rt.take_sent()
    assert dst == 99 and again == req  # the same request, same nonce
    rt.advance(4.0)
    assert [m for _, m in rt.take_sent()] == [req]
    assert core.stats["join_locate_seed_resends"] == 2
    seed, other = _h(0x70 << 152, 99), _h(0x71 << 152, 7)
    rt.advance(0.05)
    core.receive(seed, NearbyReply(req.nonce, -1, (other,)))
    assert core.prox.rtt(seed) is None
    assert {d for d, m in _sent(rt) if isinstance(m, Ping)} == {seed, other}
    rt.advance(8.5)  # past the third resend's time: answered, so none went
    assert not [m for _, m in rt.take_sent() if isinstance(m, NearbyRequest) and m.row == -1]
    assert core.stats["join_locate_seed_resends"] == 2


def _located(cfg: PastryConfig) -> tuple[ManualRuntime, PastryCore, NodeHandle, NodeHandle]:
    """A joiner whose discovery measured ``near`` (10 ms) and ``far`` (100 ms) and found
    nothing else: it has just sent its routed join to ``near``."""
    rt, core, req = _joiner(cfg)
    near, far = _h(0x71 << 152, 7), _h(0x72 << 152, 8)
    rt.advance(0.200)
    core.receive(_h(0x70 << 152, 99), NearbyReply(req.nonce, -1, (near, far)))
    pings = {d: m for d, m in _sent(rt) if isinstance(m, Ping)}
    rt.advance(0.010)
    core.receive(near, Pong(pings[near].nonce, pings[near].sent_at))
    rt.advance(0.090)
    core.receive(far, Pong(pings[far].nonce, pings[far].sent_at))
    for d, m in _sent(rt):  # the walk's requests: nothing new anywhere
        rt.advance(0.01)
        core.receive(d, NearbyReply(m.nonce, 0, ()))
    for d, m in _sent(rt):
        rt.advance(0.01)
        core.receive(d, NearbyReply(m.nonce, 0, ()))
    assert core.joiner.entry == near and core.joiner.state is JoinState.JOINING
    rt.take_sent()
    return rt, core, near, far


def test_a_retry_joins_through_the_next_node_found_not_the_seed() -> None:
    """Under churn a joiner's one seed may crash while it joins. A routed join that got no reply
    is retried through the next nearest node the discovery measured — not the seed, and with no
    second discovery — and only when every node found has gone silent is a seed asked again."""
    cfg = PastryConfig(join_timeout_s=2.0, join_route_wait_s=100.0)  # (no resend in between)
    rt, core, _, far = _located(cfg)
    rt.advance(cfg.join_timeout_s + 0.01)  # near never answers the join
    assert [(d, type(m)) for d, m in rt.take_sent()] == [(far, JoinRequest)]
    assert core.joiner.entry == far and core.stats["join_retries_via_found"] == 1
    seed = _h(0x70 << 152, 99)  # measured too: its reply was a round trip of ours
    rt.advance(2 * cfg.join_timeout_s + 0.01)  # nor does far
    assert [(d, type(m)) for d, m in rt.take_sent()] == [(seed, JoinRequest)]
    rt.advance(4 * cfg.join_timeout_s + 0.01)  # every node found is silent: the seed address
    assert [(d, type(m)) for d, m in rt.take_sent() if not isinstance(m, Ping)] == [
        (99, NearbyRequest)
    ]
    assert core.stats["join_retries"] == 3 and core.stats["join_retries_via_found"] == 2


def test_a_routed_join_without_reply_is_asked_again_within_the_attempt() -> None:
    """The routed join's request and the root's reply are one datagram each: one of them lost
    must not cost the whole attempt's timeout. The request goes again to the same entry with
    the same nonce after ``join_route_wait_s``, doubled each time; the first reply is taken,
    a second one (the resent request's) is dropped and counted, and no resend follows."""
    cfg = PastryConfig(join_timeout_s=20.0)
    rt, core, near, _ = _located(cfg)
    nonce = core.joiner.nonce
    rt.advance(cfg.join_route_wait_s - 0.01)
    assert not rt.take_sent()
    rt.advance(0.02)
    assert rt.take_sent() == [(near, JoinRequest(nonce))]
    rt.advance(2 * cfg.join_route_wait_s)
    assert rt.take_sent() == [(near, JoinRequest(nonce))]
    assert core.stats["join_request_resends"] == 2 and core.stats["join_requests"] == 1
    root, leaf = _h(0x6F << 152, 11), _h(0x74 << 152, 12)
    core.receive(root, JoinReply(nonce, (leaf,), (), ()))
    assert core.joiner.state is JoinState.PROBING
    asked = {d for d, m in _sent(rt) if isinstance(m, LeafSetRequest)}
    assert asked == {root, leaf}
    core.receive(root, JoinReply(nonce, (leaf, _h(0x75 << 152, 13)), (), ()))
    assert core.stats["join_reply_duplicates"] == 1
    assert not [m for _, m in rt.take_sent() if isinstance(m, LeafSetRequest)]
    rt.advance(8 * cfg.join_route_wait_s)  # past the third resend's time: none went
    assert not [m for _, m in rt.take_sent() if isinstance(m, JoinRequest)]


# ---------------------------------------------------------------------- a ring built by joins
def _ring(n: int, seed: int) -> Network:
    net = Network(seed=seed, latency=TransitStub(seed=seed))
    nodes = net.spawn(n, overlay="pastry")
    assert all(x.core.ready for x in nodes)
    return net


def test_joins_spend_few_discovery_probes_and_still_build_a_correct_ring() -> None:
    net = _ring(250, seed=27)
    nodes = net.nodes
    cfg = PastryConfig()
    per_join = [x.core.stats["join_locate_probes"] for x in nodes[1:]]
    assert max(per_join) <= cfg.join_locate_max_probes  # every join within the budget
    # no join was restarted while it was still locating (before: 164 restarts in 249 joins)
    assert sum(x.core.stats["join_retries"] for x in nodes) == 0
    # the whole build, maintenance included: measured 213.6 datagrams per node (264.5 with
    # one timeout over discovery and join, 16 probes per round, every entry announced to)
    assert net.message_count / len(nodes) <= 235
    assert net.msg_by_type["TableAnnounce"] / len(nodes) <= 8  # 5.8 (22.5 before)
    # brute-force oracles: every leaf set is the L/2 live nodes each side, every lookup
    # reaches the numerically closest live node
    leaf_sets = wrong_windows(nodes, cfg.half_leaf, lambda x: x.core.leaf.nodes())  # type: ignore[attr-defined]
    assert leaf_sets == 0
    ok, _ = lookups(net, nodes, 1000, seed=5)
    assert ok == 1.0
