"""Pastry leaf-set maintenance: who heartbeats whom, who sweeps, how a side is repaired.

Against brute-force oracles over the sorted ids of the live nodes, on the shared-clock pump of
``test_pastry_units`` (deterministic seeds, no timing asserts).
"""

from __future__ import annotations

from collections import Counter

from test_pastry_units import MiniNet, crash_and_check_leaves

from overlay.handle import Address
from overlay.messages import Message
from overlay.pastry import PastryConfig
from overlay.pastry.messages import Heartbeat

#: MSPastry's mode (the default, explicit here): most tests are about the left neighbour's lease
LEFT_ONLY = PastryConfig(heartbeat_left_only=True)


def _ring(n: int, seed: int, cfg: PastryConfig | None = LEFT_ONLY) -> MiniNet:
    net = MiniNet(seed=seed)
    net.join(net.add(cfg), [])
    for _ in range(n - 1):
        assert net.join(net.add(cfg), [0]) == [True]
    net.run(60)
    return net


def _heartbeat_log(net: MiniNet) -> Counter[tuple[int, int]]:
    """Record (src, dst) of every Heartbeat sent from now on."""
    log: Counter[tuple[int, int]] = Counter()
    send = net.send

    def spy(src: int, dst: Address, msg: Message) -> None:
        if isinstance(msg, Heartbeat) and isinstance(dst, int):
            log[(src, dst)] += 1
        send(src, dst, msg)

    net.send = spy  # type: ignore[method-assign]
    return log


def _neighbours(net: MiniNet) -> dict[int, tuple[int, int]]:
    """Brute force: (ccw, cw) neighbour address of every core, from the sorted ids."""
    order = sorted(net.cores, key=lambda c: int(c.id))
    n = len(order)
    out = {}
    for i, c in enumerate(order):
        ccw, cw = order[(i - 1) % n], order[(i + 1) % n]
        out[int(c.handle.address)] = (int(ccw.handle.address), int(cw.handle.address))  # type: ignore[call-overload]
    return out


def test_heartbeats_go_to_the_left_neighbour_only() -> None:
    net = _ring(30, seed=41)
    log = _heartbeat_log(net)
    net.run(400)
    nb = _neighbours(net)
    for src, (ccw, _cw) in nb.items():
        dsts = {d for (s, d) in log if s == src}
        assert dsts == {ccw}, (src, dsts, ccw)
        assert log[(src, ccw)] >= 400 // 20 - 1
    # and the rate is one heartbeat per node per period
    assert sum(log.values()) <= len(net.cores) * (400 / 20 + 1)


def test_both_sides_when_configured_as_freepastry() -> None:
    net = _ring(20, 42, PastryConfig(heartbeat_left_only=False))
    log = _heartbeat_log(net)
    net.run(200)
    for src, (ccw, cw) in _neighbours(net).items():
        assert {d for (s, d) in log if s == src} == {ccw, cw}


def test_a_lone_crash_is_found_by_its_left_neighbour_and_reaches_every_leaf_set() -> None:
    net = _ring(40, seed=43)
    for c in net.cores:
        c.stats["leaf_sweep_probes"] = 0
    live = crash_and_check_leaves(net, {17})
    # Only the detector sweeps the rest of its leaf set (correlated failures); the members that
    # confirm its report do not (each would probe ~L members to find nothing).
    sweeps = sum(c.stats["leaf_sweep_probes"] for c in live)
    assert 0 < sweeps <= 2 * 16


def test_two_crashes_close_together_make_the_members_sweep() -> None:
    net = _ring(40, seed=44)
    for c in net.cores:
        c.stats["leaf_sweep_probes"] = 0
    order = sorted(net.cores, key=lambda c: int(c.id))
    victims = {int(order[10].handle.address), int(order[12].handle.address)}  # type: ignore[call-overload]
    live = crash_and_check_leaves(net, victims)
    swept = sum(1 for c in live if c.stats["leaf_sweep_probes"] > 0)
    assert swept > 2


def test_a_lone_crash_is_repaired_without_re_routed_joins() -> None:
    """A side refilled by its first leaf-set request (a lone crash: the common case under
    churn) needs no join re-routed for our own id; every member of the crashed node's leaf set
    used to send one (~0.025 msg/s/node at N = 2,000, 30-min sessions). The leaf sets are still
    exact (oracle in ``crash_and_check_leaves``)."""
    net = _ring(40, seed=43)
    for c in net.cores:
        c.stats["rejoins"] = 0
        c.stats["leaf_repairs"] = 0
    live = crash_and_check_leaves(net, {17})
    assert sum(c.stats["leaf_repairs"] for c in live) > 0  # the sides were repaired...
    assert sum(c.stats["rejoins"] for c in live) == 0  # ... without a rejoin
