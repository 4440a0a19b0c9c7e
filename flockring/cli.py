"""The ``flockring`` command (docs/design.md): the one floor that may import every package.

User mistakes print one line on stderr and exit non-zero, never a traceback: every
``OverlayError`` (and argparse's own usage errors) end in :func:`main`'s handler.
"""

from __future__ import annotations

import argparse
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


class CliError(OverlayError):
    """A mistake on the command line (bad address, unreadable file, …)."""


def build_parser() -> argparse.ArgumentParser:
    """The ``flockring`` argument parser: every command module's subcommands plus ``bench``."""
    from sim_adapter import bench

    p = argparse.ArgumentParser(
        prog="flockring",
        description="Self-organizing P2P overlays and HTC resource discovery.",
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    bench.register_modules(sub, COMMAND_MODULES)
    bp = sub.add_parser("bench", help="run a benchmark and print its figures (JSON with --json)")
    bsub = bp.add_subparsers(dest="bench", metavar="NAME")
    bsub.required = True
    bench.register_all(bsub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``flockring`` command on ``argv``; return the exit status (errors print one line on
    stderr)."""
    parser = build_parser()
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
