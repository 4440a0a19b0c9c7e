"""A local workload for a simulated pool on a live node (demos without HTCondor): a Poisson
stream of jobs that keeps the pool busy at a given load, so that it flocks when overloaded
(Butt et al. 2006 §3.2.1: a pool flocks when its queue exceeds its free machines)."""

from __future__ import annotations

import random
from typing import Any

__all__ = ["simulated_load"]


def simulated_load(
    pool: Any, load: float, mean_job_s: float, horizon_s: float, rng: random.Random
) -> int:
    """Give a ``SimulatedPool`` a Poisson stream of local jobs that keeps its machines busy at
    ``load`` (1.0 = arrivals exactly fill it; above 1 the queue grows and the pool flocks).

    Exponential job lengths of mean ``mean_job_s``; arrivals up to ``horizon_s`` from now are
    registered at once (``load_trace``: no timer per job). Returns the number of jobs.
    """
    if load <= 0 or pool.machines == 0:
        return 0
    rate = load * pool.machines / mean_job_s
    t = pool.now
    submit: list[float] = []
    length: list[float] = []
    while True:
        t += rng.expovariate(rate)
        if t > pool.now + horizon_s:
            break
        submit.append(t)
        length.append(rng.expovariate(1.0 / mean_job_s))
    pool.load_trace(submit, length)
    return len(submit)
