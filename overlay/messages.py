"""Message base class and the type registry used by the wire codec.

Theory of operation: every protocol message is a frozen, slotted attrs class deriving from
:class:`Message` and registered under a small integer tag with :func:`register`. The codec
(``overlay/wire.py``) maps a message to ``(tag, [field values])`` and back; nothing is pickled.
Tags are grouped by protocol so modules never collide:

=========  ======================================
1–15       KBR routing (overlay/kbr.py)
16–19      live control requests (overlay/live/control.py: status, lookup)
20–29      proximity probes (overlay/proximity.py)
30–59      Pastry (overlay/pastry/)
60–89      small-world ring (overlay/smallworld/)
90–109     multicast / aggregation (overlay/multicast/)
110–199    discovery plugins (discovery/)
200–254    tests and experiments
=========  ======================================

Messages built inside a core are trusted and type-checked by mypy; messages that arrive from the
network are validated field by field by the wire codec before a core ever sees them (validating
every internally built message would cost the 10^6-node simulator more than it protects).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, TypeVar

import attrs

from overlay.errors import OverlayError


@attrs.frozen(slots=True)
class Message:
    """Base of every protocol message. Subclasses are ``@attrs.frozen`` and ``@register``-ed."""

    TAG: ClassVar[int] = 0


REGISTRY: dict[int, type[Message]] = {}

M = TypeVar("M", bound=type[Message])


def register(tag: int) -> Callable[[M], M]:
    """Class decorator: give a message class its wire tag (1–254, unique)."""

    def deco(cls: M) -> M:
        if not 1 <= tag <= 254:
            raise OverlayError(f"message tag {tag} outside 1..254")
        other = REGISTRY.get(tag)
        if other is not None and other is not cls:
            raise OverlayError(f"message tag {tag} used by {other.__name__} and {cls.__name__}")
        cls.TAG = tag
        REGISTRY[tag] = cls
        return cls

    return deco
