"""A submit machine that reboots never applies a decision older than the one it applied last.

The applied decision is kept next to the ``config.d`` fragment (a dot file HTCondor does not
read, written atomically *before* the fragment) and loaded at start
(``FlockConfigApplier(persist=True).load``). Checked on files alone (restart, a crash between
the two writes, an unreadable state file, a failed reconfigure) and on a simulated pool ring:
after a restart, a genuine manager-signed push of an older decision is refused and counted;
without the kept version the same replay rolls the machine back (so the oracle can fail).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from discovery.announce import FlockConfig
from discovery.condor import (
    CondorError,
    FlockConfigApplier,
    applied_state_path,
    encode_applied_state,
    read_applied_state,
)
from discovery.condor_syntax import parse_config
from discovery.decision import FlockDecision, FlockTarget
from discovery.signing import sign_message
from discovery.submit import DOMAIN, FlockPush, SubmitConfig, encode_decision
from overlay import Identity
from sim_adapter.latency import Uniform
from sim_adapter.network import Network
from sim_adapter.plugins.failover import signers_for
from sim_adapter.plugins.flock import FixedPool
from sim_adapter.plugins.site import SitePool
from sim_adapter.simnode import SimNode


def _d(epoch: int, seq: int, *pools: int) -> FlockDecision:
    ts = tuple(FlockTarget(f"{p:040x}", f"cm{p}.pool.sim:9618", f"pool{p}") for p in pools)
    return FlockDecision(bool(ts), ts, float(seq), epoch, seq)


def _flock_to(path: Path) -> str:
    return parse_config(path.read_text()).get("FLOCK_TO", "")


def _noop() -> None:
    return None


def test_the_applied_version_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "99-flock.config"
    a = FlockConfigApplier(path, reconfig=_noop, persist=True)
    assert a.load() is None  # nothing kept yet
    assert a(_d(1, 1, 7)) and a(_d(1, 3, 8, 9))
    state = applied_state_path(path)
    assert state.name.startswith(".")  # LOCAL_CONFIG_DIR_EXCLUDE_REGEXP skips dot files
    b = FlockConfigApplier(path, reconfig=_noop, persist=True)  # the machine rebooted
    assert b.load() == _d(1, 3, 8, 9) and b.stats["state_loaded"] == 1
    assert not b(_d(1, 2, 7)) and b.stats["stale"] == 1  # older: refused
    assert _flock_to(path) == "cm8.pool.sim:9618, cm9.pool.sim:9618"
    # without persistence the same reboot forgets, and the older decision is written
    c = FlockConfigApplier(path, reconfig=_noop)
    assert c.load() is None and c(_d(1, 2, 7)) and _flock_to(path) == "cm7.pool.sim:9618"


def test_a_crash_between_the_two_writes_is_repaired_at_load(tmp_path: Path) -> None:
    path = tmp_path / "99-flock.config"
    a = FlockConfigApplier(path, reconfig=_noop, persist=True)
    a(_d(2, 1, 5))
    # the state file reached disk for (2, 4), the fragment did not (crash in between)
    applied_state_path(path).write_text(encode_applied_state(_d(2, 4, 6)))
    b = FlockConfigApplier(path, reconfig=_noop, persist=True)
    assert b.load() == _d(2, 4, 6) and b.stats["state_repaired"] == 1
    assert "epoch=2 seq=4" in path.read_text() and _flock_to(path) == "cm6.pool.sim:9618"


@pytest.mark.parametrize(
    "junk",
    ["", "{", "[]", '{"epoch": -1}', '{"epoch": true, "seq": 1}', '{"epoch": 1, "seq": 1}'],
)
def test_an_unreadable_state_file_is_counted_and_ignored(tmp_path: Path, junk: str) -> None:
    path = tmp_path / "99-flock.config"
    applied_state_path(path).write_text(junk)
    assert read_applied_state(applied_state_path(path)) is None
    a = FlockConfigApplier(path, reconfig=_noop, persist=True)
    assert a.load() is None and a.stats["state_unreadable"] == 1


def test_a_failed_reconfigure_keeps_the_previous_state(tmp_path: Path) -> None:
    path = tmp_path / "99-flock.config"
    FlockConfigApplier(path, reconfig=_noop, persist=True)(_d(1, 1, 3))

    def fail() -> None:
        raise RuntimeError("condor_reconfig: no master")

    bad = FlockConfigApplier(path, reconfig=fail, persist=True)
    bad.load()
    with pytest.raises(CondorError):
        bad(_d(1, 2, 4))
    assert read_applied_state(applied_state_path(path)) == _d(1, 1, 3)
    assert _flock_to(path) == "cm3.pool.sim:9618"


def _ring(tmp_path: Path, seed: int, persist: bool) -> tuple[Network, list[SimNode], SitePool]:
    net = Network(seed=seed, latency=Uniform(0.01, 0.05, seed=seed))
    rng = random.Random(seed)
    idents = [Identity.from_rng(rng) for _ in range(6)]
    nodes = net.spawn(6, overlay="pastry", join_interval_s=0.5, ids=[i.id for i in idents])

    def applier_for(node: SimNode) -> FlockConfigApplier:
        d = tmp_path / f"node{node.index}"
        d.mkdir(exist_ok=True)
        return FlockConfigApplier(d / "99-flock.config", reconfig=_noop, persist=persist)

    site = SitePool(
        net,
        nodes,
        nodes[0],
        FixedPool(10, 4, 0),
        collector="cm0.pool.sim:9618",
        pool_name="pool0",
        flock_config=FlockConfig(require_signatures=False, manager_period_s=1e6),
        submit_config=SubmitConfig(),
        signers=signers_for(idents),
        applier_for=applier_for,
    )
    site.start()
    t = site.failover.run_until(site.converged, 300.0)
    assert t == t, "the pool never agreed on a first decision"
    return net, nodes, site


@pytest.mark.parametrize("persist", [True, False])
def test_a_replayed_older_push_after_a_reboot(tmp_path: Path, persist: bool) -> None:
    net, nodes, site = _ring(tmp_path, 8, persist)
    assert site.converged()
    mgr = site.site(nodes[0])
    base = mgr.sync.published
    assert base is not None
    older = _d(base.epoch, base.seq + 1, 11)
    newer = _d(base.epoch, base.seq + 2, 12, 13)
    for d in (older, newer):
        mgr.sync.publish(d)
        net.run(3.0)
    victim = nodes[3]
    assert site.site(victim).sync.applied == newer
    signer = site.signers[nodes[0].id]  # type: ignore[index]
    replay = sign_message(
        FlockPush(
            site.failover.pool_key,
            nodes[0].core.handle,
            older.epoch,
            older.seq,
            encode_decision(older),
        ),
        signer,
        DOMAIN,
    )
    site.crash(victim)
    net.run(2.0)
    back = site.restart(victim)
    sync = site.site(back).sync
    sync.receive(replay)  # someone on the path replays the manager's older push
    net.run(20.0)
    conf = tmp_path / f"node{back.index}" / "99-flock.config"
    if persist:
        assert sync.stats["stale"] >= 1 and sync.stats["applied"] == 0
        assert sync.applied == newer and site.monotone()
        assert _flock_to(conf) == "cm12.pool.sim:9618, cm13.pool.sim:9618"
    else:  # without the kept version the machine goes back to the older list, then forward
        assert not site.monotone()
        assert any(i == back.index and d == older for _, i, d in site.applies[-10:])
