"""``transports.session.Sessions`` without a network: a queue of frames between a few endpoints and
a hand-driven clock.

Checked: the handshake binds each side to the id of its Ed25519 key; records flow both ways;
every captured record is refused when replayed (same session, a later session, another node);
tampered, truncated, forged and misdirected frames are dropped and counted, never raise; a
HELLO draws no larger answer; floods and tables stay bounded; rekeying and expiry under steady
traffic lose no record; a restarted peer (same key, new state) is found again.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

import transports.session as sm
import transports.session_record as sr
from transports.auth import key_hash, public_bytes
from transports.errors import TransportConfigError
from transports.session import (
    DATA_OVERHEAD,
    HELLO_BYTES,
    SessionConfig,
    Sessions,
    is_session_frame,
)

EAGER = SessionConfig(handshake_after_frames=1)


class Net:
    """Endpoints by address; frames wait in one FIFO until :meth:`run` delivers them."""

    def __init__(self) -> None:
        self.now = 0.0
        self.nodes: dict[str, Sessions] = {}
        self.queue: list[tuple[str, str, bytes]] = []
        self.wire: list[tuple[str, str, bytes]] = []  # everything ever sent (for replays)
        self.delivered: dict[str, list[bytes]] = {}
        self.drop: Callable[[str, str, bytes], bool] = lambda s, d, f: False

    def add(
        self,
        address: str,
        key: Ed25519PrivateKey | None = None,
        config: SessionConfig = EAGER,
        admit: Callable[[str, float], bool] | None = None,
    ) -> Sessions:
        def send(dst: str, frame: bytes, peer: bytes | None) -> None:
            self.wire.append((address, dst, frame))
            self.queue.append((address, dst, frame))

        s = Sessions(key or Ed25519PrivateKey.generate(), address, send, config=config, admit=admit)
        self.nodes[address] = s
        self.delivered.setdefault(address, [])
        return s

    def run(self) -> None:
        while self.queue:
            src, dst, frame = self.queue.pop(0)
            node = self.nodes.get(dst)
            if node is None or self.drop(src, dst, frame):
                continue
            opened = node.receive(src, frame, self.now)
            if opened is not None:
                assert opened.reply_to == src and opened.to == node.own_id
                self.delivered[dst].append(opened.body)

    def connect(self, a: str, b: str) -> None:
        """``a`` heard sustained signed traffic from ``b``: it starts a handshake."""
        self.nodes[a].consider(self.nodes[b].own_id, b, 99, self.now)
        self.run()

    def send(self, a: str, b: str, body: bytes) -> bool:
        """Send a record from a to b if a session allows; False if a would sign instead."""
        frame = self.nodes[a].seal(self.nodes[b].own_id, b, body, self.now)
        if frame is None:
            self.run()
            return False
        self.wire.append((a, b, frame))
        self.queue.append((a, b, frame))
        self.run()
        return True


def pair(config: SessionConfig = EAGER) -> tuple[Net, Sessions, Sessions]:
    net = Net()
    a = net.add("udp://10.0.0.1:1", config=config)
    b = net.add("udp://10.0.0.2:2", config=config)
    net.connect("udp://10.0.0.1:1", "udp://10.0.0.2:2")
    return net, a, b


A, B, C = "udp://10.0.0.1:1", "udp://10.0.0.2:2", "udp://10.0.0.3:3"


def data_frames(net: Net, src: str, dst: str) -> list[bytes]:
    return [f for s, d, f in net.wire if s == src and d == dst and f[0] == sm.DATA and len(f) > 29]


def test_handshake_binds_both_identities_and_records_flow_both_ways() -> None:
    net = Net()
    ka, kb = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    a, b = net.add(A, ka), net.add(B, kb)
    assert a.own_id == key_hash(public_bytes(ka))
    net.connect(A, B)
    assert a.has_session(b.own_id) and b.has_session(a.own_id)
    assert a.counters["established"] == b.counters["established"] == 1
    assert [len(f) for s, d, f in net.wire if f[0] == sm.HELLO] == [HELLO_BYTES]
    for i in range(20):
        assert net.send(A, B, b"a%d" % i) and net.send(B, A, b"b%d" % i)
    assert net.delivered[B] == [b"a%d" % i for i in range(20)]
    assert net.delivered[A] == [b"b%d" % i for i in range(20)]
    # what the records carry is secret on the wire and costs 29 bytes
    frame = data_frames(net, A, B)[0]
    assert b"a0" not in frame and len(frame) == DATA_OVERHEAD + 2


def test_the_initiator_drops_a_responder_that_is_not_the_id_it_called() -> None:
    net = Net()
    a = net.add(A)
    impostor = net.add(B)
    someone = key_hash(public_bytes(Ed25519PrivateKey.generate()))
    a.consider(someone, B, 99, 0.0)  # we meant `someone`, whom we believe to be at B
    net.run()
    assert a.counters["handshake_wrong_peer"] == 1
    assert not a.has_session(someone) and not a.has_session(impostor.own_id)
    assert not net.send(A, B, b"x")


def _corrupt_payload_signature(s: Sessions) -> None:
    s._static_key()
    p = bytearray(s._payload)
    p[40] ^= 1  # a bit of the Ed25519 signature over the static key
    s._payload = bytes(p)


@pytest.mark.parametrize("liar", [A, B])
def test_a_static_key_its_identity_did_not_sign_is_refused(liar: str) -> None:
    net = Net()
    a, b = net.add(A), net.add(B)
    _corrupt_payload_signature(net.nodes[liar])
    sr._VERIFIED.clear()
    net.connect(A, B)
    honest = b if liar == A else a
    assert honest.counters["handshake_forged"] == 1
    assert not a.has_session(b.own_id) or not b.has_session(a.own_id)
    assert not honest.has_session(net.nodes[liar].own_id)


def test_a_handshake_with_our_own_identity_is_refused() -> None:
    net = Net()
    key = Ed25519PrivateKey.generate()
    a = net.add(A, key)
    twin = net.add(B, key)  # another process running with our key
    twin.consider(a.own_id, A, 99, 0.0)
    net.run()
    assert twin.counters["handshakes_started"] == 0  # an honest node never calls itself
    twin.own_id = bytes(20)  # the twin skips that guard ...
    twin.consider(a.own_id, A, 99, 0.0)
    net.run()
    assert a.counters["own_id"] == 1  # ... and A refuses a peer proving A's own id
    assert len(a) == 0 and not a.has_session(a.own_id)


def test_captured_records_replayed_in_the_same_session_are_refused() -> None:
    net, _a, b = pair()
    for i in range(10):
        net.send(A, B, b"m%d" % i)
    captured = data_frames(net, A, B)
    for f in captured:
        assert b.receive(A, f, net.now) is None
    assert b.counters["replayed"] == len(captured) == 10
    assert b.counters["accepted"] == 10


def test_records_out_of_order_pass_inside_the_window_and_older_ones_do_not() -> None:
    _net, a, b = pair()
    frames = [a.seal(b.own_id, B, b"%d" % i, 0.0) for i in range(300)]
    assert all(f is not None for f in frames)
    order = list(range(150, 300)) + list(range(150 - 1, 150 - 100, -1))
    got = [b.receive(A, frames[i] or b"", 0.0) for i in order]
    assert all(x is not None for x in got[:150])
    window = b.config.window
    for k, i in enumerate(order[150:]):
        assert (got[150 + k] is not None) == (299 - i < window), i
    assert b.receive(A, frames[0] or b"", 0.0) is None and b.counters["replayed"] >= 1


def test_captured_records_replayed_in_a_new_session_or_to_another_node_are_refused() -> None:
    cfg = SessionConfig(
        handshake_after_frames=1,
        rekey_after_s=4,
        expire_after_s=8,
        send_margin_s=1,
        handshake_timeout_s=1,
        retry_after_s=1,
    )
    net = Net()
    a, b = net.add(A, config=cfg), net.add(B, config=cfg)
    c = net.add(C, config=cfg)
    net.connect(A, B)
    net.connect(A, C)
    for i in range(5):
        net.send(A, B, b"old%d" % i)
    old = data_frames(net, A, B)
    # to another node: no session there has that index (or, by chance, the key is wrong)
    for f in old:
        assert c.receive(A, f, net.now) is None
    assert c.counters["unknown_session"] + c.counters["forged"] == len(old)
    assert c.counters["accepted"] == 0
    # time passes, traffic goes on: a new session replaces the old one, then the old expires
    while net.now < 20:
        net.now += 0.5
        net.send(A, B, b"t%.1f" % net.now)
    assert a.counters["established"] >= 3
    before = Counter(b.counters)
    for f in old:
        assert b.receive(A, f, net.now) is None
    dropped = sum((b.counters - before).values()) - (b.counters - before)["accepted"]
    assert (b.counters - before)["accepted"] == 0 and dropped >= len(old)


def test_every_flipped_bit_of_a_record_is_dropped_and_counted() -> None:
    _net, a, b = pair()
    frame = a.seal(b.own_id, B, b"important", 0.0)
    assert frame is not None
    for i in range(len(frame)):
        for bit in (0, 7):
            bad = bytearray(frame)
            bad[i] ^= 1 << bit
            assert b.receive(A, bytes(bad), 0.0) is None
    assert b.counters["accepted"] == 0
    assert b.receive(A, frame, 0.0) is not None  # the genuine one still opens, once
    assert b.receive(A, frame, 0.0) is None


@settings(max_examples=300, deadline=None)
@given(st.integers(0xF1, 0xF5), st.binary(max_size=400))
def test_arbitrary_session_frames_never_raise(kind: int, rest: bytes) -> None:
    _net, _a, b = _FUZZ_PAIR
    before = sum(b.counters.values())
    assert b.receive(A, bytes([kind]) + rest, 1.0) is None
    assert sum(b.counters.values()) > before or kind == sm.HELLO  # counted (HELLO: answered)


_FUZZ_PAIR = pair()


def test_a_hello_draws_no_larger_answer_even_for_the_longest_address() -> None:
    longest = "udp://" + "9" * (128 - len("udp://:1")) + ":1"
    assert len(longest) == 128
    net = Net()
    net.add(A)
    net.add(longest)
    net.connect(A, longest)
    hello = [f for s, d, f in net.wire if f[0] == sm.HELLO]
    reply = [f for s, d, f in net.wire if f[0] == sm.REPLY]
    assert len(hello) == len(reply) == 1 and len(reply[0]) <= len(hello[0]) == HELLO_BYTES
    with pytest.raises(TransportConfigError):
        net.add(longest + "0")


def test_a_hello_flood_is_rate_limited_and_pending_handshakes_stay_bounded() -> None:
    tokens = [50]

    def admit(src: str, now: float) -> bool:
        tokens[0] -= 1
        return tokens[0] >= 0

    net = Net()
    b = net.add(B, config=SessionConfig(max_pending=16), admit=admit)
    rng = random.Random(1)
    hello = None
    for i in range(200):
        attacker = Net()
        x = attacker.add(f"udp://10.9.{i // 250}.{i % 250}:1")
        x._initiate(b.own_id, B, 0.0)
        hello = attacker.queue[0][2]
        b.receive(f"udp://10.9.0.{rng.randrange(256)}:1", hello, 0.0)
    assert b.counters["handshakes_answered"] == 50
    assert b.counters["rate_limited"] == 150
    assert len(b._responding) <= 16 and b.counters["pending_full"] == 34
    b.receive(A, hello or b"", 100.0)  # after the timeout, everything pending is forgotten
    assert len(b._responding) <= 1


def test_tables_are_bounded() -> None:
    net = Net()
    hub = net.add(A, config=SessionConfig(handshake_after_frames=1, max_sessions=5))
    for i in range(8):
        addr = f"udp://10.1.0.{i}:1"
        net.add(addr)
        net.connect(addr, A)
    assert len(hub) == 5 and hub.counters["sessions_full"] == 3


def test_steady_traffic_across_many_rekeys_and_expiries_loses_no_record() -> None:
    cfg = SessionConfig(
        handshake_after_frames=1,
        rekey_after_s=3,
        expire_after_s=6,
        send_margin_s=1,
        handshake_timeout_s=0.5,
        retry_after_s=0.5,
    )
    net = Net()
    a, b = net.add(A, config=cfg), net.add(B, config=cfg)
    net.connect(A, B)
    sent = {A: [], B: []}  # type: dict[str, list[bytes]]
    signed = 0
    for step in range(600):
        net.now = step * 0.1
        for src, dst in ((A, B), (B, A)):
            body = b"%s %d" % (src.encode(), step)
            if net.send(src, dst, body):
                sent[dst].append(body)
            else:
                signed += 1  # a signed frame would carry it: nothing is lost either way
                net.nodes[dst].consider(net.nodes[src].own_id, src, 99, net.now)
                net.run()
    assert net.delivered[A] == sent[A] and net.delivered[B] == sent[B]
    assert a.counters["established"] >= 10 and b.counters["established"] >= 10
    drops = ("unknown_session", "expired", "replayed", "forged", "early")
    assert not any(a.counters[k] or b.counters[k] for k in drops), (a.counters, b.counters)
    assert len(a) <= 2 and len(b) <= 2  # at most the current and the previous session
    assert signed <= 4  # records went on sessions all along, bar the first exchange


def test_a_restarted_peer_is_found_again() -> None:
    net = Net()
    kb = Ed25519PrivateKey.generate()
    a, b = net.add(A), net.add(B, kb)
    net.connect(A, B)
    assert net.send(A, B, b"before")
    # B restarts: same key, same address, no sessions
    b2 = net.add(B, kb)
    assert b2.own_id == b.own_id and len(b2) == 0
    net.now = 1.0
    assert net.send(A, B, b"lost in the restart")  # B holds no such session ...
    assert b2.counters["unknown_session"] == 1
    assert a.counters["unknown_hints"] == 1  # ... says so, and A handshakes at once
    assert b2.has_session(a.own_id) and a.has_session(b2.own_id)
    assert net.send(A, B, b"after") and net.send(B, A, b"back")
    assert net.delivered[B][-1] == b"after" and net.delivered[A][-1] == b"back"
    # the other way round: A restarts and B notices from A's signed frames
    a2 = net.add(A)
    net.now = 100.0
    b2._tried.clear()
    b2.consider(a2.own_id, A, 1, net.now)
    net.run()
    assert b2.has_session(a2.own_id) and a2.has_session(b2.own_id)


def test_unknown_hints_naming_no_session_of_ours_are_ignored() -> None:
    _net, a, b = pair()
    for i in range(1000):
        a.receive(C, b"\xf5" + random.Random(i).randbytes(4), 0.0)
    assert a.counters["unknown_ignored"] >= 999 and a.has_session(b.own_id)


def test_a_record_that_overtakes_the_last_handshake_message_is_not_answered_with_a_hint() -> None:
    net = Net()
    a, b = net.add(A), net.add(B)
    held: list[tuple[str, str, bytes]] = []

    def hold_confirm(s: str, d: str, f: bytes) -> bool:
        if f[0] == sm.CONFIRM:
            held.append((s, d, f))
            return True
        return False

    net.drop = hold_confirm
    net.connect(A, B)
    assert a.has_session(b.own_id) and not b.has_session(a.own_id)
    # A does not send on the new session before B confirms it: signed meanwhile
    assert a.seal(b.own_id, B, b"x", 0.0) is None
    # a record made for the pending index (as if sent early) is dropped without a hint
    frame = b"\xf4" + held[0][2][1:5] + bytes(8) + bytes(16)
    assert b.receive(A, frame, 0.0) is None and b.counters["early"] == 1
    assert not [f for s, d, f in net.queue if f[0] == sm.UNKNOWN]
    net.drop = lambda s, d, f: False
    net.queue.extend(held)
    net.run()
    assert a.seal(b.own_id, B, b"x", 0.0) is not None


def test_crossed_hellos_leave_one_session_per_pair() -> None:
    net = Net()
    a, b = net.add(A), net.add(B)
    a.consider(b.own_id, B, 99, 0.0)
    b.consider(a.own_id, A, 99, 0.0)
    net.run()
    assert a.counters["established"] == b.counters["established"] == 1
    assert len(a) == len(b) == 1
    assert net.send(A, B, b"x") and net.send(B, A, b"y")


def test_frames_are_recognised_by_their_first_byte() -> None:
    assert not is_session_frame(b"") and not is_session_frame(b"\x98\x01")
    assert all(is_session_frame(bytes([t])) for t in range(0xF1, 0xF6))


def test_config_is_checked() -> None:
    with pytest.raises(TransportConfigError):
        SessionConfig(rekey_after_s=200)
    with pytest.raises(TransportConfigError):
        SessionConfig(handshake_timeout_s=0)
    with pytest.raises(TransportConfigError):
        SessionConfig(window=0)
