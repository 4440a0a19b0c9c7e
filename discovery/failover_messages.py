"""Wire messages of manager failover (faultD, tags 150–169), epochs and signatures.

Theory of operation (Butt et al. 2006 §3.3, §4.2 and its Fig. 4):

* **Epochs.** Every manager reign has an :class:`Epoch` ``(term, node)``: ``term`` is a ballot
  number that grows with every change of manager, ``node`` the id of the node that won it. The
  pair is totally ordered (term first) and unique by construction, so two nodes can never be
  manager "in the same epoch"; the replica holders' promises (``discovery.failover_replica``)
  make the stronger "one manager per *term*" hold wherever the holders can talk to each other.
  A state replica is stamped with a :class:`StateStamp` ``(epoch, version)``.
* **alive** (:class:`Alive`): the paper's ``alive(manager id, seq, next_in)``, plus the pool key,
  the term, the replica holders (the "bookkeeping information" of §4.2) and the committed state
  version. ``(epoch, seq)`` orders alives, so duplicates, reordered, stale and replayed ones
  change nothing. It is multicast to the pool ring and signed by the manager.
* **manager_missing** (:class:`ManagerMissing`): routed by key to the missing manager's id; the
  KBR layer delivers it to the manager if alive, else to the live node closest to its id.
* **election** (:class:`VoteRequest` / :class:`VoteReply`), **replication**
  (:class:`StatePush` / :class:`StateAck`) and **preemption** (:class:`PreemptRequest`,
  :class:`HandoffConsent`, :class:`Handoff`) travel point to point as top-level messages, so a
  live node sees the transport-authenticated sender.
* **Signatures.** ``Alive``, ``PreemptRequest`` and ``HandoffConsent`` (the manager-change
  messages whose origin matters beyond one hop) carry the origin's raw Ed25519 public key
  (``key``) and a signature (``sig``) over the message's canonical wire encoding with ``sig``
  empty, prefixed by a domain string. A verifier checks that SHA-1 of the key is the claimed
  node id (self-certifying ids) and that the signature verifies.
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs

from discovery.signing import Ed25519Signer, Signer, sign_message, verify_message
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.messages import Message, register

__all__ = [
    "DOMAIN",
    "Alive",
    "Ed25519Signer",
    "Epoch",
    "Handoff",
    "HandoffConsent",
    "ManagerMissing",
    "PreemptRequest",
    "Signer",
    "StateAck",
    "StatePush",
    "StateStamp",
    "VoteKind",
    "VoteReason",
    "VoteReply",
    "VoteRequest",
    "sign",
    "verify",
]

#: domain separation: a failover signature can never be mistaken for another protocol's
DOMAIN = b"flockring/failover/v1\x00"

#: the most replica holders a message may name (far above any sensible K)
MAX_HOLDERS = 64


def _non_negative(_inst: object, attr: attrs.Attribute[Any], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attr.name} must be >= 0")


def _holders(_inst: object, attr: attrs.Attribute[Any], value: tuple[NodeHandle, ...]) -> None:
    if len(value) > MAX_HOLDERS:
        raise ValueError(f"{attr.name}: at most {MAX_HOLDERS} holders")


# ---------------------------------------------------------------------- value types
@attrs.frozen(slots=True, order=True)
class Epoch:
    """A manager reign: ballot ``term`` (grows on every manager change) and the winner's id."""

    term: int = attrs.field(validator=_non_negative)
    node: NodeId

    def __str__(self) -> str:
        return f"{self.term}/{self.node.short()}"


@attrs.frozen(slots=True, order=True)
class StateStamp:
    """The version of a replicated state: the epoch that committed it, then a counter."""

    epoch: Epoch
    version: int = attrs.field(validator=_non_negative)


class VoteKind:
    """Why a candidate asks for votes (ints on the wire)."""

    TAKEOVER = 0  #: a listener received manager_missing (Butt et al. 2006 §4.2)
    BOOTSTRAP = 1  #: the pool's original manager found no manager at start-up
    PREEMPT = 2  #: the original returned and the replacement consented (``consent`` set)

    ALL = (TAKEOVER, BOOTSTRAP, PREEMPT)


class VoteReason:
    """Why a vote was refused (ints on the wire)."""

    GRANTED = 0
    STALE_TERM = 1  #: the holder promised an equal or higher term to someone else
    LEASE = 2  #: the holder heard a live manager within its lease: no takeover
    WRONG_POOL = 3


# ---------------------------------------------------------------------- messages
@register(150)
@attrs.frozen(slots=True)
class Alive(Message):
    """The manager's periodic ``alive(manager id, seq, next_in)`` (Butt et al. 2006 §4.2)."""

    pool: NodeId  #: the pool key (the original manager's id)
    manager: NodeHandle
    term: int = attrs.field(validator=_non_negative)
    seq: int = attrs.field(validator=_non_negative)
    #: expected time until the next alive, seconds (the paper's ``next_in``)
    next_in_s: float
    #: the replica holders the manager commits to (a takeover's electorate)
    holders: tuple[NodeHandle, ...] = attrs.field(validator=_holders)
    #: newest committed state version
    version: int = attrs.field(validator=_non_negative)
    key: bytes = b""
    sig: bytes = b""

    @property
    def epoch(self) -> Epoch:
        """The epoch this message speaks for."""
        return Epoch(self.term, self.manager.id)


@register(151)
@attrs.frozen(slots=True)
class ManagerMissing(Message):
    """A listener missed the manager's alives; routed with the manager's id as the key."""

    pool: NodeId
    manager: NodeHandle  #: the manager the reporter last heard
    term: int = attrs.field(validator=_non_negative)
    reporter: NodeHandle
    holders: tuple[NodeHandle, ...] = attrs.field(validator=_holders)


@register(157)
@attrs.frozen(slots=True)
class HandoffConsent(Message):
    """The serving manager's signed consent that ``successor`` (the original) takes over."""

    pool: NodeId
    manager: NodeHandle
    term: int = attrs.field(validator=_non_negative)
    successor: NodeHandle
    nonce: int = attrs.field(validator=_non_negative)
    key: bytes = b""
    sig: bytes = b""

    @property
    def epoch(self) -> Epoch:
        """The epoch this message speaks for."""
        return Epoch(self.term, self.manager.id)


@register(152)
@attrs.frozen(slots=True)
class VoteRequest(Message):
    """A candidate asks a replica holder for its promise and its newest state."""

    pool: NodeId
    candidate: NodeHandle
    term: int = attrs.field(validator=_non_negative)
    kind: int = attrs.field(validator=attrs.validators.in_(VoteKind.ALL))
    nonce: int = attrs.field(validator=_non_negative)
    consent: HandoffConsent | None = None

    @property
    def epoch(self) -> Epoch:
        """The epoch this message speaks for."""
        return Epoch(self.term, self.candidate.id)


@register(153)
@attrs.frozen(slots=True)
class VoteReply(Message):
    """A holder's answer: granted (with its newest state) or refused (with the reason)."""

    pool: NodeId
    term: int = attrs.field(validator=_non_negative)
    nonce: int = attrs.field(validator=_non_negative)
    granted: bool
    reason: int
    promised: Epoch | None = None
    stamp: StateStamp | None = None
    state: bytes | None = None
    #: the newest alive the holder knows (lets a candidate see that a manager is alive)
    newest: Alive | None = None


@register(154)
@attrs.frozen(slots=True)
class StatePush(Message):
    """The manager's versioned state for a replica holder (Butt et al. 2006 §4.2)."""

    pool: NodeId
    manager: NodeHandle
    term: int = attrs.field(validator=_non_negative)
    version: int = attrs.field(validator=_non_negative)
    state: bytes

    @property
    def stamp(self) -> StateStamp:
        """The stamp of the pushed state."""
        return StateStamp(Epoch(self.term, self.manager.id), self.version)


@register(155)
@attrs.frozen(slots=True)
class StateAck(Message):
    """A holder stored ``version`` (``ok``) or refuses: it promised a newer epoch."""

    pool: NodeId
    term: int = attrs.field(validator=_non_negative)
    version: int = attrs.field(validator=_non_negative)
    ok: bool
    promised: Epoch | None = None


@register(156)
@attrs.frozen(slots=True)
class PreemptRequest(Message):
    """The returning original asks the replacement to hand the role back (Butt §4.2)."""

    pool: NodeId
    original: NodeHandle
    term: int = attrs.field(validator=_non_negative)  #: the term being preempted
    nonce: int = attrs.field(validator=_non_negative)
    key: bytes = b""
    sig: bytes = b""


@register(158)
@attrs.frozen(slots=True)
class Handoff(Message):
    """The replacement's answer to a preemption: its consent and up-to-date state."""

    consent: HandoffConsent
    stamp: StateStamp | None = None
    state: bytes | None = None


# ---------------------------------------------------------------------- signatures
Signed = Alive | PreemptRequest | HandoffConsent
S = TypeVar("S", Alive, PreemptRequest, HandoffConsent)


def sign(msg: S, signer: Signer) -> S:
    """``msg`` with ``key`` set to the signer's public key and ``sig`` to its signature."""
    return sign_message(msg, signer, DOMAIN)


def verify(msg: Signed, claimed: NodeId) -> bool:
    """True if ``msg`` carries a key whose SHA-1 is ``claimed`` and a valid signature by it."""
    return verify_message(msg, claimed, DOMAIN)
