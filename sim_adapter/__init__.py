"""The discrete-event simulator: the same protocol cores in virtual time (docs/simulator.md)."""

from sim_adapter import latency
from sim_adapter.engine import Engine
from sim_adapter.network import OVERLAYS, Lookup, Network
from sim_adapter.simnode import SimNode

__all__ = ["OVERLAYS", "Engine", "Lookup", "Network", "SimNode", "latency"]
