"""Reproduced experiments, one module per table/figure; each has ``register(subparsers)``."""

EXPERIMENT_MODULES = ("sim_adapter.experiments.ring",)
