"""``flockring sim pond-scaling``: scheduling latency against pool size (PonD Fig. 6, §4.1, §4.2.1).

Theory of operation. Three schedulers, N = 10^2 … 10^6 resources (Lee et al. 2012 §4.2.1):

* **Condor** — the linear model of PonD §4.2.1: one matchmaking round costs 1 s at 10^4 workers
  (Bradley et al. 2011, as PonD cites it) and grows linearly with N: ``N / 10^4`` s.
* **Condor-flock** — N/100 pools of 100 workers visited in sequence. *Analytic* (equation 2):
  each visited negotiator adds its expected wait ``T_i² / (2·T_d)`` = 20²/120 = 3.3 s
  (``T_d`` = 60 s negotiation cycle, ``T_i`` = 20 s minimum interval, Condor's defaults), so
  ``N/100 · 3.3`` s. *Simulated*: each negotiator runs its own 60 s cycle from a random phase;
  a job arriving ``t`` after the last cycle waits ``max(0, T_i - t)`` (PonD Fig. 2), then
  costs one matchmaking round over its 100 workers (the linear model: 0.01 s) and moves on to
  the next pool. One job per trial, so no job delays another (PonD's own simulator,
  ``kyungyonglee/PondSim`` ``event_action.cpp``, also randomises each cycle's length in
  [21, 100] s to de-synchronise pools; we keep Condor's fixed 60 s with random phases).
* **C-PonD** — the discovery latency of *our* ClassAd tree query (``discovery.query`` over the
  recursive-partition multicast on the small-world ring, C-PonD's Brunet) with every edge's
  one-way delay fixed per pair and uniform on [50, 300] ms (PonD §4.2.1), no loss, a static
  ring built by oracle (as PondSim; maintenance off). *Event-driven* up to ``events_max_n``:
  the real protocol forms a pond (``PoolOnDemand.form_pond``, k machines, ``best`` mode) in the
  discrete-event simulator — query latency and pond formation (query + invitations) are both
  recorded. *Analytic* at every N: :func:`sim_adapter.fastquery.count_analytic`, PondSim's
  critical-path recursion over the same tree (no events); without loss it equals the
  event-driven latency exactly (checked at every event-driven point and reported).
  A third series runs PondSim's own edge model (each visited node draws 200–600 ms, 0.5 % loss
  per exchange, ``edges="redraw"``) on our tree, beside PondSim's published outputs
  11.0 / 16.1 / 21.6 / 26.9 s at 10^3 … 10^6 — outputs of the authors' public simulator, not
  figures printed in the paper, which says only "tens of seconds" at 10^6 and that C-PonD beats
  Condor "when the number of resources is larger than 100,000".
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import time
from typing import Any

import attrs

from sim_adapter.bench import peak_rss_mib
from sim_adapter.experiments import common
from sim_adapter.experiments.pond_common import crossing, static_ring

__all__ = [
    "PONDSIM_OUTPUTS_S",
    "ScalingConfig",
    "condor_linear_s",
    "flock_eq2_s",
    "flock_simulate_s",
    "register",
    "replicate",
    "run",
]

#: full-ring query latency (s) by N printed by the authors' public simulator (PondSim,
#: kyungyonglee/PondSim) for the set-up of PonD Fig. 6 — simulator outputs, not paper figures
PONDSIM_OUTPUTS_S = {1_000: 11.0, 10_000: 16.1, 100_000: 21.6, 1_000_000: 26.9}

NAME = "pond-scaling"


@attrs.frozen(slots=True)
class ScalingConfig:
    """Parameters of the PonD Fig. 6 experiment (sources beside each field)."""

    #: pool sizes — PonD Fig. 6 spans 10^2 … 10^6 (half decades added here)
    ns: tuple[int, ...] = (100, 316, 1_000, 3_162, 10_000, 31_623, 100_000, 316_228, 1_000_000)
    #: largest N run event-driven (the protocol in the simulator); analytic at every N
    events_max_n: int = 100_000
    #: pond formations per N and seed, event-driven (each from a random root)
    event_queries: int = 3
    #: analytic queries per N and seed (random roots)
    analytic_queries: int = 5
    #: one-way edge delay U[lo, hi] s — PonD §4.2.1 "between 50 ms and 300 ms"
    edge_s: tuple[float, float] = (0.05, 0.30)
    #: machines a pond asks for (our choice; the latency does not depend on it in best mode)
    k: int = 10
    #: the query's requirements and rank (every random machine ad has Memory >= 512)
    requirements: str = "TARGET.Memory >= 1024"
    rank: str = "TARGET.KFlops"
    #: Condor: one matchmaking round costs this at ``condor_ref_n`` workers — PonD §4.2.1,
    #: from Bradley et al. 2011: "one second in a pool of 10,000 worker nodes"
    condor_round_s: float = 1.0
    condor_ref_n: int = 10_000
    #: Condor-flock: workers per pool, cycle T_d and minimum interval T_i — PonD §4.2.1 / §2.1
    flock_pool_size: int = 100
    cycle_s: float = 60.0
    min_interval_s: float = 20.0
    #: jobs pushed through the whole flock per N and seed (simulation)
    flock_trials: int = 20
    #: also run PondSim's edge model (200-600 ms redrawn per visit, 0.5 % loss) on our tree
    pondsim_series: bool = True
    pondsim_loss: float = 0.005

    def __attrs_post_init__(self) -> None:
        if not self.ns or min(self.ns) < 2:
            raise ValueError("ns must be pool sizes >= 2")
        if not 0 <= self.min_interval_s <= self.cycle_s:
            raise ValueError("need 0 <= min_interval_s <= cycle_s (T_i <= T_d)")

    def as_dict(self) -> dict[str, Any]:
        """The parameters, JSON-friendly."""
        return attrs.asdict(self)


# ---------------------------------------------------------------------- Condor and the flock
def condor_linear_s(cfg: ScalingConfig, n: int) -> float:
    """Condor's matchmaking round at ``n`` workers: linear from 1 s at 10^4 (PonD §4.2.1)."""
    return cfg.condor_round_s * n / cfg.condor_ref_n


def flock_pools(cfg: ScalingConfig, n: int) -> int:
    """Pools of a flock of ``n`` workers (``flock_pool_size`` each, at least one)."""
    return max(1, round(n / cfg.flock_pool_size))


def flock_eq2_s(cfg: ScalingConfig, n: int) -> float:
    """Equation 2 per visited manager, ``T_i² / (2·T_d)``, times the N/100 managers."""
    return flock_pools(cfg, n) * cfg.min_interval_s**2 / (2.0 * cfg.cycle_s)


class Negotiator:
    """One pool's negotiator: a cycle every ``cycle_s`` from a random phase, and a requested
    cycle starts at once if ``min_interval_s`` has passed since the last one, else when it has
    (PonD Fig. 2). ``request(t)`` returns when the job's negotiation starts."""

    __slots__ = ("cycle", "last", "min_iv", "next")

    def __init__(self, cycle_s: float, min_interval_s: float, phase_s: float) -> None:
        self.cycle = cycle_s
        self.min_iv = min_interval_s
        self.last = phase_s - cycle_s  # the cycle before time 0
        self.next = phase_s

    def request(self, t: float) -> float:
        """A job arrives at ``t``: the start of the cycle that considers it."""
        if t >= self.next:  # periodic cycles that ran before the job arrived
            k = math.floor((t - self.next) / self.cycle)
            self.last = self.next + k * self.cycle
            self.next = self.last + self.cycle
        start = t if t - self.last >= self.min_iv else self.last + self.min_iv
        self.last = start
        self.next = start + self.cycle
        return start


def flock_simulate_s(cfg: ScalingConfig, n: int, rng: random.Random) -> list[float]:
    """Scheduling latency of ``flock_trials`` jobs that visit every pool of the flock in turn
    (each negotiator with its own random phase; one matchmaking round over 100 workers at
    each); returns one latency per trial."""
    pools = flock_pools(cfg, n)
    mm = condor_linear_s(cfg, cfg.flock_pool_size)
    out = []
    for _ in range(cfg.flock_trials):
        negs = [
            Negotiator(cfg.cycle_s, cfg.min_interval_s, rng.uniform(0.0, cfg.cycle_s))
            for _ in range(pools)
        ]
        t0 = t = rng.uniform(0.0, cfg.cycle_s)
        for neg in negs:
            t = neg.request(t) + mm
        out.append(t - t0)
    return out


# ---------------------------------------------------------------------- C-PonD
def _ring(cfg: ScalingConfig, n: int, seed: int) -> Any:
    return static_ring(cfg.edge_s, n, seed)


def cpond_point(cfg: ScalingConfig, n: int, seed: int) -> dict[str, Any]:
    """C-PonD at one N: event-driven pond formations (if ``n <= events_max_n``), the analytic
    latency from the same and more roots, and PondSim's edge model on the same tree."""
    from sim_adapter.fastquery import count_analytic
    from sim_adapter.plugins import query as pq

    t0 = time.perf_counter()
    net = _ring(cfg, n, seed)
    build_s = time.perf_counter() - t0
    rng = random.Random(f"pond-scaling-roots-{seed}-{n}")
    roots = [rng.randrange(n) for _ in range(max(cfg.analytic_queries, cfg.event_queries))]
    out: dict[str, Any] = {"n": n, "build_wall_s": round(build_s, 2)}
    events: list[dict[str, float]] = []
    if n <= cfg.events_max_n:
        t1 = time.perf_counter()
        pq.attach(net, seed=seed + 7)
        for r in roots[: cfg.event_queries]:
            res = pq.form_pond(
                net, net.nodes[r], k=cfg.k, requirements=cfg.requirements, rank=cfg.rank
            )
            q = res.query
            assert q is not None
            exact = count_analytic(net, net.nodes[r], loss=0.0)
            events.append(
                {
                    "root": r,
                    "query_s": q.elapsed_s,
                    "formation_s": res.elapsed_s,
                    "visited": q.visited,
                    "depth": q.depth,
                    "joined": len(res.joined),
                    "analytic_same_root_s": exact.latency_s,
                }
            )
            pq.release(net, net.nodes[r], res.pond_id)
        out["events_wall_s"] = round(time.perf_counter() - t1, 2)
    out["events"] = events
    t2 = time.perf_counter()
    ana = [count_analytic(net, net.nodes[r], loss=0.0) for r in roots[: cfg.analytic_queries]]
    out["analytic"] = [{"root": r, "latency_s": a.latency_s, "depth": a.depth, "count": a.value}
                       for r, a in zip(roots, ana, strict=False)]  # fmt: skip
    out["analytic_wall_s"] = round(time.perf_counter() - t2, 2)
    if cfg.pondsim_series:
        prng = random.Random(f"pond-scaling-pondsim-{seed}-{n}")
        ps = [
            count_analytic(
                net, net.nodes[r], edges="redraw", loss=cfg.pondsim_loss, rng=prng
            ).latency_s
            for r in roots[: cfg.analytic_queries]
        ]
        out["pondsim_model_s"] = ps
    out["peak_rss_mib"] = round(peak_rss_mib(), 1)
    return out


def replicate(cfg: ScalingConfig, seed: int) -> dict[str, Any]:
    """One replicate (one seed): every N's flock simulation and C-PonD point."""
    rng = random.Random(f"pond-scaling-flock-{seed}")
    rows = []
    for n in cfg.ns:
        t0 = time.perf_counter()
        flock = flock_simulate_s(cfg, n, rng)
        c = cpond_point(cfg, n, seed)
        c["flock_sim_s"] = flock
        c["wall_s"] = round(time.perf_counter() - t0, 2)
        rows.append(c)
    return {"seed": seed, "points": rows, "peak_rss_mib": round(peak_rss_mib(), 1)}


# ---------------------------------------------------------------------- aggregation, output
def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def aggregate(cfg: ScalingConfig, reps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per N: the model curves and every measured series as a mean with a 95% interval over
    the replicates (each replicate's value is its mean over queries / trials)."""
    rows = []
    for i, n in enumerate(cfg.ns):
        pts = [r["points"][i] for r in reps]
        ev = [_mean([e["query_s"] for e in p["events"]]) for p in pts if p["events"]]
        form = [_mean([e["formation_s"] for e in p["events"]]) for p in pts if p["events"]]
        gap = [abs(e["query_s"] - e["analytic_same_root_s"]) for p in pts for e in p["events"]]
        rows.append(
            {
                "n": n,
                "condor_linear_s": condor_linear_s(cfg, n),
                "flock_eq2_s": flock_eq2_s(cfg, n),
                "flock_sim_s": common.interval95([_mean(p["flock_sim_s"]) for p in pts]),
                "cpond_events_s": common.interval95(ev) if ev else None,
                "cpond_formation_s": common.interval95(form) if form else None,
                "events_vs_analytic_max_abs_s": max(gap) if gap else None,
                "cpond_analytic_s": common.interval95(
                    [_mean([a["latency_s"] for a in p["analytic"]]) for p in pts]
                ),
                "depth": _mean([float(a["depth"]) for p in pts for a in p["analytic"]]),
                "pondsim_model_s": common.interval95(
                    [_mean(p["pondsim_model_s"]) for p in pts if "pondsim_model_s" in p]
                ),
                "pondsim_outputs_s": PONDSIM_OUTPUTS_S.get(n),
                "mode": "events+analytic" if ev else "analytic",
            }
        )
    return rows


def _f(x: Any, nd: int = 2) -> str:
    if x is None:
        return "—"
    if isinstance(x, dict):
        if x.get("n", 0) == 0 or x["mean"] is None or math.isnan(x["mean"]):
            return "—"
        if x["n"] <= 1:
            return f"{x['mean']:.{nd}f}"
        return f"{x['mean']:.{nd}f} ±{(x['hi'] - x['lo']) / 2:.{nd}f}"
    return f"{x:.{nd}f}"


def markdown(rows: list[dict[str, Any]], k: int, cross: float | None) -> str:
    """The figure's numbers as a table (seconds), ours over ``k`` seeds."""
    lines = [
        f"### {NAME}: scheduling latency (s) against N, ours over {k} seed(s)",
        "",
        "| N | Condor linear | flock eq. 2 | flock sim | C-PonD query (events) | "
        "C-PonD pond formed (events) | C-PonD analytic | depth | PondSim model on our tree | "
        "authors' simulator (PondSim) outputs¹ |",
        "|" + "---|" * 10,
    ]
    for r in rows:
        lines.append(
            f"| {r['n']:,} | {_f(r['condor_linear_s'])} | {_f(r['flock_eq2_s'], 1)} | "
            f"{_f(r['flock_sim_s'], 1)} | {_f(r['cpond_events_s'])} | "
            f"{_f(r['cpond_formation_s'])} | {_f(r['cpond_analytic_s'])} | {r['depth']:.1f} | "
            f"{_f(r['pondsim_model_s'])} | {_f(r['pondsim_outputs_s'], 1)} |"
        )
    lines += [
        "",
        "C-PonD (analytic) overtakes Condor's linear model at N ≈ "
        + (f"{cross:,.0f}" if cross else "(no crossing in range)")
        + ' (paper: "larger than 100,000").',
        "",
        "¹ 11.0 / 16.1 / 21.6 / 26.9 s are outputs of the authors' public simulator (PondSim), "
        'not figures printed in the paper, which says only "tens of seconds" at 10^6.',
        "",
    ]
    return "\n".join(lines)


def _figure(rows: list[dict[str, Any]]) -> Any:
    def draw(fig: Any) -> None:
        ax = fig.add_subplot(1, 2, 1)
        xs = [r["n"] for r in rows]
        ax.loglog(xs, [r["condor_linear_s"] for r in rows], "k-", label="Condor (linear)")
        ax.loglog(xs, [r["flock_eq2_s"] for r in rows], "b:", label="Condor-flock (eq. 2)")
        ax.loglog(xs, [r["flock_sim_s"]["mean"] for r in rows], "b-", label="Condor-flock (sim)")
        ax.loglog(
            xs, [r["cpond_analytic_s"]["mean"] for r in rows], "r:", label="C-PonD (analytic)"
        )
        ev = [(r["n"], r["cpond_events_s"]["mean"]) for r in rows if r["cpond_events_s"]]
        if ev:
            ax.loglog(*zip(*ev, strict=True), "ro", label="C-PonD (event-driven)")
        ps = sorted(p for p in ((n, s) for n, s in PONDSIM_OUTPUTS_S.items()))
        ax.loglog(*zip(*ps, strict=True), "g^", label="PondSim outputs (authors' simulator)")
        ax.set_xlabel("resources N")
        ax.set_ylabel("scheduling latency (s)")
        ax.legend(fontsize=6)
        ax.set_title("PonD Fig. 6 (ours)", fontsize=9)
        ax2 = fig.add_subplot(1, 2, 2)
        ax2.semilogx(xs, [r["cpond_analytic_s"]["mean"] for r in rows], "r.-", label="U[50,300] ms")
        pm = [r["pondsim_model_s"]["mean"] for r in rows]
        ax2.semilogx(xs, pm, "g.-", label="PondSim edge model")
        ax2.semilogx(*zip(*ps, strict=True), "g^", label="PondSim outputs (not the paper)")
        ax2.set_xlabel("resources N (log)")
        ax2.set_ylabel("C-PonD discovery latency (s, linear)")
        ax2.legend(fontsize=6)
        ax2.set_title("C-PonD: O(log N)", fontsize=9)

    return draw


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the experiment; write outputs; return the document."""
    ns = tuple(int(x) for x in args.ns.split(",")) if args.ns else ScalingConfig().ns
    cfg = ScalingConfig(
        ns=ns,
        events_max_n=args.events_max_n,
        event_queries=args.event_queries,
        analytic_queries=args.analytic_queries,
        flock_trials=args.flock_trials,
    )
    seeds, reps, wall = common.run_seeded(functools.partial(replicate, cfg), args, NAME)
    rows = aggregate(cfg, reps)
    cross = crossing(
        [r["n"] for r in rows],
        [r["condor_linear_s"] for r in rows],
        [r["cpond_analytic_s"]["mean"] for r in rows],
    )
    rss = common.peak_rss_of(reps)
    doc = {
        "experiment": NAME,
        "source": "Lee et al. 2012 (PonD) §4.1, §4.2.1, Fig. 6, equation 2",
        "config": cfg.as_dict(),
        "seeds": seeds,
        "wall_s": round(wall, 2),
        "peak_rss_mib": rss,
        "rows": rows,
        "crossing_n": cross,
        "pondsim_outputs_s": PONDSIM_OUTPUTS_S,
        "paper": {
            "condor": "linear in N",
            "cpond": "O(log N), 'tens of seconds' at 10^6",
            "crossing": "larger than 100,000",
            "flock": "eq. 2 and simulation almost identical",
        },
        "replicates": reps,
    }
    md = markdown(rows, len(seeds), cross)
    cmd = f"flockring sim {NAME} --seeds {args.seeds} --seed {args.seed}"
    if args.ns:
        cmd += f" --ns {args.ns}"
    md += f"\nCommand: `{cmd}`; wall time {wall:.1f} s; peak RSS {rss:.0f} MiB.\n"
    doc["files"] = [
        str(p) for p in common.write_outputs(args.out, NAME, doc, md, [("", _figure(rows))])
    ]
    return doc


def _main(args: argparse.Namespace) -> int:
    doc = run(args)
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(markdown(doc["rows"], len(doc["seeds"]), doc["crossing_n"]))
        print(f"wall {doc['wall_s']} s; wrote {', '.join(doc['files'])}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``pond-scaling``."""
    p = sub.add_parser(NAME, help="PonD Fig. 6: Condor, Condor-flock and C-PonD vs pool size")
    common.add_common_args(p)
    d = ScalingConfig()
    p.add_argument("--ns", default="", help="comma-separated pool sizes (default 10^2..10^6)")
    p.add_argument("--events-max-n", type=int, default=d.events_max_n)
    p.add_argument("--event-queries", type=int, default=d.event_queries)
    p.add_argument("--analytic-queries", type=int, default=d.analytic_queries)
    p.add_argument("--flock-trials", type=int, default=d.flock_trials)
    p.set_defaults(func=_main)
