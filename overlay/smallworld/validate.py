"""Checks of small-world message fields that arrive from the network.

Theory of operation: the wire codec (``overlay/wire.py``) already checks every field against its
annotation on live nodes, but handlers also run on messages handed over as objects (the
simulator without fidelity, hostile-input tests), and some fields carry more than their type
says (a NodeHandle must hold a NodeId; a time must be finite). A failed check raises
:class:`MalformedInput`; the KBR base drops and counts the message (``dropped_malformed``).
"""

from __future__ import annotations

import math

from overlay.handle import NodeHandle
from overlay.ids import NodeId

__all__ = ["MalformedInput", "check_handle", "check_int", "check_time"]


class MalformedInput(ValueError):
    """Raised inside a handler on hostile/broken input; the KBR base drops and counts it."""


def check_handle(h: object) -> NodeHandle:
    """Return ``h`` if it is a NodeHandle with a NodeId, else raise MalformedInput."""
    if not isinstance(h, NodeHandle) or not isinstance(h.id, NodeId):
        raise MalformedInput(f"not a NodeHandle: {type(h).__name__}")
    return h


def check_time(x: object) -> float:
    """Return ``x`` as a float if it is a finite number (not a bool), else raise MalformedInput."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        raise MalformedInput(f"not a finite number: {x!r}")
    return float(x)


def check_int(x: object) -> int:
    """Return ``x`` if it is an int (not a bool), else raise MalformedInput."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise MalformedInput(f"not an int: {type(x).__name__}")
    return x
