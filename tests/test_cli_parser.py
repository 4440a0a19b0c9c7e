"""The ``flockring`` parser registers only the command it is given, and that command's parser is
the one the full parser holds (``flockring.cli.build_parser``)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from flockring import cli
from sim_adapter import bench


def _registered(module: str) -> list[str]:
    """The subcommands ``module.register`` adds, read off a fresh parser (the brute force)."""
    sub = argparse.ArgumentParser().add_subparsers()
    importlib.import_module(module).register(sub)
    return list(sub.choices)


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


FULL = cli.build_parser(["--help"])
BENCHES = _subparsers(_subparsers(FULL)["bench"])


def test_the_command_table_is_what_the_modules_register() -> None:
    seen = {name: mod for mod in cli.COMMAND_MODULES for name in _registered(mod)}
    assert seen == cli.COMMANDS
    assert set(_subparsers(FULL)) == {*cli.COMMANDS, "bench"}


def test_every_benchmark_name_finds_its_module() -> None:
    seen = {name: mod for mod in bench.BENCH_MODULES for name in _registered(mod)}
    assert seen == {name: bench.module_of(name) for name in seen}
    assert set(BENCHES) == set(seen)
    assert bench.module_of("nope") is None and bench.module_of("__init__") is None


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_one_command_gets_the_parser_the_full_one_holds(command: str) -> None:
    p = cli.build_parser(["-v", command, "--some-option", "x"])
    assert list(_subparsers(p)) == _registered(cli.COMMANDS[command])
    assert _subparsers(p)[command].format_help() == _subparsers(FULL)[command].format_help()


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_one_benchmark_gets_the_parser_the_full_one_holds(name: str) -> None:
    p = cli.build_parser(["bench", name, "--json"])
    (only,) = _subparsers(_subparsers(p)["bench"]).values()
    assert only.format_help() == BENCHES[name].format_help()


@pytest.mark.parametrize(
    "argv", [[], ["--help"], ["-v", "nope"], ["bench"], ["bench", "--json"], ["bench", "nope"]]
)
def test_anything_else_gets_the_full_parser(argv: list[str]) -> None:
    p = cli.build_parser(argv)
    want = set(BENCHES) if argv[:1] == ["bench"] else set(cli.COMMANDS) | {"bench"}
    got = _subparsers(p)
    if argv[:1] == ["bench"]:
        got = _subparsers(got["bench"])
    assert set(got) == want


def test_a_live_command_imports_no_simulator() -> None:
    code = (
        "import sys\n"
        "from flockring import cli\n"
        "for c in ('node', 'status', 'route', 'flock', 'query', 'pond', 'manager'):\n"
        "    cli.build_parser([c])\n"
        "print(sorted(m for m in ('sim_adapter', 'networkx', 'numpy', 'matplotlib')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
