"""The flock list reaches every submit machine (Butt et al. 2006 §4.1) at 5% message loss.

A pool ring of 1 central manager and 5 submit machines (signed ids, real joins), each with
faultD, the flock plugin, the decision push and a ``FlockConfigApplier`` writing a real
``config.d`` fragment. The manager publishes a stream of decisions; the oracle is the
manager's own rendered ``FLOCK_TO`` and the full record of every apply on every machine.
"""

from __future__ import annotations

import random
from pathlib import Path

import attrs
import pytest

from discovery.announce import FlockConfig
from discovery.condor import FlockConfigApplier
from discovery.condor_syntax import parse_config
from discovery.decision import FlockDecision, FlockTarget
from discovery.signing import sign_message
from discovery.site import SiteState, decode_site_state, encode_site_state
from discovery.submit import (
    DOMAIN,
    FlockPush,
    SubmitConfig,
    decode_decision,
    encode_decision,
)
from overlay import Identity
from overlay.pastry.config import PastryConfig
from sim_adapter.latency import Uniform
from sim_adapter.network import Network
from sim_adapter.plugins.failover import signers_for
from sim_adapter.plugins.flock import FixedPool
from sim_adapter.plugins.site import SitePool
from sim_adapter.simnode import SimNode

SUBMIT = SubmitConfig()  # republish every 10 s, signatures required
#: the stated bound: one re-broadcast period plus the multicast's delivery with retransmissions
#: (a few one-way delays of <= 50 ms and retries of a lost edge) and the pull round trip
BOUND_S = SUBMIT.republish_period_s + 5.0


def _flock_to(path: Path) -> str:
    return parse_config(path.read_text()).get("FLOCK_TO", "")


def _ring(
    tmp_path: Path, seed: int
) -> tuple[Network, list[SimNode], SitePool, dict[int, FlockConfigApplier]]:
    net = Network(seed=seed, latency=Uniform(0.01, 0.05, seed=seed), loss=0.05)
    rng = random.Random(seed)
    idents = [Identity.from_rng(rng) for _ in range(6)]
    nodes = net.spawn(6, overlay="pastry", join_interval_s=0.5, ids=[i.id for i in idents])

    def applier_for(node: SimNode) -> FlockConfigApplier:
        d = tmp_path / f"node{node.index}"
        d.mkdir(exist_ok=True)
        return FlockConfigApplier(
            d / "99-flock.config", reconfig=lambda: None, restart_schedd=lambda: None
        )

    appliers: dict[int, FlockConfigApplier] = {}

    def make(node: SimNode) -> FlockConfigApplier:
        a = applier_for(node)
        appliers[node.index] = a
        return a

    site = SitePool(
        net,
        nodes,
        nodes[0],
        FixedPool(10, 4, 0),
        collector="cm0.pool.sim:9618",
        pool_name="pool0",
        # the manager's own Flocking Manager period is long so that the test's stream of
        # decisions is the only one (the Site still publishes its first decision)
        flock_config=FlockConfig(require_signatures=False, manager_period_s=1e6),
        submit_config=SUBMIT,
        signers=signers_for(idents),
        applier_for=make,
    )
    site.start()
    t = site.failover.run_until(site.converged, 300.0)
    assert t == t, "the pool never agreed on a first decision"
    return net, nodes, site, appliers


def _targets(rng: random.Random) -> tuple[FlockTarget, ...]:
    k = rng.randrange(0, 4)
    pools = rng.sample(range(50), k)
    return tuple(FlockTarget(f"{p:040x}", f"cm{p}.pool.sim:9618", f"pool{p}") for p in pools)


@pytest.mark.parametrize("seed", [1, 2])
def test_every_submit_machine_converges_and_never_goes_back(tmp_path: Path, seed: int) -> None:
    net, nodes, site, appliers = _ring(tmp_path, seed)
    mgr = site.site(nodes[0])
    assert mgr.serving
    rng = random.Random(seed * 7)
    base = mgr.sync.published
    assert base is not None
    published: list[tuple[float, FlockDecision]] = []
    for k in range(25):
        targets = _targets(rng)
        d = FlockDecision(bool(targets), targets, net.now, base.epoch, base.seq + 1 + k)
        mgr.sync.publish(d)
        published.append((net.now, d))
        net.run(rng.uniform(0.5, 8.0))
    net.run(BOUND_S)
    # oracle 1: versions only grow on every machine, over every apply ever made
    assert site.monotone()
    # oracle 2: every machine's FLOCK_TO file equals the manager's rendering of its newest
    last = published[-1][1]
    want = _flock_to(appliers[nodes[0].index].path)
    assert want == ", ".join(dict.fromkeys(t.collector for t in last.targets))
    for n in nodes:
        assert appliers[n.index].applied == last, n.index
        assert _flock_to(appliers[n.index].path) == want
    # oracle 3: the stated bound, decision by decision: within BOUND_S of its publication,
    # every machine applied it or a newer one
    worst = 0.0
    for t_pub, d in published:
        for n in nodes:
            t_have = min(t for t, i, a in site.applies if i == n.index and a.version >= d.version)
            worst = max(worst, t_have - t_pub)
    assert worst <= BOUND_S, worst


def test_forged_stale_and_foreign_pushes_change_nothing(tmp_path: Path) -> None:
    net, nodes, site, _ = _ring(tmp_path, 3)
    sub = site.site(nodes[3]).sync
    have = sub.applied
    assert have is not None
    mgr = site.site(nodes[0]).sync
    assert mgr.published is not None and mgr.published.version == have.version
    newer = FlockDecision(True, _targets(random.Random(1)) or (), net.now, have.epoch, 99)
    raw = encode_decision(newer)
    # a submit machine (not the manager) signs a push with its own key: refused
    other = site.signers[nodes[2].id]  # type: ignore[index]
    foreign = sign_message(
        FlockPush(site.failover.pool_key, nodes[2].core.handle, newer.epoch, newer.seq, raw),
        other,
        DOMAIN,
    )
    sub.receive(foreign)
    assert sub.applied == have and sub.stats["unauthorized"] == 1
    # the manager's genuine push, one field changed after signing: refused
    genuine = sign_message(
        FlockPush(site.failover.pool_key, nodes[0].core.handle, newer.epoch, newer.seq, raw),
        site.signers[nodes[0].id],  # type: ignore[index]
        DOMAIN,
    )
    sub.receive(attrs.evolve(genuine, seq=100))
    assert sub.applied == have and sub.stats["bad_signature"] == 1
    # a malformed decision blob, or fields of the wrong type: refused and counted
    sub.receive(attrs.evolve(genuine, decision=b"\xc1junk"))
    sub.receive(attrs.evolve(genuine, epoch="7"))  # type: ignore[arg-type]
    sub.receive(attrs.evolve(genuine, decision=None))  # type: ignore[arg-type]
    sub.receive("not a push")
    assert sub.applied == have
    # (the junk blob fails the signature first: the signature covers the blob)
    assert sub.stats["bad_signature"] == 2
    assert sub.stats["malformed"] == 2 and sub.stats["stray"] == 1
    # the genuine one applies; replaying it or an older one changes nothing
    sub.receive(genuine)
    assert sub.applied == newer
    sub.receive(genuine)
    old = sign_message(
        FlockPush(
            site.failover.pool_key,
            nodes[0].core.handle,
            have.epoch,
            have.seq,
            encode_decision(have),
        ),
        site.signers[nodes[0].id],  # type: ignore[index]
        DOMAIN,
    )
    sub.receive(old)
    assert sub.applied == newer
    assert sub.stats["duplicate"] >= 1 and sub.stats["stale"] >= 1
    assert site.monotone()


def test_decision_and_site_state_round_trip_and_reject_garbage() -> None:
    rng = random.Random(4)
    for k in range(50):
        targets = tuple(
            FlockTarget(f"{p:040x}", f"cm{p}.pool.sim:9618", f"pool{p}", rng.random(), p, p % 3)
            for p in rng.sample(range(100), rng.randrange(0, 6))
        )
        d = FlockDecision(bool(targets), targets, rng.uniform(0, 1e6), rng.randrange(9), k)
        assert decode_decision(encode_decision(d)) == d
        st = SiteState("cm.example.org:9618", "poolA", d if k % 2 else None)
        assert decode_site_state(encode_site_state(st)) == st
    raw = encode_decision(FlockDecision(True, (), 1.0, 1, 1))
    for bad in (
        b"",
        b"\xc1",
        raw[:-1],
        raw + b"x",
        b"\x95\xc3\xcb" + b"\x00" * 8 + b"\x01\xff\x90",
    ):
        assert decode_decision(bad) is None
    assert decode_site_state(b"\x93\x01\x02\xc0") is None
    assert decode_site_state(None) is None


def test_a_machine_that_missed_updates_converges_to_the_newest(tmp_path: Path) -> None:
    net, nodes, site, appliers = _ring(tmp_path, 4)
    mgr = site.site(nodes[0])
    base = mgr.sync.published
    assert base is not None
    cut = nodes[4]
    rng = random.Random(9)
    # cut one submit machine off for less than faultD's detection time, while the manager
    # publishes three decisions; no push can reach it
    net.partition([[cut], [n for n in nodes if n is not cut]])
    last = base
    for k in range(3):
        last = FlockDecision(True, _targets(rng), net.now, base.epoch, base.seq + 1 + k)
        mgr.sync.publish(last)
        net.run(4.0)
    net.heal()
    missed = site.site(cut).sync.applied
    assert missed is not None and missed.version < last.version  # it really missed them
    healed_at = net.now
    # The overlay's own probes declare the cut-off machine DEAD within the 12 s (every other
    # node held it DEAD at the heal, with or without custody), so it is back in the leaf sets,
    # and the multicast tree, only once it is re-integrated: at most one
    # ``reintegration_interval_s`` on top of the stated bound (measured: 13.8 s to re-integrate
    # on one trajectory, then 2.3 s to converge; 6.1 s in all on another).
    bound = BOUND_S + PastryConfig().reintegration_interval_s
    t = site.failover.run_until(lambda: site.site(cut).sync.applied == last, bound, step_s=0.1)
    assert t == t, f"the cut-off machine did not converge within {bound} s"
    # it jumped straight to the newest: none of the missed intermediate decisions was applied
    assert [a.version for at, i, a in site.applies if i == cut.index and at >= healed_at] == [
        last.version
    ]
    assert site.monotone()
    assert _flock_to(appliers[cut.index].path) == _flock_to(appliers[nodes[0].index].path)
