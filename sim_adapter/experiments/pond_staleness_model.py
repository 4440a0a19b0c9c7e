"""Models of PonD Fig. 7 (§4.1 "Matchmaking result staleness", §4.2.2, equations 3–4).

Theory of operation. A scheduling result is *stale* when the machine it names no longer
satisfies the job when the scheduling completes (PonD §4, Fig. 5).

**Condor, soft state (Fig. 7a).** Each worker alternates up and down sessions, both exponential
with mean ``1/λ`` (PonD: "join/leave event rate λ"; up half the time). While up it sends its ad
at join and every ``T_d`` = 300 s; the collector keeps an ad until ``T_s`` = 15 min after its last
update (HTCondor's ``UPDATE_INTERVAL`` and ``CLASSAD_LIFETIME``); a worker that leaves says
nothing. :func:`condor_churn_sim` simulates exactly that, forward in time, for every worker
(vectorised over workers with numpy: sessions are drawn one after another from a warm-up far in
the past, updates follow their fixed schedule), and looks at the collector at time ``T``:
a worker is *listed* if its newest ad is younger than ``T_s``; a listed worker's result is
*stale* if the session that sent the ad has ended by ``T + δ``, when scheduling completes
(``δ`` = Condor's matchmaking time at N, the linear model of PonD §4.2.1). Two measures:

* ``eq4`` — 1 − P(listed and stale) over *all* workers: what equations 3–4 compute (eq. 3 is the
  probability that a down worker is still listed, eq. 4 multiplies by P(down) = 1/2);
* ``per_schedule`` — P(not stale | listed): a negotiator picks a listed worker (the job's
  requirements admit any, its rank is arbitrary), as a real scheduling does.

:func:`condor_churn_analytic` gives both in closed form. ``eq3`` is the paper's equation 3 (the
age ``u`` of a dead worker's last update uniform on [0, T_d)): P(Stl) = 1 − (e^{−λ(T_s−T_d)} −
e^{−λT_s}) / (λT_d). ``exact`` uses the true law of ``u``, the session length modulo ``T_d``
(density λe^{−λu} / (1 − e^{−λT_d})), which the simulation follows; with ``δ``:
eq4 = 1 − P(Stl)/2 − (1 − e^{−λδ})/2 and per_schedule = e^{−λδ} / (1 + P(Stl)).

**Condor, attribute dynamics (Fig. 7b).** Workers stay up; each changes its ``ZipfAttribute``
at rate λ (exponential gaps), a change drawing a fresh value from the same Zipf law (it may draw
the value it had). A job requires ``ZipfAttribute == v`` with ``v`` Zipf-drawn; the negotiator
picks a worker whose *collector* value (the value at its last update, updates every ``T_d`` from
a random phase) is ``v``; stale if the worker's value at ``T + δ`` differs.
Analytic: P(non-stale) = Σ_v p_v [p_v + (1 − p_v) · e^{−λδ} (1 − e^{−λT_d}) / (λT_d)].

**C-PonD.** A node matches the job against its own ad when the query reaches it (``a_i``) and
is claimed — the invitation re-checks the match (``discovery.pond_worker``) — when the
invitation arrives, ``L + one_way(root, i)`` after the query started (``L`` the query latency).
The window ``w_i`` between the two is all that can make the result stale. At large N the
windows come from :func:`sim_adapter.fastquery.query_timeline` (the same tree the protocol
builds) and a worker is stale with probability 1 − e^{−λw_i} (churn; memoryless sessions) or
(1 − p_v)(1 − e^{−λw_i}) (attribute change). The event-driven mode (:mod:`.pond_staleness`)
runs the pond protocol itself and counts invitations lost to departed nodes and ``stale``
declines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from sim_adapter.experiments.pond_common import zipf_pmf

__all__ = [
    "attr_analytic",
    "attr_sim",
    "condor_churn_analytic",
    "condor_churn_sim",
    "cpond_windows",
    "p_stl_eq3",
    "p_stl_exact",
]


def p_stl_eq3(lam: float, td: float, ts: float) -> float:
    """PonD equation 3 in closed form: P(a dead worker's ad is still at the collector)."""
    return 1.0 - (math.exp(-lam * (ts - td)) - math.exp(-lam * ts)) / (lam * td)


def p_stl_exact(lam: float, td: float, ts: float, steps: int = 4000) -> float:
    """Equation 3 with the true law of the last update's age at death (session length
    modulo ``td``), by the trapezoid rule over the death age ``t`` in [T_s − T_d, T_s]."""
    a = ts - td
    first = 1.0 - math.exp(-lam * a)
    norm = 1.0 - math.exp(-lam * td)
    h = td / steps
    acc = 0.0
    for j in range(steps + 1):
        t = a + j * h
        f = lam * math.exp(-lam * t) * (1.0 - math.exp(-lam * (ts - t))) / norm
        acc += f * (0.5 if j in (0, steps) else 1.0)
    return first + acc * h


def condor_churn_analytic(mean_s: float, td: float, ts: float, delta_s: float) -> dict[str, float]:
    """Both measures (module docstring) from equation 3 and from its exact form."""
    lam = 1.0 / mean_s
    out = {}
    for name, p in (("eq3", p_stl_eq3(lam, td, ts)), ("exact", p_stl_exact(lam, td, ts))):
        keep = math.exp(-lam * delta_s)
        out[f"p_stl_{name}"] = p
        out[f"eq4_{name}"] = 1.0 - 0.5 * p - 0.5 * (1.0 - keep)
        out[f"per_schedule_{name}"] = keep / (1.0 + p)
    return out


def condor_churn_sim(
    n: int,
    mean_s: float,
    td: float,
    ts: float,
    deltas: Sequence[float],
    rng: np.random.Generator,
    *,
    warmup_means: float = 12.0,
) -> dict[str, Any]:
    """Simulate ``n`` workers' sessions and the collector (module docstring); the collector is
    read at ``T`` = 0 and results checked at ``T + δ`` for each ``δ`` in ``deltas``."""
    horizon = max(deltas)
    t0 = -(warmup_means * mean_s + 2.0 * ts)
    up = rng.random(n) < 0.5
    start = np.full(n, t0)
    end = start + rng.exponential(mean_s, n)
    # the newest up session that started by T = 0: its start and end (NaN: none yet)
    js = np.full(n, np.nan)
    je = np.full(n, np.nan)
    sessions = 0
    while True:
        act = end <= horizon
        if not act.any():
            break
        rec = act & up & (start <= 0.0)
        js[rec] = start[rec]
        je[rec] = end[rec]
        sessions += int((act & up).sum())
        start[act] = end[act]
        end[act] = start[act] + rng.exponential(mean_s, int(act.sum()))
        up[act] = ~up[act]
    rec = up & (start <= 0.0)  # the session in progress at the horizon
    js[rec] = start[rec]
    je[rec] = end[rec]
    have = ~np.isnan(js)
    safe_js = np.where(have, js, 0.0)
    last = safe_js + td * np.floor((np.minimum(np.where(have, je, 0.0), 0.0) - safe_js) / td)
    listed = have & (-last <= ts)
    up_now = have & (je > 0.0)
    out: dict[str, Any] = {
        "workers": n,
        "sessions": sessions,
        "up_fraction": float(up_now.mean()),
        "listed_fraction": float(listed.mean()),
        "by_delta": {},
    }
    nl = int(listed.sum())
    for d in deltas:
        ok = listed & (je > d)
        out["by_delta"][str(d)] = {
            "eq4": 1.0 - float((listed & ~ok).mean()),
            "per_schedule": float(ok.sum()) / nl if nl else math.nan,
            "listed": nl,
        }
    return out


def attr_analytic(mean_s: float, td: float, delta_s: float, n: int = 10) -> float:
    """P(non-stale) of Condor under attribute dynamics (module docstring)."""
    lam = 1.0 / mean_s
    keep = math.exp(-lam * delta_s) * (1.0 - math.exp(-lam * td)) / (lam * td)
    return sum(p * (p + (1.0 - p) * keep) for p in zipf_pmf(n))


def _zipf(rng: np.random.Generator, size: int, pmf: Sequence[float]) -> Any:
    return rng.choice(np.arange(1, len(pmf) + 1), size=size, p=np.asarray(pmf))


def attr_sim(
    n: int,
    mean_s: float,
    td: float,
    deltas: Sequence[float],
    rng: np.random.Generator,
    *,
    warmup_s: float = 3600.0,
) -> dict[str, Any]:
    """Simulate ``n`` always-up workers whose ``ZipfAttribute`` changes at rate 1/``mean_s``
    and whose ads reach the collector every ``td`` (random phase); read the collector at 0
    and check at each ``δ``. A job's target ``v`` is Zipf-drawn; its result is a worker whose
    collector value is ``v``; the fraction non-stale is averaged over targets."""
    pmf = zipf_pmf()
    horizon = max(deltas)
    phase = rng.uniform(0.0, td, n)
    last = -np.mod(-phase, td)  # the newest update at or before 0: phase + k·td <= 0
    last = np.where(last > 0.0, last - td, last)
    v = _zipf(rng, n, pmf)
    v_at_update = v.copy()
    nxt = -warmup_s + rng.exponential(mean_s, n)
    # the value at each δ: filled when the first change after δ is drawn (or at the end)
    ds = sorted(float(d) for d in deltas)
    at_delta = {d: v.copy() for d in ds}
    done_d = {d: np.zeros(n, dtype=bool) for d in ds}
    changes = 0
    while True:
        act = nxt <= horizon
        if not act.any():
            break
        idx = np.nonzero(act)[0]
        t = nxt[idx]
        for d in ds:
            passed = idx[(t > d) & ~done_d[d][idx]]
            at_delta[d][passed] = v[passed]
            done_d[d][passed] = True
        new = _zipf(rng, idx.size, pmf)
        v[idx] = new
        before = idx[t <= last[idx]]
        v_at_update[before] = v[before]
        nxt[idx] = t + rng.exponential(mean_s, idx.size)
        changes += idx.size
    for d in ds:
        rest = ~done_d[d]
        at_delta[d][rest] = v[rest]
    out: dict[str, Any] = {
        "workers": n,
        "changes": changes,
        "value1_fraction": float((v_at_update == 1).mean()),
        "by_delta": {},
    }
    for d in ds:
        frac = 0.0
        for val, p in enumerate(pmf, start=1):
            cand = v_at_update == val
            c = int(cand.sum())
            if c:
                frac += p * float((at_delta[d][cand] == val).sum()) / c
        out["by_delta"][str(d)] = frac
    return out


def cpond_windows(net: Any, root_index: int) -> tuple[Any, float, int]:
    """The staleness window of every node a query from ``root_index`` reaches: from its
    evaluation to the arrival of its invitation (``L + one_way(root, i) - a_i``); returns
    (windows as a numpy array, the query latency L, nodes visited)."""
    from sim_adapter.fastquery import query_timeline

    tl = query_timeline(net, net.nodes[root_index])
    arr = np.frombuffer(tl.arrival_s, dtype=np.float64)
    seen = ~np.isnan(arr)
    ow = net.latency.one_way_s
    inv = np.array(
        [0.0 if i == root_index else ow(root_index, i) for i in range(len(arr))], dtype=np.float64
    )
    w = tl.latency_s + inv - arr
    return w[seen], tl.latency_s, tl.visited
