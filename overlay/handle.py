"""NodeHandle: a node's id plus the transport address that reaches it.

The address is opaque to the cores: an ``int`` index in the simulator, a string such as
``"udp://127.0.0.1:9000"`` on a live transport. Handles are immutable and hash by (id, address),
so they can key dicts and sit in sets everywhere in the cores.

A handle is a ``NamedTuple`` rather than an attrs class on purpose: handles are hashed and
compared on every routing hop and every liveness lookup, and a tuple does both in C (profiling
the simulator showed the attrs-generated ``__hash__``/``__eq__`` at ~10% of a quiet run).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple

from overlay.ids import NodeId

Address = Hashable


class NodeHandle(NamedTuple):
    """Who a node is (``id``) and where it is (``address``)."""

    id: NodeId
    address: Address

    def __repr__(self) -> str:
        return f"<{self.id.short()}@{self.address}>"
