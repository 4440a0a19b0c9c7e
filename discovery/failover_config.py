"""Configuration, errors and the manager-change record of the failover plugin (faultD).

Theory of operation: see :mod:`discovery.failover`. The defaults below cite their source; the
paper (Butt et al. 2006 §3.3, §4.2) gives the mechanism but no timings, so the timings follow
HTCondor's own high-availability daemons (``condor_had`` / ``condor_replication``) where they
have an equivalent, and the overlays' failure detectors otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from discovery.failover_messages import Epoch
from overlay.errors import OverlayError
from overlay.handle import NodeHandle
from overlay.validators import at_least, positive

__all__ = [
    "ApplyCondorHost",
    "FailoverConfig",
    "FailoverError",
    "ManagerChange",
    "ManagerChangeHook",
    "NotManagerError",
    "StateTooLargeError",
]


class FailoverError(OverlayError):
    """Misuse of the failover API."""


class NotManagerError(FailoverError):
    """``commit`` was called on a node that is not serving as the pool's manager."""


class StateTooLargeError(FailoverError, ValueError):
    """The state given to ``commit`` exceeds ``FailoverConfig.max_state_bytes``."""


def _optional_positive(inst: object, attr: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None:
        positive(inst, attr, value)


def _optional_quorum(inst: FailoverConfig, attr: attrs.Attribute[Any], value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= inst.replicas:
        from overlay.errors import ConfigError

        raise ConfigError(f"quorum must be an int in 1..replicas ({inst.replicas}), got {value!r}")


@attrs.frozen(slots=True)
class FailoverConfig:
    """Knobs of faultD on one node (every node of a pool ring should use the same values)."""

    #: seconds between the manager's alive multicasts. The paper gives none. HTCondor's HA
    #: daemons stabilise in 12 × (number of central managers) × HAD_CONNECTION_TIMEOUT (5 s),
    #: i.e. 120 s for two managers; 10 s alives with 3 misses detect a crash in ~30 s, well
    #: inside that, at ~0.25 messages/s/node of multicast traffic (measured, docs/failover.md).
    alive_period_s: float = attrs.field(default=10.0, validator=positive)
    #: alives missed before a listener reports ``manager_missing`` (the overlays' detectors
    #: declare a peer dead after a few unanswered probes, MSPastry §3.3; 3 tolerates two losses).
    missed_alives: int = attrs.field(default=3, validator=at_least(2))
    #: K, the replica holders (Butt §3.3: "the K immediate neighbors"). 4 = the small-world near
    #: window (2 per side, the smallest neighbourhood both overlays keep; the Pastry leaf set
    #: holds 8 per side); a majority quorum of 3 survives one holder failing with the manager.
    replicas: int = attrs.field(default=4, validator=at_least(1))
    #: acknowledgements that make a version committed (None: a majority of the holders). A
    #: takeover then needs votes from ``max(majority, K - quorum + 1)`` holders.
    quorum: int | None = attrs.field(default=None, validator=_optional_quorum)
    #: full re-push of the newest state to every holder (Butt §4.2: the Replication Module
    #: "periodically pushes"; HTCondor's REPLICATION_INTERVAL is 300 s, shorter here because
    #: the holder set follows overlay churn). Every commit is pushed at once anyway.
    replication_interval_s: float = attrs.field(default=60.0, validator=positive)
    #: retransmission of an unacknowledged state push.
    push_retry_s: float = attrs.field(default=2.0, validator=positive)
    #: retransmission of an unanswered vote or preempt request.
    request_retry_s: float = attrs.field(default=1.0, validator=positive)
    #: a candidate that has no quorum of votes (or of acks for the recovered state) by then
    #: gives up; several WAN round trips (PonD's model: one-way 200–600 ms) plus retries.
    election_timeout_s: float = attrs.field(default=6.0, validator=positive)
    #: a manager that consented to a preemption resumes if the original has not taken over.
    handoff_timeout_s: float = attrs.field(default=20.0, validator=positive)
    #: the original listens this long for an existing manager before claiming the role
    #: (None: alive_period_s × missed_alives, one detection period).
    startup_wait_s: float | None = attrs.field(default=None, validator=_optional_positive)
    #: random extra delay of a listener's detection, as a fraction of the alive period, so the
    #: listeners of a pool do not all report at the same instant.
    detection_jitter: float = attrs.field(default=0.1, validator=at_least(0.0))
    #: bound on the opaque state blob (fits a 64 KiB datagram with the envelope and signature).
    max_state_bytes: int = attrs.field(default=32 * 1024, validator=at_least(0))
    #: the returning original takes its role back (Butt §4.2); False keeps the replacement.
    preempt: bool = True
    #: debounce of holder-set updates after a neighbour joined or left.
    holder_refresh_s: float = attrs.field(default=1.0, validator=positive)
    #: manager changes kept in ``Failover.history``.
    history: int = attrs.field(default=64, validator=at_least(1))
    #: the KBR application name.
    app_name: str = "failover"

    @property
    def detection_s(self) -> float:
        """Silence after which a listener reports the manager missing."""
        return self.alive_period_s * self.missed_alives

    @property
    def lease_s(self) -> float:
        """A holder that heard a manager this recently refuses takeover votes: one alive period
        less than the detection time, so a real crash is past the lease when reported."""
        return self.alive_period_s * (self.missed_alives - 1)

    @property
    def startup_s(self) -> float:
        """How long the original listens before claiming the role."""
        return self.startup_wait_s if self.startup_wait_s is not None else self.detection_s


@attrs.frozen(slots=True)
class ManagerChange:
    """One change of the pool's manager as this node saw it (history, listeners, iterator)."""

    #: the manager now (None: this node stepped down and knows no successor yet)
    manager: NodeHandle | None
    epoch: Epoch | None
    #: this node became (True) or is not (False) the manager
    i_am_manager: bool
    #: the replicated committed state, when this node became the manager (else None)
    state: bytes | None
    #: version of that state
    version: int
    #: runtime time of the change
    at_s: float
    #: the manager before (None: unknown)
    previous: NodeHandle | None


#: ``on_manager_change(manager, epoch, i_am_manager, state)``
ManagerChangeHook = Callable[[NodeHandle | None, Epoch | None, bool, bytes | None], None]
#: ``apply_condor_host(manager)``: render CONDOR_HOST for this node's daemons and reconfigure
ApplyCondorHost = Callable[[NodeHandle], None]
