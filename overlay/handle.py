"""NodeHandle: a node's id plus the transport address that reaches it.

The address is opaque to the cores: an ``int`` index in the simulator, a string such as
``"udp://127.0.0.1:9000"`` on a live transport. Handles are immutable and hash by (id, address),
so they can key dicts and sit in sets everywhere in the cores.
"""

from __future__ import annotations

from collections.abc import Hashable

import attrs

from overlay.ids import NodeId

Address = Hashable


@attrs.frozen(slots=True, cache_hash=True, repr=False)
class NodeHandle:
    """Who a node is (``id``) and where it is (``address``)."""

    id: NodeId
    address: Address

    def __repr__(self) -> str:
        return f"<{self.id.short()}@{self.address}>"
