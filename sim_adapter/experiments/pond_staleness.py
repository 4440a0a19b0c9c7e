"""``flockring sim pond-staleness``: matchmaking-result staleness, Condor vs C-PonD (PonD Fig. 7).

Theory of operation (models in :mod:`.pond_staleness_model`; Lee et al. 2012 §4.1, §4.2.2).

* **Fig. 7a — worker churn.** Sessions exponential with mean 300 … 1500 s. *Condor*: the
  collector's soft state simulated for ``workers`` (10^6, the paper's size) workers, checked at
  ``T + δ`` with ``δ`` = Condor's matchmaking time at that size (linear model: N/10^4 s) and at
  ``δ = 0`` (equation 4's setting), beside equations 3–4 (analytic). *C-PonD* at 10^6 in the
  **analytic mode** (the event-driven one does not fit 10^6 nodes with churn in this process):
  the staleness windows of the query tree (:func:`sim_adapter.fastquery.query_timeline`) with
  exponential departures; and **event-driven** at ``events_n`` nodes, where the real pond
  protocol forms ponds while nodes depart (crash) and a match is stale when its invitation finds
  the node gone — counted by the pond plugin as a lost invitation.
* **Fig. 7b — attribute dynamics.** Each worker's ``ZipfAttribute`` changes at rate λ; x values
  are the mean times between changes, :attr:`StalenessConfig.attr_means_s`. *Condor* simulated
  at ``workers`` workers and analytic; *C-PonD* analytic at ``workers`` (tree windows) and
  event-driven at ``events_n``, where every node's ad changes on timers and the pond plugin's
  **claim-time re-check** declines a stale match (``declined["stale"]``). The share of nodes
  holding value 1 is reported (PonD: 35 %).

Replicates (seeds) redraw everything: sessions, values, rings, roots.
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
import numpy as np

from discovery.machine import DictProvider, MachineAd, random_machine_ad, zipf_value
from sim_adapter.bench import peak_rss_mib
from sim_adapter.experiments import common
from sim_adapter.experiments import pond_staleness_model as m
from sim_adapter.experiments.pond_common import static_ring, zipf_pmf

__all__ = ["NAME", "StalenessConfig", "register", "replicate", "run"]

NAME = "pond-staleness"

#: what the paper states in the text of §4.2.2 (Fig. 7's bars are not printed as numbers)
PAPER = {
    "7a": "Condor: ~20% stale at 25 min mean uptime; C-PonD: almost no impact",
    "7b": "Condor: ~20% stale when the mean change period equals the 300 s update period",
    "zipf_value1": 0.35,
}


@attrs.frozen(slots=True)
class StalenessConfig:
    """Parameters of the PonD Fig. 7 experiment (sources beside each field)."""

    #: mean session times (s) — PonD §4.2.2: λ = 1/300 … 1/1500 per second
    means_s: tuple[float, ...] = (300.0, 600.0, 900.0, 1200.0, 1500.0)
    #: mean times between attribute changes (s), Fig. 7b's x axis (the paper does not print
    #: its values; it discusses 300 s, the ad update period)
    attr_means_s: tuple[float, ...] = (60.0, 150.0, 300.0, 600.0, 900.0, 1200.0, 1500.0)
    #: HTCondor UPDATE_INTERVAL (ad period) and CLASSAD_LIFETIME (soft-state expiry) — PonD
    #: §4.2.2: "every 300 seconds", "15 minutes"
    update_s: float = 300.0
    lifetime_s: float = 900.0
    #: workers of the Condor simulation and of C-PonD's analytic mode — PonD: 10^6
    workers: int = 1_000_000
    #: roots of C-PonD's analytic mode (windows averaged over them)
    analytic_roots: int = 3
    #: nodes of the event-driven C-PonD runs
    events_n: int = 10_000
    #: ponds formed per mean value, event-driven (7a: each on a fresh ring)
    event_queries: int = 8
    #: machines per pond (our choice)
    k: int = 10
    #: one-way edge delay U[lo, hi] s — PonD §4.2.1
    edge_s: tuple[float, float] = (0.05, 0.30)
    #: Condor's matchmaking round at 10^4 workers (linear model, PonD §4.2.1)
    condor_round_s: float = 1.0
    #: 7a event-driven: departures are drawn this far ahead of each pond formation (s)
    churn_horizon_s: float = 120.0

    def condor_delta_s(self) -> float:
        """Condor's matchmaking time at ``workers`` (when its scheduling completes)."""
        return self.condor_round_s * self.workers / 10_000

    def as_dict(self) -> dict[str, Any]:
        """The parameters, JSON-friendly."""
        return attrs.asdict(self)


def _ring(cfg: StalenessConfig, n: int, seed: int) -> Any:
    return static_ring(cfg.edge_s, n, seed)


# ---------------------------------------------------------------------- C-PonD, analytic
def cpond_analytic(cfg: StalenessConfig, n: int, seed: int) -> dict[str, Any]:
    """Staleness windows of ``analytic_roots`` queries on an ``n``-node ring, and the resulting
    non-stale fractions for every mean of 7a and 7b (expectation over all nodes, the matches
    of a rank-ordered query being a random sample of them)."""
    net = _ring(cfg, n, seed)
    rng = random.Random(f"staleness-roots-{seed}-{n}")
    ws, lats = [], []
    for _ in range(cfg.analytic_roots):
        w, lat, _ = m.cpond_windows(net, rng.randrange(n))
        ws.append(w)
        lats.append(lat)
    w = np.concatenate(ws)
    pmf = zipf_pmf()
    change = sum(p * (1.0 - p) for p in pmf)
    return {
        "n": n,
        "query_latency_s": lats,
        "window_mean_s": float(w.mean()),
        "window_max_s": float(w.max()),
        "churn": {str(mu): float(np.exp(-w / mu).mean()) for mu in cfg.means_s},
        "attr": {
            str(mu): 1.0 - change * float((1.0 - np.exp(-w / mu)).mean()) for mu in cfg.attr_means_s
        },
    }


# ---------------------------------------------------------------------- C-PonD, event-driven
def _ads(net: Any, seed: int, providers: dict[int, DictProvider] | None = None) -> None:
    from sim_adapter.plugins import query as pq

    def make(node: Any, rng: random.Random) -> MachineAd:
        ad = random_machine_ad(rng, f"slot1@node{node.index}")
        prov = DictProvider()
        prov.set(ZipfAttribute=zipf_value(rng))
        if providers is not None:
            providers[node.index] = prov
        return MachineAd(ad, prov)

    pq.attach(net, machine_ad=make, seed=seed)


def cpond_churn_events(cfg: StalenessConfig, mean_s: float, seed: int) -> dict[str, Any]:
    """Event-driven 7a: ``event_queries`` pond formations, each on a fresh ring whose nodes
    (all but the root) depart at exponential times; a match whose node left before its
    invitation arrived is stale (the invitation is lost)."""
    from sim_adapter.plugins import query as pq

    joined = lost = stale = 0
    latency = []
    for q in range(cfg.event_queries):
        s = seed * 1_000 + q
        net = _ring(cfg, cfg.events_n, s)
        _ads(net, s + 7)
        rng = random.Random(f"staleness-churn-{seed}-{mean_s}-{q}")
        root = rng.randrange(cfg.events_n)
        for node in net.nodes:
            d = rng.expovariate(1.0 / mean_s)
            if node.index != root and d < cfg.churn_horizon_s:
                net.engine.call_later(d, functools.partial(net.crash, node))
        res = pq.form_pond(net, net.nodes[root], k=cfg.k, requirements="true", rank="TARGET.KFlops")
        joined += len(res.joined)
        lost += len(res.lost)
        stale += res.declined.get("stale", 0)
        if res.query is not None:
            latency.append(res.query.elapsed_s)
    tot = joined + lost + stale
    return {
        "joined": joined,
        "lost": lost,
        "stale_declined": stale,
        "non_stale": joined / tot if tot else math.nan,
        "query_latency_s": latency,
    }


def cpond_attr_events(cfg: StalenessConfig, mean_s: float, seed: int) -> dict[str, Any]:
    """Event-driven 7b: one ring whose nodes change ``ZipfAttribute`` on timers; ponds for
    Zipf-drawn targets; the claim-time re-check declines stale matches."""
    from sim_adapter.plugins import query as pq

    net = _ring(cfg, cfg.events_n, seed)
    prov: dict[int, DictProvider] = {}
    _ads(net, seed + 7, prov)
    rc = random.Random(f"staleness-attr-{seed}-{mean_s}")
    changes = [0]

    def change(i: int) -> None:
        prov[i].set(ZipfAttribute=zipf_value(rc))
        changes[0] += 1
        net.engine.call_later(rc.expovariate(1.0 / mean_s), functools.partial(change, i))

    for i in prov:
        net.engine.call_later(rc.expovariate(1.0 / mean_s), functools.partial(change, i))
    value1 = sum(1 for p in prov.values() if p.values["ZipfAttribute"] == 1) / len(prov)
    joined = stale = lost = 0
    for _ in range(cfg.event_queries):
        v = zipf_value(rc)
        root = net.nodes[rc.randrange(cfg.events_n)]
        res = pq.form_pond(
            net, root, k=cfg.k, requirements=f"TARGET.ZipfAttribute == {v}", rank="TARGET.KFlops"
        )
        joined += len(res.joined)
        lost += len(res.lost)
        stale += res.declined.get("stale", 0)
        pq.release(net, root, res.pond_id)
    tot = joined + stale + lost
    return {
        "joined": joined,
        "stale_declined": stale,
        "lost": lost,
        "non_stale": joined / tot if tot else math.nan,
        "changes": changes[0],
        "value1_fraction": value1,
    }


# ---------------------------------------------------------------------- one replicate
def replicate(cfg: StalenessConfig, seed: int) -> dict[str, Any]:
    """One seed: Condor simulated and analytic, C-PonD analytic (``workers`` nodes) and
    event-driven (``events_n`` nodes), for 7a and 7b."""
    t0 = time.perf_counter()
    gen = np.random.default_rng(seed)
    delta = cfg.condor_delta_s()
    td, ts = cfg.update_s, cfg.lifetime_s
    out: dict[str, Any] = {"seed": seed, "condor_delta_s": delta}
    out["condor_churn"] = {
        str(mu): {
            "sim": m.condor_churn_sim(cfg.workers, mu, td, ts, (0.0, delta), gen),
            "analytic_delta0": m.condor_churn_analytic(mu, td, ts, 0.0),
            "analytic": m.condor_churn_analytic(mu, td, ts, delta),
        }
        for mu in cfg.means_s
    }
    out["condor_attr"] = {
        str(mu): {
            "sim": m.attr_sim(cfg.workers, mu, td, (0.0, delta), gen),
            "analytic_delta0": m.attr_analytic(mu, td, 0.0),
            "analytic": m.attr_analytic(mu, td, delta),
        }
        for mu in cfg.attr_means_s
    }
    t1 = time.perf_counter()
    out["cpond_analytic"] = cpond_analytic(cfg, cfg.workers, seed)
    out["cpond_analytic_events_n"] = cpond_analytic(cfg, cfg.events_n, seed)
    t2 = time.perf_counter()
    out["cpond_churn_events"] = {str(mu): cpond_churn_events(cfg, mu, seed) for mu in cfg.means_s}
    out["cpond_attr_events"] = {
        str(mu): cpond_attr_events(cfg, mu, seed) for mu in cfg.attr_means_s
    }
    out["wall_s"] = {
        "condor": round(t1 - t0, 2),
        "cpond_analytic": round(t2 - t1, 2),
        "cpond_events": round(time.perf_counter() - t2, 2),
    }
    out["peak_rss_mib"] = round(peak_rss_mib(), 1)
    return out


# ---------------------------------------------------------------------- aggregate and output
def _iv(xs: list[float]) -> dict[str, float]:
    return common.interval95([x for x in xs if not math.isnan(x)])


def aggregate(cfg: StalenessConfig, reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Every series as mean ± 95% interval over replicates (non-stale fractions)."""
    d0, d = "0.0", str(cfg.condor_delta_s())
    a: dict[str, Any] = {"7a": [], "7b": []}
    for mu in cfg.means_s:
        k = str(mu)
        cc = [r["condor_churn"][k] for r in reps]
        a["7a"].append(
            {
                "mean_s": mu,
                "cpond_analytic": _iv([r["cpond_analytic"]["churn"][k] for r in reps]),
                "cpond_events": _iv([r["cpond_churn_events"][k]["non_stale"] for r in reps]),
                "cpond_analytic_events_n": _iv(
                    [r["cpond_analytic_events_n"]["churn"][k] for r in reps]
                ),
                "condor_sim_eq4": _iv([c["sim"]["by_delta"][d0]["eq4"] for c in cc]),
                "condor_thr_eq4": cc[0]["analytic_delta0"]["eq4_eq3"],
                "condor_thr_eq4_exact": cc[0]["analytic_delta0"]["eq4_exact"],
                "condor_sim_per_schedule": _iv(
                    [c["sim"]["by_delta"][d]["per_schedule"] for c in cc]
                ),
                "condor_thr_per_schedule": cc[0]["analytic"]["per_schedule_exact"],
            }
        )
    for mu in cfg.attr_means_s:
        k = str(mu)
        ca = [r["condor_attr"][k] for r in reps]
        a["7b"].append(
            {
                "mean_s": mu,
                "cpond_analytic": _iv([r["cpond_analytic"]["attr"][k] for r in reps]),
                "cpond_events": _iv([r["cpond_attr_events"][k]["non_stale"] for r in reps]),
                "cpond_analytic_events_n": _iv(
                    [r["cpond_analytic_events_n"]["attr"][k] for r in reps]
                ),
                "condor_sim": _iv([c["sim"]["by_delta"][d] for c in ca]),
                "condor_sim_delta0": _iv([c["sim"]["by_delta"][d0] for c in ca]),
                "condor_thr": ca[0]["analytic"],
                "condor_thr_delta0": ca[0]["analytic_delta0"],
            }
        )
    a["value1_fraction"] = _iv(
        [c["sim"]["value1_fraction"] for r in reps for c in r["condor_attr"].values()]
    )
    a["window_mean_s"] = _iv([r["cpond_analytic"]["window_mean_s"] for r in reps])
    a["query_latency_s"] = _iv([x for r in reps for x in r["cpond_analytic"]["query_latency_s"]])
    return a


def _c(iv: Any) -> str:
    return common.fmt_interval(iv, 3)


def markdown(cfg: StalenessConfig, agg: dict[str, Any], k: int) -> str:
    """Both panels as tables of non-stale fractions, ours over ``k`` seeds."""
    w, e = f"{cfg.workers:,}", f"{cfg.events_n:,}"
    dl = f"{cfg.condor_delta_s():g}"
    lines = [
        f"### {NAME} — Fig. 7a: fraction of non-stale results vs mean session time, "
        f"ours over {k} seed(s)",
        "",
        f"| mean session (s) | C-PonD analytic ({w}) | C-PonD events ({e}) | "
        f"C-PonD analytic ({e}) | Condor sim, eq.4 measure (δ=0) | Condor thr eq. 4 | "
        f"Condor eq. 4 exact | Condor sim per schedule (δ={dl} s) | same, analytic |",
        "|" + "---|" * 9,
    ]
    for r in agg["7a"]:
        lines.append(
            f"| {r['mean_s']:.0f} | {_c(r['cpond_analytic'])} | {_c(r['cpond_events'])} | "
            f"{_c(r['cpond_analytic_events_n'])} | {_c(r['condor_sim_eq4'])} | "
            f"{_c(r['condor_thr_eq4'])} | {_c(r['condor_thr_eq4_exact'])} | "
            f"{_c(r['condor_sim_per_schedule'])} | {_c(r['condor_thr_per_schedule'])} |"
        )
    lines += [
        "",
        f"Paper (text of §4.2.2): {PAPER['7a']}.",
        "",
        f"### {NAME} — Fig. 7b: fraction of non-stale results vs mean time between attribute "
        "changes",
        "",
        f"| mean change period (s) | C-PonD analytic ({w}) | C-PonD events ({e}) | "
        f"C-PonD analytic ({e}) | Condor sim (δ={dl} s) | Condor thr (δ={dl} s) | "
        "Condor sim (δ=0) | Condor thr (δ=0) |",
        "|" + "---|" * 8,
    ]
    for r in agg["7b"]:
        lines.append(
            f"| {r['mean_s']:.0f} | {_c(r['cpond_analytic'])} | {_c(r['cpond_events'])} | "
            f"{_c(r['cpond_analytic_events_n'])} | {_c(r['condor_sim'])} | "
            f"{_c(r['condor_thr'])} | {_c(r['condor_sim_delta0'])} | "
            f"{_c(r['condor_thr_delta0'])} |"
        )
    lines += [
        "",
        f"Paper: {PAPER['7b']}. Nodes holding ZipfAttribute = 1: {_c(agg['value1_fraction'])} "
        "(paper: 35%).",
        f"C-PonD query latency at {w} nodes: {_c(agg['query_latency_s'])} s; mean staleness "
        f"window {_c(agg['window_mean_s'])} s.",
        "",
    ]
    return "\n".join(lines)


def _fig_a(cfg: StalenessConfig, agg: dict[str, Any]) -> Any:
    def draw(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        rows = agg["7a"]
        series = [
            (f"C-PonD (analytic, {cfg.workers:,})", [r["cpond_analytic"]["mean"] for r in rows]),
            (f"C-PonD (events, {cfg.events_n:,})", [r["cpond_events"]["mean"] for r in rows]),
            ("Condor (sim, eq.4 measure)", [r["condor_sim_eq4"]["mean"] for r in rows]),
            ("Condor (thr, eq. 4)", [r["condor_thr_eq4"] for r in rows]),
            ("Condor (sim, per schedule)", [r["condor_sim_per_schedule"]["mean"] for r in rows]),
        ]
        width = 0.16
        for j, (label, ys) in enumerate(series):
            ax.bar([i + (j - 2) * width for i in range(len(rows))], ys, width, label=label)
        ax.set_xticks(range(len(rows)), [f"{r['mean_s'] / 60:.0f}" for r in rows])
        ax.set_xlabel("mean session time (min)")
        ax.set_ylabel("fraction of non-stale results")
        ax.set_ylim(0, 1.35)
        ax.legend(fontsize=7, loc="upper center", ncol=3)
        ax.set_title("PonD Fig. 7a (ours): worker churn")

    return draw


def _fig_b(cfg: StalenessConfig, agg: dict[str, Any]) -> Any:
    def draw(fig: Any) -> None:
        ax = fig.add_subplot(1, 1, 1)
        rows = agg["7b"]
        xs = [r["mean_s"] for r in rows]
        ana = [r["cpond_analytic"]["mean"] for r in rows]
        ax.semilogx(xs, ana, "r.-", label=f"C-PonD (analytic, {cfg.workers:,})")
        ev = [r["cpond_events"]["mean"] for r in rows]
        ax.semilogx(xs, ev, "ro", label=f"C-PonD (events, {cfg.events_n:,})")
        ax.semilogx(xs, [r["condor_sim"]["mean"] for r in rows], "b.-", label="Condor (sim)")
        ax.semilogx(xs, [r["condor_thr"] for r in rows], "b:", label="Condor (analytic)")
        ax.axvline(300, color="grey", lw=0.5)
        ax.set_xlabel("mean time between ZipfAttribute changes (s)")
        ax.set_ylabel("fraction of non-stale results")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title("PonD Fig. 7b (ours): attribute dynamics")

    return draw


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the experiment; write outputs; return the document."""
    cfg = StalenessConfig(
        workers=args.workers_n, events_n=args.events_n, event_queries=args.event_queries
    )
    seeds, reps, wall = common.run_seeded(functools.partial(replicate, cfg), args, NAME)
    agg = aggregate(cfg, reps)
    rss = common.peak_rss_of(reps)
    doc = {
        "experiment": NAME,
        "source": "Lee et al. 2012 (PonD) §4.1, §4.2.2, Fig. 7, equations 3-4",
        "config": cfg.as_dict(),
        "seeds": seeds,
        "wall_s": round(wall, 2),
        "peak_rss_mib": rss,
        "aggregate": agg,
        "paper": PAPER,
        "replicates": reps,
    }
    md = markdown(cfg, agg, len(seeds))
    cmd = (
        f"flockring sim {NAME} --seeds {args.seeds} --seed {args.seed} "
        f"--workers-n {cfg.workers} --events-n {cfg.events_n}"
    )
    md += f"\nCommand: `{cmd}`; wall time {wall:.1f} s; peak RSS {rss:.0f} MiB.\n"
    figs = [("-7a", _fig_a(cfg, agg)), ("-7b", _fig_b(cfg, agg))]
    doc["files"] = [str(p) for p in common.write_outputs(args.out, NAME, doc, md, figs)]
    return doc


def _main(args: argparse.Namespace) -> int:
    doc = run(args)
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(markdown(StalenessConfig(**doc["config"]), doc["aggregate"], len(doc["seeds"])))
        print(f"wall {doc['wall_s']} s; wrote {', '.join(doc['files'])}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``pond-staleness``."""
    p = sub.add_parser(NAME, help="PonD Fig. 7: stale matchmaking results, Condor vs C-PonD")
    common.add_common_args(p)
    d = StalenessConfig()
    p.add_argument("--workers-n", type=int, default=d.workers, help="workers (paper: 10^6)")
    p.add_argument("--events-n", type=int, default=d.events_n, help="nodes, event-driven runs")
    p.add_argument("--event-queries", type=int, default=d.event_queries)
    p.set_defaults(func=_main)
