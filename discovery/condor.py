"""The Condor Module: flocking decisions and manager changes as HTCondor configuration.

Theory of operation. Butt et al. 2006 §4.1 splits poolD into an Information Gatherer, a Policy
Manager, a Flocking Manager and a *Condor Module* that "interfaces with the local Condor
installation". This module is the last: it turns values into configuration text and applies
it. It is an adapter (it writes files and runs commands); the sans-io plugins never call it
directly but receive an applier callable (:class:`FlockConfigApplier`,
:class:`CondorHostApplier`) and call it with a value.

The module is in three parts: :mod:`discovery.condor_render` turns values into configuration
text (what the HTCondor manual asks for on the submit and execute sides, and for a new central
manager), :mod:`discovery.condor_apply` writes a fragment atomically into ``LOCAL_CONFIG_DIR``
and reconfigures the daemons (rolling back when that fails), and this module holds the two
appliers the plugins are given and the applied decision a :class:`FlockConfigApplier` keeps
across restarts. Every name of the three is importable from here.

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
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from discovery.condor_apply import (
    Reconfig,
    apply_config,
    apply_flock_config,
    atomic_write,
    command,
    default_reconfig,
    htcondor_reconfig,
)
from discovery.condor_render import (
    ALLOW_FROM_FLOCK,
    FlockSource,
    fragment_version,
    render_condor_host,
    render_execute_config,
    render_flock_config,
    render_submit_config,
)
from discovery.condor_syntax import (
    CondorError,
    is_valid_contact,
    is_valid_host_pattern,
    parse_config,
    parse_with_htcondor,
)
from discovery.decision import FlockDecision, FlockTarget

__all__ = [
    "ALLOW_FROM_FLOCK",
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
    "fragment_version",
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

# -- the applied version, kept across restarts ------------------------------------------------


def applied_state_path(config_path: str | os.PathLike[str]) -> Path:
    """Where a persisting :class:`FlockConfigApplier` keeps its applied decision: next to the
    fragment, under a dot name (HTCondor's ``LOCAL_CONFIG_DIR_EXCLUDE_REGEXP`` skips it)."""
    p = Path(config_path)
    return p.parent / f".{p.name}.applied"


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
            on_disk = fragment_version(self.path.read_text())
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
                atomic_write(sp, encode_applied_state(decision), 0o644)
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
                        atomic_write(sp, old_state, 0o644)
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
