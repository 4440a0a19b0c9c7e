"""Applying configuration: atomic config.d writes, reconfigure, rollback, and the appliers."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from discovery.condor import (
    FLOCK_CONFIG_FILE,
    CondorHostApplier,
    FlockConfigApplier,
    FlockSource,
    apply_config,
    command,
    default_reconfig,
    render_condor_host,
)
from discovery.condor_syntax import CondorError, parse_config, parse_with_htcondor
from discovery.decision import FlockDecision, FlockTarget

#: HTCondor's default LOCAL_CONFIG_DIR_EXCLUDE_REGEXP (param_info.in): files it never reads
EXCLUDE = re.compile(
    r"^((\..*)|(.*\.pl)|(.*\.py)|(.*\.sh)|(.*~)|(#.*)|(.*\.rpmsave)|(.*\.rpmnew)"
    r"|(.*\.dpkg-old)|(.*\.dpkg-dist)|(.*\.cfsaved))$"
)
OLD = render_condor_host("cm-old.example.org")
NEW = render_condor_host("cm-new.example.org:9618")


class Calls:
    def __init__(self, fail: bool = False) -> None:
        self.n = 0
        self.fail = fail

    def __call__(self) -> None:
        self.n += 1
        if self.fail:
            raise RuntimeError("condor_reconfig: can't connect to local master")


def decision(seq: int, *collectors: str, epoch: int = 1) -> FlockDecision:
    targets = tuple(FlockTarget(f"{i:040x}", c) for i, c in enumerate(collectors))
    return FlockDecision(enabled=bool(collectors), targets=targets, epoch=epoch, seq=seq)


def test_writes_then_reconfigures_once_and_skips_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "config.d" / "98-flockring-manager.config"
    path.parent.mkdir()
    rc = Calls()
    assert apply_config(path, OLD, reconfig=rc) is True
    assert path.read_text() == OLD and rc.n == 1
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert apply_config(path, OLD, reconfig=rc) is False and rc.n == 1
    path.chmod(0o640)
    assert apply_config(path, NEW, reconfig=rc) is True and rc.n == 2
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # the site's mode is kept
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_failing_reconfig_restores_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "98-flockring-manager.config"
    apply_config(path, OLD, reconfig=Calls())
    with pytest.raises(CondorError, match=r"previous 98-flockring-manager\.config restored"):
        apply_config(path, NEW, reconfig=Calls(fail=True))
    assert path.read_text() == OLD
    fresh = tmp_path / "99-new.config"
    with pytest.raises(CondorError, match="can't connect"):
        apply_config(fresh, NEW, reconfig=Calls(fail=True))
    assert not fresh.exists()  # there was no previous file: none is left
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_invalid_fragment_is_refused_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "x.config"
    path.write_text(OLD)
    rc = Calls()
    with pytest.raises(CondorError, match="line 2: ALLOW_ADMINISTRATOR is not a knob"):
        apply_config(path, "FLOCK_TO = cm.example.org\nALLOW_ADMINISTRATOR = *\n\n", reconfig=rc)
    with pytest.raises(CondorError, match="line 2"):
        apply_config(path, "FLOCK_TO = a.org,\nb c\n", reconfig=rc)
    assert path.read_text() == OLD and rc.n == 0
    with pytest.raises(CondorError, match="does not exist"):
        apply_config(tmp_path / "missing" / "x.config", OLD, reconfig=rc)


def test_failed_write_leaves_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.config"
    path.write_text(OLD)

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    rc = Calls()
    with pytest.raises(CondorError, match="No space left"):
        apply_config(path, NEW, reconfig=rc)
    assert path.read_text() == OLD and rc.n == 0
    assert [p.name for p in tmp_path.iterdir()] == ["x.config"]


def test_a_crash_mid_write_leaves_no_partial_file(tmp_path: Path) -> None:
    d = tmp_path / "config.d"
    d.mkdir()
    path = d / FLOCK_CONFIG_FILE
    path.write_text(OLD)
    # the child dies (SIGKILL) after writing the temp file, before the rename
    child = textwrap.dedent(
        f"""
        import os, signal
        os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        from discovery.condor import apply_config
        apply_config({str(path)!r}, {NEW!r}, reconfig=lambda: None)
        """
    )
    res = subprocess.run([sys.executable, "-c", child], cwd=Path(__file__).parents[1], timeout=60)
    assert res.returncode == -9
    assert path.read_text() == OLD  # the old file, whole
    left = sorted(p.name for p in d.iterdir() if p != path)
    assert len(left) == 1 and EXCLUDE.match(left[0])  # a leftover HTCondor never reads
    assert (d / left[0]).read_text() == NEW
    # HTCondor's own loader reads the directory as if the leftover were not there
    got = parse_with_htcondor(f"LOCAL_CONFIG_DIR = {d}\n", ["CONDOR_HOST"])
    assert got == {"CONDOR_HOST": "cm-old.example.org"}
    # the next apply cleans it up
    assert apply_config(path, NEW, reconfig=lambda: None)
    assert sorted(p.name for p in d.iterdir()) == [path.name]


def test_flock_applier_applies_only_newer_decisions(tmp_path: Path) -> None:
    path = tmp_path / FLOCK_CONFIG_FILE
    rc = Calls()
    apply = FlockConfigApplier(path, reconfig=rc, admitted=[FlockSource("b", ("sub.b.org",))])
    d3 = decision(3, "cm.c.org", "cm.b.org")
    # delivered out of order and twice: the newest wins and is never rolled back
    for d in (decision(1, "cm.a.org"), d3, decision(2, "cm.b.org"), d3, decision(1, "cm.x.org")):
        apply(d)
    assert apply.applied == d3
    assert parse_config(path.read_text())["FLOCK_TO"] == "cm.c.org, cm.b.org"
    assert parse_config(path.read_text())["FLOCK_FROM"] == "sub.b.org"
    assert apply.stats == {"applied": 2, "stale": 3}
    assert rc.n == 2
    assert apply(decision(0, "cm.z.org", epoch=2))  # a new manager epoch beats any seq
    assert apply.set_admitted([])
    assert parse_config(path.read_text())["FLOCK_FROM"] == ""
    assert parse_config(path.read_text())["FLOCK_TO"] == "cm.z.org"


def test_flock_applier_restarts_the_schedd_only_when_flocking_turns_off(tmp_path: Path) -> None:
    restarts = Calls()
    apply = FlockConfigApplier(tmp_path / "f.config", reconfig=Calls(), restart_schedd=restarts)
    apply(decision(1))  # off from the start: nothing to forget
    apply(decision(2, "cm.a.org"))
    apply(decision(3, "cm.b.org"))
    assert restarts.n == 0
    apply(decision(4))  # on -> off: a reconfigure would keep the old list
    assert restarts.n == 1 and apply.stats["restarts"] == 1
    apply(decision(5))
    assert restarts.n == 1


def test_flock_applier_failure_keeps_the_applied_decision(tmp_path: Path) -> None:
    path = tmp_path / "f.config"
    ok = FlockConfigApplier(path, reconfig=Calls())
    ok(decision(1, "cm.a.org"))
    bad = FlockConfigApplier(path, reconfig=Calls(fail=True))
    with pytest.raises(CondorError):
        bad(decision(2, "cm.b.org"))
    assert bad.applied is None and bad.stats["failed"] == 1
    assert parse_config(path.read_text())["FLOCK_TO"] == "cm.a.org"


def test_condor_host_applier(tmp_path: Path) -> None:
    rc = Calls()
    apply = CondorHostApplier(
        tmp_path / "99-flockring-pond.config", reconfig=rc, subsystem="STARTD"
    )
    assert apply("cm-pond.example.org:9618") and apply.current == "cm-pond.example.org:9618"
    assert parse_config((tmp_path / "99-flockring-pond.config").read_text()) == {
        "STARTD.CONDOR_HOST": "cm-pond.example.org",
        "STARTD.COLLECTOR_HOST": "cm-pond.example.org:9618",
    }
    assert not apply("cm-pond.example.org:9618") and rc.n == 1
    with pytest.raises(CondorError):
        apply("cm.example.org\nSTART = True")
    assert apply.current == "cm-pond.example.org:9618"


def test_command_reconfig_reports_exit_status() -> None:
    command([sys.executable, "-c", "pass"])()
    with pytest.raises(CondorError, match="exited 3: boom"):
        command([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"])()
    with pytest.raises(CondorError):
        command(["/nonexistent/condor_reconfig"])()


def test_default_reconfig_uses_condor_reconfig_from_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "called"
    exe = tmp_path / "condor_reconfig"
    exe.write_text(f"#!/bin/sh\necho reconfigured > {marker}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    default_reconfig()()
    assert marker.read_text() == "reconfigured\n"


def test_default_reconfig_without_condor_fails_clearly() -> None:
    # no condor_reconfig on PATH and no local condor_master: a CondorError, not a hang or
    # a traceback from the bindings (in a child: the bindings' state stays out of this process)
    code = (
        "from discovery.condor import default_reconfig, CondorError\n"
        "try:\n    default_reconfig()()\nexcept CondorError as e:\n    print('CondorError', e)\n"
    )
    env = {**os.environ, "PATH": "/nonexistent"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=Path(__file__).parents[1],
        check=True,
    )
    assert out.stdout.startswith("CondorError reconfigure through htcondor2 failed")
