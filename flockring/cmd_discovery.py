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
import time
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
    bl = [[k, v, "own"] for k, v in data.get("blacklist", {}).items()]
    for k, e in data.get("blacklist_learned", {}).items():
        bl.append([k, e["left_s"], "from " + ", ".join(x[:8] for x in e["from"])])
    if bl:
        _table("blacklisted pools (skipped)", ["pool", "left s", "source"], bl)
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


def _counts(d: dict[str, Any]) -> tuple[int, ...]:
    return (
        d["ponds_formed"],
        d["ponds_grown"],
        d["ponds_released"],
        len(d["dispatched"]),
        len(d["finished"]),
        d["idle_jobs"],
        d["running_jobs"],
    )


def _queue_line(t: float, d: dict[str, Any]) -> str:
    members = sum(len(c["members"]) for c in d["clusters"])
    return (
        f"{t:7.1f} s  ponds: {len(d['clusters'])} ({members} machines)  formed "
        f"{d['ponds_formed']}, grown {d['ponds_grown']}, released {d['ponds_released']}, "
        f"shrunk by {d['members_shrunk']}; jobs dispatched {len(d['dispatched'])}, "
        f"finished {len(d['finished'])}; queue: {d['idle_jobs']} idle, "
        f"{d['running_jobs']} running"
    )


async def _pond_queue(args: argparse.Namespace) -> dict[str, Any]:
    """Start the node's queue-driven ponds, follow them, stop them (releasing every pond)."""
    from discovery.control import PondQueueRequest

    addr, to = args.address, args.timeout
    start = PondQueueRequest(_nonce(), "start", args.interval, args.max_pond)
    data: dict[str, Any] = await _ask(addr, start, to)
    t0 = trio.current_time()
    if not args.json:
        print(
            f"queue-driven ponds on {addr}: {data['idle_jobs']} idle, {data['running_jobs']} "
            f"running jobs; minimum interval {args.interval:g} s, at most {args.max_pond} "
            "machines a pond",
            flush=True,
        )
        print(_queue_line(0.0, data), flush=True)
    timeline = [[0.0, *_counts(data)]]
    ended = "duration"
    last = _counts(data)
    limit = args.duration if args.duration is not None else float("inf")
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as sigs:
        stop_sig = trio.Event()

        async def watch() -> None:
            async for _ in sigs:
                stop_sig.set()
                return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            with trio.move_on_after(limit):
                while not stop_sig.is_set():
                    with trio.move_on_after(args.poll):
                        await stop_sig.wait()
                    if stop_sig.is_set():
                        ended = "signal"
                        break
                    data = await _ask(addr, PondQueueRequest(_nonce(), "status"), to)
                    t = trio.current_time() - t0
                    now = _counts(data)
                    if now != last:
                        last = now
                        timeline.append([round(t, 2), *now])
                        if not args.json:
                            print(_queue_line(t, data), flush=True)
                    if args.until_empty and data["queue_empty"] and not data["clusters"]:
                        ended = "empty"
                        break
            nursery.cancel_scope.cancel()
    before = data
    final: dict[str, Any] = await _ask(addr, PondQueueRequest(_nonce(), "stop"), to)
    final["before_stop"] = before
    final["ended"] = ended
    final["timeline"] = timeline
    final["elapsed_s"] = round(trio.current_time() - t0, 2)
    if not args.json:
        print(
            f"stopped ({ended}) after {final['elapsed_s']:.1f} s: ponds formed "
            f"{final['ponds_formed']}, grown {final['ponds_grown']}, released "
            f"{before['ponds_released']} as the queue emptied and {len(before['clusters'])} at "
            f"stop; jobs dispatched {len(final['dispatched'])}, finished "
            f"{len(final['finished'])}; "
            f"{len(final['violations'])} starts outside a pond"
        )
    return final


async def _pond_member(args: argparse.Namespace) -> dict[str, Any]:
    from discovery.control import PondMemberRequest

    data: dict[str, Any] = await _ask(args.address, PondMemberRequest(_nonce()), args.timeout)
    return data


def cmd_pond(args: argparse.Namespace) -> int:
    if args.member:
        data = _run(_pond_member, args)
        if args.json:
            print(json.dumps(data, indent=1))
        else:
            m = data["member_of"]
            print(
                "in no pond"
                if m is None
                else f"in pond {m['pond_id']} (job {m['job_id']}) of {m['manager'][:8]}"
            )
            rows = [
                [time.strftime("%H:%M:%S", time.localtime(t)), (mgr or "-")[:8], job or "-"]
                for t, mgr, job in data["history"]
            ]
            _table("pond memberships (joined / left)", ["time", "manager", "job"], rows)
        return 0
    if args.from_queue:
        if args.interval <= 0 or args.max_pond < 1 or args.poll <= 0:
            raise CliError("--interval and --poll must be > 0, --max-pond >= 1")
        data = _run(_pond_queue, args)
        if args.json:
            print(json.dumps(data, indent=1))
        return 0
    if not args.requirements:
        raise CliError("pond needs REQUIREMENTS (or --from-queue, or --member)")
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
    site = data.get("site")
    if site:
        sync = site["sync"]
        role = "serving (announces, decides, pushes)" if site["serving"] else "following"
        print(f"flock role: {role}   pool {site['pool_name']} ({site['collector']})")
        av = site.get("applied_version")
        print(
            "applied decision: "
            + (f"epoch {av[0]} seq {av[1]}" if av else "none yet")
            + f"   FLOCK_TO = {', '.join(site['applied_flock_to'])}"
        )
        keys = ("applied", "duplicate", "stale", "unauthorized", "bad_signature", "pulls_sent")
        print("push counters: " + "  ".join(f"{k}={sync['stats'].get(k, 0)}" for k in keys))
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

    p = sub.add_parser(
        "pond",
        help="form a Pool on Demand from a running node (or run its queue-driven ponds)",
    )
    p.add_argument("address")
    p.add_argument("requirements", nargs="?")
    p.add_argument("--rank")
    p.add_argument("-k", type=int, default=1)
    p.add_argument(
        "--hold", type=float, metavar="S", help="release after S seconds (default: Ctrl-C)"
    )
    p.add_argument(
        "--from-queue",
        action="store_true",
        help="run ponds driven by the node's job queue (one per autocluster), then release them",
    )
    p.add_argument(
        "--duration", type=float, metavar="S", help="with --from-queue: stop after S seconds"
    )
    p.add_argument(
        "--until-empty",
        action="store_true",
        help="with --from-queue: stop once the queue is empty and every pond released",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=5.0,
        metavar="S",
        help="minimum time between negotiation cycles (default 5 s, NEGOTIATOR_MIN_INTERVAL)",
    )
    p.add_argument("--max-pond", type=int, default=64, help="most machines a pond may hold")
    p.add_argument("--poll", type=float, default=1.0, metavar="S", help=argparse.SUPPRESS)
    p.add_argument("--member", action="store_true", help="which ponds the node's machine joined")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_pond)

    m = sub.add_parser("manager", help="who manages a node's pool ring (failover status)")
    m.add_argument("address")
    m.add_argument("--timeout", type=float, default=5.0)
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_manager)
