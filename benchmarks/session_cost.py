"""CPU cost of authenticating datagrams: Ed25519 per datagram vs Noise sessions (docs/security.md).

Measures, in one process, on the machine it runs on:

* a signed envelope (``transports.auth``): ``Signer.seal`` + ``Verifier.open`` of one body;
* a session record (``transports.session``): ``Sessions.seal`` + ``Sessions.receive``;
* one whole session handshake (HELLO, REPLY, CONFIRM and the confirmation record) between two
  ``Sessions`` objects, with the identity check cached (a rekey with a known peer) and not;

and prints how many datagrams a session must carry before it costs less CPU than signing them.
Run: ``.venv/bin/python benchmarks/session_cost.py [--body BYTES] [--n N] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import transports.session_record as session_record
from transports.auth import Signer, Verifier, key_hash, public_bytes
from transports.session import SessionConfig, Sessions


def _per_op_us(fn: Callable[[], object], n: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def _pair() -> tuple[Sessions, Sessions, list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """Two Sessions objects whose sends land in two lists (A's outbox, B's outbox)."""
    out_a: list[tuple[str, bytes]] = []
    out_b: list[tuple[str, bytes]] = []
    cfg = SessionConfig(handshake_after_frames=1)
    a = Sessions(
        Ed25519PrivateKey.generate(),
        "udp://10.0.0.1:1",
        lambda addr, f, p: out_a.append((addr, f)),
        config=cfg,
    )
    b = Sessions(
        Ed25519PrivateKey.generate(),
        "udp://10.0.0.2:2",
        lambda addr, f, p: out_b.append((addr, f)),
        config=cfg,
    )
    return a, b, out_a, out_b


def _handshake(a: Sessions, b: Sessions, out_a: list[Any], out_b: list[Any], now: float) -> None:
    """A starts, frames are delivered until both sides are quiet."""
    a.consider(b.own_id, "udp://10.0.0.2:2", 1, now)
    while out_a or out_b:
        while out_a:
            _, f = out_a.pop(0)
            b.receive("udp://10.0.0.1:1", f, now)
        while out_b:
            _, f = out_b.pop(0)
            a.receive("udp://10.0.0.2:2", f, now)


def measure(body_bytes: int, n: int) -> dict[str, Any]:
    """Run the measurements; a JSON-able dict of microseconds per operation."""
    body = bytes(range(256)) * (body_bytes // 256) + bytes(body_bytes % 256)
    key = Ed25519PrivateKey.generate()
    signer = Signer(key)
    me = key_hash(public_bytes(Ed25519PrivateKey.generate()))
    verifier = Verifier(own_id=me)

    def signed() -> None:
        assert verifier.open(signer.seal("udp://10.0.0.1:1", body, me)) is not None

    signed_us = _per_op_us(signed, n)

    a, b, out_a, out_b = _pair()
    _handshake(a, b, out_a, out_b, 0.0)
    assert a.has_session(b.own_id) and b.has_session(a.own_id)

    def record() -> None:
        frame = a.seal(b.own_id, "udp://10.0.0.2:2", body, 1.0)
        assert frame is not None and b.receive("udp://10.0.0.1:1", frame, 1.0) is not None

    record_us = _per_op_us(record, n)

    hs_n = max(20, n // 20)

    _pair_cache = [_pair()]
    _handshake(*_pair_cache[0], 0.0)  # identity signatures now cached
    t = time.perf_counter()
    for i in range(hs_n):
        # a new handshake between the same two nodes (a rekey): the retry timer is bypassed by
        # moving time on
        x, y, ox, oy = _pair_cache[0]
        now = 100.0 * (i + 1)
        x._tried.clear()
        _handshake(x, y, ox, oy, now)
    warm_us = (time.perf_counter() - t) / hs_n * 1e6

    t = time.perf_counter()
    for i in range(hs_n):
        session_record._VERIFIED.clear()  # first contact: both identity signatures are checked
        x, y, ox, oy = _pair_cache[0]
        x._tried.clear()
        _handshake(x, y, ox, oy, 100.0 * (hs_n + i + 1))
    cold_us = (time.perf_counter() - t) / hs_n * 1e6

    def break_even(hs: float) -> float:
        return round(hs / max(1e-9, signed_us - record_us), 1)

    return {
        "body_bytes": body_bytes,
        "signed_envelope_seal_open_us": round(signed_us, 1),
        "session_record_seal_open_us": round(record_us, 1),
        "handshake_known_peer_us": round(warm_us, 1),
        "handshake_new_peer_us": round(cold_us, 1),
        "handshake_datagrams": 4,
        "signed_frame_bytes": len(signer.seal("udp://10.0.0.1:1", body, me)),
        "session_frame_bytes": len(a.seal(b.own_id, "udp://10.0.0.2:2", body, 1.0) or b""),
        "break_even_datagrams_known_peer": break_even(warm_us),
        "break_even_datagrams_new_peer": break_even(cold_us),
    }


def main() -> None:
    """Parse arguments, measure, print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--body", type=int, default=120, help="message body bytes (default 120)")
    ap.add_argument("--n", type=int, default=2000, help="repetitions (default 2000)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = measure(a.body, a.n)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        for k, v in res.items():
            print(f"{k:36} {v}")


if __name__ == "__main__":
    main()
