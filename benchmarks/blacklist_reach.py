"""How far blacklists shared between trusted pools reach (Butt et al. 2006 §3.2.1), simulated.

N pools on a Pastry ring (or the small-world ring) built on the transit-stub model; the pools
of one stub domain — one site, near each other — trust each other with their blacklists
(``blacklist-from`` / ``blacklist-to`` allow the site's other pools by overlay address, or by
whole node id with ``--by id``, which routes a share to the ones the reporter does not know). A
tenth of the pools offer machines, a few of those are bad; every other pool is overloaded. After
one announcement round (TTL 1) each consumer that holds a bad pool in its willing list reports
it failed with probability ``--report``. Then the shares travel, and the script counts:

* ``shares_per_report``: shares sent per failure reported;
* ``pair_reach``: of the (reporter, trusted site peer) pairs, the fraction in which the peer
  adopted the report — a direct share goes one hop, to pools the reporter knows on the
  overlay; with ``--by id`` the rest are routed to (``routed_shares``; ``route_msgs``: the
  routed messages' hops, other routed traffic of the 30 s included);
* ``spared``: of the (consumer, bad pool) pairs where the consumer holds the bad pool in its
  willing list, did not report it itself, and a site peer did, the fraction the consumer now
  skips.

Usage: ``python benchmarks/blacklist_reach.py --nodes 1000 --seed 1 [--overlay smallworld]
[--by id]``;
prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict

from discovery.announce import FlockConfig
from discovery.policy import Policy
from sim_adapter import Network, latency
from sim_adapter.plugins.flock import FixedPool, FlockSim


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--overlay", choices=["pastry", "smallworld"], default="pastry")
    ap.add_argument("--build", choices=["oracle", "joins"], default="oracle")
    ap.add_argument("--offering", type=float, default=0.1, help="fraction offering machines")
    ap.add_argument("--bad", type=int, default=10, help="bad pools among the offering ones")
    ap.add_argument("--report", type=float, default=0.3, help="chance a holder reports")
    ap.add_argument(
        "--by",
        choices=["addr", "id"],
        default="addr",
        help="name a site's pools by address (shares go to the ones known) or by whole node id "
        "(shares are also routed to the others)",
    )
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    t0 = time.perf_counter()
    lat = latency.TransitStub(seed=a.seed)
    net = Network(seed=a.seed, latency=lat)
    nodes = net.spawn(a.nodes, overlay=a.overlay, build=a.build)
    rng = random.Random(a.seed)
    graph = lat.topology.graph
    site = {x.index: graph.nodes[lat.stub_router(x.index)]["domain"] for x in nodes}
    members: dict[int, list[int]] = defaultdict(list)
    for i, d in site.items():
        members[d].append(i)
    offering = set(rng.sample([x.index for x in nodes], int(a.offering * a.nodes)))
    bad = set(rng.sample(sorted(offering), a.bad))
    pools = {
        x.index: FixedPool(10, 8) if x.index in offering else FixedPool(10, 0, idle_jobs=5)
        for x in nodes
    }

    ids = {x.index: x.id for x in nodes}

    def name(j: int) -> str:
        return f"addr:{j}" if a.by == "addr" else f"id:{int(ids[j]):040x}"

    def policy(i: int) -> Policy:
        peers = ", ".join(f'"{name(j)}"' for j in members[site[i]] if j != i)
        return Policy.loads(
            f"[blacklist-from]\nallow = [{peers}]\n[blacklist-to]\nallow = [{peers}]\n"
        )

    sim = FlockSim(
        net,
        pools,
        FlockConfig(ttl=1, require_signatures=False),
        policies={x.index: policy(x.index) for x in nodes},
    )
    sim.round(3.0)
    consumers = [x.index for x in nodes if x.index not in offering]
    routed0 = net.msg_by_type.get("RouteMsg", 0)
    holds: dict[int, set[int]] = {}
    reported: dict[int, set[int]] = {}
    for i in consumers:
        f = sim[i]
        holds[i] = {b for b in bad if f.willing.slot(ids[b]) is not None}
        reported[i] = {b for b in sorted(holds[i]) if rng.random() < a.report}
        for b in sorted(reported[i]):
            f.report_failure(ids[b], "simulated eviction")
    net.run(30.0)
    n_reports = sum(len(r) for r in reported.values())
    shares = sum(sim[i].stats["blacklist_shares_sent"] for i in consumers)
    pairs = reached = 0
    eligible = spared = 0
    for i in consumers:
        learned = sim[i].learned_blacklist()
        peers = [j for j in members[site[i]] if j != i and j in reported]
        for j in peers:
            if reported[j]:
                pairs += 1
                hx = f"{int(ids[j]):040x}"
                reached += all(
                    hx in learned.get(f"{int(ids[b]):040x}", (0, ()))[1] for b in reported[j]
                )
        told = set().union(*(reported[j] for j in peers)) if peers else set()
        skip = {t.node_id for t in sim[i].targets()}
        for b in holds[i] - reported[i]:
            if b in told:
                eligible += 1
                spared += f"{int(ids[b]):040x}" not in skip
    out = {
        "overlay": a.overlay,
        "build": a.build,
        "trust_by": a.by,
        "nodes": a.nodes,
        "seed": a.seed,
        "sites": len(members),
        "pools_per_site_mean": round(a.nodes / len(members), 1),
        "consumers": len(consumers),
        "bad_pools": len(bad),
        "reports": n_reports,
        "shares_sent": shares,
        "shares_per_report": round(shares / n_reports, 2) if n_reports else None,
        "routed_shares": sum(sim[i].stats["blacklist_shares_routed"] for i in consumers),
        "route_msgs": net.msg_by_type.get("RouteMsg", 0) - routed0,
        "reporter_peer_pairs": pairs,
        "pair_reach": round(reached / pairs, 3) if pairs else None,
        "spare_eligible": eligible,
        "spared": round(spared / eligible, 3) if eligible else None,
        "untrusted_drops": sum(sim[i].stats["blacklist_untrusted"] for i in consumers),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
