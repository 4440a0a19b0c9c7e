"""Hostile input to the small-world ring: replies bind to requests and to their senders.

One forged ``ConnectReply`` used to replace every near neighbour of a node with fake handles;
now a reply must come from the responder it names and answer a request still pending (random
token), or it is dropped and counted and changes nothing.
"""

from __future__ import annotations

import itertools
import random

from sim_oracles import lookups

from overlay import NodeHandle, NodeId
from overlay.smallworld.messages import JOIN, NEAR, SHORTCUT, ConnectReply
from sim_adapter import Network, SimNode


def _ring(seed: int) -> tuple[Network, list[SimNode]]:
    net = Network(seed=seed, fidelity=True)  # the wire and observed handles, as live
    nodes = net.spawn(60, overlay="smallworld", build="oracle")
    net.run(30.0)
    return net, nodes


def test_forged_and_unsolicited_connect_replies_change_nothing() -> None:
    net, nodes = _ring(seed=4)
    rng = random.Random(2)
    victim, liar = nodes[3], nodes[40]
    near_before = set(victim.core.near_connections())  # type: ignore[attr-defined]
    fakes = tuple(NodeHandle(NodeId.random(rng), f"fake-{i}") for i in range(8))
    for kind in (NEAR, SHORTCUT, JOIN):
        # (a) a reply naming someone else as responder
        victim.core.receive(liar.handle, ConnectReply(fakes[0], kind, 1, fakes[1:]))
        # (b) a reply from its real sender that answers no request of ours
        for _ in range(5):
            tok = rng.getrandbits(31) | 1
            victim.core.receive(liar.handle, ConnectReply(liar.handle, kind, tok, fakes))
    net.run(5.0)
    assert set(victim.core.near_connections()) == near_before  # type: ignore[attr-defined]
    known = set(victim.core.known_nodes())
    assert not known & set(fakes)
    st = victim.core.stats
    assert st["connect_reply_forged"] == 3
    assert st["connect_reply_unsolicited"] >= 10  # NEAR and SHORTCUT ones (JOIN: join state)
    ok, _ = lookups(net, nodes, 200, seed=5)
    assert ok == 1.0


def test_tokens_are_random_not_a_counter() -> None:
    _, nodes = _ring(seed=5)
    core = nodes[0].core
    toks = [core.next_token() for _ in range(50)]  # type: ignore[attr-defined]
    assert len(set(toks)) == 50
    assert sum(1 for a, b in itertools.pairwise(toks) if b == a + 1) == 0
