"""``flockring bench pastry``: Pastry routing in the simulator (docs/pastry.md).

Without ``--slots`` this is the shared overlay benchmark (``bench/overlay.py``: build, quiet
period, oracle-checked lookups with hops and route stretch). With ``--slots K`` it measures the
proximity of the routing tables instead of only their effect: after the same build and quiet
period, ``K`` random nodes' tables are compared slot by slot with the brute-force best entry
(``overlay.pastry.table_quality``), the join cost is estimated, and the route stretch is
measured with the same lookups and definition (RDP = overlay path latency / direct one-way
latency from the source to the answering node); the same pairs' routes are then replayed hop by
hop to show where the stretch comes from (:func:`route_breakdown`).

Join cost. Joins and maintenance overlap during a build, so the datagrams of the joins are
estimated as the build's datagrams minus the maintenance rate measured in the quiet period
times the node-seconds nodes were ready during the build, per node. The protocol's own counters
(discovery requests and probes, PNS probes, row walks) are reported beside it, per node.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from overlay.ids import NodeId
from sim_adapter import bench
from sim_adapter.bench.overlay import ROUTING_TYPES, add_common_arguments, make_latency, run_overlay
from sim_adapter.network import Network

#: per-node protocol counters reported with ``--slots`` (``PastryCore.stats`` keys)
JOIN_STATS = (
    "join_locate_requests",
    "join_locate_probes",
    "join_locate_pruned",
    "join_pns_probes",
    "row_walks",
    "walk_pns_probes",
    "pns_hinted_probes",
    "near_announces",
    "table_announces",
    "announce_probes",
    "announce_pns_probes",
    "row_pns_probes",
    "row_requests",
    "row_reply_unsolicited",
    "row_reply_rtt_samples",
    "join_rows_unsolicited",
    "join_retries",
)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The overlay routing benchmark on Pastry (with ``--slots``: the table-proximity report)."""
    if getattr(args, "slots", 0):
        return run_slots(args)
    return run_overlay(args, "pastry")


def run_slots(args: argparse.Namespace) -> dict[str, Any]:
    """Build, idle, then report routing-table proximity against the brute-force best entry of
    each slot, the join cost, maintenance and the route stretch (see the module doc)."""
    from overlay.pastry import table_quality

    lat = make_latency(args.latency, args.seed)
    net = Network(seed=args.seed, latency=lat, loss=args.loss)
    res: dict[str, Any] = {
        "bench": "pastry-slots",
        "nodes": args.nodes,
        "build": args.build,
        "latency": args.latency,
        "loss": args.loss,
        "join_interval_s": args.join_interval_s,
        "seed": args.seed,
        "config_overrides": list(args.set or ()),
        **bench.environment(),
    }
    prog = bench.Progress("build pastry", args.progress or None)
    with bench.stopwatch() as t_build:
        nodes = net.spawn(
            args.nodes,
            overlay="pastry",
            build=args.build,
            progress=prog,
            join_interval_s=args.join_interval_s,
            config=_config(args.set or ()),
        )
    t_end = net.now
    build_msgs = net.message_count
    res["build_wall_s"] = bench.r(t_build(), 2)
    res["build_virtual_s"] = bench.r(t_end, 1)
    res["build_messages_per_node"] = bench.r(build_msgs / max(1, args.nodes), 1)
    res["build_messages_by_type_per_node"] = {
        k: bench.r(v / max(1, args.nodes), 2) for k, v in sorted(net.msg_by_type.items())
    }
    ready_s = sum(
        max(0.0, t_end - n.core.joiner.ready_at)  # type: ignore[attr-defined]
        for n in nodes
        if n.core.ready
    )
    res["not_ready_after_build"] = sum(1 for n in nodes if not n.core.ready)
    stats: Counter[str] = Counter()
    for n in nodes:
        stats.update({k: n.core.stats[k] for k in JOIN_STATS})
    res["build_counters_per_node"] = {
        k: bench.r(stats[k] / max(1, args.nodes), 2) for k in JOIN_STATS
    }

    rate = 0.0
    if args.quiet_s > 0:
        m0 = net.message_count
        net.run(args.quiet_s)
        live = len(net.live_nodes())
        rate = (net.message_count - m0) / args.quiet_s / max(1, live)
        res["quiet_virtual_s"] = args.quiet_s
        res["maintenance_msgs_per_s_per_node"] = bench.r(rate, 4)
        if args.build == "joins":
            res["join_datagrams_per_node_est"] = bench.r(
                (build_msgs - rate * ready_s) / max(1, args.nodes), 1
            )

    live_nodes = net.live_nodes()
    cores = [n.core for n in live_nodes]
    examined = random.Random(args.seed).sample(cores, min(args.slots, len(cores)))

    def rtt_s(a: Any, b: Any) -> float:
        return float(lat.rtt_s(a.address, b.address))

    with bench.stopwatch() as t_q:
        quality = table_quality(cores, rtt_s, examined)  # type: ignore[arg-type]
    res["slots_examined_nodes"] = len(examined)
    res["slots_wall_s"] = bench.r(t_q(), 2)
    res["rows"] = [q.as_dict() for q in quality]

    rng = net.rng
    rdp: list[float] = []
    hops: list[float] = []
    correct = 0
    routing0 = sum(net.msg_by_type[t] for t in ROUTING_TYPES)
    done = 0
    all_pairs: list[tuple[Any, NodeId]] = []
    while done < args.lookups:
        k = min(args.batch, args.lookups - done)
        pairs = [(rng.choice(live_nodes), NodeId.random(rng)) for _ in range(k)]
        all_pairs.extend(pairs)
        for (src, key), lk in zip(pairs, net.lookup_many(pairs), strict=True):
            if lk.result is None:
                continue
            correct += lk.result == net.closest_live(key)
            hops.append(lk.hops)
            dst = net.node_by_id(lk.result)
            if dst is not src:
                direct = lat.one_way_s(src.index, dst.index)
                if direct > 0:
                    rdp.append(lk.latency_s / direct)
        done += k
    routing = sum(net.msg_by_type[t] for t in ROUTING_TYPES) - routing0
    res.update(
        {
            "lookups": args.lookups,
            "correct_fraction": bench.r(correct / max(1, args.lookups), 5),
            "hops_mean": bench.r(bench.mean(hops), 3),
            "rdp_mean": bench.r(bench.mean(rdp), 3),
            "rdp_p50": bench.r(bench.percentile(rdp, 50), 3),
            "rdp_p90": bench.r(bench.percentile(rdp, 90), 3),
            "routing_msgs_per_lookup": bench.r(routing / max(1, args.lookups), 2),
        }
    )
    res["rdp_breakdown"] = route_breakdown(net, lat, all_pairs)
    return res


def route_breakdown(net: Network, lat: Any, pairs: Sequence[tuple[Any, NodeId]]) -> dict[str, Any]:
    """Where the route stretch comes from: each pair's route is replayed hop by hop with
    ``next_hop`` on the (static, quiet) ring, no message sent. Reports the share of the overlay
    latency spent on hops taken by a node whose leaf set covers the key (the last hop, to the
    root), the latency-weighted stretch (sum of overlay / sum of direct latency) and the mean
    RDP per decile of direct latency (short direct paths weigh most on the mean)."""
    by_id = {n.core.id: n for n in net.live_nodes()}
    rows: list[tuple[float, float, float]] = []  # (direct, overlay, on leaf-set hops)
    for src, key in pairs:
        cur = src
        total = leaf = 0.0
        for _ in range(64):  # bounded: a static ring routes in ~log16 N hops
            nh = cur.core.next_hop(key)
            if nh is None:
                break
            nxt = by_id.get(nh.id)
            if nxt is None:
                break
            d = lat.one_way_s(cur.index, nxt.index)
            total += d
            if cur.core.leaf.in_range(key):
                leaf += d
            cur = nxt
        if cur is not src:
            rows.append((lat.one_way_s(src.index, cur.index), total, leaf))
    if not rows:
        return {}
    rows.sort()
    k = max(1, len(rows) // 10)
    deciles = []
    for i in range(0, len(rows) - k + 1, k):
        part = rows[i : i + k]
        deciles.append(
            {
                "direct_ms": [bench.r(part[0][0] * 1e3, 1), bench.r(part[-1][0] * 1e3, 1)],
                "rdp_mean": bench.r(bench.mean([o / d for d, o, _ in part if d > 0]), 3),
            }
        )
    overlay = sum(o for _, o, _ in rows)
    return {
        "routes": len(rows),
        "leaf_hop_latency_share": bench.r(sum(f for _, _, f in rows) / max(overlay, 1e-12), 3),
        "latency_weighted_stretch": bench.r(overlay / max(sum(d for d, _, _ in rows), 1e-12), 3),
        "rdp_mean_by_direct_decile": deciles,
    }


def _config(pairs: Sequence[str], cls: type[Any] | None = None) -> Any:
    """A ``cls`` (default PastryConfig; SmallWorldConfig for the ring) with ``field=value``
    overrides (``overlay.config_overrides``): ``group.field=value`` overrides a field of a
    nested config (``kbr``, ``proximity``), keeping that overlay's own defaults for the rest."""
    from overlay.config_overrides import with_overrides
    from overlay.pastry import PastryConfig

    return with_overrides((PastryConfig if cls is None else cls)(), pairs)


def _main(args: argparse.Namespace) -> int:
    bench.emit(run(args), args.json, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``pastry`` benchmark parser."""
    p = sub.add_parser("pastry", help="Pastry: build, lookups vs oracle, hops, RDP, maintenance")
    add_common_arguments(p, default_nodes=1000)
    p.add_argument(
        "--slots",
        type=int,
        default=0,
        metavar="K",
        help="table-proximity report: compare K random nodes' routing tables slot by slot with "
        "the brute-force best entry; also the join cost and per-node protocol counters",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="with --slots: override a PastryConfig field (repeatable), e.g. "
        "--set row_exchange_interval_s=300",
    )
    p.set_defaults(func=_main)
