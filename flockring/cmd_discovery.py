"""Discovery subcommands: ``flock``, ``query``, ``pond`` and ``manager`` against a live node.

Each sends one control request (``discovery.control``) to a running ``flockring node`` and
prints the answer as a ``rich`` table (plain text when stdout is not a terminal, JSON with
``--json``). The work happens on the node: a query runs from it through the overlay, a pond is
managed by it. A ClassAd syntax error comes back as the parser's message, one line, exit 1.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

import trio

from flockring.cli import CliError

__all__ = ["register"]


async def _ask(address: str, msg: Any, timeout_s: float) -> Any:
    from discovery.control import InfoReply
    from flockring.cmd_live import _client_bind, _open_transport
    from overlay.live.control import ControlClient

    async with _open_transport(_client_bind(address)) as t, ControlClient(t) as c:
        reply = await c.request(address, msg, timeout_s)
    if not isinstance(reply, InfoReply):
        raise CliError(f"unexpected answer {type(reply).__name__} from {address}")
    if not reply.ok:
        raise CliError(reply.error or "the node refused the request")
    return reply.data


def _nonce() -> int:
    import secrets

    return secrets.randbits(62)


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    """A table on stdout: rich on a terminal, aligned text otherwise."""
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title, header_style="bold")
        for c in columns:
            t.add_column(c)
        for r in rows:
            t.add_row(*("-" if v is None else str(v) for v in r))
        Console().print(t)
        return
    print(title)
    cells = [columns, *[["-" if v is None else str(v) for v in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def _run(fn: Any, *args: Any) -> Any:
    from flockring.cmd_live import _trio_run

    return _trio_run(fn, *args)


# ------------------------------------------------------------------ flock
def cmd_flock(args: argparse.Namespace) -> int:
    from discovery.control import FlockInfoRequest

    data = _run(_ask, args.address, FlockInfoRequest(_nonce(), args.condor_config), args.timeout)
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    pool = data["pool"]
    print(
        f"pool {pool['name']} ({pool['collector']}): {pool['machines']} machines, "
        f"{pool['free']} free, {pool['idle_jobs']} idle jobs, {pool['running_jobs']} running"
    )
    rows = [
        [
            e["row"],
            e["node"][:8],
            e["pool"],
            e["collector"],
            e["rtt_ms"],
            e["free"],
            e["expires_in_s"],
        ]
        for sub in data["willing"]
        for e in sub
    ]
    _table(
        "willing list (by row, nearest first)",
        ["row", "node", "pool", "collector", "rtt ms", "free", "expires in s"],
        rows,
    )
    d = data["decision"]
    if d is None:
        print("flocking decision: none yet (the manager runs once a period)")
    else:
        state = "ON" if d["enabled"] else "off"
        print(f"flocking {state} (epoch {d['epoch']}, seq {d['seq']})")
        if d["targets"]:
            print("FLOCK_TO = " + ", ".join(d["targets"]))
    if args.condor_config and data.get("condor_config"):
        print()
        print(data["condor_config"], end="")
    return 0


# ------------------------------------------------------------------ query
def _print_query(data: dict[str, Any]) -> None:
    rows = []
    for i, m in enumerate(data["matches"]):
        attrs = ", ".join(f"{k}={v}" for k, v in m["ad"].items())
        rows.append([i + 1, m["node"][:8], m["address"], f"{m['rank']:g}", attrs])
    _table("matches (best first)", ["#", "node", "address", "rank", "attributes"], rows)
    missing = data["missing"]
    print(
        f"visited {data['visited']} nodes in {data['elapsed_s']:.3f} s; "
        f"matched {data['matched']}, rejected {data['rejected']}, errors {data['errors']}, "
        f"claimed {data['claimed']}; {'early answer' if data['early'] else 'whole tree'}; "
        f"missing ranges: {len(missing)}"
    )
    for a, b in missing:
        print(f"  missing [{a[:8]}, {b[:8]})")


def cmd_query(args: argparse.Namespace) -> int:
    from discovery.control import QueryRequest

    mode = "first_fit" if args.first_fit else "best"
    msg = QueryRequest(_nonce(), args.requirements, args.rank or "", args.k, mode, args.redundant)
    data = _run(_ask, args.address, msg, args.timeout)
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        _print_query(data)
    return 0


# ------------------------------------------------------------------ pond
async def _pond(args: argparse.Namespace) -> dict[str, Any]:
    from discovery.control import PondReleaseRequest, PondRequest

    msg = PondRequest(_nonce(), args.requirements, args.rank or "", args.k)
    data: dict[str, Any] = await _ask(args.address, msg, args.timeout)
    if not args.json:
        rows = [[i + 1, n[:8], a] for i, (n, a) in enumerate(data["members"])]
        _table(f"pond {data['pond_id']} (job {data['job_id']})", ["#", "node", "address"], rows)
        print(
            f"{len(data['members'])} of {args.k} joined in {data['elapsed_s']:.3f} s; "
            f"declined {data['declined'] or 'none'}; lost {data['lost']}; surplus {data['surplus']}"
        )
    hold = args.hold
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as sigs:
        if not args.json:
            what = f"{hold:g} s" if hold is not None else "Ctrl-C"
            print(f"holding the pond; releasing after {what}", flush=True)
        with trio.move_on_after(hold if hold is not None else float("inf")):
            async for _ in sigs:
                break
    rel = await _ask(args.address, PondReleaseRequest(_nonce(), data["pond_id"]), args.timeout)
    data["release"] = rel
    if not args.json:
        print(f"released: {rel['acked']} acknowledged, {rel['unacked']} not")
    return data


def cmd_pond(args: argparse.Namespace) -> int:
    if args.k < 1:
        raise CliError("-k must be >= 1")
    data = _run(_pond, args)
    if args.json:
        print(json.dumps(data, indent=1))
    return 0


# ------------------------------------------------------------------ manager
def cmd_manager(args: argparse.Namespace) -> int:
    from discovery.control import ManagerInfoRequest

    data = _run(_ask, args.address, ManagerInfoRequest(_nonce()), args.timeout)
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    epoch = data.get("epoch")
    print(f"this node: {data.get('role')}   pool ring key: {data.get('pool')}")
    print(f"manager:   {data.get('manager')}  {data.get('manager_address') or ''}")
    if epoch:
        print(f"epoch:     term {epoch[0]} (node {str(epoch[1])[:8]})   seq {data.get('seq')}")
    holders = data.get("holders") or []
    print(f"replica holders ({len(holders)}): " + " ".join(h[:8] for h in holders))
    return 0


def register(sub: Any) -> None:
    """Add ``flock``, ``query``, ``pond`` and ``manager`` to the CLI."""
    f = sub.add_parser("flock", help="a running node's willing list and flocking decision")
    f.add_argument("address")
    f.add_argument("--condor-config", action="store_true", help="print the HTCondor fragment")
    f.add_argument("--timeout", type=float, default=5.0)
    f.add_argument("--json", action="store_true")
    f.set_defaults(func=cmd_flock)

    q = sub.add_parser("query", help="run a ClassAd tree query from a running node")
    q.add_argument("address")
    q.add_argument(
        "requirements", help="job Requirements, e.g. 'Memory > 1024 && Arch == \"X86_64\"'"
    )
    q.add_argument("--rank", help="job Rank expression (default: none)")
    q.add_argument("-k", type=int, default=1, help="machines wanted (default 1)")
    q.add_argument("--first-fit", action="store_true", help="answer as soon as k fit")
    q.add_argument("--redundant", action="store_true", help="clockwise + counter-clockwise trees")
    q.add_argument("--timeout", type=float, default=60.0)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_query)

    p = sub.add_parser("pond", help="form a Pool on Demand from a running node, then release it")
    p.add_argument("address")
    p.add_argument("requirements")
    p.add_argument("--rank")
    p.add_argument("-k", type=int, default=1)
    p.add_argument(
        "--hold", type=float, metavar="S", help="release after S seconds (default: Ctrl-C)"
    )
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_pond)

    m = sub.add_parser("manager", help="who manages a node's pool ring (failover status)")
    m.add_argument("address")
    m.add_argument("--timeout", type=float, default=5.0)
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_manager)
