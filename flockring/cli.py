"""The ``flockring`` command (docs/design.md): the one floor that may import every package.

User mistakes print one line on stderr and exit non-zero, never a traceback: every
``OverlayError`` (and argparse's own usage errors) end in :func:`main`'s handler.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from overlay.errors import OverlayError

#: modules contributing top-level subcommands; each has ``register(subparsers)``.
COMMAND_MODULES = (
    "flockring.cmd_live",
    "flockring.cmd_discovery",
    "flockring.demo_discovery",
    "flockring.cmd_sim",
)

#: the module of :data:`COMMAND_MODULES` that registers each top-level command, so that a
#: command imports its own module only: ``status``, ``route`` or ``node`` then start without
#: the simulator, networkx and numpy (~1 s of imports every benchmark and experiment needs and
#: no live command does). ``tests/test_cli_parser.py`` checks it against what the modules
#: register.
COMMANDS: dict[str, str] = {
    "node": "flockring.cmd_live",
    "status": "flockring.cmd_live",
    "route": "flockring.cmd_live",
    "demo": "flockring.cmd_live",
    "flock": "flockring.cmd_discovery",
    "query": "flockring.cmd_discovery",
    "pond": "flockring.cmd_discovery",
    "manager": "flockring.cmd_discovery",
    "demo-discovery": "flockring.demo_discovery",
    "sim": "flockring.cmd_sim",
}


class CliError(OverlayError):
    """A mistake on the command line (bad address, unreadable file, …)."""


def _words(argv: Sequence[str]) -> list[str]:
    """The words of ``argv`` before the first option after the command: the command and, for
    ``bench``, the benchmark's name (the only options before them are ``-v``, which take no
    value)."""
    out: list[str] = []
    for a in argv:
        if a.startswith("-"):
            if out:
                break
            continue
        out.append(a)
    return out


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``flockring`` argument parser: every command module's subcommands plus ``bench``.

    Given the ``argv`` it will parse, it registers only the command named there when that is a
    known one (for ``bench NAME``, only that benchmark's module); anything else — no command,
    ``--help``, a misspelt command — gets the full parser, whose messages list every command.
    The parser for one command is the one the full parser holds for it."""
    p = argparse.ArgumentParser(
        prog="flockring",
        description="Self-organizing P2P overlays and HTC resource discovery.",
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    words = _words(sys.argv[1:] if argv is None else argv)
    command = words[0] if words else None
    if command in COMMANDS:
        importlib.import_module(COMMANDS[command]).register(sub)
        return p
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    from sim_adapter import bench

    bp = sub.add_parser("bench", help="run a benchmark and print its figures (JSON with --json)")
    bsub = bp.add_subparsers(dest="bench", metavar="NAME")
    bsub.required = True
    one = bench.module_of(words[1]) if command == "bench" and len(words) > 1 else None
    if one is None:
        bench.register_all(bsub)
    else:
        bench.register_modules(bsub, (one,))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``flockring`` command on ``argv``; return the exit status (errors print one line on
    stderr)."""
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_usage(sys.stderr)
        return 2
    try:
        rc = func(args)
    except OverlayError as e:
        print(f"flockring: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("flockring: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"flockring: error: {e.strerror or e}", file=sys.stderr)
        return 1
    return int(rc) if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
