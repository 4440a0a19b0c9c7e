"""Public types of Pools on Demand: the config, the results, the error.

Split from :mod:`discovery.pond` (theory of operation there; PonD §3.2, §3.3), which re-exports
them.
"""

from __future__ import annotations

import attrs

from discovery.query import QueryResult
from overlay.errors import OverlayError
from overlay.handle import NodeHandle
from overlay.validators import non_negative, positive

__all__ = ["PondConfig", "PondError", "PondResult", "ReleaseResult"]


class PondError(OverlayError):
    """Misuse of the pond API (unknown pond, releasing twice, ...)."""


@attrs.frozen
class PondConfig:
    """Knobs of Pools on Demand (per node; a manager's and its members' should agree)."""

    #: manager -> member keep-alive period (PonD §3.3 "periodically"; 10 s keeps withdrawal
    #: under a minute while costing one small message per member per period).
    alive_period_s: float = attrs.field(default=10.0, validator=positive)
    #: a member with no alive for this long withdraws: three missed alives plus 5 s for a WAN
    #: round trip (PonD's edges are 0.2–0.6 s one way) — HTCondor's claim keep-alive pattern.
    withdraw_after_s: float = attrs.field(default=35.0, validator=positive)
    #: wait for an answer before re-sending an invitation: one WAN RTT (<= 1.2 s in PonD's
    #: model) plus the machine's re-check and CONDOR_HOST change.
    invite_timeout_s: float = attrs.field(default=3.0, validator=positive)
    #: re-sends of an unanswered invitation before it counts as lost.
    invite_retries: int = attrs.field(default=2, validator=non_negative)
    #: wait for a destroy's acknowledgement, and re-sends before giving up on it.
    destroy_timeout_s: float = attrs.field(default=3.0, validator=positive)
    destroy_retries: int = attrs.field(default=3, validator=non_negative)
    #: machines invited beyond k, as a fraction of k (rounded up): PonD invites exactly the
    #: discovered set; a little extra absorbs stale declines, and surplus is released at once.
    extra_invites: float = attrs.field(default=0.0, validator=non_negative)
    #: None: require signed pond messages exactly when this node signs its own (live nodes).
    require_signatures: bool | None = None


@attrs.frozen(slots=True)
class PondResult:
    """One forming (or growing) round: who is in, and what became of the other invitations."""

    pond_id: int
    job_id: str
    members: tuple[NodeHandle, ...]  #: every member of the pond after this round
    joined: tuple[NodeHandle, ...]  #: members that joined in this round
    declined: dict[str, int]  #: decline reasons ("claimed", "stale", "policy", ...) -> count
    lost: tuple[NodeHandle, ...]  #: invitations never answered
    surplus: tuple[NodeHandle, ...]  #: accepted beyond k, destroyed at once
    query: QueryResult | None
    elapsed_s: float


@attrs.frozen(slots=True)
class ReleaseResult:
    """The end of a pond: members that acknowledged the destroy, and those that did not."""

    pond_id: int
    acked: tuple[NodeHandle, ...]
    unacked: tuple[NodeHandle, ...]
    elapsed_s: float
