"""Pastry overlay (Rowstron & Druschel 2001; MSPastry 2003; FreePastry 2.1); docs/pastry.md.

Public names: :class:`PastryCore` (the sans-io node), :class:`PastryConfig`, :func:`build_oracle`
(steady state for large simulations), :func:`table_quality` / :class:`RowQuality` (brute-force
check of routing-table proximity), and the building blocks :class:`LeafSet`,
:class:`RoutingTable`, :class:`JoinState`.
"""

from overlay.pastry.config import PastryConfig
from overlay.pastry.core import PastryCore
from overlay.pastry.join import JOIN_APP, JoinState
from overlay.pastry.leaf_set import LeafSet
from overlay.pastry.oracle import RowQuality, build_oracle, table_quality
from overlay.pastry.routing_table import RoutingTable

__all__ = [
    "JOIN_APP",
    "JoinState",
    "LeafSet",
    "PastryConfig",
    "PastryCore",
    "RoutingTable",
    "RowQuality",
    "build_oracle",
    "table_quality",
]
