"""Announcement authenticity and freshness, sans-io with real Ed25519 keys.

A receiver (a Pastry core on a ManualRuntime with a Flock) is handed announcements built by
hand: a valid one is accepted; a forged origin, a forged signature, a tampered field, a replay
of an older sequence number, an expired or future-stamped copy, an unsigned one, a tailored
copy meant for another node and malformed fields are each dropped and counted under their own
reason — and the node keeps accepting valid announcements afterwards.
"""

from __future__ import annotations

import attrs
import pytest
from flock_support import announce, ident, keyed_node

from discovery.announce import Flock, FlockConfig
from discovery.flock_messages import (
    FlockAnnounce,
    IdentitySigner,
    sign_announce,
    signed_bytes,
    verify_announce,
)
from overlay import ConfigError, NodeHandle
from overlay.wire import decode_message, encode_message

ORIGIN = ident(2)
ATTACKER = ident(3)
O_HANDLE = NodeHandle(ORIGIN.id, 999)


@pytest.fixture
def rx() -> Flock:
    k = keyed_node(1)
    k.core.prox.sample(O_HANDLE, 0.02)  # known RTT: no probe traffic in these tests
    k.rt.advance(100.0)  # clock at 100 s
    return k.flock


def _deliver(f: Flock, m: FlockAnnounce) -> None:
    f.core.receive(O_HANDLE, m)


def _ids(f: Flock) -> set[object]:
    return {e.origin.id for e in f.willing_entries()}


def test_a_valid_signed_announcement_is_accepted(rx: Flock) -> None:
    _deliver(rx, announce(ORIGIN, issued=99.0, free=7, idle=3, util=0.25, row=2))
    [e] = rx.willing_entries()
    assert (e.origin.id, e.free_machines, e.idle_jobs, e.row) == (ORIGIN.id, 7, 3, 2)
    assert e.collector == "cm.example.org:9618"
    assert e.expires_at_s == 99.0 + 60.0
    assert rx.stats["accepted"] == 1


def test_forged_origin_is_rejected(rx: Flock) -> None:
    """The attacker signs with its own key but claims the origin's id."""
    m = announce(ORIGIN, issued=99.0, sign=False)
    m = sign_announce(m, IdentitySigner(ATTACKER))
    _deliver(rx, m)
    assert rx.stats["forged"] == 1 and not _ids(rx)


def test_forged_signature_is_rejected(rx: Flock) -> None:
    """The origin's real public key, with a signature it never made."""
    m = announce(ORIGIN, issued=99.0)
    bogus = IdentitySigner(ATTACKER).sign(signed_bytes(m))
    _deliver(rx, attrs.evolve(m, signature=bogus))
    assert rx.stats["tampered"] == 1 and not _ids(rx)


@pytest.mark.parametrize(
    "change",
    [
        {"free_machines": 500},
        {"collector": "evil.example.org"},
        {"row": 1},
        {"ttl": 3},
        {"valid_for_s": 600.0},
        {"seq": 2},
        {"origin": NodeHandle(ORIGIN.id, 1234)},
        {"to": ident(1).id},
    ],
)
def test_any_tampered_signed_field_is_rejected(rx: Flock, change: dict[str, object]) -> None:
    m = announce(ORIGIN, issued=99.0)
    _deliver(rx, attrs.evolve(m, **change))
    assert rx.stats["tampered"] == 1 and not _ids(rx)
    _deliver(rx, m)  # the node keeps serving: the genuine copy is accepted
    assert _ids(rx) == {ORIGIN.id}


def test_hops_is_outside_the_signature(rx: Flock) -> None:
    m = announce(ORIGIN, issued=99.0, ttl=3)
    assert verify_announce(attrs.evolve(m, hops=2)) is None
    _deliver(rx, attrs.evolve(m, hops=1))
    assert _ids(rx) == {ORIGIN.id}


def test_replay_of_an_older_announcement_is_rejected(rx: Flock) -> None:
    old = announce(ORIGIN, issued=95.0, seq=5, free=9)
    new = announce(ORIGIN, issued=99.0, seq=6, free=2)
    _deliver(rx, old)
    _deliver(rx, new)
    _deliver(rx, old)  # captured and replayed: still within its validity
    assert rx.stats["replayed"] == 1
    [e] = rx.willing_entries()
    assert (e.seq, e.free_machines) == (6, 2)


def test_the_same_copy_twice_is_a_duplicate_not_applied_twice(rx: Flock) -> None:
    m = announce(ORIGIN, issued=99.0)
    _deliver(rx, m)
    _deliver(rx, m)
    assert rx.stats["duplicate"] == 1 and rx.stats["accepted"] == 1


def test_expired_and_future_announcements_are_rejected(rx: Flock) -> None:
    _deliver(rx, announce(ORIGIN, issued=30.0, valid=60.0))  # expired at 90 < now 100
    assert rx.stats["expired"] == 1
    _deliver(rx, announce(ORIGIN, issued=120.0, seq=2))  # 20 s in the future > 5 s skew
    assert rx.stats["future"] == 1
    assert not _ids(rx)
    _deliver(rx, announce(ORIGIN, issued=103.0, seq=3))  # within the allowed skew
    assert _ids(rx) == {ORIGIN.id}


def test_unsigned_announcements_are_rejected_when_signatures_are_required(rx: Flock) -> None:
    _deliver(rx, announce(ORIGIN, issued=99.0, sign=False))
    assert rx.stats["unsigned"] == 1 and not _ids(rx)


def test_unsigned_accepted_when_signatures_are_off_but_bad_signatures_still_count() -> None:
    k = keyed_node(1, signed=False)
    k.rt.advance(100.0)
    k.core.prox.sample(O_HANDLE, 0.02)
    k.core.receive(O_HANDLE, announce(ORIGIN, issued=99.0, sign=False))
    assert len(k.flock.willing_entries()) == 1
    m = announce(ORIGIN, issued=99.0, seq=2)
    k.core.receive(O_HANDLE, attrs.evolve(m, free_machines=1000))
    assert k.flock.stats["tampered"] == 1


def test_a_tailored_copy_for_another_node_is_misdirected(rx: Flock) -> None:
    _deliver(rx, announce(ORIGIN, issued=99.0, to=ident(7).id))
    assert rx.stats["misdirected"] == 1 and not _ids(rx)


@pytest.mark.parametrize(
    "change",
    [
        {"free_machines": -1},
        {"utilization": 1.5},
        {"ttl": 99},
        {"hops": 1},  # hops >= ttl
        {"row": 400},
        {"valid_for_s": 0.0},
        {"issued_at_s": float("nan")},
        {"collector": "x" * 300},
        {"public_key": b"short"},
    ],
)
def test_malformed_fields_are_dropped_and_counted(rx: Flock, change: dict[str, object]) -> None:
    m = attrs.evolve(announce(ORIGIN, issued=99.0, sign=False), **change)
    _deliver(rx, m)
    assert rx.stats["malformed"] == 1
    _deliver(rx, announce(ORIGIN, issued=99.0, seq=2))
    assert _ids(rx) == {ORIGIN.id}


def test_a_signed_announcement_survives_the_wire_codec() -> None:
    m = announce(ORIGIN, issued=12.5, row=3, seq=77, to=ident(5).id, address=0)
    m = attrs.evolve(m, origin=NodeHandle(ORIGIN.id, "udp://10.0.0.2:9000"))
    m = sign_announce(m, IdentitySigner(ORIGIN))
    back = decode_message(encode_message(m))
    assert back == m
    assert isinstance(back, FlockAnnounce) and verify_announce(back) is None


def test_signer_must_match_the_node_id() -> None:
    k = keyed_node(1)
    with pytest.raises(ConfigError):
        Flock(k.core, k.pool, FlockConfig(), signer=IdentitySigner(ATTACKER), register=False)
    with pytest.raises(ConfigError):
        Flock(k.core, k.pool, FlockConfig(require_signatures=True), register=False)
