"""A toy greedy ring overlay for tests of the shared machinery (KbrCore, Network, multicast).

It knows its four ring neighbours on each side plus symmetric power-of-two fingers, is built by
its oracle only, and routes greedily by ring distance (the ``closer`` rule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from overlay import NodeHandle, NodeId
from overlay.handle import Address
from overlay.ids import closer, is_between
from overlay.kbr import KbrConfig, KbrCore
from overlay.proximity import ProximityConfig
from overlay.runtime import Runtime


@attrs.frozen
class ToyConfig:
    kbr: KbrConfig = attrs.field(factory=KbrConfig)
    proximity: ProximityConfig = attrs.field(factory=ProximityConfig)


class ToyCore(KbrCore):
    overlay_name = "toy"

    def __init__(self, runtime: Runtime, handle: NodeHandle, config: ToyConfig) -> None:
        super().__init__(runtime, handle, config.kbr, config.proximity)
        self.known: list[NodeHandle] = []

    def start(self) -> None:
        return None

    def join(self, seeds: Sequence[Address], on_done: Callable[[bool], None] | None = None) -> None:
        raise NotImplementedError("the toy overlay is built by its oracle only")

    def next_hop(self, key: NodeId, exclude: set[NodeHandle] | None = None) -> NodeHandle | None:
        best = self.handle
        bad = self.prox.bad
        for h in self.known:
            if h in bad or (exclude and h in exclude):
                continue
            if closer(key, h.id, best.id):
                best = h
        return None if best == self.handle else best

    def local_lookup(self, key: NodeId, n: int) -> list[NodeHandle]:
        return sorted(self.known, key=lambda h: (abs(h.id - key), h.id))[:n]

    def neighbor_set(self, n: int) -> list[NodeHandle]:
        return self.known[:n]

    def replica_set(self, key: NodeId, k: int) -> list[NodeHandle]:
        return self.local_lookup(key, k)

    def known_in_range(self, begin: NodeId, end: NodeId) -> list[NodeHandle]:
        return [h for h in self.known if is_between(h.id, begin, end)]

    def known_nodes(self) -> list[NodeHandle]:
        return list(self.known)

    def _on_peer_dead(self, h: NodeHandle) -> None:
        if h in self.known:
            self.known.remove(h)


def toy_oracle(cores: list[ToyCore], rtt_s: Callable[[NodeHandle, NodeHandle], float]) -> None:
    ring = sorted(cores, key=lambda c: c.id)
    n = len(ring)
    for i, c in enumerate(ring):
        near = {ring[(i + d) % n].handle for d in (-4, -3, -2, -1, 1, 2, 3, 4)}
        fingers = {
            ring[(i + s * (1 << j)) % n].handle for j in range(n.bit_length()) for s in (1, -1)
        }
        c.known = sorted((near | fingers) - {c.handle}, key=lambda h: h.id)
        c.ready = True
