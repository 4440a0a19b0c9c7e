"""attrs validators shared by the config classes: a config is validated when it is built.

Each validator raises :class:`overlay.errors.ConfigError` naming the field, the rule and the
value it refused (``"level_s must be > 0, got 0"``), so that a bad config fails where it is
built, never deep inside a protocol. Use them as ``attrs.field(default=..., validator=positive)``.
The comparisons are written ``not value > 0`` so that NaN is refused too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from overlay.errors import ConfigError

__all__ = ["at_least", "non_negative", "non_negative_int", "positive"]

#: the signature attrs calls a validator with: (instance, attribute, value)
Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def positive(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    """Refuse anything not > 0 (zero, negatives, NaN)."""
    if not value > 0:
        raise ConfigError(f"{attr.name} must be > 0, got {value!r}")


def non_negative(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    """Refuse anything not >= 0 (negatives, NaN)."""
    if not value >= 0:
        raise ConfigError(f"{attr.name} must be >= 0, got {value!r}")


def non_negative_int(_inst: object, attr: attrs.Attribute[Any], value: int) -> None:
    """Refuse anything that is not an ``int`` >= 0 (``bool`` is refused too)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{attr.name} must be an int >= 0, got {value!r}")


def at_least(lo: float) -> Validator:
    """A validator refusing anything not >= ``lo`` (NaN included)."""

    def check(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
        if not value >= lo:
            raise ConfigError(f"{attr.name} must be >= {lo}, got {value!r}")

    return check
