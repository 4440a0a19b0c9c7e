"""A machine's side of Pools on Demand, sans-io, with real Ed25519 keys (PonD §3.2, §3.3).

One worker application on a hand-driven core (``ManualRuntime``: explicit time, every sent
message recorded); invitations are built and signed here with the manager's real key, then
forged, tampered with, replayed, misdirected or sent unsigned. Each rejection must be counted
and must leave the machine unclaimed; the claim-time re-check must decline a machine whose ad
changed since the query and accept one that still matches.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs
import pytest

from discovery.classads import job_ad
from discovery.machine import DictProvider, MachineAd, Stamp, random_machine_ad
from discovery.pond import PondConfig, PoolOnDemand
from discovery.pond_messages import (
    Ed25519Signer,
    PondAlive,
    PondAnswer,
    PondDestroy,
    PondDestroyAck,
    PondInvite,
    PondLeave,
    ReplayWindow,
    sign,
    verify,
)
from overlay.handle import NodeHandle
from overlay.identity import Identity
from overlay.ids import NodeId
from overlay.runtime import ManualRuntime

JOB = str(job_ad("TARGET.Memory >= 4096 && TARGET.LoadAvg < 0.5", "TARGET.Memory"))


class FakeCore:
    """The slice of a KBR core the pond application uses."""

    def __init__(self, ident: Identity, rt: ManualRuntime) -> None:
        self.id = ident.id
        self.handle = NodeHandle(ident.id, f"udp://{ident.id.short()}:1")
        self.runtime = rt
        self.apps: dict[str, Any] = {}
        self.stats: Counter[str] = Counter()
        self.stopped = False
        self.sent: list[tuple[NodeHandle, str, Any]] = []

    def send_direct(self, dst: NodeHandle, app: str, payload: Any) -> None:
        self.sent.append((dst, app, payload))


class Deny:
    def __init__(self) -> None:
        self.asked: list[tuple[str, Any]] = []

    def allows(self, action: str, peer: Any) -> bool:
        self.asked.append((action, peer))
        return False


@pytest.fixture
def keys() -> dict[str, Identity]:
    return {n: Identity.from_seed(bytes([i + 1]) * 32) for i, n in enumerate(("m", "w", "x"))}


def worker(
    keys: dict[str, Identity], *, policy: Any = None, config: PondConfig | None = None
) -> tuple[PoolOnDemand, FakeCore, MachineAd, list[Any]]:
    rt = ManualRuntime(seed=1)
    core = FakeCore(keys["w"], rt)
    static = random_machine_ad(__import__("random").Random(1), "slot1@w")
    static["Memory"] = 8192
    static["Requirements"] = True
    machine = MachineAd(static, DictProvider({"State": "Unclaimed", "LoadAvg": 0.1}))
    hook: list[Any] = []
    app = PoolOnDemand(
        core,  # type: ignore[arg-type]
        machine,
        config,
        signer=Ed25519Signer(keys["w"].private_key),
        policy=policy,
        on_condor_host=lambda mgr, stamp: hook.append((mgr, stamp, rt.now())),
    )
    return app, core, machine, hook


def invite(keys: dict[str, Identity], seq: int, *, pond: int = 7, epoch: int = 1, to: str = "w",
           by: str = "m") -> PondInvite:  # fmt: skip
    mgr = keys[by]
    m = PondInvite(pond, "job.7", JOB, NodeHandle(mgr.id, "udp://m:1"), keys[to].id, epoch, seq)
    return sign(m, Ed25519Signer(mgr.private_key))


def answers(core: FakeCore) -> list[PondAnswer]:
    return [p for _, _, p in core.sent if type(p) is PondAnswer]


def test_valid_invitation_is_accepted_stamped_and_signed(keys: dict[str, Identity]) -> None:
    app, core, machine, hook = worker(keys)
    app.deliver(core.id, invite(keys, 1), NodeHandle(keys["m"].id, "udp://m:1"))
    (a,) = answers(core)
    assert a.accept and a.seq == 1 and verify(a, keys["w"].id)  # the answer is signed too
    assert machine.stamp == Stamp("job.7", str(keys["m"].id), 7)
    assert machine.current()["PondJobId"] == "job.7"
    assert hook[0][0].id == keys["m"].id and hook[0][1] == machine.stamp
    assert app.membership is not None and app.stats["accepted"] == 1


def test_forged_tampered_unsigned_and_misdirected_are_rejected_and_counted(
    keys: dict[str, Identity],
) -> None:
    app, core, machine, hook = worker(keys)
    src = NodeHandle(keys["m"].id, "udp://m:1")
    good = invite(keys, 1)
    # forged: signed with x's key while claiming to come from m
    forged = sign(attrs.evolve(good, sig=b""), Ed25519Signer(keys["x"].private_key))
    tampered = attrs.evolve(good, job_ad=str(job_ad("true")))  # m's signature, other content
    unsigned = attrs.evolve(good, key=b"", sig=b"")
    misdirected = invite(keys, 2, to="x")  # a valid invitation for another machine
    for msg in (forged, tampered, unsigned, misdirected):
        app.deliver(core.id, msg, src)
    assert app.stats["forged"] == 2 and app.stats["unsigned"] == 1
    assert app.stats["misdirected"] == 1
    assert not core.sent and machine.stamp is None and not hook  # nothing answered or applied
    app.deliver(core.id, good, src)  # the genuine one still works afterwards
    assert answers(core)[0].accept


def test_replayed_invitation_is_rejected_after_the_pond_is_gone(keys: dict[str, Identity]) -> None:
    app, core, machine, _ = worker(keys)
    src = NodeHandle(keys["m"].id, "udp://m:1")
    inv = invite(keys, 1)
    app.deliver(core.id, inv, src)
    destroy = sign(
        PondDestroy(7, keys["m"].id, keys["w"].id, 1, 2), Ed25519Signer(keys["m"].private_key)
    )
    app.deliver(core.id, destroy, src)
    assert machine.stamp is None and app.stats["destroyed"] == 1
    acks = [p for _, _, p in core.sent if type(p) is PondDestroyAck]
    assert len(acks) == 1 and acks[0].seq == 2 and verify(acks[0], keys["w"].id)
    core.sent.clear()
    app.deliver(core.id, inv, src)  # captured and sent again
    app.deliver(core.id, destroy, src)
    assert app.stats["replayed"] == 2 and machine.stamp is None and not core.sent
    # a new incarnation of the manager (new epoch) is not confused with the old one
    app.deliver(core.id, invite(keys, 1, epoch=2, pond=8), src)
    assert answers(core)[-1].accept and machine.stamp is not None


def test_replay_window_tolerates_reordering_not_repeats() -> None:
    w = ReplayWindow(width=64, max_senders=2)
    assert w.check(1, 1, 5) and w.check(1, 1, 3) and w.check(1, 1, 4)
    assert not w.check(1, 1, 4) and not w.check(1, 1, 5)
    assert w.check(1, 1, 200) and not w.check(1, 1, 100)  # older than the window
    assert w.check(1, 2, 1)  # another epoch
    w.check(2, 1, 1)
    w.check(3, 1, 1)  # evicts the oldest (sender 1, epoch 1): bounded memory
    assert w.check(1, 1, 4)


def test_stale_machine_declines_and_matching_machine_accepts(keys: dict[str, Identity]) -> None:
    app, core, machine, _ = worker(keys)
    src = NodeHandle(keys["m"].id, "udp://m:1")
    assert isinstance(machine.provider, DictProvider)
    machine.provider.set(LoadAvg=0.9)  # busy since the query: no longer matches
    app.deliver(core.id, invite(keys, 1), src)
    a = answers(core)[-1]
    assert not a.accept and a.reason == "stale" and app.stats["stale"] == 1
    assert machine.stamp is None
    machine.provider.set(LoadAvg=0.2)  # idle again: the next invitation is accepted
    app.deliver(core.id, invite(keys, 2, pond=9), src)
    assert answers(core)[-1].accept and app.stats["stale"] == 1


def test_claimed_machine_declines_another_pond(keys: dict[str, Identity]) -> None:
    app, core, machine, _ = worker(keys)
    app.deliver(core.id, invite(keys, 1), NodeHandle(keys["m"].id, "udp://m:1"))
    app.deliver(core.id, invite(keys, 1, by="x", pond=3), NodeHandle(keys["x"].id, "udp://x:1"))
    a = answers(core)
    assert a[0].accept and not a[1].accept and a[1].reason == "claimed"
    assert machine.stamp is not None and machine.stamp.pond_id == 7
    # the same pond inviting again (its answer was lost) gets the accept again
    app.deliver(core.id, invite(keys, 2), NodeHandle(keys["m"].id, "udp://m:1"))
    assert answers(core)[-1].accept and app.stats["invite_duplicate"] == 1


def test_invite_from_policy_is_asked_and_obeyed(keys: dict[str, Identity]) -> None:
    deny = Deny()
    app, core, machine, _ = worker(keys, policy=deny)
    app.deliver(core.id, invite(keys, 1), NodeHandle(keys["m"].id, "udp://m:1"))
    ((action, peer),) = deny.asked
    assert action == "invite-from" and peer.node_id == f"{int(keys['m'].id):040x}"
    a = answers(core)[-1]
    assert not a.accept and a.reason == "policy" and machine.stamp is None


def test_member_withdraws_when_the_manager_is_silent(keys: dict[str, Identity]) -> None:
    cfg = PondConfig(alive_period_s=10.0, withdraw_after_s=35.0)
    app, core, machine, hook = worker(keys, config=cfg)
    src = NodeHandle(keys["m"].id, "udp://m:1")
    rt = core.runtime
    app.deliver(core.id, invite(keys, 1), src)
    signer = Ed25519Signer(keys["m"].private_key)
    for i in range(5):  # alives every 10 s keep it in
        rt.advance(10.0)
        app.deliver(core.id, sign(PondAlive(7, keys["m"].id, keys["w"].id, 1, 2 + i), signer), src)
    assert machine.stamp is not None
    last = rt.now()
    rt.advance(34.9)
    assert machine.stamp is not None  # not before the stated timeout
    rt.advance(0.2)
    assert machine.stamp is None and app.stats["withdrawn"] == 1
    assert hook[-1][:2] == (None, None) and hook[-1][2] - last == pytest.approx(35.0)
    leave = [p for _, _, p in core.sent if type(p) is PondLeave]
    assert leave and leave[0].reason == "manager-silent" and verify(leave[0], keys["w"].id)
    # a forged alive cannot keep a machine in a pond either
    app.deliver(core.id, invite(keys, 20), src)
    forged = sign(
        PondAlive(7, keys["m"].id, keys["w"].id, 1, 21), Ed25519Signer(keys["x"].private_key)
    )
    rt.advance(30.0)
    app.deliver(core.id, forged, src)
    rt.advance(6.0)
    assert machine.stamp is None and app.stats["forged"] == 1


def test_alive_for_a_pond_it_left_is_answered_with_leave(keys: dict[str, Identity]) -> None:
    app, core, _, _ = worker(keys)
    src = NodeHandle(keys["m"].id, "udp://m:1")
    alive = sign(
        PondAlive(7, keys["m"].id, keys["w"].id, 1, 5), Ed25519Signer(keys["m"].private_key)
    )
    app.deliver(core.id, alive, src)
    (leave,) = [p for _, _, p in core.sent if type(p) is PondLeave]
    assert leave.reason == "not-a-member" and leave.manager == keys["m"].id
    assert NodeId(int(leave.worker.id)) == keys["w"].id


def test_the_policy_file_decides_invitations(keys: dict[str, Identity], tmp_path: Any) -> None:
    """With the project's own policy files: deny the manager's id prefix, allow the rest."""
    from discovery.policy import Policy

    path = tmp_path / "policy.toml"
    prefix = f"{int(keys['x'].id):040x}"[:8]
    path.write_text(f'[invite-from]\ndeny = ["id:{prefix}*"]\n')
    app, core, machine, _ = worker(keys, policy=Policy.load(path))
    app.deliver(core.id, invite(keys, 1, by="x", pond=3), NodeHandle(keys["x"].id, "udp://x:1"))
    assert answers(core)[-1].reason == "policy" and machine.stamp is None
    app.deliver(core.id, invite(keys, 1), NodeHandle(keys["m"].id, "udp://m:1"))
    assert answers(core)[-1].accept
