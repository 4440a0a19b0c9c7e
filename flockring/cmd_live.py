"""Live subcommands of the ``flockring`` CLI: node, status, route, demo (docs/live.md).

Theory of operation: ``node`` runs one or more :class:`overlay.Node` objects in this process on
UDP (or TCP) sockets, joins them through the given seeds (or starts a ring), prints one
machine-readable ``JOINING <id> <address>`` line as each node starts its join and ``NODE <id>
<address>`` once it has joined, and then a status table that it
refreshes. ``status`` and ``route`` are clients: they bind an ephemeral port, speak the node's
read-only control protocol (``overlay.live.node.ControlClient``: signed ``StatusRequest`` /
``LookupRequest`` datagrams) and print the answer. ``demo`` starts three ``flockring node``
processes of four nodes each on loopback, reads their ``NODE`` lines, routes lookups between
them and checks every answer against the brute-force oracle (the numerically closest id).
User mistakes end in one line on stderr and a non-zero exit (``flockring.cli.main``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import trio

from flockring import node_plugins
from flockring.cli import CliError
from flockring.tables import status_rows, status_table
from overlay.errors import OverlayError
from overlay.identity import Identity
from overlay.ids import NodeId, closer
from overlay.live.node import ControlClient, Node, StatusReply, live_config
from transports.address import AddressError, format_address, parse_address, resolve

__all__ = ["register"]


# ------------------------------------------------------------------ helpers
def _address(text: str, what: str = "address") -> str:
    try:
        out = resolve(text)
        sch = parse_address(out)[0]
    except AddressError as exc:
        raise CliError(f"bad {what}: {exc}") from None
    if sch not in ("udp", "tcp"):
        raise CliError(f"bad {what} {text!r}: use udp://HOST:PORT or tcp://HOST:PORT")
    return out


def _key(text: str) -> tuple[NodeId, str]:
    """A hex id (1–40 digits) or any other text, hashed with SHA-1 as a key."""
    t = text.strip()
    try:
        return NodeId.from_hex(t), "hex id"
    except OverlayError:
        return NodeId.hash_of(t.encode("utf-8")), f"SHA-1 of {t!r}"


def _nth_listen(address: str, index: int) -> str:
    """The listen address of the index-th node of a process: consecutive ports, or port 0."""
    sch, host, port = parse_address(address)
    return format_address(sch, host, port + index if port else 0)


def _nth_advertise(advertise: str | None, listen: str, index: int) -> str | None:
    """What the index-th node advertises: ``--advertise`` (a bare IP takes the listen scheme;
    port 0 or none: the bound port), else None (the bound address, if not a wildcard)."""
    if advertise is None:
        return None
    sch = listen.partition("://")[0]
    text = advertise if "://" in advertise else format_address(sch, advertise.strip("[]"), 0)
    return _nth_listen(_address(text, "--advertise address"), index)


def _open_transport(address: str, tls_key: Any = None) -> Any:
    from transports import open_tcp, open_udp

    if address.startswith("tcp://"):
        return open_tcp(address, tls_key=tls_key)
    return open_udp(address)


# ------------------------------------------------------------------ flockring node
async def _run_nodes(args: argparse.Namespace, out: TextIO) -> int:
    listen = _address(args.listen, "--listen address")
    seeds = [_address(s, "--join address") for s in args.join]
    count = args.nodes
    if count < 1:
        raise CliError("--nodes must be >= 1")
    identities: list[Identity | None] = []
    if args.identity:
        if count != 1:
            raise CliError("--identity works with --nodes 1 only")
        identities.append(Identity.load_or_create(args.identity))
    else:
        identities = [None] * count
    # --set: the overlay's live default config with these fields changed (one config, shared)
    config = live_config(args.overlay, args.set) if args.set else None
    nodes: list[Node] = []
    async with trio.open_nursery() as nursery:

        async def host(i: int, task_status: trio.TaskStatus[Node]) -> None:
            ident = identities[i] or Identity.generate()
            addr = _nth_listen(listen, i)
            async with _open_transport(addr, ident.private_key if args.tls else None) as t:
                node = Node(
                    t,
                    args.overlay,
                    ident,
                    config,
                    signing=not args.no_signing,
                    join_timeout_s=args.join_timeout,
                    advertise=_nth_advertise(args.advertise, listen, i),
                    sessions=not args.no_sessions,
                )
                async with node:
                    task_status.started(node)
                    await node.closed_event.wait()

        try:
            for i in range(count):
                node = await nursery.start(host, i)
                nodes.append(node)
                # announced before the join: a tool reading the lines knows the node exists
                # (and may answer lookups) before its NODE line says the join has ended
                print(f"JOINING {node.id} {node.address}", file=out, flush=True)
                await node.join(seeds if (seeds or i == 0) else [nodes[0].address])
                plugins = node_plugins.attach(args, node, i)
                if plugins is not None and plugins.flock is not None and args.pool == "condor":
                    nursery.start_soon(node_plugins.refresh_forever, plugins.flock.pool, 60.0)
                print(f"NODE {node.id} {node.address}", file=out, flush=True)
        except BaseException:
            for n in nodes:
                n.crash()
            nursery.cancel_scope.cancel()
            raise
        print(
            f"READY {count} node(s), overlay {args.overlay}; Ctrl-C to leave", file=out, flush=True
        )

        async def status_loop() -> None:
            if args.status_interval <= 0:
                return
            if not out.isatty():  # a pipe or a log: plain tables, one after the other
                while True:
                    await trio.sleep(args.status_interval)
                    out.write("\n".join(status_rows(nodes)) + "\n")
                    out.flush()
            from rich.console import Console
            from rich.live import Live

            title = f"flockring {args.overlay}: {len(nodes)} node(s), Ctrl-C to leave"
            with Live(
                status_table(nodes, title), console=Console(file=out), auto_refresh=False
            ) as live:
                while True:
                    await trio.sleep(args.status_interval)
                    live.update(status_table(nodes, title), refresh=True)

        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
            async with trio.open_nursery() as inner:
                inner.start_soon(status_loop)
                async for _ in sigs:
                    break
                inner.cancel_scope.cancel()
        for n in nodes:
            n.leave()
    print("left the overlay", file=out, flush=True)
    return 0


def _unwrap(exc: BaseException) -> BaseException:
    """The first leaf of an exception group whose leaves are the user-facing errors."""
    while isinstance(exc, BaseExceptionGroup):
        leaves = [e for e in exc.exceptions if not isinstance(e, trio.Cancelled)]
        if not leaves:
            break
        exc = leaves[0]
    return exc


def _trio_run(fn: Any, *args: Any) -> Any:
    try:
        return trio.run(fn, *args)
    except BaseExceptionGroup as eg:
        leaf = _unwrap(eg)
        if isinstance(leaf, (OverlayError, OSError, KeyboardInterrupt)):
            raise leaf from None
        raise


def cmd_node(args: argparse.Namespace) -> int:
    return int(_trio_run(_run_nodes, args, sys.stdout))


# ------------------------------------------------------------------ status / route clients
def _client_bind(target: str) -> str:
    """A local address to ask ``target`` from: loopback for loopback targets, else any."""
    sch, host, _ = parse_address(target)
    if host.startswith("127.") or host == "::1":
        local = host if sch == "udp" else ("::1" if ":" in host else "127.0.0.1")
    else:
        local = "::" if ":" in host else "0.0.0.0"
    return format_address(sch, local, 0)


def _client(address: str, tls: bool) -> tuple[Any, Identity]:
    """A transport to ask ``address`` from (TLS 1.3 with a throwaway key if ``tls``) and the
    identity the client signs its requests with."""
    ident = Identity.generate()
    return _open_transport(_client_bind(address), ident.private_key if tls else None), ident


async def _status(address: str, timeout_s: float, tls: bool = False) -> StatusReply:
    transport, ident = _client(address, tls)
    async with transport as t, ControlClient(t, ident) as c:
        return await c.status(address, timeout_s)


def _print_status(r: StatusReply, out: TextIO) -> None:
    stats = dict(r.stats)
    print(f"node     {r.handle.id}", file=out)
    print(f"address  {r.handle.address}", file=out)
    print(
        f"overlay  {r.overlay}   ready: {'yes' if r.ready else 'no'}   "
        f"up {r.uptime_s:.0f} s   known nodes: {r.known}",
        file=out,
    )
    print(f"routing table rows filled: {' '.join(map(str, r.routing_rows)) or '-'}", file=out)
    print(f"leaf set ({len(r.leaf_set)}):", file=out)
    for h in r.leaf_set:
        print(f"  {h.id.short()}  {h.address}", file=out)
    keys = (
        "delivered",
        "forwarded",
        "transport.sent",
        "transport.received",
        "reroutes",
        "route_dropped",
        "auth.forged",
        "auth.replayed",
        "auth.unsigned",
        "wire.bad_message",
    )
    print("counters: " + "  ".join(f"{k}={stats.get(k, 0)}" for k in keys), file=out)
    rate = {
        k.removeprefix("rate.dropped_"): v
        for k, v in stats.items()
        if k.startswith("rate.dropped_") and v
    }
    if rate:
        print("rate-limited: " + "  ".join(f"{k}={v}" for k, v in sorted(rate.items())), file=out)


def cmd_status(args: argparse.Namespace) -> int:
    address = _address(args.address)
    r = _trio_run(_status, address, args.timeout, args.tls)
    if args.json:
        print(json.dumps(_status_json(r)))
    else:
        _print_status(r, sys.stdout)
    return 0


def _status_json(r: StatusReply) -> dict[str, Any]:
    return {
        "id": str(r.handle.id),
        "address": r.handle.address,
        "overlay": r.overlay,
        "ready": r.ready,
        "uptime_s": r.uptime_s,
        "leaf_set": [[str(h.id), h.address] for h in r.leaf_set],
        "routing_rows": list(r.routing_rows),
        "known": r.known,
        "stats": dict(r.stats),
    }


async def _route(address: str, key: NodeId, timeout_s: float, tls: bool = False) -> dict[str, Any]:
    transport, ident = _client(address, tls)
    async with transport as t, ControlClient(t, ident) as c:
        t0 = trio.current_time()
        r = await c.lookup(address, key, timeout_s)
        return {
            "key": str(key),
            "responsible": str(r.responsible.id),
            "responsible_address": r.responsible.address,
            "entry": str(r.entry.id),
            "rtt_ms": round((trio.current_time() - t0) * 1e3, 2),
        }


def cmd_route(args: argparse.Namespace) -> int:
    address = _address(args.address)
    key, how = _key(args.key)
    res = _trio_run(_route, address, key, args.timeout, args.tls)
    if args.json:
        print(json.dumps(res))
    else:
        print(f"key          {key}  ({how})")
        print(f"entry node   {res['entry']}  {address}")
        print(f"responsible  {res['responsible']}  {res['responsible_address']}")
        print(f"answered in  {res['rtt_ms']} ms")
    return 0


# ------------------------------------------------------------------ demo
def _spawn_node(
    count: int, join: list[str], overlay: str = "pastry", extra: Sequence[str] = ()
) -> subprocess.Popen[str]:
    """Start ``flockring node`` with ``count`` nodes on loopback (``extra``: more options)."""
    cmd = [
        sys.executable,
        "-m",
        "flockring",
        "node",
        "--listen",
        "udp://127.0.0.1:0",
        "--nodes",
        str(count),
        "--overlay",
        overlay,
        "--status-interval",
        "0",
    ]
    for j in join:
        cmd += ["--join", j]
    cmd += extra
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _read_nodes(p: subprocess.Popen[str], count: int, timeout_s: float) -> list[tuple[str, str]]:
    """The ``(id, address)`` of the ``count`` nodes a spawned process reports (CliError if it
    does not come up in time)."""
    assert p.stdout is not None
    out: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count:
        if time.monotonic() > deadline:
            raise CliError("a demo node process did not come up in time")
        line = p.stdout.readline()
        if not line:
            err = p.stderr.read() if p.stderr is not None else ""
            raise CliError(f"a demo node process exited: {err.strip().splitlines()[-1:]}")
        parts = line.split()
        if len(parts) == 3 and parts[0] == "NODE":
            out.append((parts[1], parts[2]))
    return out


def cmd_demo(args: argparse.Namespace) -> int:
    procs: list[subprocess.Popen[str]] = []
    per = args.per_process
    print(
        f"flockring demo: {args.processes} processes x {per} nodes, {args.overlay} overlay, "
        "loopback UDP, signed datagrams"
    )
    t0 = time.monotonic()
    try:
        nodes: list[tuple[str, str]] = []
        for i in range(args.processes):
            p = _spawn_node(per, [nodes[0][1]] if nodes else [], args.overlay)
            procs.append(p)
            got = _read_nodes(p, per, 60)
            nodes += got
            print(
                f"  process {i + 1} (pid {p.pid}): "
                + ", ".join(f"{nid[:8]}@{addr.rsplit(':', 1)[1]}" for nid, addr in got)
            )
        print(f"ring of {len(nodes)} nodes up in {time.monotonic() - t0:.1f} s\n")
        ids = [int(n, 16) for n, _ in nodes]
        rows = []
        ok = 0
        for j in range(args.lookups):
            key, _ = _key(f"demo-key-{j}")
            entry_id, entry = nodes[(j * 5) % len(nodes)]
            res = _trio_run(_route, entry, key, 5.0)
            best = ids[0]
            for x in ids:
                if closer(key, x, best):
                    best = x
            good = int(res["responsible"], 16) == best
            ok += good
            rows.append(
                f"  {str(key)[:8]}  from {entry_id[:8]}  ->  {res['responsible'][:8]}"
                f"  {res['rtt_ms']:>7.2f} ms  {'ok' if good else 'WRONG'}"
            )
        print("  key       entry             responsible    time      oracle")
        print("\n".join(rows))
        st = _trio_run(_status, nodes[0][1], 3.0)
        print(
            f"\nnode {nodes[0][0][:8]}: leaf set {len(st.leaf_set)}, routing rows "
            f"{list(st.routing_rows)}, known {st.known}"
        )
        print(f"\n{ok}/{args.lookups} lookups reached the numerically closest node")
        return 0 if ok == args.lookups else 1
    finally:
        stop_processes(procs)


def stop_processes(procs: Sequence[subprocess.Popen[Any]], timeout_s: float = 5.0) -> None:
    """SIGTERM every process still running, then wait for each; kill one that outlives
    ``timeout_s`` (``demo`` and the tests that start ``flockring node`` processes use it)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# ------------------------------------------------------------------ registration
def register(subparsers: Any) -> None:
    """Add ``node``, ``status``, ``route`` and ``demo`` to an argparse subparsers object."""
    p = subparsers.add_parser("node", help="run live overlay node(s) and show their status")
    p.add_argument(
        "--listen",
        default="udp://127.0.0.1:0",
        help="udp://HOST:PORT or tcp://HOST:PORT (port 0: any; default %(default)s)",
    )
    p.add_argument(
        "--advertise",
        metavar="ADDR",
        help="the address peers reach this node at (IP, or udp://IP:PORT / tcp://IP:PORT); "
        "required when --listen is a wildcard such as udp://0.0.0.0:9000",
    )
    p.add_argument(
        "--join",
        action="append",
        default=[],
        metavar="ADDR",
        help="seed address to join through (repeatable); none: start a new ring",
    )
    p.add_argument("--overlay", choices=("pastry", "smallworld"), default="pastry")
    p.add_argument(
        "--identity", metavar="PATH", help="Ed25519 key file (created with mode 0600 if absent)"
    )
    p.add_argument("--nodes", type=int, default=1, help="nodes in this process (default 1)")
    p.add_argument(
        "--status-interval",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds between status tables (0: none)",
    )
    p.add_argument("--join-timeout", type=float, default=30.0, metavar="S")
    p.add_argument("--tls", action="store_true", help="TLS 1.3 on tcp:// (certificate from key)")
    p.add_argument(
        "--no-signing",
        action="store_true",
        help="send and accept UNSIGNED datagrams (benchmarks only; insecure)",
    )
    p.add_argument(
        "--no-sessions",
        action="store_true",
        help="sign every datagram with Ed25519 instead of holding authenticated sessions "
        "(Noise XX) with peers that exchange sustained traffic",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="change a field of the overlay's config (PastryConfig / SmallWorldConfig, "
        "docs/design.md; GROUP.FIELD for a nested one, e.g. proximity.probe_retries=3; JSON "
        "values), repeatable",
    )
    node_plugins.add_arguments(p)
    p.set_defaults(func=cmd_node)

    s = subparsers.add_parser("status", help="show a running node's status")
    s.add_argument("address")
    s.add_argument("--timeout", type=float, default=3.0)
    s.add_argument("--json", action="store_true")
    s.add_argument("--tls", action="store_true", help="the node serves TLS 1.3 (node --tls)")
    s.set_defaults(func=cmd_status)

    r = subparsers.add_parser("route", help="ask a node which node is responsible for KEY")
    r.add_argument("address")
    r.add_argument("key", help="40-hex-digit id, or any text (hashed with SHA-1)")
    r.add_argument("--timeout", type=float, default=5.0)
    r.add_argument("--json", action="store_true")
    r.add_argument("--tls", action="store_true", help="the node serves TLS 1.3 (node --tls)")
    r.set_defaults(func=cmd_route)

    d = subparsers.add_parser("demo", help="bring up a live ring in 3 local processes")
    d.add_argument("--processes", type=int, default=3)
    d.add_argument("--per-process", type=int, default=4)
    d.add_argument("--lookups", type=int, default=12)
    d.add_argument("--overlay", choices=("pastry", "smallworld"), default="pastry")
    d.set_defaults(func=cmd_demo)
