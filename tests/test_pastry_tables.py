"""Routing-table maintenance messages that a join costs (``overlay/pastry/tables.py``).

Units on ``ManualRuntime`` (explicit time): whom a newly ready node announces itself to, and
the RTT sample a row request's reply gives for free. Each rule is checked against the full set
the node could have used (every entry, every leaf-set member), counted on the wire.
"""

from __future__ import annotations

import pytest

from overlay import NodeHandle, NodeId
from overlay.handle import Address
from overlay.ids import RING
from overlay.messages import Message
from overlay.pastry import PastryConfig, PastryCore
from overlay.pastry.messages import RowReply, RowRequest, TableAnnounce
from overlay.proximity import Ping
from overlay.runtime import ManualRuntime


def _h(i: int, addr: Address = None) -> NodeHandle:
    return NodeHandle(NodeId(i % RING), addr if addr is not None else i % 997)


def _sent(rt: ManualRuntime) -> list[tuple[NodeHandle, Message]]:
    """The messages sent to handles since the last call (not those to bare addresses)."""
    return [(d, m) for d, m in rt.take_sent() if isinstance(d, NodeHandle)]


ME = 0x10 << 152


def _ready(cfg: PastryConfig) -> tuple[ManualRuntime, PastryCore, list[NodeHandle]]:
    """A node whose row 0 holds 15 measured entries (RTT 10, 20, … 150 ms, in shuffled
    columns) and whose leaf set holds two numerically close nodes that are also table
    entries (row 2)."""
    rt = ManualRuntime(seed=1)
    core = PastryCore(rt, _h(ME, 0), cfg)
    cols = [c for c in range(16) if c != 1]
    order = [7, 3, 12, 0, 9, 15, 4, 11, 2, 14, 5, 10, 6, 13, 8]  # col index -> RTT rank
    row0 = []
    for rank, c in zip(order, cols, strict=True):
        h = _h(c << 156 | 0x1234, 100 + c)
        core.prox.sample(h, 0.010 * (rank + 1))
        core.consider(h, probe=False)
        row0.append(h)
    for k, delta in enumerate((1 << 140, 2 << 140)):
        leaf = _h(ME + delta, 200 + k)
        core.prox.sample(leaf, 0.050)
        core.add_leaf(leaf)
        core.consider(leaf, probe=False)
    core.joiner.mark_ready()
    _sent(rt)
    return rt, core, row0


def _announced(rt: ManualRuntime) -> dict[NodeHandle, TableAnnounce]:
    return {d: m for d, m in _sent(rt) if isinstance(m, TableAnnounce)}


@pytest.mark.parametrize("k", [0, 4, 15])
def test_row0_announces_go_to_the_k_nearest_entries_only(k: int) -> None:
    rt, core, row0 = _ready(PastryConfig(announce_row0_nearest=k))
    core.tables.on_ready()
    ann = _announced(rt)
    nearest = sorted(row0, key=lambda h: core.prox.rtt(h) or 0.0)[:k]
    assert {h for h in ann if h in row0} == set(nearest)  # brute force over the row
    assert core.stats["table_announces"] == len(ann)


def test_leaf_set_members_are_not_announced_to() -> None:
    # the consistent join's insert-me request already made them learn us
    rt, core, _ = _ready(PastryConfig())
    leaves = core.leaf.nodes()
    assert len(leaves) == 2 and all(h in core.table.members for h in leaves)
    core.tables.on_ready()
    ann = _announced(rt)
    assert ann and not set(ann) & set(leaves)
    entries = set(core.table.entries())
    assert set(ann) <= entries


def test_with_pushed_rows_every_entry_hears_of_us() -> None:
    # receivers that probe the pushed row (announce_probe_limit > 0) need it, leaves included
    rt, core, _ = _ready(PastryConfig(announce_probe_limit=1, announce_row0_nearest=0))
    core.tables.on_ready()
    assert set(_announced(rt)) == set(core.table.entries())


def test_a_row_reply_is_an_rtt_sample_of_the_replier() -> None:
    rt, core, _ = _ready(PastryConfig())
    core.tables.repair_slot(0, 1)  # asks an entry for R[0][1] (R&D §2.5)
    ((asked, req),) = [(d, m) for d, m in _sent(rt) if isinstance(m, RowRequest)]
    assert core.prox.rtt(asked) >= 0.010  # type: ignore[operator]
    rt.advance(0.004)
    core.receive(asked, RowReply(req.row, (), ()))
    assert core.prox.rtt(asked) == pytest.approx(0.004)  # the minimum RTT: this sample
    assert core.stats["row_reply_rtt_samples"] == 1
    assert not [m for _, m in _sent(rt) if isinstance(m, Ping)]
    # a reply nobody asked for measures nothing
    stranger = _h(0x55 << 152 | 7, 55)
    rt.advance(0.004)
    core.receive(stranger, RowReply(0, (), ()))
    assert core.prox.rtt(stranger) is None
    assert core.stats["row_reply_rtt_samples"] == 1


def test_a_reply_while_two_requests_were_outstanding_is_no_sample() -> None:
    # Karn's rule: the reply may answer either request, so its delay measures nothing
    rt, core, _ = _ready(PastryConfig())
    peer = _h(0x55 << 152 | 7, 55)
    core.tables._expect_row(peer, 3)
    rt.advance(0.5)
    core.tables._expect_row(peer, 3)
    rt.advance(0.001)
    core.receive(peer, RowReply(3, (), ()))
    assert core.prox.rtt(peer) is None
    assert core.stats["row_reply_rtt_samples"] == 0
    assert core.stats["row_reply_unsolicited"] == 0  # still bound to our request


def test_a_slot_refilled_from_measured_peers_asks_no_one() -> None:
    """R[1][5] (empty in ``_ready``): with measured live peers that belong there, the nearest
    of them (brute force over every peer we measured) fills it and no row request goes out;
    with none, an entry is asked for its R[1][5] (R&D §2.5)."""
    rt, core, _ = _ready(PastryConfig())
    cands = [_h(0x15 << 152 | 0x55 << 140 | i, 300 + i) for i in range(3)]
    for i, h in enumerate(cands):
        core.prox.sample(h, 0.030 - 0.010 * i)
    dead = _h(0x15 << 152 | 0x66 << 140, 400)
    core.prox.sample(dead, 0.001)
    core.prox.declare_dead(dead)  # nearer, but dead: never a refill
    best = min(
        (h for h in core.prox.peers if core.table.slot_of(h.id) == (1, 5)),
        key=lambda h: (core.prox.is_dead(h), core.prox.rtt(h)),
    )
    core.tables.repair_slot(1, 5)
    assert core.table.get(1, 5) == best == cands[2]
    assert not [m for _, m in _sent(rt) if isinstance(m, RowRequest)]
    assert core.stats["slot_refills_local"] == 1 and core.stats["slot_repairs"] == 0

    rt, core, _ = _ready(PastryConfig())
    core.tables.repair_slot(1, 5)
    assert core.table.get(1, 5) is None
    assert [m for _, m in _sent(rt) if isinstance(m, RowRequest)] == [RowRequest(1, 5)]
    assert core.stats["slot_repairs"] == 1
