"""Latency models of the live-on-loopback scenes that the join-after-crash tests rebuild in
the simulator (``bench chaos``: processes on one machine)."""

from __future__ import annotations

from collections.abc import Iterable

from overlay.handle import NodeHandle
from sim_adapter.latency import Uniform

RING = 1 << 160

#: one-way delays between processes on one machine, as the scenes model them (seconds)
LOOPBACK_ONE_WAY_S = (0.0005, 0.002)


def loopback(seed: int) -> Uniform:
    """Loopback-like delays: 0.5–2 ms one way."""
    return Uniform(*LOOPBACK_ONE_WAY_S, seed=seed)


class OneFar(Uniform):
    """Loopback-like delays, but node ``far`` is 0.45 s away from every other (RTT 0.9 s,
    within the 1-s initial RTO): a live peer that a guess from the others would call dead."""

    def __init__(self, far: int, seed: int) -> None:
        super().__init__(*LOOPBACK_ONE_WAY_S, seed=seed)
        self.far = far

    def one_way_s(self, a: int, b: int) -> float:
        return 0.45 if self.far in (a, b) else super().one_way_s(a, b)

    def rtt_s(self, a: int, b: int) -> float:
        return self.one_way_s(a, b) + self.one_way_s(b, a)


def nearest_each_side(me: int, have: Iterable[NodeHandle], live: Iterable[NodeHandle]) -> bool:
    """True if, on each side of ``me`` on the ring, the nearest of ``have`` is the nearest of
    ``live`` (brute force): the neighbours a node needs to deliver right."""
    have, live = list(have), list(live)
    if not have or not live:
        return False
    for side in (1, -1):

        def dist(h: NodeHandle, side: int = side) -> int:
            return (side * (int(h.id) - me)) % RING

        if min(have, key=dist) != min(live, key=dist):
            return False
    return True
