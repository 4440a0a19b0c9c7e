"""Messages of the pool agent: machine ads, job requests, matches, claims and job completions.

Theory of operation (Butt et al. 2006 §4.2; Thain et al. 2004 §5): HTCondor's startds send their
machine ads to the central manager's collector, schedds send their job requests (submitter ads)
to it, and the negotiator matches the two and tells the schedd, which then claims the machine
directly. :mod:`discovery.failover_agent` runs that cycle on a pool ring so that a manager
change can be tested end to end: after faultD moves the manager role, every machine and every
submitter re-sends to the new manager (§4.2).

All of them are point-to-point datagrams between members of one pool ring. They carry no
signature of their own: the sender is the authenticated source of the datagram (on live nodes
every datagram is signed by its node's key, ``transports.auth``), and each receiver checks that
the source is the node the message speaks for (a machine for its ad, the manager it follows for
a match). Tags 172–179 (the site/submit range).
"""

from __future__ import annotations

import attrs

from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.messages import Message, register

__all__ = [
    "CLAIMED",
    "UNCLAIMED",
    "AdUpdate",
    "ClaimReply",
    "ClaimRequest",
    "DoneAck",
    "JobDone",
    "JobRequests",
    "MatchNotice",
    "UpdateAck",
]

#: machine states as HTCondor's startd names them
UNCLAIMED = "Unclaimed"
CLAIMED = "Claimed"


@register(172)
@attrs.frozen(slots=True)
class AdUpdate(Message):
    """A machine's ad for the manager's collector (HTCondor: the startd's UPDATE_STARTD_AD)."""

    pool: NodeId
    machine: NodeHandle
    #: random per incarnation of the machine's agent, so a rebooted machine's versions restart
    incarnation: int
    #: grows with every change of the ad within one incarnation
    version: int
    state: str
    #: the job it runs ("" when Unclaimed)
    job: str = ""


@register(173)
@attrs.frozen(slots=True)
class JobRequests(Message):
    """A submitter's idle jobs, the whole list (HTCondor: the schedd's submitter ad)."""

    pool: NodeId
    submitter: NodeHandle
    incarnation: int
    version: int
    jobs: tuple[str, ...]


@register(174)
@attrs.frozen(slots=True)
class MatchNotice(Message):
    """The negotiator matched ``job`` to ``machine``; the submitter claims it."""

    pool: NodeId
    job: str
    machine: NodeHandle


@register(175)
@attrs.frozen(slots=True)
class ClaimRequest(Message):
    """A submitter claims a machine for one job (HTCondor: REQUEST_CLAIM + ACTIVATE_CLAIM)."""

    job: str
    duration_s: float


@register(176)
@attrs.frozen(slots=True)
class ClaimReply(Message):
    """The machine's answer: ``accepted`` (it runs or ran ``job``) or busy with another job."""

    job: str
    accepted: bool


@register(177)
@attrs.frozen(slots=True)
class JobDone(Message):
    """The machine finished ``job`` (re-sent until acknowledged)."""

    job: str


@register(178)
@attrs.frozen(slots=True)
class DoneAck(Message):
    """The submitter recorded ``job`` as finished."""

    job: str


@register(179)
@attrs.frozen(slots=True)
class UpdateAck(Message):
    """The manager holds this ad (``kind`` "ad") or request list ("requests") version; the
    sender stops re-sending it."""

    kind: str
    incarnation: int
    version: int
