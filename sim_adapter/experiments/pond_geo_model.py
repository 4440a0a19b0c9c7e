"""The model of PonD §4.4 (Fig. 9): C-PonD on 440 shared testbed nodes, geographic queries.

Theory of operation (Lee et al. 2012 §4.4). 440 nodes on three continents — 200 in America, 160
in Europe, 80 in Asia (an assumption: the paper gives no split; ours follows PlanetLab's
well-known bias towards North American and European sites, not a measured census) — placed at
university cities (:data:`CITIES`, real coordinates, jittered by up to ±0.5° so that no two
nodes share a position). Each node's ad carries its ``Latitude`` and ``Longitude`` (PonD:
"geographic coordinate information ... extracted from the IP address of each node as
condor_startd ClassAds attributes") and a ``ZipfAttribute``; delays follow
:class:`~sim_adapter.experiments.pond_common.GeoLatency` (great circle at 2/3 c plus 5 ms one
way).

Jobs arrive in four phases (PonD Fig. 9): Req.1 — ``ZipfAttribute == v`` with ``v`` Zipf-drawn;
Req.2 — America; Req.3 — Europe; Req.4 — Asia, a region being a latitude/longitude box
(:data:`REGIONS`) written as a ClassAd range query on the two attributes. Jobs are submitted at
exponential intervals from ``submitters`` stable nodes and run in ponds formed by
:class:`~discovery.pond_scheduler.PondScheduler`.

Churn (a stated model of shared testbed nodes, an assumption: no PlanetLab availability trace
is used): every other node alternates up and down times, exponential with means
``mttf_s`` (24 h) and ``mttr_s`` (2 h), so a node is up ~92 % of the time; a node fails
silently (crash) and comes back with the same id and a fresh state, joining the ring through the
real join protocol. A task running on a failed node is evicted and re-queued after
``detect_s`` (300 s, HTCondor's ``ALIVE_INTERVAL`` default, assumption for the shadow noticing
its starter is gone); at the same time the pond's manager drops the failed member (its startd's
ad is gone from the pond's collector) — :class:`~discovery.pond_scheduler.PondScheduler` has no
failure detection of its own.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from typing import Any

import attrs

from discovery.classads import ClassAd
from discovery.machine import DictProvider, MachineAd, zipf_value
from discovery.pond_scheduler import PondScheduler, SchedulerConfig
from overlay.handle import NodeHandle
from sim_adapter.experiments.pond_common import GeoLatency, job_ad
from sim_adapter.experiments.pond_queue import PondJobQueue, TaskLog, TaskSpec

__all__ = ["CITIES", "PHASES", "REGIONS", "GeoConfig", "GeoRun", "in_region", "simulate_geo"]

#: university cities hosting testbed nodes (latitude, longitude in degrees)
CITIES: dict[str, tuple[tuple[str, float, float], ...]] = {
    "America": (
        ("Berkeley", 37.87, -122.26), ("Seattle", 47.65, -122.31), ("Princeton", 40.35, -74.65),
        ("Cambridge MA", 42.36, -71.09), ("Atlanta", 33.78, -84.40), ("Austin", 30.29, -97.74),
        ("Chicago", 41.79, -87.60), ("Gainesville", 29.64, -82.35), ("Toronto", 43.66, -79.40),
        ("Vancouver", 49.26, -123.25), ("Madison", 43.07, -89.40), ("Salt Lake", 40.76, -111.85),
        ("Sao Paulo", -23.56, -46.73), ("Mexico City", 19.33, -99.19), ("Pittsburgh", 40.44, -80.0),
    ),
    "Europe": (
        ("Paris", 48.85, 2.35), ("Berlin", 52.52, 13.40), ("Cambridge UK", 52.20, 0.12),
        ("Zurich", 47.38, 8.55), ("Madrid", 40.45, -3.73), ("Rome", 41.90, 12.50),
        ("Stockholm", 59.35, 18.07), ("Warsaw", 52.22, 21.01), ("Amsterdam", 52.36, 4.90),
        ("Athens", 37.98, 23.73), ("Helsinki", 60.19, 24.83), ("Lisbon", 38.74, -9.14),
    ),
    "Asia": (
        ("Tokyo", 35.71, 139.76), ("Beijing", 40.00, 116.33), ("Seoul", 37.46, 126.95),
        ("Taipei", 25.02, 121.54), ("Hong Kong", 22.28, 114.14), ("Singapore", 1.30, 103.78),
        ("Bangalore", 12.97, 77.59), ("Shanghai", 31.20, 121.43),
    ),
}  # fmt: skip

#: regions as latitude/longitude boxes (degrees): (lat_lo, lat_hi, lon_lo, lon_hi)
REGIONS: dict[str, tuple[float, float, float, float]] = {
    "America": (-60.0, 75.0, -170.0, -30.0),
    "Europe": (35.0, 72.0, -25.0, 45.0),
    "Asia": (-11.0, 60.0, 60.0, 150.0),
}

#: the four request phases of PonD Fig. 9: (label, region or None for "any ZipfAttribute")
PHASES: tuple[tuple[str, str | None], ...] = (
    ("Req.1 (any)", None),
    ("Req.2 (America)", "America"),
    ("Req.3 (Europe)", "Europe"),
    ("Req.4 (Asia)", "Asia"),
)


def in_region(lat: float, lon: float, region: str) -> bool:
    """Brute force: is (lat, lon) inside the region's box?"""
    a, b, c, d = REGIONS[region]
    return a <= lat <= b and c <= lon <= d


def region_requirements(region: str) -> str:
    """The ClassAd range query for a region (PonD §4.4: "latitude/longitude range")."""
    a, b, c, d = REGIONS[region]
    return (
        f"TARGET.Latitude >= {a} && TARGET.Latitude <= {b} && "
        f"TARGET.Longitude >= {c} && TARGET.Longitude <= {d}"
    )


@attrs.frozen(slots=True)
class GeoConfig:
    """Parameters of the Fig. 9 experiment (sources and assumptions beside each field)."""

    #: nodes per continent (PonD §4.4: 440 PlanetLab nodes; the split is ours)
    nodes: tuple[tuple[str, int], ...] = (("America", 200), ("Europe", 160), ("Asia", 80))
    #: length of each request phase, s (PonD Fig. 9: four phases over 65 hours)
    phase_s: float = 65 * 3600 / 4
    #: job arrival rate, jobs per hour (PonD: "controlled ... not to overwhelm PlanetLab
    #: nodes"; ours: a few busy nodes per region on average)
    jobs_per_hour: float = 6.0
    #: tasks per job U{1..max_tasks}; run time log-normal (median, sigma) s (assumptions)
    max_tasks: int = 8
    runtime_median_s: float = 1200.0
    runtime_sigma: float = 0.8
    #: stable nodes that submit jobs and never fail (assumption)
    submitters: int = 8
    #: churn: mean up time and mean down time, s (assumption, see the module docstring)
    mttf_s: float = 24 * 3600.0
    mttr_s: float = 2 * 3600.0
    #: a failed member's task is re-queued, and the member dropped, this long after (s)
    detect_s: float = 300.0
    #: sample the state every this many seconds (for the figure)
    sample_s: float = 600.0
    #: after the last phase, run until every task ended, at most this long (s)
    drain_max_s: float = 2 * 86400.0
    #: the ring: Pastry by default — C-PonD ran on a small-world ring (Brunet), which
    #: ``--overlay smallworld`` selects, but its maintenance costs this simulator ~4x Pastry's
    #: per node-hour and nothing measured here depends on the ring's kind
    overlay: str = "pastry"
    #: per-path delay overhead beyond fibre, one way (assumption, see GeoLatency)
    overhead_s: float = 0.005

    def as_dict(self) -> dict[str, Any]:
        """The parameters, JSON-friendly."""
        return attrs.asdict(self)


def place_nodes(cfg: GeoConfig, seed: int) -> list[tuple[str, float, float]]:
    """(continent, latitude, longitude) of every node, in spawn order."""
    rng = random.Random(f"pond-geo-place-{seed}")
    out = []
    for cont, n in cfg.nodes:
        cities = CITIES[cont]
        for i in range(n):
            _, la, lo = cities[i % len(cities)]
            out.append((cont, la + rng.uniform(-0.5, 0.5), lo + rng.uniform(-0.5, 0.5)))
    return out


def node_ads(cfg: GeoConfig, seed: int) -> list[ClassAd]:
    """Every node's static machine ad with its coordinates and ``ZipfAttribute``."""
    rng = random.Random(f"pond-geo-ads-{seed}")
    ads = []
    for i, (cont, la, lo) in enumerate(place_nodes(cfg, seed)):
        ad = ClassAd()
        name = f"slot1@node{i}.{cont.lower()}"
        ad.update(
            {
                "MyType": "Machine", "Name": name, "Machine": name, "OpSys": "LINUX",
                "Arch": "X86_64", "Cpus": 1, "Memory": 2048, "Continent": cont,
                "Latitude": round(la, 4), "Longitude": round(lo, 4),
                "ZipfAttribute": zipf_value(rng), "Requirements": True, "Rank": 0,
            }
        )  # fmt: skip
        ads.append(ad)
    return ads


def make_jobs(cfg: GeoConfig, seed: int, submitters: list[int]) -> list[TaskSpec]:
    """The tasks of every phase's jobs."""
    rng = random.Random(f"pond-geo-jobs-{seed}")
    tasks: list[TaskSpec] = []
    jobs = 0
    for p, (_, region) in enumerate(PHASES):
        t = p * cfg.phase_s
        end = (p + 1) * cfg.phase_s
        while True:
            t += rng.expovariate(cfg.jobs_per_hour / 3600.0)
            if t >= end:
                break
            z = zipf_value(rng)
            req = region_requirements(region) if region else f"TARGET.ZipfAttribute == {z}"
            ad = job_ad(req, JobNo=jobs)
            rt = rng.lognormvariate(math.log(cfg.runtime_median_s), cfg.runtime_sigma)
            node = rng.choice(submitters)
            for _ in range(rng.randint(1, cfg.max_tasks)):
                tasks.append(TaskSpec(len(tasks), jobs, ad, rt, t, node, z, region or ""))
            jobs += 1
    return tasks


@attrs.define(slots=True)
class GeoRun:
    """One run: the log, the sampled state, churn counts, the node ads."""

    log: TaskLog
    ads: list[ClassAd]
    samples: list[dict[str, Any]]
    failures: int
    restarts: int
    counters: dict[str, int]
    end_s: float


def _claimed(node: Any) -> bool:
    from sim_adapter.plugins import query as pq

    m = pq.machine_of(node)
    return m is not None and m.stamp is not None


def simulate_geo(
    cfg: GeoConfig, seed: int, progress: Callable[[float], None] | None = None
) -> GeoRun:
    """Run the four phases with churn (module docstring)."""
    from sim_adapter.network import Network
    from sim_adapter.plugins import query as pq

    ads = node_ads(cfg, seed)
    n = len(ads)
    coords = [(float(a["Latitude"]), float(a["Longitude"])) for a in ads]
    net = Network(seed=seed, latency=GeoLatency(coords, overhead_s=cfg.overhead_s), loss=0.0)
    net.spawn(n, overlay=cfg.overlay, build="oracle")
    rng = random.Random(f"pond-geo-churn-{seed}")

    def attach(nodes: list[Any]) -> None:
        pq.attach(
            net,
            nodes=nodes,
            machine_ad=lambda node, _r: MachineAd(ads[node.index], DictProvider()),
            seed=seed,
        )

    attach(list(net.nodes))
    subs = sorted(rng.sample(range(n), cfg.submitters))
    log = TaskLog()
    queues: dict[int, tuple[PondJobQueue, PondScheduler]] = {}
    scfg = SchedulerConfig()
    for i in subs:
        node = net.nodes[i]
        holder: list[PondScheduler] = []

        def eligible(
            m: NodeHandle, cluster: str, holder: list[PondScheduler] = holder
        ) -> tuple[bool, str, str]:
            w = net.nodes[int(m.address)]  # type: ignore[call-overload]
            c = holder[0].clusters.get(cluster)
            want = c.job_id if c is not None else ""
            mad = pq.machine_of(w) if w.alive else None
            st = mad.stamp if mad is not None else None
            got = st.job_id if st is not None else ""
            return (bool(want) and got == want, got, want)

        q = PondJobQueue(node.core.runtime, log, eligible, requeue_after_s=cfg.detect_s)
        s = PondScheduler(pq.pond_app(node), q, q, scfg)
        holder.append(s)
        q.on_change = s.kick
        s.start()
        queues[i] = (q, s)
    counts = {"failures": 0, "restarts": 0}

    def drop_member(idx: int) -> None:
        for mi, (_, s) in queues.items():
            app = pq.pond_app(net.nodes[mi])
            for c in list(s.clusters.values()):
                if c.pond_id is None or c.pond_id not in app.ponds:
                    continue
                dead = [h for h in app.members(c.pond_id) if int(h.address) == idx]  # type: ignore[call-overload]
                if dead:
                    app.shrink(c.pond_id, members=dead)

    def fail(idx: int) -> None:
        node = net.nodes[idx]
        if not node.alive:
            return
        counts["failures"] += 1
        net.crash(node)
        for q, _ in queues.values():
            q.worker_lost(idx)
        net.engine.call_later(cfg.detect_s, functools.partial(drop_member, idx))
        net.engine.call_later(rng.expovariate(1.0 / cfg.mttr_s), functools.partial(recover, idx))

    def recover(idx: int) -> None:
        new = net.restart(net.nodes[idx])
        attach([new])
        counts["restarts"] += 1
        net.engine.call_later(rng.expovariate(1.0 / cfg.mttf_s), functools.partial(fail, idx))

    for i in range(n):
        if i in queues:
            continue
        # start in the stationary state: up with probability MTTF / (MTTF + MTTR)
        if rng.random() < cfg.mttr_s / (cfg.mttf_s + cfg.mttr_s):
            net.engine.call_later(0.0, functools.partial(fail, i))
        else:
            net.engine.call_later(rng.expovariate(1.0 / cfg.mttf_s), functools.partial(fail, i))
    tasks = make_jobs(cfg, seed, subs)

    def submit(t: TaskSpec) -> None:
        q, s = queues[t.node]
        q.submit(t)
        s.kick()

    for t in tasks:
        net.engine.call_later(t.submit_s, functools.partial(submit, t))
    samples: list[dict[str, Any]] = []

    def sample() -> None:
        row: dict[str, Any] = {"t": net.now}
        running_on = {r.machine for r in log.runs if r.end_s is None}
        for cont, _ in cfg.nodes:
            idx = [i for i in range(n) if ads[i]["Continent"] == cont]
            alive = [i for i in idx if net.nodes[i].alive]
            row[cont] = {
                "alive": len(alive),
                "available": sum(1 for i in alive if not _claimed(net.nodes[i])),
                "running": sum(1 for i in idx if i in running_on),
            }
        row["running"] = len(running_on)
        samples.append(row)

    total_s = cfg.phase_s * len(PHASES)
    at = 0.0
    while at <= total_s:
        net.engine.call_later(at, sample)
        at += cfg.sample_s
    limit = total_s + cfg.drain_max_s
    while net.now < total_s or len(log.completed()) < len(tasks):
        if net.now >= limit:
            raise RuntimeError(f"pond-geo: {len(tasks) - len(log.completed())} tasks unfinished")
        net.run(3600.0)
        if progress is not None:
            progress(net.now / total_s)
    for _, s in queues.values():
        s.stop()
    counters = {
        "tasks": len(tasks),
        "jobs": len({t.job_id for t in tasks}),
        "evicted_runs": sum(1 for r in log.runs if r.evicted),
        "stale_declines": sum(pq.pond_app(x).stats["declined_stale"] for x in net.nodes if x.alive),
        "messages": net.message_count,
    }
    end = max((r.end_s or 0.0) for r in log.runs) if log.runs else 0.0
    return GeoRun(log, ads, samples, counts["failures"], counts["restarts"], counters, end)
