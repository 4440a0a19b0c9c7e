"""One simulated node and the narrow view of a network that analytic walks need.

Kept apart from :mod:`sim_adapter.network` so that modules the network uses (the analytic
query of :mod:`sim_adapter.fastquery`) can name these types without importing the network.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from overlay.handle import NodeHandle
from overlay.kbr import KbrCore

if TYPE_CHECKING:
    from sim_adapter.latency import LatencyModel

__all__ = ["NetworkView", "SimNode"]


class SimNode:
    """One simulated node: its core plus bookkeeping."""

    __slots__ = ("alive", "core", "handle", "id", "index")

    def __init__(self, index: int, handle: NodeHandle, core: KbrCore) -> None:
        self.index = index
        self.id = handle.id
        self.handle = handle
        self.core = core
        self.alive = True

    def __repr__(self) -> str:
        return f"SimNode({self.index}, {self.id.short()}, alive={self.alive})"


class NetworkView(Protocol):
    """What an analytic walk reads of a :class:`~sim_adapter.network.Network`."""

    @property
    def nodes(self) -> Sequence[SimNode]:
        """Every node ever spawned, by index (dead ones included, ``alive`` False)."""

    @property
    def latency(self) -> LatencyModel:
        """The network's latency model."""

    @property
    def loss(self) -> float:
        """Per-message loss probability."""

    @property
    def seed(self) -> int:
        """The network's seed."""
