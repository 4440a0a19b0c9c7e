"""Hostile input to multicast: numbers from the wire are clamped, replies bind to requests.

A query whose budget or level allowance is NaN or huge used to arm no timer, so one child that
acknowledged and never answered pinned its ancestors' sessions open for ever. Session tokens are
random, and a reply-ack is taken only from the parent it acknowledges.
"""

from __future__ import annotations

import math

import pytest

from overlay.multicast import MULTICAST_APP, McQuery, McReply, McReplyAck, Multicast
from sim_adapter import Network


def _ring(seed: int) -> tuple[Network, list]:  # type: ignore[type-arg]
    net = Network(seed=seed, fidelity=True)  # the wire and observed handles, as live
    nodes = net.spawn(40, overlay="pastry", build="oracle")
    net.run(5.0)
    return net, nodes


def _app(node: object) -> Multicast:
    app = node.core.apps[MULTICAST_APP]  # type: ignore[attr-defined]
    assert isinstance(app, Multicast)
    return app


@pytest.mark.parametrize(("budget", "level"), [(math.nan, math.nan), (1e12, 1e12), (-1.0, -5.0)])
def test_bogus_budgets_are_clamped_and_sessions_end(budget: float, level: float) -> None:
    net, nodes = _ring(seed=3)
    x, parent = nodes[5], nodes[20]
    for y in nodes:  # every child acks at once and then never answers (a silent subtree)
        if y is not x:
            y.alive = False
    q = McQuery(7, "count", None, 1, x.id, x.id, budget, level, 40, 8, None, 12345, 0)
    x.core.receive(parent.handle, q)
    assert x.core.stats["multicast_clamped"] == 2
    net.run(3 * 3600.0 + 60.0)  # the local cap (1 h) plus reply retransmissions
    assert not _app(x)._sessions


def test_reply_ack_from_a_stranger_is_ignored_and_tokens_are_random() -> None:
    net, nodes = _ring(seed=4)
    by_addr = {n.handle.address: n for n in nodes}
    root = nodes[0]
    got: list[int] = []
    _app(root).aggregate("count", None, on_done=lambda r: got.append(r.value))
    awaiting: list[tuple[object, object, McReply]] = []  # (child, parent, reply)
    orig = net._send

    def spy(src: int, dst: object, msg: object) -> None:
        if isinstance(msg, McReplyAck):
            return  # hold every reply-ack back: children keep their reply sessions open
        if isinstance(msg, McReply) and msg.ctoken:
            awaiting.append((net.nodes[src], by_addr[dst], msg))
        orig(src, dst, msg)  # type: ignore[arg-type]

    net._send = spy  # type: ignore[method-assign]
    while not got and net.now < 30.0:  # until the root has its answer: the children's reply
        net.run(0.05)  # sessions then still wait for the acks we held back
    assert got == [40] and awaiting
    stranger = nodes[-1]
    checked = 0
    for child, parent, rep in awaiting:
        app = _app(child)
        if rep.ctoken not in app._sessions or parent is stranger:
            continue
        child.core.receive(stranger.handle, McReplyAck(rep.ctoken))  # type: ignore[attr-defined]
        assert rep.ctoken in app._sessions
        child.core.receive(parent.handle, McReplyAck(rep.ctoken))  # type: ignore[attr-defined]
        assert rep.ctoken not in app._sessions
        checked += 1
    assert checked > 0
    assert sum(n.core.stats["multicast_foreign_reply_ack"] for n in nodes) == checked
    tokens = [rep.ctoken for _, _, rep in awaiting]
    assert min(tokens) > 1 << 20  # random 62-bit tokens, not a small counter
