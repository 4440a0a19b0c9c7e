"""Replicated manager state: the holder's store and the manager's commit tracker.

Theory of operation (Butt et al. 2006 §3.3, §4.2: "replicas of the pool configuration and other
management information of the central manager are maintained on the K immediate neighbors";
the Replication Module "periodically pushes the up-to-date information"):

* Every node has a :class:`ReplicaStore`. As a **holder** it keeps only the newest state it was
  pushed, by :class:`~discovery.failover_messages.StateStamp` ``(epoch, version)``, and one
  **promise**: the highest epoch it voted for or accepted state from. It grants a vote to a
  candidate only for a *term* above its promise (so at most one candidate wins a term among
  holders that can talk to each other) and refuses state from an epoch below its promise (so a
  deposed manager's late pushes cannot commit). This is the promise rule of Paxos's first phase
  (Lamport, "Paxos Made Simple", 2001) applied to the paper's K replica holders.
* The manager's :class:`Replicator` pushes every new version to its K holders and counts
  acknowledgements. A version is **committed** once ``quorum`` holders acknowledged it (or a
  later one); the default quorum is a majority of the holders, ``K // 2 + 1``. A takeover
  gathers votes from a majority of the same holders (named in the manager's alives), and each
  vote carries the holder's newest state: any two majorities of one set intersect, so the
  winner always sees the last committed version. Uncommitted versions may be lost.
* Sizes are bounded: a state is an opaque ``bytes`` blob of at most ``max_state_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from discovery.failover_messages import Epoch, StateStamp, VoteReason
from overlay.handle import NodeHandle
from overlay.ids import NodeId

__all__ = ["CommitCallback", "ReplicaStore", "Replicator", "majority"]

#: ``on_committed(True)`` once a quorum acknowledged; ``False`` if it never can be (step-down)
CommitCallback = Callable[[bool], None]


def majority(n: int) -> int:
    """Smallest strict majority of ``n`` members (0 for an empty set)."""
    return n // 2 + 1 if n > 0 else 0


class ReplicaStore:
    """A holder's newest state and its promise (one per node)."""

    __slots__ = ("promised", "stamp", "state")

    def __init__(self) -> None:
        self.promised: Epoch | None = None
        self.stamp: StateStamp | None = None
        self.state: bytes | None = None

    def vote(self, epoch: Epoch) -> int:
        """Promise ``epoch`` if its term is above the promise (or it is the promised epoch
        itself: a retransmission). Returns a :class:`VoteReason` (``GRANTED`` on success)."""
        p = self.promised
        if p is None or epoch.term > p.term or epoch == p:
            self.promised = epoch
            return VoteReason.GRANTED
        return VoteReason.STALE_TERM

    def accept(self, stamp: StateStamp, state: bytes) -> bool:
        """Store a pushed state unless its epoch is below the promise; keep only the newest.
        True when the holder now has ``stamp`` or newer (an ack)."""
        p = self.promised
        if p is not None and stamp.epoch < p:
            return False
        if p is None or stamp.epoch > p:
            self.promised = stamp.epoch
        if self.stamp is None or stamp > self.stamp:
            self.stamp = stamp
            self.state = state
        return True

    def observe_term(self, term: int) -> int:
        """The highest term this store has seen (for choosing a candidate's next term)."""
        t = term
        if self.promised is not None and self.promised.term > t:
            t = self.promised.term
        if self.stamp is not None and self.stamp.epoch.term > t:
            t = self.stamp.epoch.term
        return t


class _Pending:
    __slots__ = ("callback", "version")

    def __init__(self, version: int, callback: CommitCallback | None) -> None:
        self.version = version
        self.callback = callback


class Replicator:
    """The manager side: versions, holders, acknowledgements and commit callbacks."""

    __slots__ = (
        "_pending",
        "acked",
        "committed",
        "epoch",
        "holders",
        "quorum",
        "quorum_override",
        "refused",
        "state",
        "version",
    )

    def __init__(
        self,
        epoch: Epoch,
        holders: Sequence[NodeHandle],
        version: int,
        state: bytes,
        quorum: int | None = None,
    ) -> None:
        self.epoch = epoch
        self.version = version
        self.state = state
        self.quorum_override = quorum
        self.holders: tuple[NodeHandle, ...] = ()
        self.quorum = 0
        #: highest version each holder acknowledged in this epoch
        self.acked: dict[NodeId, int] = {}
        #: holders that refused this epoch (they promised a newer one)
        self.refused: set[NodeId] = set()
        #: highest committed version (-1: none yet in this epoch)
        self.committed = -1
        self._pending: list[_Pending] = []
        self.set_holders(holders)

    @property
    def stamp(self) -> StateStamp:
        """The stamp of the newest version."""
        return StateStamp(self.epoch, self.version)

    def set_holders(self, holders: Sequence[NodeHandle]) -> list[NodeHandle]:
        """Replace the holder set; returns the new members (they need the newest state)."""
        old = {h.id for h in self.holders}
        self.holders = tuple(holders)
        q = self.quorum_override
        n = len(self.holders)
        self.quorum = min(q, n) if q is not None else majority(n)
        keep = {h.id for h in self.holders}
        self.acked = {k: v for k, v in self.acked.items() if k in keep}
        return [h for h in self.holders if h.id not in old]

    def new_version(self, state: bytes, callback: CommitCallback | None) -> int:
        """Record the application's next state; the caller pushes it to every holder."""
        self.version += 1
        self.state = state
        self._pending.append(_Pending(self.version, callback))
        return self.version

    def track(self, callback: CommitCallback | None) -> None:
        """Wait for the current version to commit (used for the recovered state)."""
        self._pending.append(_Pending(self.version, callback))

    def unacked(self) -> list[NodeHandle]:
        """Holders that have not acknowledged the newest version."""
        v = self.version
        return [
            h for h in self.holders if self.acked.get(h.id, -1) < v and h.id not in self.refused
        ]

    def refuse(self, holder: NodeId) -> bool:
        """A holder refused this epoch; True while a quorum of the others can still commit."""
        if holder in {h.id for h in self.holders}:
            self.refused.add(holder)
        able = sum(1 for h in self.holders if h.id not in self.refused)
        return able >= self.quorum

    def ack(self, holder: NodeId, version: int) -> list[CommitCallback | None]:
        """Count an acknowledgement; returns the callbacks of versions that just committed."""
        if holder not in {h.id for h in self.holders}:
            return []
        if version > self.acked.get(holder, -1):
            self.acked[holder] = version
        return self._settle()

    def _settle(self) -> list[CommitCallback | None]:
        if self.quorum == 0:
            newly = self.version
        else:
            acks = sorted(self.acked.values(), reverse=True)
            if len(acks) < self.quorum:
                return []
            newly = acks[self.quorum - 1]
        if newly <= self.committed:
            return []
        self.committed = newly
        done = [p.callback for p in self._pending if p.version <= newly]
        self._pending = [p for p in self._pending if p.version > newly]
        return done

    def settle_now(self) -> list[CommitCallback | None]:
        """Re-check the quorum (after the holder set changed, or with no holders at all)."""
        return self._settle()

    def fail_all(self) -> list[CommitCallback | None]:
        """Give up every pending version (the manager steps down): their callbacks get False."""
        out = [p.callback for p in self._pending]
        self._pending = []
        return out
