"""What the join and maintenance protocols see of the Pastry core that owns them.

The core (:mod:`overlay.pastry.core`) builds a :class:`~overlay.pastry.join.JoinProtocol` and a
:class:`~overlay.pastry.maintenance.Maintenance` and dispatches messages to them; they in turn
read and change the node's state (leaf set, routing table, proximity) through the core's
mutators, which keep the invariants that span both (MSPastry §3: a leaf-set change notifies the
joiner and the maintenance timers). They type against this protocol rather than importing the
core class, so the import graph has arrows in one direction only: core → join, maintenance →
host and the state modules below it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Protocol

from overlay.handle import Address, NodeHandle
from overlay.ids import NodeId
from overlay.pastry.config import PastryConfig
from overlay.pastry.leaf_set import LeafSet
from overlay.pastry.routing_table import RoutingTable
from overlay.proximity import Proximity
from overlay.runtime import Runtime

__all__ = ["JoinerView", "MaintenanceView", "PastryHost", "TablesView"]


class JoinerView(Protocol):
    """What maintenance uses of the join protocol: the bootstrap seeds (partition healing), the
    node the join went through and the nearest nodes its discovery found (announcements)."""

    seeds: list[Address]
    entry: NodeHandle | None
    near_found: list[NodeHandle]


class MaintenanceView(Protocol):
    """What the join protocol and the table maintenance use of the leaf-set maintenance."""

    def on_ready(self) -> None:
        """The node became ready: start heartbeats and row exchange."""

    def table_leaf_check(self) -> None:
        """Offer routing-table entries that belong in the leaf set."""


class TablesView(Protocol):
    """What join and maintenance use of the routing-table maintenance (``tables.py``)."""

    def on_ready(self) -> None:
        """The join finished: announce us and start the join's row walks."""

    def repair_slot(self, row: int, col: int) -> None:
        """A dead entry's slot: refill it locally and ask a peer for its entry."""

    def walk(self, nonce: object) -> Any:
        """The outstanding walk with this nonce, or None."""

    def offer_walk(
        self, src: NodeHandle, entries: Sequence[NodeHandle], rtts: Sequence[float], walk: Any
    ) -> None:
        """Offer the rows a walk hop sent."""

    def end_walk(self, nonce: int) -> None:
        """Forget a finished walk."""


class PastryHost(Protocol):
    """The state and mutators of a Pastry node, as join and maintenance use them."""

    runtime: Runtime
    handle: NodeHandle
    id: NodeId
    config: PastryConfig
    stats: Counter[str]
    ready: bool
    stopped: bool
    prox: Proximity
    leaf: LeafSet
    table: RoutingTable

    @property
    def joiner(self) -> JoinerView:
        """The node's join protocol."""

    @property
    def maint(self) -> MaintenanceView:
        """The node's maintenance protocol."""

    @property
    def tables(self) -> TablesView:
        """The node's routing-table maintenance."""

    def add_leaf(self, h: NodeHandle) -> bool:
        """Offer ``h`` to the leaf set; True if it was added."""

    def learn_alive(self, h: NodeHandle) -> None:
        """``h`` answered us: offer it to the leaf set and the routing table."""

    def offer_leaves(self, cands: Iterable[NodeHandle], skip_dead: bool = True) -> None:
        """Offer leaf-set candidates (probing those not yet known alive)."""

    def consider(self, h: NodeHandle, probe: bool) -> bool:
        """Offer ``h`` to the routing table (proximity neighbour selection)."""

    def near_enough_s(self) -> float:
        """RTT within which nothing nearer is worth a probe (config plus timing noise)."""

    def hints(self, entries: Iterable[NodeHandle]) -> tuple[float, ...]:
        """Our measured RTT to each of ``entries`` (-1 = unknown): hints sent with candidates."""

    def offer_hinted(
        self,
        via: NodeHandle | None,
        entries: Sequence[NodeHandle],
        rtts: Sequence[float],
        budget: int,
        via_rtt_hint: float | None = None,
        fill_unmeasured: bool = True,
        spare: Collection[NodeHandle] = (),
    ) -> int:
        """Offer candidates with RTT hints to the routing table (bounded, pruned probing)."""

    def drop_dead(self, h: NodeHandle) -> None:
        """Remove ``h`` as dead (even if it was already marked dead)."""

    def accept_failure_report(self, h: NodeHandle, found_at: float) -> None:
        """A peer reported ``h`` failed: probe it ourselves (rate-limited)."""

    def route(
        self, key: NodeId | None, app: str, payload: Any, hint: NodeHandle | None = None
    ) -> None:
        """KBR route (see :meth:`overlay.kbr.KbrCore.route`)."""

    def register(self, name: str, app: Any) -> None:
        """Register a KBR application."""


#: signature of a join completion callback
JoinDone = Callable[[bool], None]
#: a sequence of seed addresses
Seeds = Sequence[Address]
