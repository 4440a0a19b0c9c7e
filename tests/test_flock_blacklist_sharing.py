"""Blacklists learned from trusted pools (Butt et al. 2006 §3.2.1): pools "can dynamically learn
of 'black listed' pools from other trusted pools".

The oracle: with a random trust relation between consumer pools (who sends to whom, who adopts
from whom) and random failure reports, every pool's flock targets must equal its willing list
minus what it reported itself and what every sender that both sends to it and is trusted by it
reported — never what a sender only heard from a third pool. Then expiry, the periodic
re-share, the policy defaults, and bad input.
"""

from __future__ import annotations

import itertools
import math
import random

import attrs
import msgpack
import pytest
from flock_support import KeyedNode, announce, ident, keyed_node, pump, put_in_table

from discovery.announce import Flock
from discovery.control import flock_info
from discovery.flock_blacklist import MAX_SHARED
from discovery.flock_messages import FLOCK_APP, BlacklistShare, IdentitySigner, sign_share
from discovery.policy import BLACKLIST_FROM, BLACKLIST_TO, Peer, Policy
from overlay import NodeHandle
from overlay.identity import Identity
from overlay.kbr import RouteMsg
from overlay.wire import decode_message, encode_message
from sim_adapter import Network, latency
from sim_adapter.plugins.flock import FixedPool, FlockSim, spawn_signed
from sim_adapter.simnode import SimNode

#: the pools that offer machines (their collectors are cmN.example.org:9618)
OFFERS = [ident(700 + i) for i in range(8)]


def _hex(k: KeyedNode) -> str:
    return f"{int(k.handle.id):040x}"


def _policy(send_to: list[KeyedNode], adopt_from: list[KeyedNode], blacklist_s: int) -> Policy:
    def ids(ks: list[KeyedNode]) -> str:
        return ", ".join(f'"id:{_hex(k)}"' for k in ks)

    return Policy.loads(
        f"[blacklist-to]\nallow = [{ids(send_to)}]\n"
        f"[blacklist-from]\nallow = [{ids(adopt_from)}]\n"
        f"[sharing]\nblacklist_s = {blacklist_s}\n"
    )


def _offer(k: KeyedNode, i: int, at: float, seq: int = 1) -> None:
    o = OFFERS[i]
    m = announce(
        o, address=800 + i, free=4, issued=at, seq=seq, collector=f"cm{800 + i}.example.org:9618"
    )
    k.core.receive(NodeHandle(o.id, 800 + i), m)


def _consumers(n: int, rng: random.Random) -> tuple[list[KeyedNode], dict[int, set[int]]]:
    """``n`` overloaded pools that all know each other; returns them and, per pool, the pools
    it would adopt from *and* that send to it (what the oracle unions)."""
    nodes = [keyed_node(10 + i, seed=i, pool=FixedPool(10, 0, idle_jobs=5)) for i in range(n)]
    send = {i: {j for j in range(n) if j != i and rng.random() < 0.6} for i in range(n)}
    adopt = {i: {j for j in range(n) if j != i and rng.random() < 0.6} for i in range(n)}
    for i, k in enumerate(nodes):
        k.flock.set_policy(_policy([nodes[j] for j in send[i]], [nodes[j] for j in adopt[i]], 600))
        for j, other in enumerate(nodes):
            if j != i:
                put_in_table(k.core, other.handle)
    # brute force over the routing state: j's share reaches i if i is in j's tables and j's
    # blacklist-to admits i, and i adopts it if its blacklist-from admits j
    knows = {j: {h.id for h in nodes[j].core.known_nodes()} for j in range(n)}
    heard = {
        i: {j for j in adopt[i] if i in send[j] and nodes[i].handle.id in knows[j]}
        for i in range(n)
    }
    return nodes, heard


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_targets_equal_own_and_trusted_reports_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    nodes, heard = _consumers(6, rng)
    for k in nodes:
        k.rt.advance(10.0)
        for i in range(len(OFFERS)):
            _offer(k, i, 9.0)
    reported: dict[int, set[str]] = {}
    for i, k in enumerate(nodes):
        bad = set(rng.sample(range(len(OFFERS)), rng.randrange(0, 3)))
        names = set()
        for b in bad:
            # by collector or by node id, as a pool model may name either
            if rng.random() < 0.5:
                k.flock.report_failure(f"cm{800 + b}.example.org:9618", "evicted")
            else:
                k.flock.report_failure(OFFERS[b].id, "failed")
            names.add(f"{int(OFFERS[b].id):040x}")
        reported[i] = names
    pump(nodes)
    nontrivial = 0
    for i, k in enumerate(nodes):
        want_out = set(reported[i])
        for j in heard[i]:
            want_out |= reported[j]
        nontrivial += bool(want_out - reported[i])
        got = {t.node_id for t in k.flock.decide_now().targets}
        every = {f"{int(o.id):040x}" for o in OFFERS}
        assert got == every - want_out, f"pool {i}"
        # the learned list names exactly the trusted senders' reports, with their senders
        learned = k.flock.learned_blacklist()
        by = {s for _, (_, senders) in learned.items() for s in senders}
        assert by <= {_hex(nodes[j]) for j in heard[i]}
    assert nontrivial > 0  # some pool skipped a pool only a trusted peer had reported


def test_adopted_entries_are_never_passed_on_and_a_pool_never_adopts_itself() -> None:
    a, b, c = (keyed_node(20 + i, pool=FixedPool(10, 0, idle_jobs=5)) for i in range(3))
    # a -> b -> c, each trusting the previous one and sending to the next
    a.flock.set_policy(_policy([b], [], 600))
    b.flock.set_policy(_policy([c], [a], 600))
    c.flock.set_policy(_policy([], [b], 600))
    for x, y in itertools.permutations([a, b, c], 2):
        put_in_table(x.core, y.handle)
    for k in (a, b, c):
        k.rt.advance(10.0)
        _offer(k, 0, 9.0)
    a.flock.report_failure(OFFERS[0].id)
    a.flock.report_failure(b.flock.collector)  # b itself: b must not adopt it
    pump([a, b, c])
    assert set(b.flock.learned_blacklist()) == {f"{int(OFFERS[0].id):040x}"}
    assert b.flock.stats["blacklist_adopted"] == 1
    # b holds no first-hand entry, so it shares nothing, even on its periodic share
    assert b.flock.share_blacklist_now() == 0
    pump([a, b, c])
    assert c.flock.learned_blacklist() == {} and c.flock.stats["blacklist_shares_received"] == 0


def test_adopted_entries_last_the_shorter_of_both_times_and_shares_repeat_each_period() -> None:
    a = keyed_node(30, pool=FixedPool(10, 0, idle_jobs=5))
    b = keyed_node(31, pool=FixedPool(10, 0, idle_jobs=5))
    # the late pool must not take b's routing-table slot at a
    late = next(
        k
        for n in range(32, 64)
        if (k := keyed_node(n, pool=FixedPool(10, 0, idle_jobs=5)))
        and a.core.table.slot_of(k.handle.id) != a.core.table.slot_of(b.handle.id)
    )
    a.flock.set_policy(_policy([b, late], [], 600))
    b.flock.set_policy(_policy([], [a], 200))  # b keeps what it learns at most 200 s
    late.flock.set_policy(_policy([], [a], 10_000))
    put_in_table(a.core, b.handle)
    for k in (a, b, late):
        k.rt.advance(10.0)
        _offer(k, 0, 9.0)
    bad = f"{int(OFFERS[0].id):040x}"
    a.flock.report_failure(OFFERS[0].id)
    pump([a, b, late])
    assert b.flock.learned_blacklist()[bad][0] == pytest.approx(200.0)
    assert late.flock.learned_blacklist() == {}  # a did not know it yet
    # a learns of the late pool; its next Flocking Manager period sends the list again
    put_in_table(a.core, late.handle)
    a.flock.start()
    for k in (a, b, late):
        k.rt.advance(a.flock.config.manager_period_s + 1.0)
    pump([a, b, late])
    left, by = late.flock.learned_blacklist()[bad]
    assert by == (_hex(a),) and 600 - 2 * a.flock.config.manager_period_s < left < 600
    # b's copy was refreshed by the same share, and still ends at b's own 200 s
    assert b.flock.learned_blacklist()[bad][0] == pytest.approx(200.0)
    for k in (a, b, late):
        k.rt.advance(200.0)
        _offer(k, 0, k.rt.now() - 1.0, seq=2)
    a.flock.stop()
    assert bad not in b.flock.learned_blacklist()
    assert bad in {t.node_id for t in b.flock.decide_now().targets}
    assert bad not in {t.node_id for t in late.flock.decide_now().targets}


def test_blacklist_exchange_is_denied_unless_named() -> None:
    anyone = Peer("ab" * 20, "cm.example.org", "udp://10.0.0.1:9000")
    for pol in (Policy.allow_all(), Policy.loads("[flock-to]\ndeny = []\n")):
        assert not pol.allows(BLACKLIST_FROM, anyone)
        assert not pol.allows(BLACKLIST_TO, anyone)
    pol = Policy.loads('[blacklist-from]\ndefault = "allow"\ndeny = ["host:*.evil.org"]\n')
    assert pol.allows(BLACKLIST_FROM, anyone)
    assert not pol.allows(BLACKLIST_FROM, Peer(host="cm.evil.org"))
    # nothing is sent while nobody is trusted with the list
    a = keyed_node(40, pool=FixedPool(10, 0, idle_jobs=5))
    put_in_table(a.core, keyed_node(41).handle)
    a.flock.report_failure("cm9.example.org")
    assert a.rt.take_sent() == [] and a.flock.stats["blacklist_shares_sent"] == 0


def test_bad_shares_are_dropped_and_counted() -> None:
    a = keyed_node(50, pool=FixedPool(10, 0, idle_jobs=5))
    b = keyed_node(51, pool=FixedPool(10, 0, idle_jobs=5))
    stranger = keyed_node(52)
    b.flock.set_policy(_policy([], [a], 600))
    ok = ("cm9.example.org:9618", 100.0)
    bad_entries: list[tuple[tuple[str, float], ...]] = [
        (("cm9.example.org:9618", -1.0),),
        (("cm9.example.org:9618", math.nan),),
        (("cm9.example.org:9618", math.inf),),
        (("CM9.example.org", 5.0),),  # not as a blacklist names it (lower case)
        (("cm9.example.org $(EVIL)", 5.0),),  # no collector contact
        (("", 5.0),),
        (("x" * 300, 5.0),),
        (ok,) * (MAX_SHARED + 1),
    ]
    for entries in bad_entries:
        b.core.receive(a.handle, BlacklistShare(entries, 1))
    assert b.flock.stats["blacklist_malformed"] == len(bad_entries)
    b.core.receive(stranger.handle, BlacklistShare((ok,), 5))
    assert b.flock.stats["blacklist_untrusted"] == 1
    b.core.receive(a.handle, BlacklistShare((ok,), 7))
    b.core.receive(a.handle, BlacklistShare((("cm8.example.org", 50.0),), 6))  # older: late
    b.core.receive(a.handle, BlacklistShare((("cm8.example.org", 50.0),), 7))  # same: replay
    assert b.flock.stats["blacklist_stale"] == 2
    assert set(b.flock.learned_blacklist()) == {"cm9.example.org:9618"}
    # a newer share replaces the older one: what a sender no longer lists is dropped
    b.core.receive(a.handle, BlacklistShare((("cm8.example.org", 50.0),), 8))
    assert set(b.flock.learned_blacklist()) == {"cm8.example.org"}
    b.core.receive(a.handle, BlacklistShare((), 9))
    assert b.flock.learned_blacklist() == {}


def test_a_share_survives_the_wire_and_a_mistyped_one_is_refused() -> None:
    m = BlacklistShare((("ab" * 20, 12.5), ("cm1.example.org:9618", 3.0)), 17)
    raw = encode_message(m)
    entries = [["ab" * 20, 12.5], ["cm1.example.org:9618", 3.0]]
    assert raw == msgpack.packb([111, entries, 17, b"", b""])
    assert decode_message(raw) == m
    # a string where the seconds go, or a third item: refused by the decoder's type checks
    assert decode_message(msgpack.packb([111, [["ab" * 20, "12.5"]], 17, b"", b""])) is None
    assert decode_message(msgpack.packb([111, [["ab" * 20, 1.0, 2]], 17, b"", b""])) is None


def test_flock_status_lists_both_blacklists() -> None:
    a = keyed_node(60, pool=FixedPool(10, 0, idle_jobs=5))
    b = keyed_node(61, pool=FixedPool(10, 0, idle_jobs=5))
    a.flock.set_policy(_policy([b], [], 600))
    b.flock.set_policy(_policy([], [a], 600))
    put_in_table(a.core, b.handle)
    a.flock.report_failure("cm9.example.org:9618")
    b.flock.report_failure("cm8.example.org")
    pump([a, b])
    info = flock_info(b.flock, b.rt.now())
    assert info["blacklist"] == {"cm8.example.org": 600.0}
    assert info["blacklist_learned"] == {
        "cm9.example.org:9618": {"left_s": 600.0, "from": [_hex(a)]}
    }
    assert info["stats"]["blacklist_adopted"] == 1


def _ring(overlay: str) -> tuple[Network, FlockSim, list[SimNode], dict[int, Identity]]:
    net = Network(seed=3, latency=latency.TransitStub(seed=3))
    nodes, idents = spawn_signed(net, 120, overlay=overlay)
    sim = FlockSim(net, lambda n: FixedPool(10, 0, idle_jobs=5), identities=idents)
    return net, sim, nodes, idents


@pytest.mark.parametrize("overlay", ["smallworld", "pastry"])
def test_a_pool_named_by_id_hears_it_wherever_it_is(overlay: str) -> None:
    net, sim, nodes, _ = _ring(overlay)
    r = nodes[0]
    known = {h.id for h in r.core.known_nodes()}
    far = [x for x in nodes[1:] if x.id not in known]
    t, gone = far[0], far[1]
    hx = {x.index: f"{int(x.id):040x}" for x in nodes}
    sim[r].set_policy(
        Policy.loads(f'[blacklist-to]\nallow = ["id:{hx[t.index]}", "id:{hx[gone.index]}"]\n')
    )
    sim[t].set_policy(Policy.loads(f'[blacklist-from]\nallow = ["id:{hx[r.index]}"]\n'))
    net.crash(gone)
    sim[r].report_failure("cm1.example.org")
    net.run(30.0)  # the copy for the crashed pool waits for its last hop to find the crash
    assert sim[r].stats["blacklist_shares_routed"] == 2
    assert sim[t].learned_blacklist() == {
        "cm1.example.org": (pytest.approx(1770.0, abs=31), (hx[r.index],))
    }
    # nobody else took it, and the share for the crashed pool ended at its id's new root
    others = [f for i, f in sim.flocks.items() if i not in (r.index, t.index)]
    assert not any(f.learned_blacklist() for f in others)
    assert sum(f.stats["blacklist_misrouted"] for f in sim.flocks.values()) == 1


def test_a_routed_share_must_be_signed_by_its_claimed_sender() -> None:
    net, sim, nodes, idents = _ring("pastry")
    r, t, liar = nodes[0], nodes[60], nodes[30]
    hx = {x.index: f"{int(x.id):040x}" for x in nodes}
    sim[t].set_policy(Policy.loads(f'[blacklist-from]\nallow = ["id:{hx[liar.index]}"]\n'))
    share = BlacklistShare((("cm1.example.org", 100.0),), 10)
    # routed by the liar: unsigned, signed with another pool's key, signed then altered
    liar.core.route(t.id, FLOCK_APP, share)
    liar.core.route(t.id, FLOCK_APP, sign_share(share, IdentitySigner(idents[r.index])))
    good = sign_share(share, IdentitySigner(idents[liar.index]))
    liar.core.route(t.id, FLOCK_APP, attrs.evolve(good, seq=11))
    net.run(10.0)
    st = sim[t].stats
    assert (st["blacklist_unsigned"], st["blacklist_forged"]) == (1, 2)
    assert sim[t].learned_blacklist() == {}
    liar.core.route(t.id, FLOCK_APP, good)
    net.run(10.0)
    assert set(sim[t].learned_blacklist()) == {"cm1.example.org"}


def test_a_routed_share_replayed_later_is_refused_even_by_a_restarted_pool() -> None:
    net, sim, nodes, idents = _ring("pastry")
    a, t = nodes[0], nodes[60]
    hx = {x.index: f"{int(x.id):040x}" for x in nodes}
    trust = Policy.loads(f'[blacklist-from]\nallow = ["id:{hx[a.index]}"]\n')
    sim[t].set_policy(trust)
    made = sim[a].clock()
    share = sign_share(
        BlacklistShare((("cm1.example.org", 100.0),), int(made * 1000)), IdentitySigner(idents[0])
    )
    a.core.route(t.id, FLOCK_APP, share)
    net.run(5.0)
    assert set(sim[t].learned_blacklist()) == {"cm1.example.org"}
    # the pool restarts (its flock forgets every sender's seq); a copy captured on the way
    # comes back after the validity an announcement would have had
    net.run(sim.config.max_validity_s)
    t.core.unregister(FLOCK_APP)
    fresh = Flock(
        t.core,
        FixedPool(10, 0, idle_jobs=5),
        sim.config,
        policy=trust,
        signer=IdentitySigner(idents[t.index]),
    )
    a.core.route(t.id, FLOCK_APP, share)
    net.run(5.0)
    assert fresh.learned_blacklist() == {} and fresh.stats["blacklist_stale"] == 1


def test_a_routed_share_is_not_admitted_by_an_address_it_only_claims() -> None:
    net, sim, nodes, idents = _ring("pastry")
    liar, t, trusted = nodes[30], nodes[60], nodes[90]
    sim[t].set_policy(
        Policy.loads(f'[blacklist-from]\nallow = ["addr:{trusted.handle.address}"]\n')
    )
    share = BlacklistShare((("cm1.example.org", 100.0),), int(sim[liar].clock() * 1000))
    signed = sign_share(share, IdentitySigner(idents[liar.index]))
    # the liar's own key signs it, but its route claims the trusted pool's address
    msg = RouteMsg(t.id, FLOCK_APP, signed, NodeHandle(liar.id, trusted.handle.address), 7, 0)
    net.inject(liar.handle, t, msg)
    net.run(5.0)
    assert sim[t].learned_blacklist() == {} and sim[t].stats["blacklist_untrusted"] == 1
