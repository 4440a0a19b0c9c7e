"""Configuration of the flock plugin and the pool view it reads.

Defaults cite their sources (Butt et al. 2006 §5.1.1 and §5.2.1 ran TTL 1, an announcement
validity of 1 min and a Flocking Manager period of 1 min); where the papers are silent (the
announcement period, the RTT tolerance, bounds on what a receiver accepts) the choice and its
reason are stated beside the field.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import attrs

from overlay.errors import ConfigError
from overlay.validators import at_least, non_negative, positive

__all__ = ["FlockConfig", "IdleAwarePool", "PoolView"]


@runtime_checkable
class PoolView(Protocol):
    """What the Flock reads of the local pool (the pool model's ``PoolState`` satisfies it)."""

    @property
    def machines(self) -> int:
        """Machines in the pool."""

    @property
    def free_machines(self) -> int:
        """Machines free to start a job now."""

    @property
    def idle_jobs(self) -> int:
        """Jobs queued and not running."""

    @property
    def running_jobs(self) -> int:
        """Jobs running."""

    @property
    def utilization(self) -> float:
        """Busy fraction of the pool's machines, 0.0-1.0."""


@runtime_checkable
class IdleAwarePool(Protocol):
    """A pool that can count machines idle for at least a given time (needed by a policy with
    ``[sharing] min_idle_s``)."""

    def free_machines_idle_for(self, seconds: float) -> int:
        """Free machines that have been idle for at least ``seconds``."""


def _probability(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"{attr.name} must be in [0, 1), got {value!r}")


def _opt_positive_int(_inst: object, attr: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{attr.name} must be None or an int >= 1, got {value!r}")


@attrs.frozen(slots=True)
class FlockConfig:
    """Knobs of the flock plugin (units in the names)."""

    #: announcement TTL — Butt et al. 2006 §5.1.1, §5.2.1 ran TTL 1 (routing table only)
    ttl: int = attrs.field(default=1, validator=at_least(1))
    #: how long an announcement is valid — Butt et al. 2006 §5.1.1: 1 min
    validity_s: float = attrs.field(default=60.0, validator=positive)
    #: announcement period. The papers say "periodically". Chosen: validity / 3 = 20 s, so an
    #: entry outlives two lost announcements in a row: with datagram loss p a willing-list
    #: entry flaps (expires although the pool still announces) with probability ~p^2 per
    #: validity window, against ~p at validity / 2 (where the next copy lands just after the
    #: previous one expired). Experiments sweep it.
    announce_period_s: float = attrs.field(default=20.0, validator=positive)
    #: Flocking Manager period — Butt et al. 2006 §5.1.1: 1 min
    manager_period_s: float = attrs.field(default=60.0, validator=positive)
    #: RTTs closer than this are "the same proximity metric" (§3.2.1): minimum-RTT probes
    #: repeat within a few ms on the wide area; 5 ms is below any RTT step that matters for
    #: job placement
    rtt_tolerance_s: float = attrs.field(default=0.005, validator=positive)
    #: each period is shortened by up to this fraction at random (Floyd & Jacobson 1994: fixed
    #: timers synchronise); the period stays an upper bound
    period_jitter: float = attrs.field(default=0.1, validator=_probability)
    #: largest TTL a receiver honours (bounds the amplification a bad origin can cause)
    max_ttl: int = attrs.field(default=4, validator=at_least(1))
    #: longest validity a receiver honours, seconds (a longer one is clamped)
    max_validity_s: float = attrs.field(default=600.0, validator=positive)
    #: announcements stamped further than this in the receiver's future are dropped; pools are
    #: expected to run NTP (HTCondor's own security sessions assume it too)
    clock_skew_s: float = attrs.field(default=5.0, validator=non_negative)
    #: willing-list capacity per node (new origins beyond it are dropped and counted)
    max_entries: int = attrs.field(default=8192, validator=at_least(1))
    #: at most this many flock targets per decision (None: every admissible pool)
    max_targets: int | None = attrs.field(default=None, validator=_opt_positive_int)
    #: drop unsigned announcements (must stay on for live nodes; the simulator may turn it off)
    require_signatures: bool = True
    #: send a free = 0 withdrawal when an offer ends instead of letting it expire
    withdraw: bool = True

    def __attrs_post_init__(self) -> None:
        if self.ttl > self.max_ttl:
            raise ConfigError(f"ttl {self.ttl} exceeds max_ttl {self.max_ttl}")
