"""The Condor Module: flocking decisions and manager changes as HTCondor configuration.

Theory of operation. Butt et al. 2006 §4.1 splits poolD into an Information Gatherer, a Policy
Manager, a Flocking Manager and a *Condor Module* that "interfaces with the local Condor
installation". This module is the last: it turns values into configuration text and applies
it. It is an adapter (it writes files and runs commands); the sans-io plugins never call it
directly but receive an applier callable (:class:`FlockConfigApplier`,
:class:`CondorHostApplier`) and call it with a value.

What the HTCondor manual asks for ("Connecting HTCondor pools with flocking";
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

Applying: the fragment is written atomically into a file of ``LOCAL_CONFIG_DIR`` (``config.d``,
read in lexical order, last wins; names starting with ``.`` are skipped by HTCondor's default
``LOCAL_CONFIG_DIR_EXCLUDE_REGEXP``, so the temporary file is never read half-written), then
the daemons are asked to reconfigure (``condor_reconfig``, or the bindings' ``send_command``).
If reconfiguring fails, the previous file is put back.

Turning flocking *off* needs more than a reconfigure. Read in HTCondor's source (schedd.cpp,
``Scheduler::Init``, which ``Scheduler::reconfig`` calls; not run here): the schedd rebuilds
its flock lists only when ``FLOCK_COLLECTOR_HOSTS`` is non-empty, and ``param()`` returns
nothing for an empty value, so emptying ``FLOCK_TO`` and reconfiguring keeps the old list until
the schedd restarts.
:class:`FlockConfigApplier` can restart the schedd on that transition (opt-in).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any

import attrs

from discovery.condor_syntax import (
    CondorError,
    is_valid_contact,
    is_valid_host_pattern,
    parse_config,
    parse_with_htcondor,
    split_contact,
)
from discovery.decision import FlockDecision, FlockTarget

__all__ = [
    "FLOCK_CONFIG_FILE",
    "MANAGER_CONFIG_FILE",
    "POND_CONFIG_FILE",
    "CondorError",
    "CondorHostApplier",
    "FlockConfigApplier",
    "FlockSource",
    "Reconfig",
    "applied_state_path",
    "apply_config",
    "apply_flock_config",
    "command",
    "default_reconfig",
    "encode_applied_state",
    "htcondor_reconfig",
    "is_valid_contact",
    "is_valid_host_pattern",
    "parse_config",
    "parse_with_htcondor",
    "read_applied_state",
    "render_condor_host",
    "render_execute_config",
    "render_flock_config",
    "render_submit_config",
]

log = logging.getLogger(__name__)

#: config.d file names: ``99-`` sorts after the distribution's files so these values win; the
#: pond file sorts after the manager file because a pond is a temporary, narrower membership
FLOCK_CONFIG_FILE = "99-flockring-flock.config"
MANAGER_CONFIG_FILE = "98-flockring-manager.config"
POND_CONFIG_FILE = "99-flockring-pond.config"


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


# -- applying ----------------------------------------------------------------------------------

#: asks the daemons to re-read their configuration; raises on failure
Reconfig = Callable[[], None]


def command(argv: Sequence[str], *, timeout_s: float = 60.0) -> Reconfig:
    """A :data:`Reconfig` that runs ``argv`` (e.g. ``("condor_reconfig",)``) and raises
    :class:`CondorError` with its output when it fails."""
    args = list(argv)

    def run() -> None:
        try:
            res = subprocess.run(
                args, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CondorError(f"{' '.join(args)}: {e}") from e
        if res.returncode != 0:
            out = (res.stderr or res.stdout).strip()
            raise CondorError(f"{' '.join(args)} exited {res.returncode}: {out}")

    return run


def htcondor_reconfig() -> Reconfig:
    """A :data:`Reconfig` through the bindings: locate the local ``condor_master`` and send
    it ``DaemonCommand.Reconfig`` (the master passes it on to its daemons). Not run against a
    live daemon here."""

    def run() -> None:
        try:
            htcondor2: Any = import_module("htcondor2")
            master = htcondor2.Collector().locate(htcondor2.DaemonType.Master)
            if master is None:
                raise CondorError("no local condor_master found")
            htcondor2.send_command(master, htcondor2.DaemonCommand.Reconfig)
        except CondorError:
            raise
        except Exception as e:
            raise CondorError(f"reconfigure through htcondor2 failed: {e}") from e

    return run


def default_reconfig() -> Reconfig:
    """``condor_reconfig`` when it is on PATH (at call time), else the bindings."""

    def run() -> None:
        exe = shutil.which("condor_reconfig")
        if exe is not None:
            command((exe,))()
        else:
            htcondor_reconfig()()

    return run


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return  # not every platform opens directories; the rename itself is atomic
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, text: str, mode: int) -> None:
    # a dot name: HTCondor's LOCAL_CONFIG_DIR_EXCLUDE_REGEXP skips it, even if left by a crash
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _remove_stale_temps(path: Path) -> None:
    for p in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            p.unlink()


def apply_config(
    path: str | os.PathLike[str],
    fragment: str,
    *,
    reconfig: Reconfig | None = None,
    validate: bool = True,
) -> bool:
    """Write ``fragment`` to ``path`` (a ``config.d`` file) atomically and reconfigure.

    Temp file in the same directory, fsync, ``os.replace``, fsync of the directory: a crash
    leaves the old file or the new one, never a partial one. Unchanged content writes nothing
    and returns False. If ``reconfig`` (default :func:`default_reconfig`) fails, the previous
    file (or its absence) is restored and :class:`CondorError` raised.
    """
    p = Path(path)
    text = fragment if fragment.endswith("\n") else fragment + "\n"
    if validate:
        parse_config(text, source=str(p))
    if not p.parent.is_dir():
        raise CondorError(f"configuration directory {p.parent} does not exist")
    _remove_stale_temps(p)
    try:
        old: str | None = p.read_text()
        mode = stat.S_IMODE(p.stat().st_mode)
    except FileNotFoundError:
        old, mode = None, 0o644
    except OSError as e:
        raise CondorError(f"cannot read {p}: {e}") from e
    if old == text:
        return False
    try:
        _atomic_write(p, text, mode)
    except OSError as e:
        raise CondorError(f"cannot write {p}: {e}") from e
    try:
        (reconfig if reconfig is not None else default_reconfig())()
    except Exception as e:
        try:
            if old is None:
                p.unlink()
                _fsync_dir(p.parent)
            else:
                _atomic_write(p, old, mode)
        except OSError as e2:
            raise CondorError(
                f"reconfigure failed ({e}) and {p} could not be restored: {e2}"
            ) from e2
        raise CondorError(f"reconfigure failed, previous {p.name} restored: {e}") from e
    log.info("applied %s", p)
    return True


#: another name for :func:`apply_config` (the flocking fragment is one use of it)
apply_flock_config = apply_config


# -- the applied version, kept across restarts ------------------------------------------------

_VERSION_LINE = re.compile(r"^# flockring flocking decision epoch=(\d+) seq=(\d+):", re.M)


def applied_state_path(config_path: str | os.PathLike[str]) -> Path:
    """Where a persisting :class:`FlockConfigApplier` keeps its applied decision: next to the
    fragment, under a dot name (HTCondor's ``LOCAL_CONFIG_DIR_EXCLUDE_REGEXP`` skips it)."""
    p = Path(config_path)
    return p.parent / f".{p.name}.applied"


def _fragment_version(text: str) -> tuple[int, int] | None:
    m = _VERSION_LINE.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def encode_applied_state(d: FlockDecision) -> str:
    """The state file's JSON text for ``d``."""
    return (
        json.dumps(
            {
                "epoch": d.epoch,
                "seq": d.seq,
                "enabled": d.enabled,
                "at_s": d.at_s,
                "targets": [attrs.asdict(t) for t in d.targets],
            },
            sort_keys=True,
        )
        + "\n"
    )


def _field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    v = obj[name]
    if (isinstance(v, bool) and kind is int) or not isinstance(v, kind):
        raise ValueError(name)
    return v


def read_applied_state(path: str | os.PathLike[str]) -> FlockDecision | None:
    """The decision in a state file, or None if it is absent or malformed (never raises)."""
    try:
        obj = json.loads(Path(path).read_text())
        if not isinstance(obj, dict):
            return None
        epoch, seq = _field(obj, "epoch", int), _field(obj, "seq", int)
        if epoch < 0 or seq < 0:
            return None
        at = _field(obj, "at_s", (int, float))
        targets = []
        for t in _field(obj, "targets", list):
            if not isinstance(t, dict):
                return None
            rtt = t.get("rtt_s")
            if rtt is not None and (isinstance(rtt, bool) or not isinstance(rtt, int | float)):
                return None
            targets.append(
                FlockTarget(
                    _field(t, "node_id", str),
                    _field(t, "collector", str),
                    _field(t, "pool_name", str),
                    None if rtt is None else float(rtt),
                    _field(t, "free_machines", int),
                    _field(t, "row", int),
                )
            )
        enabled = _field(obj, "enabled", bool)
        return FlockDecision(enabled, tuple(targets), float(at), epoch, seq)
    except (OSError, ValueError, KeyError, TypeError):
        return None


class FlockConfigApplier:
    """Renders and applies flocking decisions, newest only: the callable a plugin is given.

    ``applier(decision)`` writes the fragment (:func:`render_flock_config`) and reconfigures;
    a decision not newer than the applied one (by ``(epoch, seq)``) is ignored and counted, so
    a submit machine that receives decisions late or twice converges to the newest and never
    goes back. ``restart_schedd`` (e.g. ``command(("condor_restart", "-daemon", "schedd"))``)
    runs when flocking goes from a non-empty ``FLOCK_TO`` to an empty one, because a
    reconfigure alone keeps the old list (module notes); without it that transition is logged.
    With ``persist`` the applied decision is also kept in a dot file next to the fragment
    (:func:`applied_state_path`, atomic write) and :meth:`load` reads it back at start, so a
    rebooted submit machine still refuses every decision older than the one it applied.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        admitted: Sequence[FlockSource | str] | None = None,
        reconfig: Reconfig | None = None,
        restart_schedd: Reconfig | None = None,
        static_flock_to: Sequence[str] = (),
        flock_increment: int | None = None,
        min_flock_level: int | None = None,
        allow_lines: bool = True,
        persist: bool = False,
    ) -> None:
        self.path = Path(path)
        #: with ``persist``: the applied decision is kept in :attr:`state_path` (see :meth:`load`)
        self.state_path: Path | None = applied_state_path(self.path) if persist else None
        self._admitted = admitted
        self._reconfig = reconfig
        self._restart = restart_schedd
        self._static = tuple(static_flock_to)
        self._increment = flock_increment
        self._min_level = min_flock_level
        self._allow_lines = allow_lines
        #: the newest decision applied (None: none yet)
        self.applied: FlockDecision | None = None
        self._flocking_to: tuple[str, ...] = ()
        #: applied, unchanged, stale, restarts, failed
        self.stats: Counter[str] = Counter()

    def render(self, decision: FlockDecision | None) -> str:
        """The fragment this applier would write for ``decision``."""
        return render_flock_config(
            decision,
            admitted=self._admitted,
            static_flock_to=self._static,
            flock_increment=self._increment,
            min_flock_level=self._min_level,
            allow_lines=self._allow_lines,
        )

    def __call__(self, decision: FlockDecision) -> bool:
        """Apply ``decision`` if it is newer than the applied one; True if the file changed."""
        if not decision.newer_than(self.applied):
            self.stats["stale"] += 1
            return False
        return self._apply(decision)

    def set_admitted(self, admitted: Sequence[FlockSource | str] | None) -> bool:
        """Change the pools admitted to flock here and re-apply (policy reload)."""
        self._admitted = admitted
        return self._apply(self.applied)

    def load(self) -> FlockDecision | None:
        """With ``persist``: read the decision applied before a restart into :attr:`applied`
        and return it (None: none, or no persistence). A submit machine that reboots thus never
        applies a decision older than the one it applied last.

        The state file is written *before* the fragment (:meth:`_apply`), so a crash between the
        two leaves the state ahead of the fragment; ``load`` then re-applies the stored decision
        (the fragment's header line names the version it was rendered from). An unreadable
        state file is logged and counted (``state_unreadable``) and ignored.
        """
        if self.state_path is None:
            return None
        d = read_applied_state(self.state_path)
        if d is None:
            if self.state_path.exists():
                self.stats["state_unreadable"] += 1
                log.warning("ignoring unreadable %s", self.state_path)
            return None
        self.applied = d
        self.stats["state_loaded"] += 1
        try:
            on_disk = _fragment_version(self.path.read_text())
        except OSError:
            on_disk = None
        if on_disk != d.version:
            self.stats["state_repaired"] += 1
            self._apply(d)
        return d

    def _apply(self, decision: FlockDecision | None) -> bool:
        text = self.render(decision)
        sp = self.state_path
        old_state: str | None = None
        if sp is not None and decision is not None:
            try:
                old_state = sp.read_text()
            except OSError:
                old_state = None
            try:
                _atomic_write(sp, encode_applied_state(decision), 0o644)
            except OSError as e:
                self.stats["failed"] += 1
                raise CondorError(f"cannot write {sp}: {e}") from e
        try:
            changed = apply_config(self.path, text, reconfig=self._reconfig)
        except CondorError:
            self.stats["failed"] += 1
            if sp is not None and decision is not None:  # the fragment was rolled back: so is it
                with contextlib.suppress(OSError):
                    if old_state is None:
                        sp.unlink()
                    else:
                        _atomic_write(sp, old_state, 0o644)
            raise
        self.applied = decision
        self.stats["applied" if changed else "unchanged"] += 1
        if decision is not None:
            now_to = tuple(parse_config(text).get("FLOCK_TO", "").replace(",", " ").split())
            if self._flocking_to and not now_to:
                if self._restart is not None:
                    self._restart()
                    self.stats["restarts"] += 1
                else:
                    log.warning(
                        "FLOCK_TO emptied in %s: the schedd keeps its old flock list until "
                        "it restarts (condor_restart -daemon schedd)",
                        self.path,
                    )
            self._flocking_to = now_to
        return changed


class CondorHostApplier:
    """Points this machine's daemons at a central manager: the callable the failover and
    PonD plugins are given (``applier("cm.example.org:9618")``)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        reconfig: Reconfig | None = None,
        subsystem: str | None = None,
    ) -> None:
        self.path = Path(path)
        self._reconfig = reconfig
        self._subsystem = subsystem
        #: the manager contact applied last (None: none yet)
        self.current: str | None = None

    def __call__(self, manager_contact: str) -> bool:
        """Render and apply ``CONDOR_HOST``; True if the file changed."""
        text = render_condor_host(manager_contact, subsystem=self._subsystem)
        changed = apply_config(self.path, text, reconfig=self._reconfig)
        self.current = manager_contact
        return changed
