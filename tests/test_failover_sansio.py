"""faultD as a sans-io protocol: synchronous cores on ``ManualRuntime``, real Ed25519 keys.

A tiny in-test network (zero latency, explicit time, every message delivered by the test)
runs the Pastry cores built by their oracle, the multicast application and ``Failover`` on
each node, every alive, preempt request and handoff consent signed by the node's identity.
Checked: duplicate, reordered, stale and replayed alives change nothing; forged ones (bad
signature, wrong key for the id, tampered, unsigned) are rejected and counted; forged preempt
requests and consents are refused; a takeover and a preemption work with every signature on;
the commit API refuses misuse.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from failover_pool import role

from discovery.failover import (
    Failover,
    FailoverConfig,
    FailoverError,
    NotManagerError,
    Role,
    StateTooLargeError,
    attach,
)
from discovery.failover_messages import (
    Alive,
    Ed25519Signer,
    HandoffConsent,
    PreemptRequest,
    VoteKind,
    VoteReply,
    VoteRequest,
    sign,
)
from overlay import Identity, NodeHandle
from overlay.messages import Message
from overlay.multicast import McQuery
from overlay.multicast import attach as attach_multicast
from overlay.pastry import PastryConfig, PastryCore, build_oracle
from overlay.runtime import ManualRuntime

CFG = FailoverConfig(alive_period_s=2.0)


class MiniNet:
    """Cores on ManualRuntimes; the test moves every message and the clock."""

    def __init__(self, n: int = 10, seed: int = 1) -> None:
        rng = random.Random(seed)
        self.idents = [Identity.from_rng(rng) for _ in range(n)]
        self.cores: list[PastryCore] = []
        self.apps: list[Failover] = []
        self.dead: set[int] = set()
        self.log: list[tuple[int, int, Message]] = []
        self.original = self.idents[0].id
        #: per node: the on_manager_change calls and the CONDOR_HOST applications
        self.hook_calls: dict[int, list[tuple[Any, ...]]] = {}
        self.condor_hosts: dict[int, list[NodeHandle]] = {}
        for i, ident in enumerate(self.idents):
            self.cores.append(
                PastryCore(ManualRuntime(seed=i), NodeHandle(ident.id, i), PastryConfig())
            )
        self.rebuild()
        for i in range(n):
            self.attach(i)

    def rebuild(self) -> None:
        live = [c for i, c in enumerate(self.cores) if i not in self.dead]
        build_oracle(live, lambda a, b: 0.01)

    def attach(self, i: int) -> Failover:
        core = self.cores[i]
        attach_multicast(core)
        fo = attach(
            core,
            CFG,
            pool_key=self.original,
            original=core.id == self.original,
            signer=Ed25519Signer(self.idents[i].private_key),
            on_manager_change=lambda *a: self.hook_calls.setdefault(i, []).append(a),
            apply_condor_host=lambda h: self.condor_hosts.setdefault(i, []).append(h),
        )
        if i < len(self.apps):
            self.apps[i] = fo
        else:
            self.apps.append(fo)
        fo.start()
        return fo

    def rt(self, i: int) -> ManualRuntime:
        r = self.cores[i].runtime
        assert isinstance(r, ManualRuntime)
        return r

    def deliver_all(self) -> None:
        for _ in range(10_000):
            moved = False
            for i, c in enumerate(self.cores):
                if i in self.dead:
                    self.rt(i).take_sent()
                    continue
                for dst, msg in self.rt(i).take_sent():
                    moved = True
                    j = dst.address if isinstance(dst, NodeHandle) else dst
                    if isinstance(j, int) and j not in self.dead:
                        # alives travel inside multicast queries: log them unwrapped
                        inner = msg.arg if isinstance(msg, McQuery) else msg
                        self.log.append((i, j, inner if isinstance(inner, Alive) else msg))
                        self.cores[j].receive(c.handle, msg)
            if not moved:
                return
        raise AssertionError("message storm")

    def run(self, seconds: float, step_s: float = 0.05) -> None:
        t = 0.0
        while t < seconds:
            self.deliver_all()
            for i in range(len(self.cores)):
                if i not in self.dead:
                    self.rt(i).advance(step_s)
            t += step_s
        self.deliver_all()

    def managers(self) -> list[int]:
        return [i for i, a in enumerate(self.apps) if i not in self.dead and a.is_manager]

    def crash(self, i: int) -> None:
        self.dead.add(i)
        self.cores[i].stop()
        self.apps[i].stop()
        self.rebuild()

    def restart(self, i: int) -> Failover:
        now = self.rt(next(j for j in range(len(self.cores)) if j not in self.dead)).now()
        self.dead.discard(i)
        ident = self.idents[i]
        self.cores[i] = PastryCore(
            ManualRuntime(seed=100 + i, start_s=now),
            NodeHandle(ident.id, i),
            PastryConfig(),
        )
        self.rebuild()
        return self.attach(i)


def snapshot(fo: Failover) -> tuple[Any, ...]:
    return (fo.known, fo.role, len(fo.history), fo.contact_s, fo.manager, fo.manager_epoch)


@pytest.fixture
def net() -> MiniNet:
    n = MiniNet()
    n.run(CFG.startup_s + 6.0)
    assert n.managers() == [0]
    return n


def _alive_signer(net: MiniNet, i: int) -> Callable[[Alive], Alive]:
    s = Ed25519Signer(net.idents[i].private_key)
    return lambda a: sign(a, s)


def test_every_alive_is_signed_and_verified(net: MiniNet) -> None:
    alives = [m for _, _, m in net.log if isinstance(m, Alive)]
    assert alives and all(len(a.sig) == 64 and len(a.key) == 32 for a in alives)
    for fo in net.apps[1:]:
        assert fo.manager == net.cores[0].handle
        assert fo.stats["alive_forged"] == 0 and fo.stats["alive_unsigned"] == 0


def test_duplicate_reordered_stale_and_replayed_alives_change_nothing(net: MiniNet) -> None:
    lst = net.apps[5]
    src = net.cores[3].handle
    known = lst.known
    assert known is not None
    before = snapshot(lst)
    # replay every alive ever delivered, oldest first: duplicates or older, nothing changes
    old = [m for _, j, m in net.log if j == 5 and isinstance(m, Alive)]
    assert len(old) >= 2
    for a in old:
        net.cores[5].receive(src, a)
    assert snapshot(lst) == before
    assert lst.stats["alive_duplicate"] >= len(old)
    # reordered: seq+2 arrives before seq+1 (both genuinely signed by the manager)
    signed = _alive_signer(net, 0)
    a2 = signed(attrs.evolve(known, seq=known.seq + 2))
    a1 = signed(attrs.evolve(known, seq=known.seq + 1))
    net.cores[5].receive(src, a2)
    assert lst.known == a2
    mid = snapshot(lst)
    net.cores[5].receive(src, a1)
    assert snapshot(lst) == mid and lst.known == a2
    # a valid alive of an older epoch from another node: ignored, and that node is told
    stale = _alive_signer(net, 7)(Alive(known.pool, net.cores[7].handle, 0, 99, 2.0, (), 0))
    net.rt(5).take_sent()
    net.cores[5].receive(src, stale)
    assert snapshot(lst)[1:] == mid[1:] and lst.known == a2
    assert lst.stats["alive_stale"] == 1
    told = [(d, m) for d, m in net.rt(5).take_sent() if isinstance(m, Alive)]
    assert told == [(net.cores[7].handle, a2)]
    # the same stale alive again: still nothing, and no second telling within a period
    net.cores[5].receive(src, stale)
    assert not [m for _, m in net.rt(5).take_sent() if isinstance(m, Alive)]
    assert len(lst.history) == before[2]


def test_forged_alives_are_rejected_and_counted(net: MiniNet) -> None:
    lst = net.apps[4]
    known = lst.known
    assert known is not None
    src = net.cores[2].handle
    before = snapshot(lst)
    higher = attrs.evolve(known, term=known.term + 3, seq=1)
    evil = Ed25519Signer(Identity.from_seed(b"\x01" * 32).private_key)
    forged_key = sign(higher, evil)  # a valid signature, but the key is not the manager's
    tampered = attrs.evolve(_alive_signer(net, 0)(higher), seq=50)
    wrong_sig = attrs.evolve(_alive_signer(net, 0)(higher), sig=bytes(64))
    unsigned = attrs.evolve(higher, key=b"", sig=b"")
    for m in (forged_key, tampered, wrong_sig):
        net.cores[4].receive(src, m)
    net.cores[4].receive(src, unsigned)
    assert lst.stats["alive_forged"] == 3
    assert lst.stats["alive_unsigned"] == 1
    assert snapshot(lst) == before
    # the genuine one with the same content is accepted: the checks were the signatures
    net.cores[4].receive(src, _alive_signer(net, 0)(attrs.evolve(known, seq=known.seq + 1)))
    assert lst.known is not None and lst.known.seq == known.seq + 1


def test_takeover_and_preemption_with_signatures(net: MiniNet) -> None:
    mgr = net.apps[0]
    mgr.commit(b"state-1")
    net.run(1.0)
    assert mgr.committed_version == 1
    holders = {h.id for h in mgr.holders}
    net.crash(0)
    net.run(CFG.detection_s + 8.0)
    ms = net.managers()
    assert len(ms) == 1 and net.cores[ms[0]].id in holders
    r = net.apps[ms[0]]
    assert r.state == b"state-1"
    # the hooks: the replacement got the committed state, everyone else the new manager
    for i in range(1, 10):
        manager, epoch, i_am, state = net.hook_calls[i][-1]
        assert manager == r.me and epoch == r.epoch and i_am == (i == ms[0])
        assert state == (b"state-1" if i == ms[0] else None)
        assert net.condor_hosts[i][-1] == r.me
    r.commit(b"state-2")
    net.run(1.0)
    # forged preemption: the request claims the original but is signed by another key
    evil = Ed25519Signer(Identity.from_seed(b"\x02" * 32).private_key)
    assert r.epoch is not None and r.pool is not None
    fake = sign(PreemptRequest(r.pool, net.cores[0].handle, r.epoch.term, 7), evil)
    net.cores[ms[0]].receive(net.cores[0].handle, fake)
    assert r.stats["preemptrequest_forged"] == 1 and role(r) is Role.MANAGER
    # a forged consent does not let a candidate past a holder's lease
    h = next(i for i, c in enumerate(net.cores) if c.id in set(holders) - {r.core.id})
    consent = sign(HandoffConsent(r.pool, r.me, r.epoch.term, net.cores[9].handle, 1), evil)
    req = VoteRequest(r.pool, net.cores[9].handle, r.epoch.term + 1, VoteKind.PREEMPT, 3, consent)
    net.rt(h).take_sent()
    net.cores[h].receive(net.cores[9].handle, req)
    replies = [m for _, m in net.rt(h).take_sent() if isinstance(m, VoteReply)]
    assert len(replies) == 1 and not replies[0].granted
    assert net.apps[h].stats["handoffconsent_forged"] == 1
    # the original returns: real signed preempt, consent and handoff; it gets the newest state
    feed = r.changes()
    back = net.restart(0)
    net.run(CFG.startup_s + 10.0)
    assert net.managers() == [0]
    assert back.state == b"state-2" and back.stats["became_manager_preempt"] == 1
    assert role(r) is Role.LISTENER
    assert all(a.manager == net.cores[0].handle for i, a in enumerate(net.apps) if i != 0)
    assert net.hook_calls[ms[0]][-1] == (back.me, back.epoch, False, None)  # handed over
    assert net.hook_calls[0][-1] == (back.me, back.epoch, True, b"state-2")  # took it back
    assert net.condor_hosts[ms[0]][-1] == back.me
    feed_ok = [ch.manager for ch in feed]
    assert feed_ok[-1] == back.me and len(feed) == 0


def test_commit_api_misuse_raises() -> None:
    n = MiniNet(n=4)
    n.run(CFG.startup_s + 2.0)
    with pytest.raises(NotManagerError):
        n.apps[1].commit(b"x")
    with pytest.raises(StateTooLargeError):
        n.apps[0].commit(b"x" * (CFG.max_state_bytes + 1))
    with pytest.raises(FailoverError):
        n.apps[0].commit("text")  # type: ignore[arg-type]
    with pytest.raises(FailoverError):
        n.apps[0].start()  # twice
    results: list[bool] = []
    n.apps[0].commit(b"ok", results.append)
    n.run(0.5)
    assert results == [True]
    # uncommitted versions are reported lost when the manager stops before a quorum acks
    for i in (1, 2, 3):
        n.dead.add(i)
    n.apps[0].commit(b"lost", results.append)
    n.apps[0].stop()
    assert results == [True, False]
