"""The Condor Module's applying half: atomic ``config.d`` writes and reconfiguring the daemons.

Theory of operation: see :mod:`discovery.condor` (Butt et al. 2006 §4.1, the Condor Module).
This is its adapter side, the only part that writes files and runs commands.

Applying: the fragment is written atomically into a file of ``LOCAL_CONFIG_DIR`` (``config.d``,
read in lexical order, last wins; names starting with ``.`` are skipped by HTCondor's default
``LOCAL_CONFIG_DIR_EXCLUDE_REGEXP``, so the temporary file is never read half-written), then
the daemons are asked to reconfigure (``condor_reconfig``, or the bindings' ``send_command``).
If reconfiguring fails, the previous file is put back. :func:`command`,
:func:`htcondor_reconfig` and :func:`default_reconfig` are the ways of reconfiguring.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any

from discovery.condor_syntax import CondorError, parse_config

__all__ = [
    "Reconfig",
    "apply_config",
    "apply_flock_config",
    "atomic_write",
    "command",
    "default_reconfig",
    "htcondor_reconfig",
]

# one logger for the whole Condor Module, as before it was split
log = logging.getLogger("discovery.condor")

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


def atomic_write(path: Path, text: str, mode: int) -> None:
    """Replace ``path`` with ``text`` (permissions ``mode``): temp file in the same directory,
    fsync, ``os.replace``, fsync of the directory, so a crash leaves the old or the new file."""
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
        atomic_write(p, text, mode)
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
                atomic_write(p, old, mode)
        except OSError as e2:
            raise CondorError(
                f"reconfigure failed ({e}) and {p} could not be restored: {e2}"
            ) from e2
        raise CondorError(f"reconfigure failed, previous {p.name} restored: {e}") from e
    log.info("applied %s", p)
    return True


#: another name for :func:`apply_config` (the flocking fragment is one use of it)
apply_flock_config = apply_config
