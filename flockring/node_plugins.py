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
* ``--pool-ring NAME`` with ``--pool SPEC`` or ``--submit`` — a *site* machine (Butt et al.
  2006 §3.3, §4.1): the flock role follows the manager role (``discovery.site.Site``), the
  manager pushes every flocking decision to the pool's machines, and a ``--submit`` machine
  applies the newest through ``--condor-config-dir DIR`` (atomic ``config.d`` fragment, the
  applied version kept next to it so that a reboot never applies an older decision). Every
  site machine re-sends its ad to each new manager (``discovery.failover_agent``).
* ``--queue-jobs N[:SECONDS]`` (with ``--pool simulated:…``) — N pond jobs of mean length
  SECONDS in the node's simulated queue (default: a Poisson stream at the pool's LOAD); with
  ``--pool condor`` the queue is the schedds'. ``flockring pond ADDR --from-queue`` runs
  queue-driven ponds over it (PonD §3.2).
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
        "--submit",
        action="store_true",
        help="with --pool-ring: a submit machine that applies the manager's flocking decisions",
    )
    g.add_argument(
        "--condor-config-dir",
        metavar="DIR",
        help="config.d directory for the flock fragment (site machines; version kept beside it)",
    )
    g.add_argument(
        "--condor-reconfig",
        metavar="CMD|none",
        help="run after writing the fragment (default: condor_reconfig or the bindings; "
        "none: write only)",
    )
    g.add_argument(
        "--queue-jobs",
        metavar="N[:SECONDS]",
        help="with --pool simulated: N pond jobs of mean length SECONDS (default 20) in the queue",
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


#: called (on the node's trio thread) after each successful refresh of a pool, by ``id(pool)``
_AFTER_REFRESH: dict[int, Any] = {}


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
        else:
            hook = _AFTER_REFRESH.get(id(pool))
            if hook is not None:  # back on the node's thread: e.g. kick the pond scheduler
                hook()
        await trio.sleep(period_s)


def parse_queue_jobs(spec: str) -> tuple[int, float]:
    """``N[:SECONDS]`` → (jobs, mean length in seconds)."""
    n, _, mean = spec.partition(":")
    try:
        jobs = int(n)
        mean_s = float(mean) if mean else DEMO_JOB_S
    except ValueError:
        raise CliError(f"--queue-jobs {spec!r}: expected N[:SECONDS]") from None
    if jobs < 0 or not mean_s > 0:
        raise CliError(f"--queue-jobs {spec!r}: need N >= 0 and SECONDS > 0")
    return jobs, mean_s


def _stream_jobs(queue: Any, runtime: Any, rng: random.Random, rate: float) -> None:
    """A Poisson stream of demo pond jobs into ``queue`` (one timer at a time)."""
    from discovery.pond_scheduler import DEMO_JOB_ADS

    def arrive() -> None:
        queue.submit(rng.choice(DEMO_JOB_ADS), rng.expovariate(1.0 / DEMO_JOB_S))
        if queue.on_change is not None:
            queue.on_change()
        runtime.call_later(rng.expovariate(rate), arrive)

    runtime.call_later(rng.expovariate(rate), arrive)


def _reconfig(args: argparse.Namespace) -> Any:
    from discovery.condor import command, default_reconfig

    cmd = args.condor_reconfig
    if cmd is None:
        return default_reconfig()
    if cmd == "none":
        return lambda: None
    import shlex

    return command(shlex.split(cmd))


def _check(args: argparse.Namespace) -> None:
    if args.submit and not args.pool_ring:
        raise CliError("--submit needs --pool-ring NAME (the pool whose manager pushes to it)")
    if args.condor_config_dir and not (args.pool_ring and (args.submit or args.pool)):
        raise CliError("--condor-config-dir needs --pool-ring with --submit or --pool")
    if args.queue_jobs and not (args.pool or "").startswith("simulated"):
        raise CliError("--queue-jobs needs --pool simulated:MACHINES[:LOAD]")


def attach(args: argparse.Namespace, node: Node, index: int) -> Discovery | None:
    """Attach the plugins the options ask for to a running, joined ``node``; None if none.
    With ``--pool condor`` the caller should also run :func:`refresh_forever` on
    ``discovery.flock.pool``."""
    _check(args)
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
    site = bool(args.pool_ring and (args.pool or args.submit))
    name = args.pool_ring if site else f"pool-{node.id.short()}"
    if site and not args.collector:
        collector = f"cm.{name}.flockring.test:9618"  # the same on every machine of the pool
    else:
        collector = _collector(args, node, index)
    pool: Any = None
    if args.pool:
        kind, machines, load = parse_pool(args.pool)
        if kind == "condor":
            from discovery.condor_pool import CondorPool, htcondor_ad_sources
            from discovery.pond_scheduler import CondorQueue

            # one schedd query feeds both the flock's counts and the pond scheduler's queue
            queue = CondorQueue(htcondor_ad_sources(collector)[1])
            pool = CondorPool(name, collector, job_ads=queue.read)
            d.attach_pond_queue(queue)

            def kick(d: Discovery = d) -> None:
                if d.scheduler is not None:
                    d.scheduler.kick()  # the queue was re-read: a cycle as soon as allowed

            _AFTER_REFRESH[id(pool)] = kick
        else:
            from discovery.pond_scheduler import SimulatedJobQueue, submit_demo_jobs
            from discovery.pool import SimulatedPool

            pool = SimulatedPool(name, machines, collector=collector, runtime=node.core.runtime)
            simulated_load(pool, load, DEMO_JOB_S, 24 * 3600.0, rng)
            sq = SimulatedJobQueue(node.core.runtime)
            if args.queue_jobs:
                n, mean_s = parse_queue_jobs(args.queue_jobs)
                submit_demo_jobs(sq, n, mean_s, rng)
            elif load > 0:
                _stream_jobs(sq, node.core.runtime, rng, load * machines / DEMO_JOB_S)
            d.attach_pond_queue(sq)
    cfg = None
    if args.flock_period:
        from discovery.flock_config import FlockConfig

        p = args.flock_period
        cfg = FlockConfig(announce_period_s=p, manager_period_s=p, validity_s=max(3 * p, 1.0))
    fcfg = None
    if args.alive_period:
        from discovery.failover_config import FailoverConfig

        a = args.alive_period
        fcfg = FailoverConfig(alive_period_s=a, election_timeout_s=max(2.0, 0.6 * a))
    if site:
        applier = None
        applied = None
        if args.condor_config_dir:
            from pathlib import Path

            from discovery.condor import FLOCK_CONFIG_FILE, FlockConfigApplier

            path = Path(args.condor_config_dir) / FLOCK_CONFIG_FILE
            if not path.parent.is_dir():
                raise CliError(f"--condor-config-dir {path.parent}: no such directory")
            fa = FlockConfigApplier(path, reconfig=_reconfig(args), persist=True)
            applied = fa.load()  # a reboot never goes back behind what was applied
            applier = fa
        d.attach_site(
            pool=pool,
            collector=collector,
            pool_name=name,
            original=args.manager,
            applier=applier,
            applied=applied,
            machine=machine is not None,
            policy=policy,
            flock_config=cfg,
            failover_config=fcfg,
            submit_config=_submit_config(args, d),
        )
    elif args.pool:
        d.attach_flock(pool, collector=collector, pool_name=name, policy=policy, config=cfg)
    if args.pool_ring and not site:
        # the pool ring is this node's overlay; the pool's key is its original manager's id
        # (Butt et al. 2006 §3.3: replicas on the K nodes nearest it), which listeners learn
        # from the first alive they hear
        d.attach_failover(None, original=args.manager, config=fcfg)
    d.serve()
    return d


def _submit_config(args: argparse.Namespace, d: Discovery) -> Any:
    """The decision push's settings: re-broadcast once an alive period (the default: 10 s)."""
    from discovery.submit import SubmitConfig

    signed = d.signer is not None
    if args.alive_period:
        return SubmitConfig(republish_period_s=args.alive_period, require_signatures=signed)
    return SubmitConfig(require_signatures=signed)
