"""The discovery options of ``flockring node``: which plugins each live node runs.

* ``--pool simulated:MACHINES[:LOAD]`` — the node is the central manager of a simulated pool
  (driven in real time: a Poisson stream of jobs keeps it ``LOAD`` busy; above 1 its queue
  grows and it flocks) and runs the self-organizing flock; ``--pool condor`` reads the local
  HTCondor pool through its collector and schedd instead (not run here: no daemon).
* ``--policy FILE`` — the TOML policy file (who may announce to us, be flocked to, invite us…).
* ``--machine-ad FILE|random`` — the machine ClassAd this node answers tree queries with
  (``random``: one drawn per node, as PonD's simulations do); every node answers queries and
  can start them and form ponds.
* ``--pool-ring NAME [--manager]`` — the node's overlay is pool ``NAME``'s pool-local ring and
  the node takes part in the manager failover; ``--manager`` on the pool's original manager
  (whose id is the pool's key: run it with ``--identity`` so that it can come back as itself).
"""

from __future__ import annotations

import argparse
import random
from typing import TYPE_CHECKING, Any

from flockring.cli import CliError

if TYPE_CHECKING:
    from discovery.live import Discovery
    from overlay.live.node import Node

__all__ = ["add_arguments", "attach", "parse_pool"]

#: mean length of a simulated job, seconds (short, so a demo shows flocking within a minute)
DEMO_JOB_S = 20.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the discovery options to the ``node`` parser."""
    g = p.add_argument_group("discovery plugins")
    g.add_argument(
        "--pool",
        metavar="SPEC",
        help="simulated:MACHINES[:LOAD] or condor: run the flock as this pool's manager",
    )
    g.add_argument("--collector", metavar="HOST:PORT", help="this pool's collector contact")
    g.add_argument("--policy", metavar="FILE", help="TOML policy file (see docs/discovery.md)")
    g.add_argument(
        "--machine-ad", metavar="FILE|random", help="machine ClassAd for tree queries and ponds"
    )
    g.add_argument("--pool-ring", metavar="NAME", help="take part in NAME's manager failover")
    g.add_argument("--manager", action="store_true", help="this node is NAME's original manager")
    g.add_argument(
        "--alive-period",
        type=float,
        metavar="S",
        help="manager alive period in seconds (default: the failover's, 10 s)",
    )
    g.add_argument(
        "--flock-period",
        type=float,
        metavar="S",
        help="announcement period in seconds (default: the flock's, 20 s)",
    )


def parse_pool(spec: str) -> tuple[str, int, float]:
    """``simulated:MACHINES[:LOAD]`` → ("simulated", machines, load); ``condor`` → (…, 0, 0)."""
    parts = spec.split(":")
    kind = parts[0]
    if kind == "condor" and len(parts) == 1:
        return kind, 0, 0.0
    if kind != "simulated" or len(parts) not in (2, 3):
        raise CliError(f"--pool {spec!r}: expected simulated:MACHINES[:LOAD] or condor")
    try:
        machines = int(parts[1])
        load = float(parts[2]) if len(parts) == 3 else 0.5
    except ValueError:
        raise CliError(f"--pool {spec!r}: MACHINES must be an integer, LOAD a number") from None
    if machines < 1 or not 0.0 <= load <= 10.0:
        raise CliError(f"--pool {spec!r}: need MACHINES >= 1 and 0 <= LOAD <= 10")
    return kind, machines, load


def _collector(args: argparse.Namespace, node: Node, index: int) -> str:
    if args.collector:
        if index == 0:
            return str(args.collector)
        host, _, port = str(args.collector).rpartition(":")
        return f"{host}:{int(port) + index}" if port.isdigit() else f"{args.collector}-{index}"
    # a simulated pool has no collector: name one after the node, as a site would
    return f"pool-{node.id.short()}.flockring.test:9618"


async def refresh_forever(pool: Any, period_s: float) -> None:
    """Re-read a ``CondorPool`` every ``period_s`` in a worker thread (the HTCondor bindings
    block; the node's trio loop must not)."""
    import trio

    while True:
        try:
            await trio.to_thread.run_sync(pool.refresh)
        except Exception as e:  # a collector that is down: keep the last reading, say so
            import logging

            logging.getLogger(__name__).warning("reading the HTCondor pool failed: %s", e)
        await trio.sleep(period_s)


def attach(args: argparse.Namespace, node: Node, index: int) -> Discovery | None:
    """Attach the plugins the options ask for to a running, joined ``node``; None if none.
    With ``--pool condor`` the caller should also run :func:`refresh_forever` on
    ``discovery.flock.pool``."""
    wants = args.pool or args.machine_ad or args.pool_ring or args.policy
    if not wants:
        return None
    from discovery.live import Discovery, simulated_load
    from discovery.machine import DictProvider, MachineAd, random_machine_ad
    from discovery.policy import Policy

    d = Discovery(node)
    policy = Policy.load(args.policy) if args.policy else None
    rng = random.Random(int(node.id))
    machine: MachineAd | None = None
    if args.machine_ad == "random":
        machine = MachineAd(random_machine_ad(rng, f"slot1@{node.id.short()}"), DictProvider())
    elif args.machine_ad:
        machine = MachineAd.from_file(args.machine_ad)
    d.attach_query(machine, policy=policy)
    if args.pool:
        kind, machines, load = parse_pool(args.pool)
        collector = _collector(args, node, index)
        pool: Any
        if kind == "condor":
            from discovery.condor_pool import CondorPool

            pool = CondorPool(f"pool-{node.id.short()}", collector)
        else:
            from discovery.pool import SimulatedPool

            pool = SimulatedPool(
                f"pool-{node.id.short()}", machines, collector=collector, runtime=node.core.runtime
            )
            simulated_load(pool, load, DEMO_JOB_S, 24 * 3600.0, rng)
        cfg = None
        if args.flock_period:
            from discovery.flock_config import FlockConfig

            p = args.flock_period
            cfg = FlockConfig(announce_period_s=p, manager_period_s=p, validity_s=max(3 * p, 1.0))
        name = f"pool-{node.id.short()}"
        d.attach_flock(pool, collector=collector, pool_name=name, policy=policy, config=cfg)
    if args.pool_ring:
        fcfg = None
        if args.alive_period:
            from discovery.failover_config import FailoverConfig

            a = args.alive_period
            fcfg = FailoverConfig(alive_period_s=a, election_timeout_s=max(2.0, 0.6 * a))
        # the pool ring is this node's overlay; the pool's key is its original manager's id
        # (Butt et al. 2006 §3.3: replicas on the K nodes nearest it), which listeners learn
        # from the first alive they hear
        d.attach_failover(None, original=args.manager, config=fcfg)
    d.serve()
    return d
