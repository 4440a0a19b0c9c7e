"""Resource discovery on the overlays: the plugins a self-organizing HTCondor grid runs.

* **Flock** (:mod:`discovery.announce`): TTL resource announcements, the proximity-sorted
  willing list and the Flocking Manager (Butt et al. 2006 §3.2, §4.1); the policy file
  (:mod:`discovery.policy`); pool models and the HTCondor configuration they lead to
  (:mod:`discovery.pool`, :mod:`discovery.condor`: rendering and applying it).
* **ResourceQuery** and **PoolOnDemand** (:mod:`discovery.query`, :mod:`discovery.pond`):
  First-Fit ClassAd tree queries with HTCondor's own matchmaking and Pools on Demand (PonD
  §3.1–3.2); the queue-driven :class:`PondScheduler`.
* **Failover** (:mod:`discovery.failover`): replica-based central-manager failover on a pool
  ring (Butt et al. 2006 §3.3, §4.2).
* :mod:`discovery.live` (a subpackage): the trio side on a live ``overlay.Node``.

Every plugin is a sans-io application on the KBR API: the same object runs in the simulator
(``sim_adapter.plugins``) and on a live node. Names are loaded on first use, so importing one
plugin does not load HTCondor's ClassAd library or trio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from discovery.announce import FLOCK_APP, Flock
    from discovery.classads import QuerySyntaxError
    from discovery.condor import CondorHostApplier, FlockConfigApplier
    from discovery.condor_apply import apply_config
    from discovery.condor_pool import CondorPool
    from discovery.condor_render import render_condor_host, render_flock_config
    from discovery.condor_syntax import CondorError
    from discovery.decision import FlockDecision, FlockTarget
    from discovery.failover import Failover
    from discovery.failover_agent import AgentConfig, CollectorView, PoolAgent
    from discovery.failover_config import (
        FailoverConfig,
        FailoverError,
        ManagerChange,
        NotManagerError,
        StateTooLargeError,
    )
    from discovery.failover_roles import Role as FailoverRole
    from discovery.flock_config import FlockConfig, PoolView
    from discovery.ledger import JobLedger, PoolError
    from discovery.machine import MachineAd, random_machine_ad
    from discovery.policy import Peer, Policy, PolicyError
    from discovery.pond import PoolOnDemand
    from discovery.pond_scheduler import CondorQueue, PondScheduler, SchedulerConfig
    from discovery.pond_types import PondConfig, PondError, PondResult, ReleaseResult
    from discovery.pool import PoolState, Refusal, SharingRules, SimulatedPool
    from discovery.query import Match, QueryConfig, QueryResult, ResourceQuery
    from discovery.site import Site, SiteState
    from discovery.submit import FlockPush, SubmitConfig, SubmitError, SubmitSync
    from discovery.willing import WillingEntry

_LAZY = {
    "FLOCK_APP": "discovery.announce",
    "Flock": "discovery.announce",
    "QuerySyntaxError": "discovery.classads",
    "CondorHostApplier": "discovery.condor",
    "FlockConfigApplier": "discovery.condor",
    "apply_config": "discovery.condor_apply",
    "render_condor_host": "discovery.condor_render",
    "render_flock_config": "discovery.condor_render",
    "CondorPool": "discovery.condor_pool",
    "CondorError": "discovery.condor_syntax",
    "FlockDecision": "discovery.decision",
    "FlockTarget": "discovery.decision",
    "Failover": "discovery.failover",
    "AgentConfig": "discovery.failover_agent",
    "CollectorView": "discovery.failover_agent",
    "PoolAgent": "discovery.failover_agent",
    "FailoverConfig": "discovery.failover_config",
    "FailoverError": "discovery.failover_config",
    "ManagerChange": "discovery.failover_config",
    "NotManagerError": "discovery.failover_config",
    "StateTooLargeError": "discovery.failover_config",
    "FailoverRole": "discovery.failover_roles:Role",
    "FlockConfig": "discovery.flock_config",
    "PoolView": "discovery.flock_config",
    "JobLedger": "discovery.ledger",
    "PoolError": "discovery.ledger",
    "MachineAd": "discovery.machine",
    "random_machine_ad": "discovery.machine",
    "Peer": "discovery.policy",
    "Policy": "discovery.policy",
    "PolicyError": "discovery.policy",
    "PoolOnDemand": "discovery.pond",
    "PondScheduler": "discovery.pond_scheduler",
    "CondorQueue": "discovery.pond_scheduler",
    "SchedulerConfig": "discovery.pond_scheduler",
    "PondConfig": "discovery.pond_types",
    "PondError": "discovery.pond_types",
    "PondResult": "discovery.pond_types",
    "ReleaseResult": "discovery.pond_types",
    "PoolState": "discovery.pool",
    "Refusal": "discovery.pool",
    "SharingRules": "discovery.pool",
    "SimulatedPool": "discovery.pool",
    "Match": "discovery.query",
    "QueryConfig": "discovery.query",
    "QueryResult": "discovery.query",
    "ResourceQuery": "discovery.query",
    "WillingEntry": "discovery.willing",
    "SubmitSync": "discovery.submit",
    "SubmitConfig": "discovery.submit",
    "SubmitError": "discovery.submit",
    "FlockPush": "discovery.submit",
    "Site": "discovery.site",
    "SiteState": "discovery.site",
}


def __getattr__(name: str) -> Any:
    spec = _LAZY.get(name)
    if spec is None:
        raise AttributeError(f"module 'discovery' has no attribute {name!r}")
    mod, _, attr = spec.partition(":")
    value = getattr(importlib.import_module(mod), attr or name)
    globals()[name] = value
    return value


__all__ = [
    "FLOCK_APP",
    "AgentConfig",
    "CollectorView",
    "CondorError",
    "CondorHostApplier",
    "CondorPool",
    "CondorQueue",
    "Failover",
    "FailoverConfig",
    "FailoverError",
    "FailoverRole",
    "Flock",
    "FlockConfig",
    "FlockConfigApplier",
    "FlockDecision",
    "FlockPush",
    "FlockTarget",
    "JobLedger",
    "MachineAd",
    "ManagerChange",
    "Match",
    "NotManagerError",
    "Peer",
    "Policy",
    "PolicyError",
    "PondConfig",
    "PondError",
    "PondResult",
    "PondScheduler",
    "PoolAgent",
    "PoolError",
    "PoolOnDemand",
    "PoolState",
    "PoolView",
    "QueryConfig",
    "QueryResult",
    "QuerySyntaxError",
    "Refusal",
    "ReleaseResult",
    "ResourceQuery",
    "SchedulerConfig",
    "SharingRules",
    "SimulatedPool",
    "Site",
    "SiteState",
    "StateTooLargeError",
    "SubmitConfig",
    "SubmitError",
    "SubmitSync",
    "WillingEntry",
    "apply_config",
    "random_machine_ad",
    "render_condor_host",
    "render_flock_config",
]
