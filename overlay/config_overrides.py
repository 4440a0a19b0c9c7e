"""``FIELD=VALUE`` overrides of an overlay config, as the command line gives them.

A FreePastry deployment tunes its node with a params file; ours are frozen attrs configs
(``PastryConfig``, ``SmallWorldConfig``) whose defaults cite their sources. Operators
(``flockring node --set``) and researchers (``flockring bench churn --set``) change a field
without code: ``field=value`` for a field of the config itself, ``group.field=value`` for one of
a nested config (``kbr``, ``proximity``), the rest keeping the base's values. Values are JSON
(numbers, ``true``/``false``, strings in quotes). Anything that is not a field, or that the
config's validators refuse, raises :class:`~overlay.errors.ConfigError` saying what.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

import attrs

from overlay.errors import ConfigError

__all__ = ["with_overrides"]

C = TypeVar("C")


def with_overrides(base: C, pairs: Sequence[str], flag: str = "--set") -> C:
    """``base`` with the ``FIELD=VALUE`` / ``GROUP.FIELD=VALUE`` overrides of ``pairs``
    (``flag`` names the option in error messages)."""
    if not attrs.has(type(base)):
        raise ConfigError(f"{flag}: {type(base).__name__} is not a config")
    name_of = type(base).__name__
    kw: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for p in pairs:
        name, sep, value = p.partition("=")
        if not sep or not name:
            raise ConfigError(f"{flag} needs FIELD=VALUE, got {p!r}")
        try:
            v = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"{flag} {name}: not a JSON value: {value!r}") from None
        group, dot, field = name.partition(".")
        if dot:
            nested.setdefault(group, {})[field] = v
        else:
            kw[name] = v
    known = attrs.fields_dict(type(base))  # type: ignore[arg-type]  # attrs.has checked above
    for name in kw:
        if name not in known:
            raise ConfigError(f"{flag} {name}: {name_of} has no field {name!r}")
    try:
        for group, fields in nested.items():
            sub = getattr(base, group, None)
            if sub is None or not attrs.has(type(sub)):
                raise ConfigError(f"{flag} {group}.…: {name_of} has no nested config {group!r}")
            inner = attrs.fields_dict(type(sub))
            for f in fields:
                if f not in inner:
                    raise ConfigError(
                        f"{flag} {group}.{f}: {type(sub).__name__} has no field {f!r}"
                    )
            kw[group] = attrs.evolve(sub, **fields)
        out: C = attrs.evolve(base, **kw)  # type: ignore[misc]  # checked by attrs.has above
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:  # a validator's refusal (or a value of a wrong type)
        raise ConfigError(f"{flag}: {e}") from None
    return out
