"""The machine's side of a Pool on Demand: accept or decline, stay, withdraw, leave.

Split from :mod:`discovery.pond` (theory of operation there; PonD §3.2, §3.2.2, §3.3; Thain et
al. 2004 §5 on claiming). An invitation passes, in order: the addressee check (it names this
machine), the signature (the key must hash to the manager's id), the replay window, the local
``invite-from`` policy, the claimed state (one pond at a time: exclusive stamping), and the
**claim-time re-check** of the job against the machine's *current* ad with ``classad2`` — a
machine whose state changed since the query declines as ``stale``. Only then does it stamp its
ad (PonD §3.2.2), apply ``CONDOR_HOST`` through the injected hook and accept. A member resets
its withdrawal timer on each alive from its manager and withdraws when it hears none for
``withdraw_after_s`` (PonD §3.3).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from discovery.classads import MATCH, JobAd, QuerySyntaxError, evaluate
from discovery.machine import MachineAd, Stamp
from discovery.pond_messages import (
    PondAlive,
    PondAnswer,
    PondDestroy,
    PondDestroyAck,
    PondInvite,
    PondLeave,
    ReplayWindow,
    Signer,
    sign,
    verify,
)
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.kbr import BaseApplication
from overlay.runtime import Timer

if TYPE_CHECKING:
    from discovery.pond_types import PondConfig
    from overlay.kbr import KbrCore

__all__ = ["POND_APP", "CondorHostHook", "InvitePolicy", "Membership", "WorkerSide", "peer_of"]

#: the application name of the pond application on every core
POND_APP = "discovery.pond"


class InvitePolicy(Protocol):
    """The local policy's say on invitations: ``allows("invite-from", peer)``, where ``peer``
    is the manager as :func:`peer_of` names it (``discovery.policy.Policy`` fits)."""

    def allows(self, action: str, peer: Any) -> bool:
        """Whether the local policy allows ``action`` (e.g. ``"invite-from"``) with ``peer``."""


def peer_of(handle: NodeHandle) -> Any:
    """The manager as the policy file matches it: a ``discovery.policy.Peer`` (node-id hex and
    address) when that module is present, else the handle itself."""
    try:
        from discovery.policy import Peer
    except ImportError:  # a trimmed installation without policy files
        return handle
    return Peer.from_handle(handle)


#: applies the startd's CONDOR_HOST: ``(manager, stamp)`` on joining, ``(None, None)`` on leaving
CondorHostHook = Callable[[NodeHandle | None, Stamp | None], None]


@attrs.frozen(slots=True)
class Membership:
    """The pond this machine is in."""

    pond_id: int
    manager: NodeHandle
    job_id: str
    joined_at_s: float


class WorkerSide(BaseApplication):
    """The machine's half of :class:`discovery.pond.PoolOnDemand` (and the shared plumbing)."""

    def __init__(
        self,
        core: KbrCore,
        machine: MachineAd | None,
        config: PondConfig,
        signer: Signer | None,
        policy: InvitePolicy | None,
        on_condor_host: CondorHostHook | None,
    ) -> None:
        self.core = core
        self.machine = machine
        self.config = config
        self.signer = signer
        self.policy = policy
        self.on_condor_host = on_condor_host
        req = config.require_signatures
        self.require_signatures = signer is not None if req is None else req
        self.stats: Counter[str] = Counter()
        self.membership: Membership | None = None
        self._withdraw_timer: Timer | None = None
        self._window = ReplayWindow()

    # ------------------------------------------------------------------ plumbing
    def _send(self, dst: NodeHandle, msg: Any) -> None:
        if self.signer is not None:
            msg = sign(msg, self.signer)
        self.core.send_direct(dst, POND_APP, msg)

    def _authentic(self, msg: Any, claimed: NodeId) -> bool:
        """Signed by ``claimed``'s key (required, or present and checked); counted if not."""
        if msg.sig or msg.key:
            if verify(msg, claimed):
                return True
            self.stats["forged"] += 1
            return False
        if self.require_signatures:
            self.stats["unsigned"] += 1
            return False
        return True

    def _fresh(self, msg: Any, manager: NodeId) -> bool:
        """For this machine, authentic, and not seen before (in that order); counted if not."""
        if msg.worker != self.core.id:
            self.stats["misdirected"] += 1
            return False
        if not self._authentic(msg, manager):
            return False
        if not self._window.check(int(manager), msg.epoch, msg.seq):
            self.stats["replayed"] += 1
            return False
        return True

    def _apply(self, manager: NodeHandle | None, stamp: Stamp | None) -> bool:
        hook = self.on_condor_host
        if hook is None:
            return True
        try:
            hook(manager, stamp)
        except Exception:  # the hook is the live node's config path: count, never crash
            self.stats["condor_host_failed"] += 1
            return False
        return True

    # ------------------------------------------------------------------ invitations
    def _answer(self, m: PondInvite, accept: bool, reason: str = "") -> None:
        if not accept:
            self.stats["declines_sent"] += 1
        self._send(
            m.manager, PondAnswer(m.pond_id, self.core.handle, m.manager.id, m.seq, accept, reason)
        )

    def _on_invite(self, src: NodeHandle, m: PondInvite) -> None:
        if not self._fresh(m, m.manager.id):
            return
        self.stats["invites_received"] += 1
        pol = self.policy
        if pol is not None:
            try:
                ok = pol.allows("invite-from", peer_of(m.manager)) is True
            except Exception:
                self.stats["policy_error"] += 1
                ok = False
            if not ok:
                self.stats["declined_policy"] += 1
                self._answer(m, False, "policy")
                return
        machine = self.machine
        if machine is None:
            self._answer(m, False, "no-machine")
            return
        mem = self.membership
        if mem is not None:
            if mem.pond_id == m.pond_id and mem.manager.id == m.manager.id:
                self.stats["invite_duplicate"] += 1  # our accept was lost: say it again
                self._arm_withdraw()
                self._answer(m, True)
                return
            self.stats["declined_claimed"] += 1
            self._answer(m, False, "claimed")
            return
        try:
            job = JobAd.from_text(m.job_ad)
        except QuerySyntaxError:
            self.stats["declined_bad_job"] += 1
            self._answer(m, False, "bad-job")
            return
        outcome, _, _ = evaluate(job, machine.current())
        if outcome != MATCH:  # claim-time re-check (Thain et al. 2004 §5)
            self.stats["stale"] += 1
            self._answer(m, False, "stale")
            return
        stamp = Stamp(m.job_id, str(m.manager.id), m.pond_id)
        machine.set_stamp(stamp)
        if not self._apply(m.manager, stamp):
            machine.clear_stamp()
            self._answer(m, False, "apply-failed")
            return
        self.membership = Membership(m.pond_id, m.manager, m.job_id, self.core.runtime.now())
        self.stats["accepted"] += 1
        self._arm_withdraw()
        self._answer(m, True)

    # ------------------------------------------------------------------ membership
    def _arm_withdraw(self) -> None:
        if self._withdraw_timer is not None:
            self._withdraw_timer.cancel()
        self._withdraw_timer = self.core.runtime.call_later(
            self.config.withdraw_after_s, self._withdraw
        )

    def _withdraw(self) -> None:
        self._withdraw_timer = None
        mem = self.membership
        if mem is None or self.core.stopped:
            return
        self._leave()
        self.stats["withdrawn"] += 1
        self._send(
            mem.manager, PondLeave(mem.pond_id, self.core.handle, mem.manager.id, "manager-silent")
        )

    def _leave(self) -> None:
        if self._withdraw_timer is not None:
            self._withdraw_timer.cancel()
            self._withdraw_timer = None
        self.membership = None
        if self.machine is not None:
            self.machine.clear_stamp()
        self._apply(None, None)

    def _is_my_pond(self, pond_id: int, manager: NodeId) -> bool:
        mem = self.membership
        return mem is not None and mem.pond_id == pond_id and mem.manager.id == manager

    def _on_alive(self, src: NodeHandle, m: PondAlive) -> None:
        if not self._fresh(m, m.manager):
            return
        if self._is_my_pond(m.pond_id, m.manager):
            self.stats["alives_received"] += 1
            self._arm_withdraw()
            return
        # a manager that still counts us (our leave was lost): tell it again
        self.stats["alive_not_member"] += 1
        self._send(src, PondLeave(m.pond_id, self.core.handle, m.manager, "not-a-member"))

    def _on_destroy(self, src: NodeHandle, m: PondDestroy) -> None:
        if not self._fresh(m, m.manager):
            return
        if self._is_my_pond(m.pond_id, m.manager):
            self._leave()
            self.stats["destroyed"] += 1
        else:
            self.stats["destroy_not_member"] += 1  # acknowledged all the same: idempotent
        self._send(src, PondDestroyAck(m.pond_id, self.core.handle, m.manager, m.seq))

    def _stop_worker(self) -> None:
        if self._withdraw_timer is not None:
            self._withdraw_timer.cancel()
            self._withdraw_timer = None
