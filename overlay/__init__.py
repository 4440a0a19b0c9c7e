"""flockring overlay layer: sans-io protocol cores and the trio Node facade (DESIGN §1)."""

from overlay.errors import (
    ConfigError,
    DuplicateApplicationError,
    InvalidIdError,
    JoinError,
    NotReadyError,
    OverlayError,
    UnknownApplicationError,
)
from overlay.handle import Address, NodeHandle
from overlay.ids import RING, NodeId

__all__ = [
    "RING",
    "Address",
    "ConfigError",
    "DuplicateApplicationError",
    "InvalidIdError",
    "JoinError",
    "NodeHandle",
    "NodeId",
    "NotReadyError",
    "OverlayError",
    "UnknownApplicationError",
]
