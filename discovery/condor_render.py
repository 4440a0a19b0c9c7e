"""The Condor Module's rendering half: flocking decisions and managers as configuration text.

Theory of operation: see :mod:`discovery.condor` (Butt et al. 2006 §4.1, the Condor Module).
Pure functions of values, no I/O: the same inputs give the same bytes, so an unchanged decision
rewrites nothing. What the HTCondor manual asks for ("Connecting HTCondor pools with flocking";
admin-manual/configuration/schedd.html and collector.html):

* submit side (read by every ``condor_schedd``): ``FLOCK_TO``, the central managers to flock
  to in order of preference (nearest first here). ``FLOCK_COLLECTOR_HOSTS`` and
  ``FLOCK_NEGOTIATOR_HOSTS`` default to ``$(FLOCK_TO)`` in current HTCondor; the schedd
  disables flocking when the two lists differ in length, so the fragment sets both to
  ``$(FLOCK_TO)`` explicitly, which overrides stale static lists from older configuration.
* execute side (read by the ``condor_collector`` and every ``condor_startd``): ``FLOCK_FROM``,
  the submit machines (schedds) of the pools the policy admits, and the four authorization
  lists the manual builds from it, ``ALLOW_{WRITE,READ}_{COLLECTOR,STARTD} = $(ALLOW_...),
  $(FLOCK_FROM)`` (inside ``if defined ALLOW_...``: an undefined list already allows all, and
  the unguarded form would shrink it to the flock hosts). Since 9.0 pools default to token
  security (IDTOKENS), where ``ALLOW_WRITE`` is ``*`` and what really gates flocking is that
  the remote schedd can authenticate to this collector; the lists still restrict under
  host-based security.
* a PonD worker or a new manager (PonD §3.2, Butt et al. 2006 §4.2): ``CONDOR_HOST`` (and
  ``COLLECTOR_HOST``, which defaults to it).

The first line of the submit side names the decision's ``(epoch, seq)``;
:func:`fragment_version` reads it back, so an applier can tell which decision a fragment on disk
was rendered from.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import attrs

from discovery.condor_syntax import (
    CondorError,
    is_valid_contact,
    is_valid_host_pattern,
    split_contact,
)
from discovery.decision import FlockDecision

__all__ = [
    "ALLOW_FROM_FLOCK",
    "FlockSource",
    "fragment_version",
    "render_condor_host",
    "render_execute_config",
    "render_flock_config",
    "render_submit_config",
]


def _as_tuple(hosts: Iterable[str]) -> tuple[str, ...]:
    return (hosts,) if isinstance(hosts, str) else tuple(hosts)


@attrs.frozen(slots=True)
class FlockSource:
    """A pool admitted to flock *into* this one, and the submit machines it flocks from.

    ``FLOCK_FROM`` lists schedds, not central managers (collector.html: "schedd names that
    should be allowed to flock to this central manager"); when a pool's schedd runs on its
    central manager, ``submit_hosts`` is that one host. Wildcards are allowed
    (``*.cs.wisc.edu``).
    """

    pool_name: str
    submit_hosts: tuple[str, ...] = attrs.field(converter=_as_tuple)

    @submit_hosts.validator
    def _check(self, _a: object, hosts: tuple[str, ...]) -> None:
        for h in hosts:
            if not is_valid_host_pattern(h):
                raise CondorError(f"pool {self.pool_name!r}: invalid submit host {h!r}")


# -- rendering ---------------------------------------------------------------------------------


def _dedup(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for it in items:
        key = it.lower()
        if key not in seen:
            seen.add(key)
            out.append(it)
    return out


def render_submit_config(
    decision: FlockDecision,
    *,
    static_flock_to: Sequence[str] = (),
    flock_increment: int | None = None,
    min_flock_level: int | None = None,
) -> str:
    """The submit side: ``FLOCK_TO`` in the decision's order (nearest first), then any
    ``static_flock_to`` partners of the site (always listed, lowest preference).

    A disabled decision renders the static partners only (often an empty ``FLOCK_TO``; see the
    module notes on turning flocking off).
    """
    contacts = [t.collector for t in decision.targets] if decision.enabled else []
    for c in [*contacts, *static_flock_to]:
        if not is_valid_contact(c):
            raise CondorError(f"invalid collector contact {c!r} (host or host:port expected)")
    flock_to = _dedup([*contacts, *static_flock_to])
    state = f"on, {len(contacts)} targets nearest first" if decision.enabled else "off"
    lines = [
        f"# flockring flocking decision epoch={decision.epoch} seq={decision.seq}: {state}",
        f"FLOCK_TO = {', '.join(flock_to)}".rstrip(),
        "FLOCK_COLLECTOR_HOSTS = $(FLOCK_TO)",
        "FLOCK_NEGOTIATOR_HOSTS = $(FLOCK_TO)",
    ]
    if flock_increment is not None:
        if flock_increment < 1:
            raise CondorError("FLOCK_INCREMENT must be >= 1")
        lines.append(f"FLOCK_INCREMENT = {flock_increment}")
    if min_flock_level is not None:
        if min_flock_level < 0:
            raise CondorError("MIN_FLOCK_LEVEL must be >= 0")
        lines.append(f"MIN_FLOCK_LEVEL = {min_flock_level}")
    return "\n".join(lines) + "\n"


#: the authorization lists the manual builds from ``FLOCK_FROM`` (connecting-pools-with-
#: flocking.html; HTCondor's ``security:host_based`` defaults have the same form)
ALLOW_FROM_FLOCK = (
    ("ALLOW_WRITE_COLLECTOR", "ALLOW_WRITE"),
    ("ALLOW_WRITE_STARTD", "ALLOW_WRITE"),
    ("ALLOW_READ_COLLECTOR", "ALLOW_READ"),
    ("ALLOW_READ_STARTD", "ALLOW_READ"),
)


def render_execute_config(
    admitted: Sequence[FlockSource | str], *, allow_lines: bool = True
) -> str:
    """The execute side: ``FLOCK_FROM`` for the admitted pools only, and the ``ALLOW_*``
    lines built from it (``allow_lines=False`` when the site writes its own; they must then
    include ``$(FLOCK_FROM)``). An empty list admits nobody."""
    hosts: list[str] = []
    names: list[str] = []
    for a in admitted:
        if isinstance(a, FlockSource):
            hosts.extend(a.submit_hosts)
            names.append(a.pool_name)
        else:
            if not is_valid_host_pattern(a):
                raise CondorError(f"invalid FLOCK_FROM entry {a!r}")
            hosts.append(a)
            names.append(a)
    flock_from = _dedup(hosts)
    lines = [
        f"# flockring: pools admitted to flock here: {', '.join(names) or 'none'}",
        f"FLOCK_FROM = {', '.join(flock_from)}".rstrip(),
    ]
    if allow_lines:
        # guarded: where ALLOW_WRITE / ALLOW_READ is not defined everyone is allowed already,
        # and "$(ALLOW_WRITE), $(FLOCK_FROM)" would shrink the list to the flock hosts
        for base in ("ALLOW_WRITE", "ALLOW_READ"):
            lines.append(f"if defined {base}")
            lines += [f"{k} = $({b}), $(FLOCK_FROM)" for k, b in ALLOW_FROM_FLOCK if b == base]
            lines.append("endif")
    return "\n".join(lines) + "\n"


def render_flock_config(
    decision: FlockDecision | None,
    *,
    admitted: Sequence[FlockSource | str] | None = None,
    static_flock_to: Sequence[str] = (),
    flock_increment: int | None = None,
    min_flock_level: int | None = None,
    allow_lines: bool = True,
) -> str:
    """The whole fragment for one pool: the submit side for ``decision`` (omitted when None)
    and the execute side for ``admitted`` (omitted when None). Deterministic text: the same
    inputs give the same bytes, so unchanged decisions rewrite nothing."""
    parts = ["# Written by flockring; rewritten on every flocking decision, do not edit.\n"]
    if decision is not None:
        parts.append(
            render_submit_config(
                decision,
                static_flock_to=static_flock_to,
                flock_increment=flock_increment,
                min_flock_level=min_flock_level,
            )
        )
    if admitted is not None:
        parts.append(render_execute_config(admitted, allow_lines=allow_lines))
    return "".join(parts)


def render_condor_host(manager_contact: str, *, subsystem: str | None = None) -> str:
    """``CONDOR_HOST`` (and ``COLLECTOR_HOST``) pointing at a new central manager.

    ``CONDOR_HOST`` is the bare host, because host-based ``ALLOW_*`` defaults list it;
    ``COLLECTOR_HOST`` (which defaults to ``$(CONDOR_HOST)``) is the full contact, port
    included, and is set too so that a site's literal ``COLLECTOR_HOST`` cannot win. ``subsystem``
    (e.g. ``"STARTD"``) scopes both to one daemon, as a PonD worker's startd needs (PonD
    §3.2).
    """
    if not is_valid_contact(manager_contact):
        raise CondorError(f"invalid manager contact {manager_contact!r}")
    if subsystem is not None and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", subsystem):
        raise CondorError(f"invalid subsystem name {subsystem!r}")
    host, _port = split_contact(manager_contact)
    pre = f"{subsystem.upper()}." if subsystem else ""
    return (
        f"# flockring: central manager is {manager_contact}\n"
        f"{pre}CONDOR_HOST = {host}\n"
        f"{pre}COLLECTOR_HOST = {manager_contact}\n"
    )


_VERSION_LINE = re.compile(r"^# flockring flocking decision epoch=(\d+) seq=(\d+):", re.M)


def fragment_version(text: str) -> tuple[int, int] | None:
    """The ``(epoch, seq)`` of the decision a fragment was rendered from (its submit side's
    header line), or None when it has no submit side."""
    m = _VERSION_LINE.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None
