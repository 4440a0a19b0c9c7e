"""The ClassAd tree query and Pools on Demand in the simulator: machine ads on every node of a
``Network``, and query / pond operations driven in virtual time through the protocol code a
live node runs (``discovery.query``, ``discovery.pond``).

Typical use::

    net = Network(seed=1, latency=latency.PondSim(seed=1))
    nodes = net.spawn(1000, overlay="smallworld", build="oracle")
    plugins.query.attach(net, seed=7)                 # random ads (PonD §4.2.2) on every node
    r = plugins.query.query(net, nodes[0], 'Memory > 1024 && Arch == "X86_64"',
                            rank="Memory", k=10, mode="first_fit")
    pond = plugins.query.form_pond(net, nodes[0], requirements="Memory >= 4096", k=5)
    plugins.query.release(net, nodes[0], pond.pond_id)

Each function starts the operation at the current virtual time and runs the engine until its
callback fires (bounded by ``max_run_s``); other events due meanwhile run too, exactly as they
would in a longer simulation.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from discovery import pond as dpond
from discovery import query as dquery
from discovery.classads import ClassAd, ExprTree
from discovery.machine import DictProvider, MachineAd, random_machine_ad
from discovery.pond import PondConfig, PondResult, PoolOnDemand, ReleaseResult
from discovery.pond_messages import Signer
from discovery.pond_worker import CondorHostHook, InvitePolicy
from discovery.query import QueryConfig, QueryResult, ResourceQuery
from discovery.query_messages import QueryArg
from overlay.errors import OverlayError
from overlay.kbr import KbrCore
from overlay.multicast import MULTICAST_APP, Multicast
from sim_adapter.network import Network
from sim_adapter.simnode import SimNode

__all__ = [
    "AdFactory",
    "ObservedQuery",
    "attach",
    "form_pond",
    "machine_of",
    "pond_app",
    "query",
    "query_app",
    "release",
    "run_until",
]

#: ``fn(node, rng) -> MachineAd | ClassAd | None``: a node's machine ad (None: no machine)
AdFactory = Callable[[SimNode, random.Random], "MachineAd | ClassAd | None"]

T = TypeVar("T")


class ObservedQuery(ResourceQuery):
    """A node's query application that also hands every result it starts to an observer
    (experiments record query latency this way, e.g. PonD Fig. 8b) before its caller sees it."""

    def __init__(
        self,
        core: KbrCore,
        machine: MachineAd | None,
        config: QueryConfig | None,
        observer: Callable[[QueryResult], None],
    ) -> None:
        super().__init__(core, machine, config)
        self.observer = observer

    def run(
        self,
        arg: QueryArg,
        on_done: Callable[[QueryResult], None],
        *,
        redundant: bool = False,
        timeout_s: float | None = None,
        level_s: float | None = None,
    ) -> int:
        """``ResourceQuery.run``, with the observer called on the result first."""

        def done(res: QueryResult) -> None:
            self.observer(res)
            on_done(res)

        return super().run(arg, done, redundant=redundant, timeout_s=timeout_s, level_s=level_s)


def _attach_observed(
    node: SimNode,
    machine: MachineAd | None,
    config: QueryConfig | None,
    on_query: Callable[[SimNode, QueryResult], None],
) -> None:
    core = node.core
    mc = core.apps.get(MULTICAST_APP)
    if not isinstance(mc, Multicast):
        raise OverlayError("attach the multicast application (overlay.multicast) first")
    app = ObservedQuery(core, machine, config, lambda r: on_query(node, r))
    core.register(dquery.QUERY_APP, app)
    mc.add_aggregator(dquery.QUERY_AGGREGATOR, dquery.AGGREGATOR)


def _random_ad(node: SimNode, rng: random.Random) -> MachineAd:
    return MachineAd(random_machine_ad(rng, f"slot1@node{node.index}"), DictProvider())


def attach(
    net: Network,
    *,
    machine_ad: AdFactory | None = None,
    seed: int = 1,
    nodes: Iterable[SimNode] | None = None,
    pond: bool = True,
    query_config: QueryConfig | None = None,
    pond_config: PondConfig | None = None,
    signer: Callable[[SimNode], Signer | None] | None = None,
    policy: Callable[[SimNode], InvitePolicy | None] | None = None,
    on_condor_host: Callable[[SimNode], CondorHostHook | None] | None = None,
    on_query: Callable[[SimNode, QueryResult], None] | None = None,
) -> list[SimNode]:
    """Give every node (or ``nodes``) a machine ad, the query application and (``pond``) the
    pond application. Ads come from ``machine_ad(node, rng)`` — by default
    :func:`discovery.machine.random_machine_ad` with a :class:`DictProvider` — with an rng
    seeded by ``seed`` (the network's own stream is left alone, so adding ads does not change
    the ring). ``on_query(node, result)`` (optional) sees every query a node starts, when its
    result arrives (:class:`ObservedQuery`). Returns the nodes attached."""
    rng = random.Random(seed)
    make = machine_ad if machine_ad is not None else _random_ad
    out = []
    for node in net.nodes if nodes is None else nodes:
        ad = make(node, rng)
        m = MachineAd(ad) if isinstance(ad, ClassAd) else ad
        if on_query is None:
            dquery.attach(node.core, m, query_config)
        else:
            _attach_observed(node, m, query_config, on_query)
        if pond:
            dpond.attach(
                node.core,
                m,
                pond_config,
                signer=signer(node) if signer is not None else None,
                policy=policy(node) if policy is not None else None,
                on_condor_host=on_condor_host(node) if on_condor_host is not None else None,
            )
        out.append(node)
    return out


def query_app(node: SimNode) -> ResourceQuery:
    """The query application attached to ``node``; OverlayError if there is none."""
    app = node.core.apps.get(dquery.QUERY_APP)
    if not isinstance(app, ResourceQuery):
        raise OverlayError(f"{node!r} has no query application: call attach() first")
    return app


def pond_app(node: SimNode) -> PoolOnDemand:
    """The pond application attached to ``node``; OverlayError if there is none."""
    app = node.core.apps.get(dpond.POND_APP)
    if not isinstance(app, PoolOnDemand):
        raise OverlayError(f"{node!r} has no pond application: call attach(pond=True) first")
    return app


def machine_of(node: SimNode) -> MachineAd | None:
    """The node's machine ad (shared by its query and pond applications)."""
    return query_app(node).machine


def run_until(net: Network, start: Callable[[Callable[[T], None]], Any], max_run_s: float) -> T:
    """Call ``start(callback)`` and run the engine until the callback fires."""
    out: list[T] = []

    def cb(v: T) -> None:
        out.append(v)
        net.engine.stop()

    start(cb)
    deadline = net.now + max_run_s
    while not out and net.now < deadline:
        if net.engine.run_until(deadline) and not out:
            break
    if not out:
        raise OverlayError(f"no answer within {max_run_s:.0f} s of virtual time")
    return out[0]


def query(
    net: Network,
    src: SimNode,
    requirements: str | ExprTree | None = None,
    rank: str | float | ExprTree | None = None,
    *,
    k: int,
    mode: str = "best",
    redundant: bool = False,
    job: ClassAd | str | None = None,
    attrs: tuple[str, ...] = (),
    timeout_s: float | None = None,
    audit: bool = False,
    max_run_s: float = 3600.0,
) -> QueryResult:
    """Run one ClassAd tree query from ``src`` (see ``ResourceQuery.query``)."""
    if not src.alive:
        raise OverlayError(f"query from crashed node {src!r}")
    app = query_app(src)

    def start(cb: Callable[[QueryResult], None]) -> None:
        app.query(
            requirements,
            rank,
            k=k,
            mode=mode,
            redundant=redundant,
            job=job,
            attrs=attrs,
            timeout_s=timeout_s,
            audit=audit,
            on_done=cb,
        )

    return run_until(net, start, max_run_s)


def form_pond(
    net: Network,
    src: SimNode,
    job: ClassAd | str | None = None,
    *,
    k: int,
    requirements: str | ExprTree | None = None,
    rank: str | float | ExprTree | None = None,
    job_id: str = "",
    mode: str = "best",
    redundant: bool = False,
    max_run_s: float = 3600.0,
) -> PondResult:
    """Form a pond from ``src`` and run until every invitation is answered or lost."""
    if not src.alive:
        raise OverlayError(f"form_pond from crashed node {src!r}")
    app = pond_app(src)

    def start(cb: Callable[[PondResult], None]) -> None:
        app.form_pond(
            job,
            k,
            requirements=requirements,
            rank=rank,
            job_id=job_id,
            mode=mode,
            redundant=redundant,
            on_done=cb,
        )

    return run_until(net, start, max_run_s)


def release(net: Network, src: SimNode, pond_id: int, max_run_s: float = 3600.0) -> ReleaseResult:
    """Release a pond managed by ``src`` and run until every destroy is acknowledged or given
    up."""
    app = pond_app(src)

    def start(cb: Callable[[ReleaseResult], None]) -> None:
        app.release(pond_id, cb)

    return run_until(net, start, max_run_s)
