"""RFC 6298 estimator and the liveness state machine, with explicit time."""

from __future__ import annotations

import pytest

from overlay import ConfigError, NodeHandle, NodeId
from overlay.proximity import Liveness, Ping, Pong, Proximity, ProximityConfig
from overlay.runtime import ManualRuntime

ME = NodeHandle(NodeId(1), "me")
PEER = NodeHandle(NodeId(2), "peer")


def make() -> tuple[ManualRuntime, Proximity, list[NodeHandle]]:
    rt = ManualRuntime(seed=3)
    dead: list[NodeHandle] = []
    return rt, Proximity(rt, ME, ProximityConfig(), on_dead=dead.append), dead


def test_rfc6298_estimator() -> None:
    _, p, _ = make()
    assert p.rto(PEER) == 1.0  # RFC 6298 §2.1 initial RTO
    p.sample(PEER, 0.1)
    # first sample: SRTT = R, RTTVAR = R/2, RTO = SRTT + 4 RTTVAR
    assert p.srtt(PEER) == pytest.approx(0.1)
    assert p.rto(PEER) == pytest.approx(0.3)
    p.sample(PEER, 0.2)
    rttvar = 0.75 * 0.05 + 0.25 * abs(0.1 - 0.2)
    srtt = 0.875 * 0.1 + 0.125 * 0.2
    assert p.srtt(PEER) == pytest.approx(srtt)
    assert p.rto(PEER) == pytest.approx(srtt + 4 * rttvar)
    assert p.rtt(PEER) == pytest.approx(0.1)  # min RTT kept for PNS
    p.sample(PEER, 0.0001)
    assert p.rto(PEER) >= 0.05  # clamp


def test_probe_answered() -> None:
    rt, p, dead = make()
    got: list[float | None] = []
    p.probe(PEER, got.append)
    p.probe(PEER, got.append)  # shares the in-flight probe
    ((dst, ping),) = rt.take_sent()
    assert dst == PEER and isinstance(ping, Ping)
    rt.advance(0.08)
    p.on_pong(PEER, Pong(ping.nonce, ping.sent_at))
    assert got == [pytest.approx(0.08)] * 2
    assert p.state(PEER) is Liveness.ALIVE
    assert not dead


def test_unanswered_probe_goes_suspected_then_dead_with_backoff() -> None:
    rt, p, dead = make()
    got: list[float | None] = []
    p.probe(PEER, got.append)
    rt.advance(1.0001)
    assert p.state(PEER) is Liveness.SUSPECTED
    assert PEER in p.bad
    # retries at 2 s, 4 s, 8 s back-off: total 1 + 2 + 4 + 8 = 15 s
    rt.advance(13.9)
    assert not dead
    rt.advance(0.2)
    assert dead == [PEER] and got == [None]
    assert p.state(PEER) is Liveness.DEAD and p.is_dead(PEER)
    assert len([m for _, m in rt.take_sent() if isinstance(m, Ping)]) == 4
    # any message from it revives it
    p.heard(PEER)
    assert p.state(PEER) is Liveness.ALIVE and PEER not in p.bad


def _pings_until_dead(rt: ManualRuntime, dead: list[NodeHandle]) -> int:
    rt.advance(60.0)
    assert dead == [PEER]
    return len([m for _, m in rt.take_sent() if isinstance(m, Ping)])


def test_a_hint_probe_retransmits_less_unless_a_full_caller_shares_it() -> None:
    """A probe of a mere candidate gives up after ``hint_probe_retries``; a caller that relies
    on the peer and joins the probe in flight restores the full count (and a full probe is
    never shortened by a hint caller)."""
    rt, p, dead = make()
    got: list[float | None] = []
    p.probe(PEER, got.append, hint=True)
    assert _pings_until_dead(rt, dead) == 1 + p.config.hint_probe_retries == 2
    assert got == [None]

    rt, p, dead = make()
    p.probe(PEER, hint=True)
    rt.advance(1.0001)  # first retransmission due at 1 s: the hint probe is on its last ping
    p.suspect(PEER)  # a route ack went missing: full strength from here on
    assert _pings_until_dead(rt, dead) == 1 + p.config.probe_retries

    rt, p, dead = make()
    p.probe(PEER)
    p.probe(PEER, hint=True)
    assert _pings_until_dead(rt, dead) == 1 + p.config.probe_retries


def test_a_candidate_probe_is_one_ping_unless_a_stronger_caller_shares_it() -> None:
    """A routing-table candidate's probe is ``1 + candidate_probe_retries`` pings (one, by
    default); a hint or full caller joining it in flight raises its count."""
    rt, p, dead = make()
    got: list[float | None] = []
    p.probe(PEER, got.append, hint=True, candidate=True)
    assert _pings_until_dead(rt, dead) == 1 + p.config.candidate_probe_retries == 1
    assert got == [None]

    rt, p, dead = make()
    p.probe(PEER, hint=True, candidate=True)
    p.probe(PEER, hint=True)
    assert _pings_until_dead(rt, dead) == 1 + p.config.hint_probe_retries

    rt, p, dead = make()
    p.probe(PEER, hint=True, candidate=True)
    p.probe(PEER)
    assert _pings_until_dead(rt, dead) == 1 + p.config.probe_retries


def test_a_peer_heard_from_after_its_probe_began_is_not_declared_dead() -> None:
    """Its pong lost, the peer spoke to us (any message) before the probe timed out: the probe
    ends as answered at that timeout, without a retransmission, and no DEAD verdict follows;
    a message heard *before* the probe began proves nothing about the probe."""
    rt, p, dead = make()
    p.sample(PEER, 0.2)
    got: list[float | None] = []
    p.probe(PEER, got.append)
    assert len(rt.take_sent()) == 1  # the ping; its pong will be lost
    rt.advance(0.1)
    p.heard(PEER)  # e.g. a heartbeat that crossed the ping
    rt.advance(60.0)
    assert got == [pytest.approx(p.srtt(PEER))] and not dead
    assert rt.take_sent() == [] and p.answered_by_traffic == 1
    assert p.state(PEER) is Liveness.ALIVE

    rt, p, dead = make()
    p.heard(PEER)
    p.sample(PEER, 0.2)
    rt.advance(1.0)
    p.probe(PEER)
    assert _pings_until_dead(rt, dead) == 1 + p.config.probe_retries


def test_a_probed_peer_we_hold_no_record_of_is_heard_too() -> None:
    """A probe of a peer never sampled (a failure report's, a hint's) runs without a record of
    it; a message from it while the probe is in flight must still count as proof of life. It
    was ignored (no record, no state for passers-by), the pong was lost, and the probe ended
    in a false DEAD verdict on a node that had just spoken to us."""
    rt, p, dead = make()
    got: list[float | None] = []
    p.probe(PEER, got.append, hint=True)
    assert len(rt.take_sent()) == 1
    rt.advance(0.1)
    p.heard(PEER)  # its own ping to us, say; our pong from it is lost
    rt.advance(60.0)
    assert not dead and got and got[0] is not None
    assert rt.take_sent() == [] and p.answered_by_traffic == 1
    assert p.state(PEER) is Liveness.ALIVE
    stranger = NodeHandle(NodeId(9), "passer-by")
    p.heard(stranger)  # no probe, no record: still nothing allocated for it
    assert stranger not in p.peers.rows


def test_foreign_pong_ignored_and_config_validated() -> None:
    _, p, _ = make()
    p.on_pong(PEER, Pong(12345, 0.0))
    assert p.state(PEER) is Liveness.UNKNOWN
    with pytest.raises(ConfigError):
        ProximityConfig(min_rto_s=0)


def test_a_pong_from_someone_else_leaves_the_probe_pending() -> None:
    """A pong with the right nonce from another id is dropped and counted; the probe keeps its
    timeout, so a dead peer is still declared dead and the real pong still counts."""
    rt, p, dead = make()
    other = NodeHandle(NodeId(3), "on-path")
    got: list[float | None] = []
    p.probe(PEER, got.append)
    ((_, ping),) = rt.take_sent()
    assert isinstance(ping, Ping)
    rt.advance(0.01)
    p.on_pong(other, Pong(ping.nonce, ping.sent_at))
    assert got == [] and p.foreign_pongs == 1 and p.rtt(other) is None
    rt.advance(0.04)
    p.on_pong(NodeHandle(PEER.id, "peer-behind-nat"), Pong(ping.nonce, ping.sent_at))
    assert got == [pytest.approx(0.05)]  # same id, other address: it is the peer answering
    assert p.rtt(PEER) == pytest.approx(0.05)
    # a peer that never answers, while someone else echoes every nonce, is still found dead
    p.probe(PEER, got.append)
    for _ in range(30):
        for _, m in rt.take_sent():
            if isinstance(m, Ping):
                p.on_pong(other, Pong(m.nonce, m.sent_at))
        rt.advance(1.0)
    assert dead == [PEER] and got[-1] is None


def test_probe_backoff_factor_spaces_the_retransmissions() -> None:
    """``probe_backoff`` 1.0 probes at a fixed interval: DEAD after (1 + retries) RTOs, against
    1 + 2 + 4 + 8 with the default doubling (the test above)."""
    rt = ManualRuntime(seed=3)
    dead: list[NodeHandle] = []
    p = Proximity(rt, ME, ProximityConfig(probe_backoff=1.0), on_dead=dead.append)
    p.probe(PEER)
    rt.advance(3.99)
    assert not dead and p.state(PEER) is Liveness.SUSPECTED
    rt.advance(0.02)
    assert dead == [PEER]
    assert len([m for _, m in rt.take_sent() if isinstance(m, Ping)]) == 4
    with pytest.raises(ValueError):
        ProximityConfig(probe_backoff=0.9)


@pytest.mark.parametrize("factor", [0.0, 1.5])
def test_pings_but_the_last_go_again_after_a_few_smoothed_rtts(factor: float) -> None:
    """One sample of 0.2 s: SRTT 0.2, RTTVAR 0.1, RTO 0.6 s (RFC 6298 §2.2). With
    ``retransmit_srtt_factor`` 1.5 the second and third pings leave 1.5 * 0.2 + 0.05 = 0.35 s
    after the one before, and the last still waits a full RTO: DEAD at 0.35 + 0.35 + 0.6 =
    1.3 s instead of 3 * 0.6 = 1.8 s. A pong to any of them up to the verdict answers it."""
    rt = ManualRuntime(seed=3)
    dead: list[NodeHandle] = []
    cfg = ProximityConfig(probe_retries=2, probe_backoff=1.0, retransmit_srtt_factor=factor)
    p = Proximity(rt, ME, cfg, on_dead=dead.append)
    p.sample(PEER, 0.2)
    assert p.rto(PEER) == pytest.approx(0.6)
    p.probe(PEER)
    sent: list[float] = []
    for _ in range(1000):
        sent += [rt.now() for _, m in rt.take_sent() if isinstance(m, Ping)]
        if dead:
            break
        rt.advance(0.005)
    step = 0.35 if factor else 0.6
    assert sent == pytest.approx([0.0, step, 2 * step], abs=0.006)
    assert rt.now() == pytest.approx(2 * step + 0.6, abs=0.006)
    # the same probe again, and the first ping's pong comes just before the verdict
    p2 = Proximity(rt, ME, cfg, on_dead=dead.append)
    p2.sample(PEER, 0.2)
    got: list[float | None] = []
    p2.probe(PEER, got.append)
    first = next(m for _, m in rt.take_sent() if isinstance(m, Ping))
    rt.advance(2 * step + 0.59)
    p2.on_pong(PEER, Pong(first.nonce, first.sent_at))
    assert got == [pytest.approx(2 * step + 0.59)] and dead == [PEER]  # only the first's


def test_a_late_pong_to_an_earlier_attempt_answers_the_probe_with_its_own_rtt() -> None:
    """A peer slower than our RTO is alive: the pong to the first ping, arriving after the
    retransmission, ends the probe (no DEAD verdict at any backoff) and is sampled against
    that ping's own send time."""
    rt = ManualRuntime(seed=3)
    dead: list[NodeHandle] = []
    p = Proximity(rt, ME, ProximityConfig(probe_backoff=1.0), on_dead=dead.append)
    got: list[float | None] = []
    p.probe(PEER, got.append)
    first = next(m for _, m in rt.take_sent() if isinstance(m, Ping))
    rt.advance(1.0001)  # first attempt timed out: SUSPECTED, a second ping went out
    assert p.state(PEER) is Liveness.SUSPECTED
    second = next(m for _, m in rt.take_sent() if isinstance(m, Ping))
    assert second.nonce != first.nonce
    rt.advance(0.1999)
    p.on_pong(PEER, Pong(first.nonce, first.sent_at))  # 1.2 s after the first ping
    assert got == [pytest.approx(1.2)]
    assert p.state(PEER) is Liveness.ALIVE and not dead
    assert p.rtt(PEER) == pytest.approx(1.2)
    # the second attempt's pong, later still, is no longer outstanding
    p.on_pong(PEER, Pong(second.nonce, second.sent_at))
    assert got == [pytest.approx(1.2)]
    rt.advance(30.0)
    assert not dead
    assert not p._by_nonce  # every attempt's nonce forgotten with the probe


def test_a_pong_after_the_dead_verdict_corrects_the_rtt_estimate() -> None:
    """An RTO below the peer's true RTT: the probe ends DEAD before the first pong is back.
    That pong, arriving after the verdict, is sampled (and revives the peer), so the next
    probe waits long enough; a pong after ``max_rto_s`` or from another id is ignored."""
    rt = ManualRuntime(seed=3)
    dead: list[NodeHandle] = []
    p = Proximity(rt, ME, ProximityConfig(probe_backoff=1.0, probe_retries=2), dead.append)
    p.sample(PEER, 0.03)  # a wrong, far too short sample: RTO 0.15 s against a true RTT of 0.5
    p.probe(PEER)
    first = next(m for _, m in rt.take_sent() if isinstance(m, Ping))
    rt.advance(0.46)  # three pings at ~0.15 s intervals, none answered in time
    assert dead == [PEER] and p.state(PEER) is Liveness.DEAD
    rt.advance(0.04)
    other = NodeHandle(NodeId(99), 99)
    p.on_pong(other, Pong(first.nonce, first.sent_at))  # not from whom we asked: ignored
    assert p.state(PEER) is Liveness.DEAD and p.pongs_after_verdict == 0
    p.on_pong(PEER, Pong(first.nonce, first.sent_at))  # 0.5 s after it was sent
    assert p.state(PEER) is Liveness.ALIVE and p.pongs_after_verdict == 1
    assert p.rto(PEER) > 0.5  # the next probe waits for a pong 0.5 s away
    # a second pong to the same ping is no new sample
    p.on_pong(PEER, Pong(first.nonce, first.sent_at))
    assert p.pongs_after_verdict == 1


def test_the_pings_of_a_failed_probe_are_forgotten_once_they_expire() -> None:
    """Kept ``max_rto_s`` for a late pong, then forgotten by the periodic ``expire_dead`` even
    if no other probe fails (found by the fuzz test's quiet-state check: they stayed for good)."""
    rt = ManualRuntime(seed=3)
    p = Proximity(rt, ME, ProximityConfig(probe_backoff=1.0, probe_retries=2), lambda h: None)
    p.probe(PEER)
    rt.take_sent()
    rt.advance(5.0)  # three pings unanswered: DEAD, the three nonces kept
    assert p.state(PEER) is Liveness.DEAD and p._failed is not None and len(p._failed) == 3
    p.expire_dead()
    assert p._failed is not None and len(p._failed) == 3  # not yet max_rto_s old
    rt.advance(p.config.max_rto_s + 0.1)
    p.expire_dead()
    assert p._failed is None


def test_a_dead_verdict_is_rechecked_once_it_is_old_and_a_pong_revives_the_peer() -> None:
    """``recheck``: nothing for a peer not held DEAD or a verdict younger than
    ``dead_recheck_s``; then one ping (no retransmission), and the verdict's clock restarts, so a
    second recheck waits as long again; a pong revives the peer through ``on_alive``."""
    rt = ManualRuntime(seed=3)
    dead: list[NodeHandle] = []
    alive: list[NodeHandle] = []
    cfg = ProximityConfig()
    p = Proximity(rt, ME, cfg, on_dead=dead.append, on_alive=alive.append)
    assert not p.recheck(PEER)  # no record
    p.sample(PEER, 0.1)
    assert not p.recheck(PEER)  # alive
    p.declare_dead(PEER)
    rt.take_sent()
    assert not p.recheck(PEER)  # the verdict is new
    rt.advance(cfg.dead_recheck_s)
    assert p.recheck(PEER)
    assert not p.recheck(PEER)  # its ping is in flight
    rt.advance(10.0)  # unanswered: one ping, no retransmission, still DEAD
    assert [type(m) for _, m in rt.take_sent()] == [Ping]
    assert p.is_dead(PEER) and dead == [PEER]
    assert not p.recheck(PEER)  # the clock restarted with the ping
    rt.advance(cfg.dead_recheck_s - 10.0)
    assert p.recheck(PEER)
    ((dst, ping),) = rt.take_sent()
    assert dst == PEER and isinstance(ping, Ping)
    rt.advance(0.1)
    p.on_pong(PEER, Pong(ping.nonce, ping.sent_at))
    assert p.state(PEER) is Liveness.ALIVE and alive == [PEER]


def test_heard_since_is_last_heard_at_or_after_a_time_and_false_without_a_hearing() -> None:
    """``heard_since(h, t)`` agrees with ``last_heard``: False with no record or a record never
    heard from (even for a time before the runtime's start), else ``last_heard >= t``."""
    rt = ManualRuntime(seed=4)
    p = Proximity(rt, ME, ProximityConfig(), on_dead=lambda h: None)
    assert not p.heard_since(PEER, -100.0)  # no record
    p.probe(PEER)  # a record, never heard from
    assert p.last_heard(PEER) is None and not p.heard_since(PEER, -100.0)
    rt.advance(5.0)
    p.heard(PEER)
    for t in (-1.0, 0.0, 5.0, 5.0001, 10.0):
        last = p.last_heard(PEER)
        assert last is not None and p.heard_since(PEER, t) == (last >= t)
    assert p.heard_since(PEER, 5.0) and not p.heard_since(PEER, 5.0001)


OTHERS = [NodeHandle(NodeId(10 + i), f"o{i}") for i in range(3)]


def _fast(rt: ManualRuntime, dead: list[NodeHandle]) -> Proximity:
    """A node with the live default: three samples scale a never-sampled peer's RTO."""
    return Proximity(rt, ME, ProximityConfig(network_rto_samples=3), on_dead=dead.append)


def _sampled(rt: ManualRuntime, dead: list[NodeHandle]) -> Proximity:
    p = _fast(rt, dead)
    for h in OTHERS:
        p.sample(h, 0.001)
    return p


def test_a_never_sampled_peer_gets_the_rto_of_the_largest_sample_once_there_are_enough() -> None:
    p = _fast(ManualRuntime(seed=3), [])
    assert p.rto(PEER) == 1.0
    p.sample(OTHERS[0], 0.004)
    p.sample(OTHERS[1], 0.020)
    assert p.rto(PEER) == 1.0  # two samples: still RFC 6298's initial RTO
    p.sample(OTHERS[2], 0.002)
    assert p.rto(PEER) == pytest.approx(3 * 0.020)  # the largest, as a first sample
    p.sample(OTHERS[0], 0.5)
    assert p.rto(PEER) == 1.0  # never above the initial RTO
    q = _sampled(ManualRuntime(seed=3), [])
    assert q.rto(PEER) == pytest.approx(0.05)  # never below min_rto_s
    assert q.rto(OTHERS[0]) == pytest.approx(0.05)  # a sampled peer: its own RTO
    _, off, _ = make()  # the default: off (simulations keep RFC 6298's initial RTO)
    for h in OTHERS:
        off.sample(h, 0.001)
    assert off.rto(PEER) == 1.0


def test_a_dead_verdict_on_a_never_sampled_peer_waits_the_initial_rto() -> None:
    """Its pings go on the network's scale (50 ms apart, doubling), but the verdict comes no
    sooner than the initial RTO after the first ping: a guess, not a bound, kills nobody."""
    rt = ManualRuntime(seed=3)
    dead: list[NodeHandle] = []
    p = _sampled(rt, dead)
    p.probe(PEER)
    rt.advance(0.05 + 0.1 + 0.2 + 0.4 + 0.01)  # every ping has timed out (0.75 s)
    assert len([m for _, m in rt.take_sent() if isinstance(m, Ping)]) == 4
    assert p.state(PEER) is Liveness.SUSPECTED and not dead
    rt.advance(0.23)
    assert not dead
    rt.advance(0.02)  # 1.0 s after the first ping
    assert dead == [PEER]


def test_a_far_peer_slower_than_the_guess_is_not_declared_dead() -> None:
    """A peer 0.9 s away, never sampled, by a node whose samples were all 1 ms: its pings time
    out on the guess, but the pong to the first one comes within the initial RTO."""
    rt = ManualRuntime(seed=3)
    dead: list[NodeHandle] = []
    p = _sampled(rt, dead)
    got: list[float | None] = []
    p.probe(PEER, got.append)
    first = next(m for _, m in rt.take_sent() if isinstance(m, Ping))
    rt.advance(0.9)
    assert p.state(PEER) is Liveness.SUSPECTED
    p.on_pong(PEER, Pong(first.nonce, first.sent_at))
    assert got == [pytest.approx(0.9)] and not dead
    assert p.state(PEER) is Liveness.ALIVE
    rt.advance(30.0)
    assert not dead
