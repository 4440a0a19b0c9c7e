"""The willing list's total order, expiry and withdrawal, and the sending side, sans-io.

Order key (Butt et al. 2006 §3.2.1 + §4.1): (RTT rounded down to the tolerance, more free
machines first, a random number drawn once per entry from the node's seeded generator).
"""

from __future__ import annotations

from flock_support import KeyedNode, announce, ident, keyed_node, put_in_table

from discovery.announce import FlockConfig
from discovery.flock_messages import FlockAnnounce
from discovery.willing import order_key
from overlay import NodeHandle
from overlay.proximity import Ping
from sim_adapter.plugins.flock import FixedPool

ORIGINS = [ident(100 + i) for i in range(8)]


def _receiver(seed: int, rtts: list[float] | None = None, **kw: object) -> KeyedNode:
    k = keyed_node(1, seed=seed, **kw)
    for i, o in enumerate(ORIGINS):
        if rtts is not None:
            k.core.prox.sample(NodeHandle(o.id, 200 + i), rtts[i])
    k.rt.advance(10.0)
    return k


def _feed(k: KeyedNode, frees: list[int], rows: list[int] | None = None, seq: int = 1) -> None:
    for i, o in enumerate(ORIGINS):
        m = announce(
            o, address=200 + i, free=frees[i], issued=9.0, seq=seq, row=rows[i] if rows else 0
        )
        k.core.receive(NodeHandle(o.id, 200 + i), m)


def _order(k: KeyedNode) -> list[int]:
    [sub] = k.flock.willing_list()
    return [ORIGINS.index(next(o for o in ORIGINS if o.id == e.origin.id)) for e in sub]


def test_order_key() -> None:
    tol = 0.005
    assert order_key(0.0101, 1, 0.9, tol) < order_key(0.0151, 100, 0.1, tol)  # RTT bucket first
    assert order_key(0.0101, 9, 0.9, tol) < order_key(0.0149, 3, 0.1, tol)  # same bucket: free
    assert order_key(0.0101, 3, 0.1, tol) < order_key(0.0149, 3, 0.9, tol)  # then random
    assert order_key(9.0, 0, 0.9, tol) < order_key(None, 100, 0.0, tol)  # unmeasured last


def test_equal_rtt_and_free_order_differs_between_seeds_and_repeats_per_seed() -> None:
    rtts = [0.020 + 0.0001 * i for i in range(8)]  # all in one 5 ms bucket
    orders = []
    for seed in range(8):
        k = _receiver(seed, rtts)
        _feed(k, [4] * 8)
        orders.append(tuple(_order(k)))
    assert len(set(orders)) > 1  # randomized across receivers (§3.2.1)
    again = _receiver(3, rtts)
    _feed(again, [4] * 8)
    assert tuple(_order(again)) == orders[3]  # deterministic per seed


def test_the_random_order_is_stable_across_rounds() -> None:
    """Drawn once per entry: the same receiver keeps its order (no FLOCK_TO flapping)."""
    k = _receiver(5, [0.02] * 8)
    _feed(k, [4] * 8)
    first = _order(k)
    _feed(k, [4] * 8, seq=2)
    assert _order(k) == first


def test_more_free_machines_first_within_a_bucket_for_every_seed() -> None:
    rtts = [0.020 + 0.0001 * i for i in range(8)]
    frees = [3, 9, 1, 7, 7, 2, 5, 8]
    for seed in range(5):
        k = _receiver(seed, rtts)
        _feed(k, frees)
        got = [frees[i] for i in _order(k)]
        assert got == sorted(frees, reverse=True)


def test_rtt_bucket_beats_free_machines() -> None:
    rtts = [0.050, 0.010, 0.030, 0.020, 0.070, 0.060, 0.040, 0.080]
    frees = [100, 1, 50, 2, 3, 4, 5, 6]
    k = _receiver(0, rtts)
    _feed(k, frees)
    assert [rtts[i] for i in _order(k)] == sorted(rtts)


def test_sublist_is_the_row_and_unprobed_origins_are_probed() -> None:
    k = _receiver(0, rtts=None)
    _feed(k, [5] * 8, rows=[0, 1, 2, 0, 1, 2, 0, 1])
    wl = k.flock.willing_list()
    assert [len(s) for s in wl] == [3, 3, 2]
    pings = [d for d, m in k.rt.take_sent() if isinstance(m, Ping)]
    assert {d.id for d in pings} == {o.id for o in ORIGINS}  # one probe per unknown origin
    assert all(e.rtt_s is None for s in wl for e in s)


def test_an_origin_heard_along_two_rows_is_listed_under_the_nearer() -> None:
    k = _receiver(0, [0.02] * 8)
    o = ORIGINS[0]
    h = NodeHandle(o.id, 200)
    k.core.receive(h, announce(o, address=200, issued=9.0, row=2))
    k.core.receive(h, announce(o, address=200, issued=9.0, row=1))
    k.core.receive(h, announce(o, address=200, issued=9.0, row=3))
    assert [e.row for e in k.flock.willing_entries()] == [1]


def test_entries_expire_with_the_offer() -> None:
    k = _receiver(0, [0.02] * 8)
    _feed(k, [5] * 8)  # issued at 9 s, valid 60 s
    k.rt.advance(68.9 - 10.0)  # expires at 9 + 60 = 69 s
    assert len(k.flock.willing_entries()) == 8
    k.rt.advance(0.1)
    assert k.flock.willing_entries() == []


def test_a_withdrawal_removes_the_entry() -> None:
    k = _receiver(0, [0.02] * 8)
    _feed(k, [5] * 8)
    o = ORIGINS[2]
    k.core.receive(NodeHandle(o.id, 202), announce(o, address=202, free=0, issued=9.5, seq=2))
    assert o.id not in {e.origin.id for e in k.flock.willing_entries()}
    assert k.flock.stats["withdrawn"] == 1


def test_capacity_bound_drops_new_origins_and_counts() -> None:
    k = _receiver(0, [0.02] * 8, config=FlockConfig(max_entries=5))
    _feed(k, [5] * 8)
    assert len(k.flock.willing_entries()) == 5 and k.flock.stats["full"] == 3


# ------------------------------------------------------------------------------ sending
def _sender_with_table(free: int) -> tuple[KeyedNode, list[tuple[int, NodeHandle]]]:
    k = keyed_node(1, pool=FixedPool(20, free))
    placed = []
    for i in range(60):
        h = NodeHandle(ident(300 + i).id, 300 + i)
        placed.append((put_in_table(k.core, h), h))
    k.rt.advance(5.0)
    return k, placed


def _sent(k: KeyedNode) -> list[tuple[NodeHandle, FlockAnnounce]]:
    return [(d, m) for d, m in k.rt.take_sent() if isinstance(m, FlockAnnounce)]


def test_announces_to_every_routing_table_entry_row_0_first() -> None:
    k, _ = _sender_with_table(free=6)
    installed = {h for h in k.core.table.entries()}
    k.flock.announce_now()
    sent = _sent(k)
    assert {d for d, _ in sent} == installed and len(sent) == len(installed)
    rows = [m.row for _, m in sent]
    assert rows == sorted(rows) and len(set(rows)) >= 2  # row 0 first, then downwards
    for d, m in sent:
        assert k.core.table.slot_of(d.id)[0] == m.row
        assert (m.free_machines, m.ttl, m.hops, m.to) == (6, 1, 0, None)
    assert len({m.seq for _, m in sent}) == 1  # one round, one sequence number
    assert all(m.signature for _, m in sent)


def test_a_full_pool_sends_one_withdrawal_then_nothing() -> None:
    k, _ = _sender_with_table(free=6)
    k.flock.announce_now()
    _sent(k)
    k.pool.free_machines = 0
    k.flock.announce_now()
    withdrawals = _sent(k)
    assert withdrawals and all(m.free_machines == 0 for _, m in withdrawals)
    k.flock.announce_now()
    assert _sent(k) == []


def test_timers_announce_every_period_and_never_later() -> None:
    k, _ = _sender_with_table(free=6)
    cfg = k.flock.config
    k.flock.start()
    k.rt.advance(cfg.announce_period_s)  # first phase is within one period
    n1 = k.flock.stats["sent"]
    assert n1 > 0
    k.rt.advance(10 * cfg.announce_period_s)
    rounds = k.flock.stats["sent"] / n1
    assert 10 <= rounds <= 10 / (1 - cfg.period_jitter) + 1
