"""Reading a policy file: TOML parsing, validation, and errors that point at the line.

Theory of operation: :mod:`tomllib` parses the text (its syntax errors carry a line and
column, which :class:`~discovery.policy.PolicyError` surfaces); then every table and key is
checked against the documented format and compiled into the frozen types of
:mod:`discovery.policy`. ``tomllib`` gives no positions for values that parse but mean nothing
to us (an unknown action, a malformed pattern, a negative quota), so :class:`_Locator` scans
the raw text once for table headers and keys and the error names the offending key's line (for
a bad list element, the element's own line). The result is built only when everything is
valid: nothing is ever half-loaded.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from discovery.policy_rules import (
    ACTIONS,
    DEFAULT_BLACKLIST_S,
    DENY_BY_DEFAULT,
    DIRECTIONS,
    Agreement,
    Pattern,
    PolicyError,
    Rule,
    Sharing,
    UserRule,
    compile_pattern,
)

__all__ = ["ParsedPolicy", "parse_policy"]


class ParsedPolicy(NamedTuple):
    """The validated fields of a policy file, in ``Policy``'s field order."""

    rules: dict[str, Rule]
    sharing: Sharing
    agreements: tuple[Agreement, ...]
    users: tuple[UserRule, ...]
    source: str


def parse_policy(text: str, source: str = "<string>") -> ParsedPolicy:
    """Parse and validate policy text; raises :class:`PolicyError` naming ``source``, the line
    and what is wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        if m:
            line: int | None = int(m.group(1))
            reason = f"TOML syntax: {msg[: m.start()].strip()} (column {m.group(2)})"
        else:  # "(at end of document)": the last line
            line = max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
            reason = f"TOML syntax: {msg}"
        raise PolicyError(source, line, reason) from None
    return _Builder(text, source).build(data)


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_.-]+)\s*=""")

_ACTION_KEYS = ("allow", "deny", "default")
_SHARING_KEYS = (
    "share_threshold",
    "min_idle_s",
    "max_machines",
    "quota",
    "user_quota",
    "blacklist_s",
)
_AGREEMENT_KEYS = ("peers", "direction", "max_machines", "quota", "users", "deny_users")
_USER_KEYS = ("name", "allow", "quota")
_TOP = (*ACTIONS, "sharing", "agreement", "user")


def _unquote(k: str) -> str:
    k = k.strip()
    if len(k) >= 2 and k[0] == k[-1] and k[0] in "\"'":
        return k[1:-1]
    return k


class _Locator:
    """Finds the line of a table header or key in the raw text (tomllib gives no positions for
    values that parse but mean nothing to us)."""

    def __init__(self, text: str) -> None:
        self.headers: dict[tuple[str | int, ...], int] = {}
        self.keys: dict[tuple[tuple[str | int, ...], str], int] = {}
        counts: dict[str, int] = {}
        cur: tuple[str | int, ...] = ()
        for n, line in enumerate(text.splitlines(), start=1):
            m = _HEADER.match(line)
            if m and not _KEY.match(line):
                name = ".".join(_unquote(part) for part in m.group(2).split("."))
                if m.group(1) == "[[":
                    i = counts.get(name, 0)
                    counts[name] = i + 1
                    cur = (name, i)
                else:
                    cur = (name,)
                self.headers.setdefault(cur, n)
                continue
            k = _KEY.match(line)
            if k:
                key = _unquote(k.group(1))
                self.keys.setdefault((cur, key), n)
        self.lines = text.splitlines()

    def line(self, table: tuple[str | int, ...], key: str | None = None) -> int | None:
        if key is not None:
            n = self.keys.get((table, key))
            if n is not None:
                return n
        return self.headers.get(table)

    def item_line(self, table: tuple[str | int, ...], key: str, item: str) -> int | None:
        """Line of a list element ``item`` under ``key`` (the key's line if not found)."""
        start = self.line(table, key)
        if start is None:
            return None
        end = min(len(self.lines), start + 200)
        for needle in (f'"{item}"', f"'{item}'", item):
            for n in range(start, end + 1):
                if needle in self.lines[n - 1]:
                    return n
        return start


class _Builder:
    def __init__(self, text: str, source: str) -> None:
        self.loc = _Locator(text)
        self.source = source

    def fail(
        self, table: tuple[str | int, ...], key: str | None, reason: str, item: str | None = None
    ) -> PolicyError:
        if item is not None and key is not None:
            line = self.loc.item_line(table, key, item)
        else:
            line = self.loc.line(table, key)
        return PolicyError(self.source, line, reason)

    def _name(self, table: tuple[str | int, ...]) -> str:
        if len(table) == 2:
            return f"[[{table[0]}]] #{int(table[1]) + 1}"
        return f"[{table[0]}]"

    def _unknown(
        self, table: tuple[str | int, ...], got: Iterable[str], known: Sequence[str]
    ) -> None:
        for k in got:
            if k not in known:
                hint = _suggest(k, known)
                raise self.fail(
                    table,
                    k,
                    f"{self._name(table)}: unknown key {k!r}{hint}; expected one of "
                    + ", ".join(known),
                )

    def build(self, data: dict[str, Any]) -> ParsedPolicy:
        for k, v in data.items():
            if k not in _TOP:
                hint = _suggest(k, _TOP)
                line = self.loc.line((k,)) or self.loc.line((k, 0)) or self.loc.line((), k)
                raise PolicyError(self.source, line, f"unknown table or key {k!r}{hint}")
            if k in ("agreement", "user"):
                if not isinstance(v, list):
                    raise self.fail((), k, f"{k!r} must be written as [[{k}]] tables")
            elif not isinstance(v, dict):
                raise self.fail((), k, f"{k!r} must be a table: write [{k}]")
        rules = {a: self._rule(a, data.get(a, {})) for a in ACTIONS}
        sharing = self._sharing(data.get("sharing", {}))
        agreements = tuple(self._agreement(i, t) for i, t in enumerate(data.get("agreement", [])))
        users = tuple(self._user(i, t) for i, t in enumerate(data.get("user", [])))
        return ParsedPolicy(rules, sharing, agreements, users, self.source)

    # ------------------------------------------------------------------ pieces
    def _patterns(self, table: tuple[str | int, ...], key: str, value: Any) -> tuple[Pattern, ...]:
        if not isinstance(value, list):
            raise self.fail(
                table,
                key,
                f"{self._name(table)} {key}: expected a list of patterns, e.g. "
                f'{key} = ["host:*.example.org"], got {type(value).__name__}',
            )
        out = []
        for item in value:
            try:
                out.append(compile_pattern(item))
            except ValueError as exc:
                raise self.fail(
                    table, key, f"{self._name(table)} {key}: {exc}", item=str(item)
                ) from None
        return tuple(out)

    def _names(self, table: tuple[str | int, ...], key: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
            raise self.fail(
                table, key, f"{self._name(table)} {key}: expected a list of non-empty strings"
            )
        return tuple(value)

    def _rule(self, action: str, t: dict[str, Any]) -> Rule:
        table: tuple[str | int, ...] = (action,)
        self._unknown(table, t, _ACTION_KEYS)
        allow = self._patterns(table, "allow", t.get("allow", []))
        deny = self._patterns(table, "deny", t.get("deny", []))
        default = t.get("default", "deny" if action in DENY_BY_DEFAULT else "allow")
        if default not in ("allow", "deny"):
            raise self.fail(
                table, "default", f'[{action}] default must be "allow" or "deny", got {default!r}'
            )
        return Rule(allow, deny, default == "allow")

    def _int(self, table: tuple[str | int, ...], key: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise self.fail(
                table, key, f"{self._name(table)} {key} must be a whole number >= 0, got {v!r}"
            )
        return v

    def _seconds(self, table: tuple[str | int, ...], key: str, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
            raise self.fail(
                table, key, f"{self._name(table)} {key} must be a number of seconds >= 0, got {v!r}"
            )
        return float(v)

    def _opt_int(self, table: tuple[str | int, ...], t: dict[str, Any], key: str) -> int | None:
        return self._int(table, key, t[key]) if key in t else None

    def _sharing(self, t: dict[str, Any]) -> Sharing:
        table: tuple[str | int, ...] = ("sharing",)
        self._unknown(table, t, _SHARING_KEYS)
        return Sharing(
            share_threshold=self._int(table, "share_threshold", t.get("share_threshold", 0)),
            min_idle_s=self._seconds(table, "min_idle_s", t.get("min_idle_s", 0.0)),
            max_machines=self._opt_int(table, t, "max_machines"),
            quota=self._opt_int(table, t, "quota"),
            user_quota=self._opt_int(table, t, "user_quota"),
            blacklist_s=self._seconds(
                table, "blacklist_s", t.get("blacklist_s", DEFAULT_BLACKLIST_S)
            ),
        )

    def _agreement(self, i: int, t: Any) -> Agreement:
        table: tuple[str | int, ...] = ("agreement", i)
        if not isinstance(t, dict):
            raise self.fail(table, None, "each agreement must be a [[agreement]] table")
        self._unknown(table, t, _AGREEMENT_KEYS)
        if "peers" not in t:
            raise self.fail(table, None, f"{self._name(table)}: missing 'peers' (a pattern list)")
        peers = self._patterns(table, "peers", t["peers"])
        if not peers:
            raise self.fail(table, "peers", f"{self._name(table)}: 'peers' is empty")
        direction = t.get("direction", "both")
        if direction not in DIRECTIONS:
            raise self.fail(
                table,
                "direction",
                f"{self._name(table)} direction must be one of "
                f"{', '.join(repr(d) for d in DIRECTIONS)}, got {direction!r}",
            )
        return Agreement(
            peers=peers,
            direction=direction,
            max_machines=self._opt_int(table, t, "max_machines"),
            quota=self._opt_int(table, t, "quota"),
            users=self._names(table, "users", t.get("users", [])),
            deny_users=self._names(table, "deny_users", t.get("deny_users", [])),
            line=self.loc.line(table) or 0,
        )

    def _user(self, i: int, t: Any) -> UserRule:
        table: tuple[str | int, ...] = ("user", i)
        if not isinstance(t, dict):
            raise self.fail(table, None, "each user rule must be a [[user]] table")
        self._unknown(table, t, _USER_KEYS)
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise self.fail(
                table, "name", f"{self._name(table)}: 'name' (a user pattern) is required"
            )
        allow = t.get("allow", True)
        if not isinstance(allow, bool):
            raise self.fail(table, "allow", f"{self._name(table)} allow must be true or false")
        return UserRule(name, allow, self._opt_int(table, t, "quota"))


def _suggest(word: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
