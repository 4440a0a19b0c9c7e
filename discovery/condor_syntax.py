"""HTCondor configuration syntax: contact strings, host patterns, and fragment checks.

Theory of operation. Everything the Condor Module writes into HTCondor's configuration comes
from values that other pools announced over the overlay (collector contacts, submit hosts). A
contact such as ``"cm.example.org\nALLOW_ADMINISTRATOR = *"`` would inject configuration, so
every value is checked against a strict grammar before it is rendered, and every rendered
fragment is checked again before it is written (:func:`parse_config`): ``NAME = value`` lines
with HTCondor's name characters (``is_valid_param_name`` in HTCondor's ``config.cpp``: letters,
digits, ``_ . /``) and per-knob values. :func:`parse_with_htcondor` additionally loads a
fragment with HTCondor's own parser from the ``htcondor`` wheel (no daemon needed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path

from overlay.errors import OverlayError

#: what ``htcondor2.param`` gives: typed for knobs HTCondor knows (ints, bools), else str
ParamValue = str | int | float | bool | None

__all__ = [
    "KNOWN_KNOBS",
    "CondorError",
    "ParamValue",
    "is_valid_contact",
    "is_valid_host_pattern",
    "parse_config",
    "parse_with_htcondor",
    "split_contact",
]


class CondorError(OverlayError):
    """HTCondor configuration could not be rendered, validated, written or applied."""


# -- contact strings and host patterns ---------------------------------------------------------

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = rf"{_LABEL}(?:\.{_LABEL})*"
_IPV4 = r"(?:25[0-5]|2[0-4]\d|1?\d?\d)(?:\.(?:25[0-5]|2[0-4]\d|1?\d?\d)){3}"
_IPV6 = r"\[[0-9A-Fa-f:.]{2,45}\]"
_PORT = r"(?::(?:6553[0-5]|655[0-2]\d|65[0-4]\d\d|6[0-4]\d{3}|[1-5]\d{4}|[1-9]\d{0,3}))"
_CONTACT_RE = re.compile(rf"(?:{_HOST}|{_IPV4}|{_IPV6}){_PORT}?")
# FLOCK_FROM / ALLOW entries: host names or addresses with ``*`` wildcards, an IPv4 network
# (``10.1.0.0/16``), optionally after an authenticated identity (``condor@domain/host``)
_WLABEL = r"(?:\*|[A-Za-z0-9*](?:[A-Za-z0-9*-]{0,61}[A-Za-z0-9*])?)"
_WHOST = rf"{_WLABEL}(?:\.{_WLABEL})*"
_NET = rf"{_IPV4}/(?:3[0-2]|[12]?\d)"
_IDENT = r"(?:[A-Za-z0-9_.*-]+@[A-Za-z0-9_.*-]+/)"
_PATTERN_RE = re.compile(rf"{_IDENT}?(?:{_NET}|{_WHOST}|{_IPV6})")
_NAME_RE = re.compile(r"[A-Za-z0-9_./]+")  # HTCondor's is_valid_param_name (config.cpp)
_MACRO_RE = re.compile(r"\$\(([A-Za-z0-9_./]+)\)")


def is_valid_contact(contact: str) -> bool:
    """True for ``host``, ``host:port``, an IPv4 or bracketed IPv6 address (with a port).

    Contacts arrive in announcements from other pools: anything else (spaces, commas, ``$``,
    newlines) could inject configuration, so receivers should drop announcements that fail
    this check, and the renderers refuse them.
    """
    return len(contact) <= 255 and _CONTACT_RE.fullmatch(contact) is not None


def is_valid_host_pattern(pattern: str) -> bool:
    """True for a ``FLOCK_FROM``/``ALLOW_*`` entry: host or address, ``*`` wildcards allowed,
    an IPv4 network, optionally ``identity@domain/`` first."""
    return len(pattern) <= 255 and _PATTERN_RE.fullmatch(pattern) is not None


def split_contact(contact: str) -> tuple[str, str | None]:
    """``(host, port or None)`` of a valid contact (IPv6 keeps its brackets)."""
    if contact.startswith("["):
        host, _, rest = contact.partition("]")
        return host + "]", rest[1:] if rest.startswith(":") else None
    host, sep, port = contact.rpartition(":")
    return (host, port) if sep else (contact, None)


# -- validation --------------------------------------------------------------------------------

_LIST_KNOBS = {"FLOCK_TO", "FLOCK_COLLECTOR_HOSTS", "FLOCK_NEGOTIATOR_HOSTS"}
#: every knob the Condor Module writes; anything else in a fragment is refused
KNOWN_KNOBS = frozenset(
    {
        *_LIST_KNOBS,
        "FLOCK_INCREMENT",
        "MIN_FLOCK_LEVEL",
        "FLOCK_FROM",
        "ALLOW_WRITE_COLLECTOR",
        "ALLOW_WRITE_STARTD",
        "ALLOW_READ_COLLECTOR",
        "ALLOW_READ_STARTD",
        "CONDOR_HOST",
        "COLLECTOR_HOST",
    }
)
_EMPTY_OK = {"FLOCK_TO", "FLOCK_FROM"}
_INT_KNOBS = {"FLOCK_INCREMENT": 1, "MIN_FLOCK_LEVEL": 0}


def _check_value(name: str, value: str) -> str | None:
    """Why ``value`` is not acceptable for knob ``name`` (None: fine)."""
    base = name.rsplit(".", 1)[-1].upper()
    if any(c in value for c in "\\\"'#\t\r\n") or "$" in _MACRO_RE.sub("", value):
        return "unexpected character (quote, backslash, '#' or a '$' outside $(NAME))"
    if not value:
        return None if base in _EMPTY_OK else "empty value"
    if base in _INT_KNOBS:
        try:
            v = import_module("classad2").ExprTree(value).eval()
        except Exception as e:
            return f"not a ClassAd value: {e}"
        if not isinstance(v, int) or isinstance(v, bool) or v < _INT_KNOBS[base]:
            return f"expected an integer >= {_INT_KNOBS[base]}"
        return None
    items = [i for i in re.split(r"[,\s]+", value) if i]
    if base in ("CONDOR_HOST", "COLLECTOR_HOST") and len(items) != 1:
        return "expected one host"
    for it in items:
        if _MACRO_RE.fullmatch(it):
            continue  # a reference to another knob, e.g. $(FLOCK_TO)
        if base in _LIST_KNOBS or base in ("CONDOR_HOST", "COLLECTOR_HOST"):
            if not is_valid_contact(it):
                return f"{it!r} is not a host or host:port"
        elif (base == "FLOCK_FROM" or base.startswith("ALLOW_")) and not is_valid_host_pattern(it):
            return f"{it!r} is not a host pattern"
    return None


def parse_config(text: str, *, source: str = "fragment", known_only: bool = True) -> dict[str, str]:
    """Check ``text`` the way the fragments are written and return ``{NAME: value}``.

    Accepted: blank lines, ``#`` comments, unnested ``if defined NAME`` ... ``endif`` and
    ``NAME = value`` lines, with HTCondor's name characters (letters, digits, ``_ . /``),
    each name once (and, with ``known_only``, only the knobs this package writes:
    :data:`KNOWN_KNOBS`, optionally ``SUBSYS.``-prefixed), no continuation lines, and
    per-knob values: host/contact lists, host patterns, ``$(NAME)``
    references, integers that ``classad2`` parses. This is a pure check (no daemon, no
    ``htcondor2.param``); :func:`parse_with_htcondor` runs HTCondor's own parser.
    Raises :class:`CondorError` naming the line.
    """
    out: dict[str, str] = {}
    guard: int | None = None  # line of an open ``if defined NAME``
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if words[0] == "if":
            if guard is not None or len(words) != 3 or words[1] != "defined":
                raise CondorError(f"{source}, line {n}: only unnested 'if defined NAME' is used")
            if not _NAME_RE.fullmatch(words[2]):
                raise CondorError(f"{source}, line {n}: invalid name {words[2]!r}")
            guard = n
            continue
        if words[0] == "endif":
            if guard is None or len(words) != 1:
                raise CondorError(f"{source}, line {n}: 'endif' without 'if'")
            guard = None
            continue
        name, eq, value = line.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not _NAME_RE.fullmatch(name):
            raise CondorError(f"{source}, line {n}: expected NAME = value, got {raw!r}")
        if known_only and name.rsplit(".", 1)[-1].upper() not in KNOWN_KNOBS:
            raise CondorError(f"{source}, line {n}: {name} is not a knob flockring writes")
        if name.upper() in {k.upper() for k in out}:
            raise CondorError(f"{source}, line {n}: {name} is set twice")
        why = _check_value(name, value)
        if why is not None:
            raise CondorError(f"{source}, line {n}: {name}: {why}")
        out[name] = value
    if guard is not None:
        raise CondorError(f"{source}, line {guard}: 'if' without 'endif'")
    return out


def parse_with_htcondor(
    text: str, names: Sequence[str], *, timeout_s: float = 60.0
) -> dict[str, ParamValue]:
    """Load ``text`` with HTCondor's own configuration parser and return ``param`` values
    (macros expanded, HTCondor's defaults applied) for ``names``.

    Runs in a child Python with ``CONDOR_CONFIG`` pointing at a file holding ``text`` (the
    bindings read the configuration at import and the parameter table is process-global);
    no daemon is needed. A configuration error raises :class:`CondorError` with HTCondor's
    message.
    """
    code = (
        "import json, sys\nimport htcondor2\n"
        "print(json.dumps({n: htcondor2.param.get(n) for n in sys.argv[1:]}))\n"
    )
    with tempfile.TemporaryDirectory(prefix="flockring-condor-") as d:
        cfg = Path(d) / "condor_config"
        cfg.write_text(text)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.upper().startswith(("_CONDOR_", "CONDOR_CONFIG"))
        }
        env.update(CONDOR_CONFIG=str(cfg), HOME=d)
        try:
            res = subprocess.run(
                [sys.executable, "-c", code, *names],
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CondorError(f"could not run HTCondor's parser: {e}") from e
    if res.returncode != 0:
        msg = (res.stderr or res.stdout).strip().replace(str(cfg), "<fragment>")
        raise CondorError(f"HTCondor rejected the configuration: {msg}")
    values: dict[str, ParamValue] = json.loads(res.stdout)
    return values
