"""Write a session trace for ``flockring bench churn --trace FILE``: heavy-tailed sessions.

The churn benchmark's default model is MSPastry's synthetic one (Castro, Costa & Rowstron 2004
§4): Poisson arrivals, exponential session times. Measured peer-to-peer populations are not
exponential: Stutzbach & Rejaie ("Understanding churn in peer-to-peer networks", IMC 2006)
found session lengths in Gnutella, Kad and BitTorrent fit by a Weibull law with shape well
below 1 — many very short sessions and a long tail. No such measured trace ships with this
repository, so this script *synthesises* one with that law, and the benchmark reads it
through its trace mode exactly as it would read one converted from a real availability trace.

Model (every number a command-line choice; the defaults are assumptions, not fitted values):

* ``--nodes N`` nodes are up at time 0 (the benchmark builds them as its initial ring), with the
  residual sessions of a stationary population;
* arrivals after 0 are Poisson with rate N / mean session, so the population stays near N;
* each session is Weibull with shape ``--shape`` (default 0.5) and the scale that gives mean
  ``--session-min`` (mean = scale * Gamma(1 + 1/shape)).

Output: one ``arrive_s depart_s`` line per session, sorted, ``#`` comment lines at the top.
Run: ``.venv/bin/python benchmarks/weibull_sessions.py --nodes 2000 --session-min 30 --hours 0.3
--out trace.txt`` then ``flockring bench churn --trace trace.txt --nodes 2000 ...``.
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path


def sessions(
    nodes: int, session_min: float, shape: float, horizon_s: float, seed: int
) -> list[tuple[float, float]]:
    """``(arrive_s, depart_s)`` of every session up to ``horizon_s`` (module docstring)."""
    rng = random.Random(seed)
    mean_s = session_min * 60.0
    scale_s = mean_s / math.gamma(1.0 + 1.0 / shape)
    # the nodes up at time 0 are a snapshot of the stationary population: their sessions are
    # length-biased (long sessions are more likely to be in progress) and each is caught at a
    # uniform point, so they leave after the residual U * L; for Weibull (k, scale) the biased
    # length is scale * G^(1/k) with G ~ Gamma(1 + 1/k). Drawing them from the plain law instead
    # would start with a population that collapses as its many short sessions end at once.
    out = [
        (0.0, rng.random() * scale_s * rng.gammavariate(1.0 + 1.0 / shape, 1.0) ** (1.0 / shape))
        for _ in range(nodes)
    ]
    t = 0.0
    rate = nodes / mean_s
    while True:
        t += rng.expovariate(rate)
        if t >= horizon_s:
            break
        out.append((t, t + rng.weibullvariate(scale_s, shape)))
    # a session shorter than the float resolution would be rejected by the reader (a < d)
    return sorted((a, max(d, a + 0.01)) for a, d in out)


def main() -> None:
    """Command line (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2000, help="nodes up at time 0 (mean N)")
    p.add_argument("--session-min", type=float, default=30.0, help="mean session, minutes")
    p.add_argument("--shape", type=float, default=0.5, help="Weibull shape (< 1: heavy tail)")
    p.add_argument("--hours", type=float, default=0.5, help="arrivals up to this time")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True, help="trace file to write")
    a = p.parse_args()
    if a.nodes < 1 or a.session_min <= 0 or a.shape <= 0 or a.hours <= 0:
        p.error("--nodes, --session-min, --shape and --hours must be positive")
    rows = sessions(a.nodes, a.session_min, a.shape, a.hours * 3600.0, a.seed)
    short = sum(1 for x, y in rows if y - x < 60.0) / len(rows)
    head = (
        f"# synthetic trace: {a.nodes} nodes at 0, Poisson arrivals, Weibull sessions "
        f"(shape {a.shape}, mean {a.session_min} min), {a.hours} h, seed {a.seed}\n"
        f"# {len(rows)} sessions, {short:.1%} shorter than 1 min\n"
    )
    Path(a.out).write_text(head + "".join(f"{x:.3f} {y:.3f}\n" for x, y in rows), "utf-8")
    print(f"wrote {a.out}: {len(rows)} sessions, {short:.1%} shorter than 1 min")


if __name__ == "__main__":
    main()
