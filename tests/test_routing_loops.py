"""Routing loops: a message that comes back round an inconsistent route is routed on, once.

Greedy routing cannot loop on a consistent ring, but tables are not consistent during churn
(an out-of-date Pastry row entry, a stale leaf set) and an application's ``forward`` upcall may
redirect a hop. The shared engine (``overlay/kbr.py``) remembers, per (origin, msg_id), the hop
count at which a node handled a message and the next hops it chose: a copy with no more hops is
a retransmission (acked, dropped), a copy with more hops came back round a loop and leaves by a
next hop not tried yet (or is delivered, when every closer node led back), and the node that
delivered it never delivers it again. ``max_hops`` bounds a loop with no way out.

The simulated rings corrupt one node's routing decision for one key so that it points away from
the key, towards a node whose own (correct) route leads straight back: the lookup must still end
at the node the oracle (``closest_live``) names, exactly once.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from toy_overlay import ToyConfig, ToyCore

from overlay import NodeHandle, NodeId
from overlay.ids import ring_distance
from overlay.kbr import BaseApplication, HandedOff, KbrConfig, RouteAck, RouteMsg
from overlay.proximity import Ping, Pong
from overlay.runtime import ManualRuntime
from sim_adapter.latency import Uniform
from sim_adapter.network import Network, SimNode


class _Recorder(BaseApplication):
    def __init__(self) -> None:
        self.got: list[Any] = []

    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        self.got.append(payload)


#: the loop rule alone: no second offer to a closer hop that sent a message back (that rule,
#: ``KbrConfig.retry_bounced_s``, is tested in ``tests/test_kbr_churn_races.py``)
_NO_RETRY = ToyConfig(kbr=KbrConfig(retry_bounced_s=0.0))


def _lone(
    known: list[int], cfg: ToyConfig | None = None
) -> tuple[ManualRuntime, ToyCore, _Recorder, list[NodeHandle]]:
    rt = ManualRuntime(seed=1)
    core = ToyCore(rt, NodeHandle(NodeId(1000), "me"), cfg or ToyConfig())
    core.known = [NodeHandle(NodeId(i), f"n{i}") for i in known]
    app = _Recorder()
    core.register("app", app)
    return rt, core, app, core.known


def _forwards(rt: ManualRuntime) -> list[tuple[Any, RouteMsg]]:
    return [(d, m) for d, m in rt.take_sent() if isinstance(m, RouteMsg)]


# --------------------------------------------------------------------------- the engine rules
def test_a_revisit_with_more_hops_leaves_by_a_next_hop_not_tried_yet() -> None:
    rt, core, app, (near, nearer) = _lone([1500, 1200], _NO_RETRY)
    peer = NodeHandle(NodeId(5), "p")
    key = NodeId(1600)
    m = RouteMsg(key, "app", "x", peer, 77, 2)
    core.receive(peer, m)
    (first,) = _forwards(rt)
    assert first[0] == near and first[1].hops == 3  # greedy: 1500 is closest to 1600
    core.receive(peer, m)  # the previous hop's retransmission: same hop count
    assert _forwards(rt) == [] and core.stats["duplicates"] == 1
    core.receive(near, RouteAck(77))  # 1500 took it on
    core.receive(near, RouteMsg(key, "app", "x", peer, 77, 6))  # 1500 sent it back: a loop
    (second,) = _forwards(rt)
    assert second[0] == nearer and second[1].hops == 7  # 1500 led back here: try 1200
    assert core.stats["route_loops"] == 1
    # every closer node has led back: this node is the closest it can reach and delivers
    core.receive(nearer, RouteAck(77))
    core.receive(nearer, RouteMsg(key, "app", "x", peer, 77, 9))
    assert _forwards(rt) == [] and app.got == ["x"]
    assert core.stats["route_loops"] == 2


def test_delivery_is_at_most_once_whatever_copies_arrive() -> None:
    rt, core, app, _ = _lone([5000])
    peer = NodeHandle(NodeId(5), "p")
    key = NodeId(1001)  # this node is the closest it knows
    for hops in (1, 1, 4, 9, 2):  # retransmission, loop copies, a slower copy with fewer hops
        core.receive(peer, RouteMsg(key, "app", "y", peer, 5, hops))
    assert app.got == ["y"]
    assert core.stats["delivered"] == 1 and core.stats["duplicates"] == 4
    acks = [m for _, m in rt.take_sent() if isinstance(m, RouteAck)]
    assert len(acks) == 5  # every copy acked: no previous hop keeps retransmitting


_HOLD = ToyConfig(kbr=KbrConfig(hold_returning_copies=True))


def test_without_holding_a_copy_that_comes_back_unacknowledged_is_routed_at_once() -> None:
    rt, core, _app, (near, nearer) = _lone([1500, 1200])
    peer = NodeHandle(NodeId(5), "p")
    core.receive(peer, RouteMsg(NodeId(1600), "app", "x", peer, 80, 2))
    core.receive(peer, RouteMsg(NodeId(1600), "app", "x", peer, 80, 5))
    # 1500 is closer to the key than this node and the copy does not come from it: the other
    # copy of a rerouted hop, sent on as usual (to 1500 again), not routed round 1500
    assert [d for d, _ in _forwards(rt)] == [near, near]
    assert core.stats["parallel_copies"] == 1 and core.stats["route_loops"] == 0
    assert core.stats["route_copies_held"] == 0
    # with the old rule every copy with more hops is a loop, and leaves avoiding 1500
    cfg = ToyConfig(kbr=KbrConfig(parallel_copies=False))
    rt, core, _app, (near, nearer) = _lone([1500, 1200], cfg)
    core.receive(peer, RouteMsg(NodeId(1600), "app", "x", peer, 80, 2))
    core.receive(peer, RouteMsg(NodeId(1600), "app", "x", peer, 80, 5))
    assert [d for d, _ in _forwards(rt)] == [near, nearer]
    assert core.stats["route_loops"] == 1 and core.stats["route_copies_held"] == 0


def test_a_copy_that_comes_back_while_the_next_hop_is_unacknowledged_is_not_a_loop() -> None:
    # Under loss: our ack to the previous hop was lost, so it rerouted the message and a copy
    # reaches us again with more hops while 1500 (the closest node we know) has not acked
    # yet. Routing that copy on avoiding 1500 would deliver it at 1200's side or here in
    # 1500's place; it waits for the hop's outcome instead (Pastry's setting).
    rt, core, app, (near, _nearer) = _lone([1500, 1200], _HOLD)
    peer = NodeHandle(NodeId(5), "p")
    key = NodeId(1600)
    core.receive(peer, RouteMsg(key, "app", "x", peer, 78, 2))
    ((dst, _),) = _forwards(rt)
    assert dst == near
    core.receive(peer, RouteMsg(key, "app", "x", peer, 78, 5))
    assert _forwards(rt) == [] and app.got == []
    assert core.stats["route_copies_held"] == 1 and core.stats["route_loops"] == 0
    # 1500's ack shows it took the message on. The copy does not come from 1500, which is
    # closer to the key than this node: the other copy of the previous hop's reroute, sent on
    # as usual (a duplicate at 1500), never routed round 1500
    core.receive(near, RouteAck(78))
    ((dst2, _),) = _forwards(rt)
    assert dst2 == near and core.stats["parallel_copies"] == 1
    assert core.stats["route_loops"] == 0 and app.got == []
    # had 1500 itself sent it back, it came round a loop: it leaves by the hop not tried yet
    core.receive(near, RouteAck(78))
    core.receive(near, RouteMsg(key, "app", "x", peer, 78, 9))
    ((dst3, _),) = _forwards(rt)
    assert dst3 == _nearer and core.stats["route_loops"] == 1


def test_a_copy_held_for_a_hop_that_times_out_is_dropped_and_the_reroute_carries_it() -> None:
    rt, core, app, (near, nearer) = _lone([1500, 1200], _HOLD)
    peer = NodeHandle(NodeId(5), "p")
    key = NodeId(1600)
    core.receive(peer, RouteMsg(key, "app", "x", peer, 79, 2))
    core.receive(peer, RouteMsg(key, "app", "x", peer, 79, 5))
    assert [d for d, _ in _forwards(rt)] == [near] and core.stats["route_copies_held"] == 1
    rt.advance(1.5)  # 1500 never acks (initial RTO 1 s): the hop is rerouted by 1200
    assert [d for d, _ in _forwards(rt)] == [nearer]
    assert core.stats["route_copies_dropped"] == 1 and core.stats["route_loops"] == 0
    assert app.got == []


def test_a_node_that_originated_a_message_routes_it_on_when_it_comes_back() -> None:
    rt, core, _app, (near, nearer) = _lone([1500, 1200])
    core.route(NodeId(1600), "app", "z")
    ((dst, out),) = _forwards(rt)
    assert dst == near and out.hops == 1
    core.receive(near, RouteAck(out.msg_id))
    core.receive(near, RouteMsg(out.key, "app", "z", core.handle, out.msg_id, 4))
    ((dst2, out2),) = _forwards(rt)
    assert dst2 == nearer and out2.msg_id == out.msg_id and core.stats["route_loops"] == 1


# --------------------------------------------------------------------------- simulated rings
def _corrupt(core: Any, key: NodeId, away: NodeHandle) -> None:
    """Make ``core`` send messages for ``key`` to ``away`` (as long as it has not tried it): a
    routing entry pointing away from the key, like an out-of-date Pastry row entry."""
    honest = core.next_hop

    def next_hop(k: NodeId, exclude: set[NodeHandle] | None = None) -> NodeHandle | None:
        if k == key and not (exclude and away in exclude):
            return away
        return honest(k, exclude)  # type: ignore[no-any-return]

    core.next_hop = next_hop


def _point_at(node: SimNode, other: NodeHandle) -> None:
    """Make ``node`` route every key to ``other``, ignoring what it already tried."""

    def next_hop(key: NodeId, exclude: set[NodeHandle] | None = None) -> NodeHandle | None:
        return other

    node.core.next_hop = next_hop  # type: ignore[method-assign]


def _far_from(nodes: list[SimNode], key: NodeId, rng: random.Random) -> SimNode:
    far = sorted(nodes, key=lambda x: ring_distance(x.id, key))[len(nodes) // 2 :]
    return rng.choice(far)


@pytest.mark.parametrize("overlay", ["pastry", "smallworld"])
def test_a_lookup_caught_in_a_loop_still_arrives_once(overlay: str) -> None:
    net = Network(seed=21, latency=Uniform(0.01, 0.05, seed=21))
    nodes = net.spawn(64, overlay=overlay, build="oracle")
    rng = random.Random(21)
    arrived = loops = 0
    for _ in range(12):
        key = NodeId.random(rng)
        root = net.node_by_id(int(net.closest_live(key)))
        away = _far_from(nodes, key, rng)
        # the root sends the key away; every route from there leads back to the root
        _corrupt(root.core, key, away.handle)
        src = rng.choice([x for x in nodes if x is not root])
        before = root.core.stats["route_loops"]
        res = net.lookup(src, key, timeout_s=30.0)
        loops += root.core.stats["route_loops"] - before
        arrived += res.result == root.id
    assert arrived == 12  # every lookup at the node the oracle names ...
    assert net.duplicate_deliveries == 0  # ... exactly once
    assert loops >= 12  # and each did go round the loop first


def test_a_loop_with_no_way_out_is_dropped_at_max_hops_and_counted(toy_overlay: str) -> None:
    cfg = ToyConfig(kbr=KbrConfig(max_hops=20))
    net = Network(seed=3, latency=Uniform(0.01, 0.02, seed=3))
    nodes = net.spawn(16, overlay=toy_overlay, build="oracle", config=cfg)
    key = NodeId.random(random.Random(3))
    a, b = sorted(nodes, key=lambda x: ring_distance(x.id, key))[:2]
    # a and b each insist the other is closer, whatever they already tried
    _point_at(a, b.handle)
    _point_at(b, a.handle)
    res = net.lookup(a, key, timeout_s=30.0)
    assert res.result is None  # not delivered anywhere: nobody took the loop for a root
    assert sum(x.core.stats["ttl_expired"] for x in (a, b)) == 1
    # every pass back was routed on: hops 2..20 arrive as loops (hop 1 is b's first visit)
    assert sum(x.core.stats["route_loops"] for x in (a, b)) == 19
    net.run(60.0)  # and nothing keeps circulating
    assert sum(x.core.stats["forwarded"] for x in (a, b)) == 21  # the origin's + hops 1..20


def test_lookups_on_a_consistent_ring_never_count_a_loop() -> None:
    net = Network(seed=8)
    nodes = net.spawn(300, overlay="smallworld", build="oracle")
    rng = random.Random(8)
    pairs = [(rng.choice(nodes), NodeId.random(rng)) for _ in range(300)]
    res = net.lookup_many(pairs)
    assert all(r.result == net.closest_live(k) for r, (_, k) in zip(res, pairs, strict=True))
    assert sum(x.core.stats["route_loops"] for x in nodes) == 0


# --------------------------------------------------------------------------- churn rules
def _pings(sent: list[tuple[Any, Any]]) -> list[Any]:
    return [d for d, m in sent if type(m).__name__ == "Ping"]


def test_a_joining_node_sends_a_message_back_and_the_previous_hop_routes_around_it() -> None:
    # x (1000) is still joining: its new neighbour p (900) already routes key 1010 to it
    rt_x, x, app_x, _ = _lone([900])
    x.is_joining = lambda: True  # type: ignore[method-assign]
    assert not x.ready
    rt_p = ManualRuntime(seed=2)
    p = ToyCore(rt_p, NodeHandle(NodeId(900), "n900"), _NO_RETRY)
    p.known = [x.handle, NodeHandle(NodeId(5000), "n5000")]
    p.ready = True
    app_p = _Recorder()
    p.register("app", app_p)
    p.route(NodeId(1010), "app", "k")
    ((dst, out),) = _forwards(rt_p)
    assert dst == x.handle  # x is numerically closest: p's (correct) greedy choice
    x.receive(p.handle, out)
    sent = rt_x.take_sent()
    back = [(d, m) for d, m in sent if isinstance(m, RouteMsg)]
    assert [d for d, _ in back] == [p.handle] and app_x.got == []
    assert x.stats["bounced_unready"] == 1
    acks = [m for _, m in sent if isinstance(m, RouteAck)]
    assert acks  # p's hop is acked all the same
    p.receive(x.handle, acks[0])
    p.receive(x.handle, back[0][1])
    # back at p with more hops: x was tried, p is the closest *active* node and delivers
    assert app_p.got == ["k"] and p.stats["route_loops"] == 1
    # once ready, x delivers what it is responsible for
    x.ready = True
    x.receive(p.handle, RouteMsg(NodeId(1010), "app", "k2", p.handle, 99, 1))
    assert app_x.got == ["k2"]


def test_a_silent_hop_with_an_alternative_is_routed_around_at_once() -> None:
    rt, core, app, (near, nearer) = _lone([1500, 1200])
    core.ready = True
    core.route(NodeId(1600), "app", "m")
    ((dst, _),) = _forwards(rt)
    assert dst == near
    rt.advance(1.01)  # the initial RTO of an unmeasured hop
    sent = rt.take_sent()
    fwd = [d for d, m in sent if isinstance(m, RouteMsg)]
    assert fwd == [nearer]  # no retransmission to the silent hop: the other way at once
    assert _pings(sent) == [near]  # and the silent hop is probed (suspected)
    assert near in core.prox.bad and core.stats["reroutes"] == 1
    assert core.stats["hop_retransmits"] == 0 and app.got == []


def test_a_silent_hop_that_is_the_only_way_on_is_retried_not_replaced_by_this_node() -> None:
    # the silent hop is the closest node this node knows: delivering here would be wrong if
    # its datagrams were only lost, so it is retransmitted until it acks
    rt, core, app, (only,) = _lone([1500])
    core.ready = True
    core.route(NodeId(1600), "app", "m")
    ((dst, out),) = _forwards(rt)
    assert dst == only
    rt.advance(1.01)
    sent = rt.take_sent()
    assert [d for d, m in sent if isinstance(m, RouteMsg)] == [only]
    assert core.stats["hop_retransmits"] == 1 and app.got == []
    core.receive(only, RouteAck(out.msg_id))  # it answers: nothing more is sent, no delivery
    core.receive(only, HandedOff(out.msg_id))  # and hands it on (KbrConfig.custody)
    rt.advance(30.0)
    assert [m for _, m in rt.take_sent() if isinstance(m, RouteMsg)] == []
    assert app.got == [] and core.stats["delivered"] == 0


def test_a_silent_only_hop_declared_dead_ends_the_retries_and_this_node_delivers() -> None:
    rt, core, app, (only,) = _lone([1500])
    core.ready = True
    core.route(NodeId(1600), "app", "m")
    rt.take_sent()
    rt.advance(120.0)  # no answer to anything: the probe declares it dead
    assert only not in core.known  # the toy overlay dropped it on the DEAD verdict
    assert app.got == ["m"]  # now this node is the closest live one it knows
    retries = core.stats["hop_retransmits"]
    assert 1 <= retries <= core.kbr_config.hop_retries


def test_a_measured_hop_times_out_after_a_few_round_trips_not_the_rfc_rto() -> None:
    rt, core, _app, (near, nearer) = _lone([1500, 1200])
    core.ready = True
    core.prox.sample(near, 0.1)  # one sample: RFC 6298 RTO = 0.1 + 4 * 0.05 = 0.3 s
    assert abs(core.prox.rto(near) - 0.3) < 1e-9
    core.route(NodeId(1600), "app", "m")
    rt.take_sent()
    f = core.kbr_config.hop_timeout_srtt_factor
    rt.advance(f * 0.1 + core.prox.config.min_rto_s + 0.001)  # 0.2 s < 0.3 s
    assert [d for d, m in rt.take_sent() if isinstance(m, RouteMsg)] == [nearer]


def test_an_ack_after_the_message_went_back_to_the_same_hop_is_no_rtt_sample() -> None:
    # Traced in `bench churn` at 5 % loss: a message rerouted away from a silent hop went back
    # to it once its probe answered, and the hop's late ack of the *first* transmission was
    # taken as the RTT of the second (0.02-0.07 s for peers 0.3-0.5 s away). Acks name only the
    # message, so an ack from a hop that had the message before is ambiguous (Karn's rule).
    rt, core, _app, (near, _nearer) = _lone([1500, 1200])
    core.ready = True
    core.route(NodeId(1600), "app", "m")
    ((_, out),) = _forwards(rt)
    rt.advance(1.01)  # near is silent: rerouted to 1200, near probed
    (ping,) = [m for _, m in rt.take_sent() if isinstance(m, Ping)]
    rt.advance(0.49)
    core.receive(near, Pong(ping.nonce, ping.sent_at))  # near is alive: an RTT of 0.5 s
    rt.advance(0.0)
    assert core.stats["reroutes_on_alive"] == 1  # the message went back to near
    assert core.prox.srtt(near) == pytest.approx(0.5)
    rt.advance(0.02)
    core.receive(near, RouteAck(out.msg_id))  # near's ack of the first transmission, late
    assert core.prox.srtt(near) == pytest.approx(0.5)  # not a 0.02 s sample
    assert core.stats["reroutes"] == 1  # and it still counts as the hop's ack: no timeout
    rt.advance(5.0)
    assert core.stats["reroutes"] == 1
