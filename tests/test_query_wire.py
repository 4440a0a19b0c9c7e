"""The query's values on the wire and the top-k plug-in's robustness (PonD §4.1).

The query argument and each subtree's answer travel inside multicast messages; the codec must
rebuild and validate them, a peer's bad value must not disturb the reduction, and the bytes
per tree edge must not grow with the ring (O(S_D + S_Q + S_A·k)).
"""

from __future__ import annotations

from typing import Any

from discovery.query import AGGREGATOR, MAX_K, prepare_query
from discovery.query_messages import QueryArg, QueryMatch, QueryValue
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.multicast import McQuery, McReply
from overlay.wire import Wire, encode_message
from sim_adapter.latency import Uniform
from sim_adapter.network import Network
from sim_adapter.plugins import query as pq


def handle(i: int) -> NodeHandle:
    return NodeHandle(NodeId(i * 7919 + 1), f"udp://10.0.0.{i % 250}:9000")


def value(matches: list[QueryMatch], visited: int = 1) -> QueryValue:
    return QueryValue(tuple(matches), visited, len(matches), 0, 0, 0, 0, 0)


def test_query_values_round_trip_through_the_codec() -> None:
    arg, _ = prepare_query("TARGET.Memory > 1024", "TARGET.Memory", k=3, job_id="j.1")
    q = McQuery(1, "discovery.classad", arg, 1, NodeId(1), NodeId(1), 9.0, 2.0, 100, 8, None, 3, 0)
    v = value([QueryMatch(handle(i), 1.5 * i, 0.0, "[ Memory = 2048 ]") for i in range(3)])
    rep = McReply(3, 0, v, ((NodeId(5), NodeId(6)),), 2, 40, False, 0)
    w = Wire()
    for msg in (q, rep):
        assert w.decode(encode_message(msg)) == msg
    assert isinstance(w.decode(encode_message(q)).arg, QueryArg)  # type: ignore[union-attr]


def test_malformed_query_values_are_dropped_by_the_codec() -> None:
    w = Wire()
    bad = QueryValue(("not a match",), 1, 0, 0, 0, 0, 0, 0)  # type: ignore[arg-type]
    rep = McReply(3, 0, bad, (), 0, 1, False, 0)
    assert w.decode(encode_message(rep)) is None and w.counters["bad_message"] == 1
    bad2 = QueryValue((), True, 0, 0, 0, 0, 0, 0)  # a bool where a count belongs
    assert w.decode(encode_message(McReply(3, 0, bad2, (), 0, 1, False, 0))) is None


def test_reduce_keeps_the_top_k_deduplicated_and_ignores_garbage() -> None:
    arg, _ = prepare_query("true", k=3)
    a = value([QueryMatch(handle(i), float(i % 3), 0.0, "[]") for i in range(5)])
    b = value([QueryMatch(handle(i), float(i % 3) + 0.5, 0.0, "[]") for i in range(3, 8)])
    r = AGGREGATOR.reduce(arg, a, b)
    keys = [(-m.rank, -m.machine_rank, int(m.node.id)) for m in r.matches]
    assert keys == sorted(keys) and len(r.matches) == 3
    assert len({m.node for m in r.matches}) == 3
    assert [m.rank for m in r.matches] == [2.5, 2.0, 1.5]  # node 4 once, with its better rank
    assert r.visited == 2 and r.matched == 10
    assert AGGREGATOR.reduce(arg, a, 17) is a  # a peer's bad value changes nothing
    nan = value([QueryMatch(handle(99), float("nan"), 0.0, "[]")])
    assert all(m.node != handle(99) for m in AGGREGATOR.reduce(arg, a, nan).matches)
    merged = AGGREGATOR.merge(arg, a, b)
    assert merged.visited == 1 and merged.matches == r.matches


def test_first_fit_done_at_k_matches_not_before() -> None:
    for k in (1, 4):
        arg, _ = prepare_query("true", k=k, mode="first_fit")
        few = value([QueryMatch(handle(i), 0.0, 0.0, "[]") for i in range(k - 1)])
        enough = value([QueryMatch(handle(i), 0.0, 0.0, "[]") for i in range(k)])
        assert not AGGREGATOR.done(arg, few) and AGGREGATOR.done(arg, enough)
        best, _ = prepare_query("true", k=k, mode="best")
        assert not AGGREGATOR.done(best, enough)
    huge = QueryArg("[ Requirements = true ]", 10**9, "first_fit", (), "", False)
    assert not AGGREGATOR.done(huge, value([]))  # k is clamped to MAX_K, never trusted
    assert MAX_K < 10**9


class _FakeMc:
    class _Core:
        def __init__(self) -> None:
            from collections import Counter

            self.stats: Counter[str] = Counter()
            self.apps: dict[str, Any] = {}
            self.id = NodeId(5)

    def __init__(self) -> None:
        self.core = self._Core()
        self.listeners = ()


def test_map_refuses_an_argument_that_is_not_a_query() -> None:
    mc = _FakeMc()
    assert AGGREGATOR.map(mc, ("Memory > 1", 3)) is None  # type: ignore[arg-type]
    assert mc.core.stats["query_bad_arg"] == 1
    arg, _ = prepare_query("true", k=1, audit=True)
    v = AGGREGATOR.map(mc, arg)  # type: ignore[arg-type]
    assert v is not None and v.no_ad == 1 and v.audit == (NodeId(5),)


def _bytes_per_edge(n: int) -> float:
    net = Network(seed=2, latency=Uniform(0.01, 0.05, seed=2), codec=True)
    nodes = net.spawn(n, overlay="smallworld", build="oracle")
    pq.attach(net, seed=3, pond=False)
    b0, m0 = net.bytes_sent, net.message_count
    r = pq.query(net, nodes[0], "TARGET.Memory >= 1024", "TARGET.Memory", k=10)
    assert r.visited == n and len(r.matches) == 10
    assert net.message_count - m0 >= 2 * (n - 1)  # one query and one reply per tree edge
    return (net.bytes_sent - b0) / (n - 1)


def test_bytes_per_edge_do_not_grow_with_the_ring() -> None:
    small, large = _bytes_per_edge(300), _bytes_per_edge(3000)
    assert large < 1.25 * small, (small, large)
