"""The Flocking Manager of a self-organizing flock: when to flock, and to whom (Butt et al.
2006 §3.2.1, §4.1).

Theory of operation: see :mod:`discovery.announce`, whose :class:`~discovery.announce.Flock`
this mixin completes. The Information Gatherer there fills the willing list; the Flocking
Manager reads it. Every ``manager_period_s``: local idle jobs exceeding free local machines ⇒
flocking on, targets = the willing list flattened nearest first, keeping only pools with free
machines that the ``flock-to`` policy and the learned blacklist admit; free machines exceeding
idle jobs (underused) ⇒ off; equal ⇒ unchanged (a hysteresis band, so a full pool with an empty
queue does not toggle HTCondor's configuration). A new
:class:`~discovery.decision.FlockDecision` (next ``seq``) is published only when the
configuration it renders (on/off and the ordered collectors) changes.

Pools that accepted our jobs and then failed or evicted them, and those that trusted pools
report, are skipped while blacklisted (§3.2.1; :mod:`discovery.flock_blacklist`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from discovery.decision import FlockDecision, FlockTarget
from discovery.flock_blacklist import FlockBlacklist
from discovery.flock_config import FlockConfig, PoolView
from discovery.policy import Peer, Policy, collector_host
from discovery.willing import WillingList
from overlay.runtime import Runtime

__all__ = ["FlockingManager"]


class FlockingManager(FlockBlacklist):
    """The Flocking Manager half of :class:`~discovery.announce.Flock` (which sets every
    attribute declared here)."""

    runtime: Runtime
    config: FlockConfig
    pool: PoolView
    policy: Policy
    willing: WillingList
    clock: Callable[[], float]
    on_decision: Callable[[FlockDecision], object] | None
    stats: Counter[str]
    #: the newest decision published (None: none yet)
    decision: FlockDecision | None
    #: the manager epoch decisions are numbered in (see :meth:`set_epoch`)
    epoch: int
    _dseq: int
    _republish: bool
    #: the policy the precomputed flags below were derived from (see ``Flock._learn``)
    _learned: Policy | None
    #: the flock-to answer for every peer when the policy cannot tell peers apart, else None
    _flock_to: bool | None

    def set_epoch(self, epoch: int) -> None:
        """A new manager epoch (failover): decisions restart at seq 0 and the next one is
        published even if unchanged."""
        self.epoch = epoch
        self._dseq = 0
        self._republish = True

    def targets(self) -> tuple[FlockTarget, ...]:
        """The ordered flock targets the willing list gives now (nearest first): pools with
        free machines that the flock-to policy admits and that are not blacklisted."""
        now = self.runtime.now()
        out: list[FlockTarget] = []
        pol = self.policy
        # a policy without flock-to patterns or agreements answers the same for every pool
        same_for_all = self._flock_to if pol is self._learned else None
        cap = self.config.max_targets
        for e in self.willing.flat(self.clock()):
            if e.free_machines <= 0 or not e.collector or self._is_blacklisted(e, now):
                continue
            if same_for_all is not None:
                if not same_for_all:
                    continue
            elif not pol.may_flock_to(Peer.from_handle(e.origin, collector_host(e.collector))):
                continue
            out.append(
                FlockTarget(
                    f"{int(e.origin.id):040x}",
                    e.collector,
                    e.pool_name,
                    e.rtt_s,
                    e.free_machines,
                    e.row,
                )
            )
            if cap is not None and len(out) >= cap:
                break
        return tuple(out)

    def decide_now(self) -> FlockDecision:
        """One Flocking Manager pass; returns the current decision (published if changed)."""
        idle = int(self.pool.idle_jobs)
        free = int(self.pool.free_machines)
        prev = self.decision
        if idle > free:
            enabled = True
        elif free > idle:
            enabled = False
        else:  # neither overloaded nor underused: keep the current state
            enabled = prev.enabled if prev is not None else False
        targets = self.targets() if enabled else ()
        same = (
            prev is not None
            and not self._republish
            and prev.enabled == enabled
            and [(t.node_id, t.collector) for t in prev.targets]
            == [(t.node_id, t.collector) for t in targets]
        )
        if same and prev is not None:
            return prev
        self._dseq += 1
        self._republish = False
        d = FlockDecision(enabled, targets, self.runtime.now(), self.epoch, self._dseq)
        self.decision = d
        self.stats["decisions"] += 1
        if self.on_decision is not None:
            self.on_decision(d)
        return d
