"""Ponds driven by the job queue (PonD §3.2, §3.2.2, §3.2.3, §4.1 auto-clustering).

Two submit nodes, each with a simulated queue of mixed autoclusters and a ``PondScheduler``,
on one small-world ring of machines with random ads. Checked against the machines' own state:
every job runs exactly once, on a machine stamped for its autocluster's pond that matches its
ClassAd (``classad2``), no machine is ever in two ponds, and every pond is released once the
queues are empty.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter, defaultdict
from typing import Any

import classad2
import pytest

from discovery.pond import PondConfig
from discovery.pond_scheduler import (
    PondScheduler,
    QueuedJob,
    SchedulerConfig,
    SimulatedJobQueue,
    autocluster,
)
from overlay.handle import NodeHandle
from sim_adapter import Network, SimNode
from sim_adapter.latency import Uniform
from sim_adapter.plugins import query as pq

JOBS = [
    '[ Requirements = TARGET.Memory >= 4096; Rank = TARGET.Memory; Owner = "a" ]',
    '[ Requirements = TARGET.Cpus >= 8 && TARGET.Arch == "X86_64"; Rank = TARGET.Cpus ]',
    "[ Requirements = TARGET.ZipfAttribute <= 2; Rank = 0 ]",
]


def test_autocluster_ignores_spelling() -> None:
    a = autocluster('[Requirements=TARGET.Memory>=4096;Rank=TARGET.Memory;Owner="b"]')
    assert a == autocluster(JOBS[0]) and a != autocluster(JOBS[1])


class World:
    def __init__(self, seed: int) -> None:
        self.net = Network(seed=seed, latency=Uniform(0.05, 0.3, seed=seed))
        self.nodes = self.net.spawn(250, overlay="smallworld", build="oracle")
        self.joined: dict[int, NodeHandle | None] = {}
        self.violations: list[str] = []
        pq.attach(self.net, seed=seed, pond_config=PondConfig(), on_condor_host=self.hook_for)

    def hook_for(self, node: SimNode) -> Any:
        def hook(manager: NodeHandle | None, stamp: Any) -> None:
            before = self.joined.get(node.index)
            if manager is not None and before is not None:
                self.violations.append(f"{node!r} joined {manager} while in {before}")
            self.joined[node.index] = manager

        return hook


def submit_mixed(q: SimulatedJobQueue, rng: random.Random, n: int) -> list[int]:
    return [q.submit(JOBS[rng.randrange(len(JOBS))], rng.uniform(20.0, 200.0)) for _ in range(n)]


@pytest.mark.parametrize("seed", [1, 2])
def test_every_job_runs_once_ponds_follow_the_queue(seed: int) -> None:
    w = World(seed)
    rng = random.Random(seed)
    managers = [w.nodes[0], w.nodes[120]]
    queues: list[SimulatedJobQueue] = []
    scheds: list[PondScheduler] = []
    starts: list[tuple[int, QueuedJob, NodeHandle]] = []
    for i, mgr in enumerate(managers):
        sched_box: list[PondScheduler] = []

        def on_start(
            job: QueuedJob, m: NodeHandle, i: int = i, box: list[PondScheduler] = sched_box
        ) -> None:
            starts.append((i, job, m))
            sched = box[0]
            c = sched.clusters[autocluster(job.ad)]
            ad = pq.machine_of(w.net.node_by_id(int(m.id)))
            assert ad is not None
            if ad.stamp is None or ad.stamp.job_id != c.job_id:  # only its own pond's machines
                w.violations.append(f"job {job.job_id} on {m} stamped {ad.stamp}")
            if not classad2.ClassAd(job.ad).symmetricMatch(ad.current()):
                w.violations.append(f"job {job.job_id} on a machine that does not match")

        q = SimulatedJobQueue(mgr.core.runtime, on_start=on_start)
        sched = PondScheduler(
            pq.pond_app(mgr), q, q, SchedulerConfig(min_interval_s=5.0, max_pond=12)
        )
        sched_box.append(sched)
        q.on_change = sched.kick
        queues.append(q)
        scheds.append(sched)
    submitted = [submit_mixed(q, rng, 40) for q in queues]
    for s in scheds:
        s.start()
    w.net.run(300.0)
    more = [submit_mixed(q, rng, 15) for q in queues]  # the queue grows while ponds exist
    for s in scheds:
        s.kick()
    for _ in range(100):
        w.net.run(60.0)
        if all(q.empty for q in queues) and not any(s.clusters for s in scheds):
            break
    w.net.run(30.0)  # the last destroys are acknowledged
    assert not w.violations, w.violations[:5]
    for i, q in enumerate(queues):
        ran = Counter(job_id for job_id, _, _, _ in q.runs)
        assert sorted(ran) == sorted(submitted[i] + more[i]) and set(ran.values()) == {1}
    for s in scheds:  # ponds released when the queue emptied
        assert not s.clusters and not s.pond.ponds
        assert s.stats["ponds_formed"] >= 3 and s.stats["ponds_released"] >= 3
    assert all(pq.machine_of(n).stamp is None for n in w.nodes)  # type: ignore[union-attr]
    assert all(v is None for v in w.joined.values())
    # a machine runs one job at a time
    by_machine: dict[NodeHandle, list[tuple[float, float]]] = defaultdict(list)
    for q in queues:
        for _, m, t0, t1 in q.runs:
            by_machine[m].append((t0, t1))
    for spans in by_machine.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert len({i for i, _, _ in starts}) == 2  # both schedulers ran jobs
    # the paths this test is about were taken: competition, growth, shrinking
    assert sum(s.pond.stats["declined_claimed"] for s in scheds) > 0
    assert sum(s.stats["ponds_grown"] for s in scheds) > 0
    assert sum(s.stats["members_shrunk"] for s in scheds) > 0


def test_cycles_respect_the_minimum_interval() -> None:
    w = World(3)
    mgr = w.nodes[5]
    q = SimulatedJobQueue(mgr.core.runtime)
    sched = PondScheduler(pq.pond_app(mgr), q, q, SchedulerConfig(min_interval_s=5.0))
    q.on_change = sched.kick
    times: list[float] = []
    cycle = sched._cycle

    def spy() -> None:
        times.append(w.net.now)
        cycle()

    sched._cycle = spy  # type: ignore[method-assign]
    for _ in range(20):
        q.submit(JOBS[0], 7.0)
    sched.start()
    for _ in range(30):  # a flood of kicks
        sched.kick()
        w.net.run(0.5)
    w.net.run(120.0)
    assert len(times) > 3
    assert all(b - a >= 5.0 - 1e-9 for a, b in itertools.pairwise(times))


def test_machines_given_back_end_the_grow_back_off() -> None:
    """An autocluster whose round found nobody (every machine in another cluster's pond) grows
    as soon as that pond gives its machines back, not after ``grow_backoff_s``."""
    net = Network(seed=4, latency=Uniform(0.05, 0.3, seed=4))
    nodes = net.spawn(8, overlay="smallworld", build="oracle")
    pq.attach(net, seed=4, pond_config=PondConfig())
    mgr = nodes[0]
    q = SimulatedJobQueue(mgr.core.runtime)
    backoff = 10_000.0
    sched = PondScheduler(
        pq.pond_app(mgr), q, q, SchedulerConfig(min_interval_s=5.0, grow_backoff_s=backoff)
    )
    q.on_change = sched.kick
    every = (
        "[ Requirements = TARGET.Memory > 0; Rank = 0 ]",
        "[ Requirements = TARGET.Memory > 0 ]",
    )
    first = [q.submit(every[0], 40.0) for _ in range(len(nodes))]  # takes the whole ring
    late = [q.submit(every[1], 10.0) for _ in range(3)]
    sched.start()
    net.run(500.0)
    ended = {job_id: (t0, t1) for job_id, _, t0, t1 in q.runs}
    assert set(ended) == {*first, *late}  # every job ran, the late cluster too
    # the late cluster's first round found nobody: it started only once the first pond shrank
    assert min(ended[j][0] for j in late) >= min(ended[j][1] for j in first)
    assert max(ended[j][1] for j in late) < backoff
    net.run(60.0)
    assert not sched.clusters and not sched.pond.ponds
