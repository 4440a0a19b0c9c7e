"""Reproduced experiments, one module per table/figure; each has ``register(subparsers)``.

Shared pieces (seeds, replicates on a process pool, 95% intervals, JSON/PNG/markdown output)
are in :mod:`sim_adapter.experiments.common`.
"""

EXPERIMENT_MODULES = (
    "sim_adapter.experiments.ring",
    "sim_adapter.experiments.butt",
    "sim_adapter.experiments.butt_sweep",
    "sim_adapter.experiments.butt_1000",
    "sim_adapter.experiments.pond",
)
