"""Wire messages of Pools on Demand (tags 132–137), their signatures and the replay window.

Theory of operation (PonD §3.2, Fig. 4; Ed25519 as everywhere in this project):

* **Messages.** A manager invites (:class:`PondInvite`), keeps members alive
  (:class:`PondAlive`) and destroys the pond (:class:`PondDestroy`); a machine answers an
  invitation (:class:`PondAnswer`: accept = the ACK of PonD Fig. 4, or decline with a reason),
  acknowledges a destroy (:class:`PondDestroyAck`) and says when it leaves on its own
  (:class:`PondLeave`). They travel as the payload of a KBR direct message to the ``pond``
  application; the codec validates every field on arrival.
* **Signatures.** Each message names its sender by node id and carries the sender's raw
  Ed25519 public key and a signature over the message's canonical encoding with ``sig`` empty,
  under a domain prefix. A receiver checks that the key hashes to the claimed id (ids are
  self-certifying: SHA-1 of the key) and that the signature verifies, so an invitation cannot
  be forged for a manager whose key the forger lacks, nor altered in flight. Invitations,
  alives and destroys name the machine they are for, so one captured for machine A is refused
  by machine B (``misdirected``).
* **Replay window** (RFC 4303 §3.4.3, as the transport's own window). A manager numbers every
  message it sends with one counter, within an *epoch* drawn at random when the application
  starts. A machine keeps, per (manager, epoch), the highest number seen and a 64-bit map of
  the numbers just below it: a number seen before, or older than the window, is a replay and is
  dropped and counted; reordering within the window is tolerated. The table is bounded (LRU):
  a replay of a message whose (manager, epoch) was evicted gets past the window, and then
  only leads to a pond the manager no longer has, which it destroys at once (or which the
  machine leaves when no alive follows) — see ``docs/query.md``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

import attrs

from discovery.signing import Ed25519Signer, Signer, sign_message, verify_message
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.messages import Message, register

__all__ = [
    "DOMAIN",
    "Ed25519Signer",
    "PondAlive",
    "PondAnswer",
    "PondDestroy",
    "PondDestroyAck",
    "PondInvite",
    "PondLeave",
    "PondMessage",
    "ReplayWindow",
    "Signer",
    "sign",
    "verify",
]

#: domain separation: a pond signature can never be mistaken for another protocol's
DOMAIN = b"flockring/pond/v1\x00"


@register(132)
@attrs.frozen(slots=True)
class PondInvite(Message):
    """Manager -> machine: join pond ``pond_id`` to run ``job_id`` (its ad for the re-check)."""

    pond_id: int
    job_id: str
    job_ad: str  #: the job ClassAd text: the machine re-checks the match before accepting
    manager: NodeHandle  #: where CONDOR_HOST will point, and where to answer
    worker: NodeId  #: the machine invited (a copy sent to another machine is refused)
    epoch: int
    seq: int
    key: bytes = b""
    sig: bytes = b""


@register(133)
@attrs.frozen(slots=True)
class PondAnswer(Message):
    """Machine -> manager: accept (joined, CONDOR_HOST applied) or decline with a reason."""

    pond_id: int
    worker: NodeHandle
    manager: NodeId
    seq: int  #: the invitation's number, echoed
    accept: bool
    reason: str  #: "" when accepted; "claimed", "stale", "policy", ... when declined
    key: bytes = b""
    sig: bytes = b""


@register(134)
@attrs.frozen(slots=True)
class PondAlive(Message):
    """Manager -> member: the pond and its manager are alive (PonD §3.3)."""

    pond_id: int
    manager: NodeId
    worker: NodeId
    epoch: int
    seq: int
    key: bytes = b""
    sig: bytes = b""


@register(135)
@attrs.frozen(slots=True)
class PondDestroy(Message):
    """Manager -> member: leave the pond (job done, surplus, or shrinking)."""

    pond_id: int
    manager: NodeId
    worker: NodeId
    epoch: int
    seq: int
    key: bytes = b""
    sig: bytes = b""


@register(136)
@attrs.frozen(slots=True)
class PondDestroyAck(Message):
    """Member -> manager: left (CONDOR_HOST points back at the machine itself)."""

    pond_id: int
    worker: NodeHandle
    manager: NodeId
    seq: int  #: the destroy's number, echoed
    key: bytes = b""
    sig: bytes = b""


@register(137)
@attrs.frozen(slots=True)
class PondLeave(Message):
    """Member -> manager: left on its own (manager silent, or not a member any more)."""

    pond_id: int
    worker: NodeHandle
    manager: NodeId
    reason: str
    key: bytes = b""
    sig: bytes = b""


PondMessage = PondInvite | PondAnswer | PondAlive | PondDestroy | PondDestroyAck | PondLeave


M = TypeVar("M", bound=Message)


def sign(msg: M, signer: Signer) -> M:
    """``msg`` with ``key`` set to the signer's public key and ``sig`` to its signature."""
    return sign_message(msg, signer, DOMAIN)


def verify(msg: Message, claimed: NodeId) -> bool:
    """True if ``msg`` carries a key whose hash is ``claimed`` and a valid signature by it."""
    return verify_message(msg, claimed, DOMAIN)


class ReplayWindow:
    """Per-(sender, epoch) anti-replay window over message numbers (RFC 4303 §3.4.3)."""

    __slots__ = ("_table", "max_senders", "width")

    def __init__(self, width: int = 64, max_senders: int = 4096) -> None:
        self.width = width
        self.max_senders = max_senders
        #: (sender id, epoch) -> (highest number, bitmap: bit i = number highest-i was seen)
        self._table: OrderedDict[tuple[int, int], tuple[int, int]] = OrderedDict()

    def check(self, sender: int, epoch: int, seq: int) -> bool:
        """Record ``seq``; False if it was seen before or is older than the window."""
        key = (sender, epoch)
        t = self._table
        entry = t.get(key)
        if entry is None:
            t[key] = (seq, 1)
            if len(t) > self.max_senders:
                t.popitem(last=False)
            return True
        t.move_to_end(key)
        top, bits = entry
        if seq > top:
            shift = seq - top
            bits = ((bits << shift) | 1) & ((1 << self.width) - 1) if shift < self.width else 1
            t[key] = (seq, bits)
            return True
        back = top - seq
        if back >= self.width or bits >> back & 1:
            return False
        t[key] = (top, bits | (1 << back))
        return True
