"""flockring overlay layer: sans-io protocol cores and the trio Node facade (docs/design.md).

The pinned public names (docs/design.md, "Public API") are importable from here. ``Node`` and
``Identity`` and the overlay configs are loaded on first use, so that importing a protocol core
(``overlay.kbr``) never pulls in trio or the crypto library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from overlay.errors import (
    ConfigError,
    DuplicateApplicationError,
    InvalidIdError,
    JoinError,
    NotReadyError,
    OverlayError,
    UnknownApplicationError,
    WildcardAddressError,
)
from overlay.handle import Address, NodeHandle
from overlay.ids import RING, NodeId

if TYPE_CHECKING:
    from overlay.identity import Identity, IdentityError
    from overlay.live.node import Node, ProbeError
    from overlay.pastry import PastryConfig
    from overlay.smallworld import SmallWorldConfig

_LAZY = {
    "Node": "overlay.live",
    "ProbeError": "overlay.live",
    "Identity": "overlay.identity",
    "IdentityError": "overlay.identity",
    "PastryConfig": "overlay.pastry",
    "SmallWorldConfig": "overlay.smallworld",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'overlay' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


__all__ = [
    "RING",
    "Address",
    "ConfigError",
    "DuplicateApplicationError",
    "Identity",
    "IdentityError",
    "InvalidIdError",
    "JoinError",
    "Node",
    "NodeHandle",
    "NodeId",
    "NotReadyError",
    "OverlayError",
    "PastryConfig",
    "ProbeError",
    "SmallWorldConfig",
    "UnknownApplicationError",
    "WildcardAddressError",
]
