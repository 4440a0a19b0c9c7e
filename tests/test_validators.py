"""The shared attrs validators (overlay/validators.py): what they refuse and how they say it."""

from __future__ import annotations

import math

import attrs
import pytest

from overlay.errors import ConfigError
from overlay.validators import at_least, non_negative, non_negative_int, positive


@attrs.frozen
class _Cfg:
    p: float = attrs.field(default=1.0, validator=positive)
    nn: float = attrs.field(default=0.0, validator=non_negative)
    ni: int = attrs.field(default=0, validator=non_negative_int)
    al: float = attrs.field(default=2.0, validator=at_least(2))


def test_defaults_pass() -> None:
    _Cfg()


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"p": 0}, "p must be > 0, got 0"),
        ({"p": math.nan}, "p must be > 0, got nan"),
        ({"nn": -1.0}, "nn must be >= 0, got -1.0"),
        ({"nn": math.nan}, "nn must be >= 0, got nan"),
        ({"ni": -1}, "ni must be an int >= 0, got -1"),
        ({"ni": True}, "ni must be an int >= 0, got True"),
        ({"ni": 1.5}, "ni must be an int >= 0, got 1.5"),
        ({"al": 1.9}, "al must be >= 2, got 1.9"),
        ({"al": math.nan}, "al must be >= 2, got nan"),
    ],
)
def test_refusals_name_field_rule_and_value(kw: dict[str, object], msg: str) -> None:
    with pytest.raises(ConfigError) as ei:
        _Cfg(**kw)  # type: ignore[arg-type]
    assert str(ei.value) == msg
