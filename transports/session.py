"""Authenticated sessions between two nodes: a Noise XX handshake that binds each side's Ed25519
identity, then AEAD records with a counter and a sliding replay window (docs/security.md).

Theory of operation (frame layouts: docs/transports.md, "Sessions"):

* **Handshake** (:mod:`transports.noise`, ``Noise_XX_25519_ChaChaPoly_BLAKE2s``, prologue
  :data:`PROLOGUE`). A node makes an X25519 *static* key at its first handshake (in memory only)
  and signs it once with its identity key; messages 2 and 3 carry that signature, so both ends
  learn each other's NodeId (the payload: :mod:`transports.session_record`, "Identity"). The
  initiator drops a responder whose id is not the one it called.
* **Frames and records** (:mod:`transports.session_record`): HELLO ``F1``, REPLY ``F2``,
  CONFIRM ``F3``, DATA ``F4``, UNKNOWN ``F5``, told from envelopes by their first byte; DATA
  names the receiver's random 32-bit session index and carries an AEAD record under the
  ``Split()`` keys, its counter checked against a sliding replay window (RFC 4303 §3.4.3).
* **When and how long** (WireGuard's timers, Donenfeld, NDSS 2017, §6): a node starts a
  handshake with a peer that sent it ``handshake_after_frames`` signed frames within its replay
  window (sustained traffic: a handshake costs ~6 signed datagrams, ``benchmarks/
  session_cost.py``). A session is refused ``expire_after_s`` after it was made (180 s); its
  initiator rekeys when sending after ``rekey_after_s`` (120 s), the responder ``2 x
  handshake_timeout_s`` later, and only a session that carried traffic. Senders stop
  ``send_margin_s`` before expiry (the receiver's copy is at most one round trip younger); a
  peer's previous session stays valid for receiving, so rekeying loses nothing in flight.
* **Fallback.** With no usable session :meth:`Sessions.seal` returns None and the caller signs
  (``transports/auth.py``): first contacts, control traffic and bare-address messages stay
  signed, and a refused or lost handshake costs CPU, never a message.
* **Lost sessions** (a restart): DATA for an unknown index is answered with UNKNOWN and the
  sender handshakes again at once; a peer that still signs to us although our session with it is
  older than ``2 x handshake_timeout_s`` gets a new handshake too.
* **Bounds.** ``max_sessions``, ``max_pending`` handshakes each way (``handshake_timeout_s``),
  two sessions per peer; answering HELLO and sending UNKNOWN pass the caller's ``admit`` (a
  token bucket in ``overlay.live``). Nothing raises on input; drops are counted by reason.

This module is sans-io: the caller passes ``now`` and a ``send(address, frame, peer_id)``.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from transports.address import MAX_ADDRESS_LEN
from transports.auth import Opened, public_bytes, public_key_entry
from transports.errors import TransportConfigError
from transports.noise import NoiseError, XXHandshake, public_raw
from transports.session_record import (
    _CONFIRM_MIN,
    _HELLO_PAD,
    _REPLY_MIN,
    CONFIRM,
    DATA,
    DATA_OVERHEAD,
    HELLO,
    HELLO_BYTES,
    REPLY,
    STATIC_DOMAIN,
    UNKNOWN,
    SessionConfig,
    _identity_payload,
    _Pending,
    _read_identity,
    _Session,
    _u32,
    is_session_frame,
)

__all__ = [
    "CONFIRM",
    "DATA",
    "DATA_OVERHEAD",
    "DROP_COUNTERS",
    "HELLO",
    "HELLO_BYTES",
    "PROLOGUE",
    "REPLY",
    "STATIC_DOMAIN",
    "UNKNOWN",
    "SessionConfig",
    "Sessions",
    "is_session_frame",
]

PROLOGUE = b"flockring/session/v1"

#: the counters of :attr:`Sessions.counters` that count dropped input (the rest count events)
DROP_COUNTERS = frozenset({"malformed", "early", "unknown_session", "expired", "replayed"}) | {
    "forged", "handshake_forged", "handshake_wrong_peer", "handshake_unexpected", "rate_limited",
    "own_id", "unknown_ignored",
}  # fmt: skip


class Sessions:
    """The sessions of one node. Sans-io: ``send(address, frame, peer_id)`` transmits, ``now``
    is passed in; ``admit(source, now)`` (optional) rate-limits answering HELLOs and UNKNOWN.

    Counters (``counters``): ``established``, ``accepted``, ``confirmations``,
    ``handshakes_started``, ``handshakes_answered``, ``unknown_hints``; drops: ``malformed``,
    ``early``, ``unknown_session``, ``expired``, ``unknown_ignored``,
    ``replayed``, ``forged``, ``handshake_forged``, ``handshake_wrong_peer``,
    ``handshake_unexpected``, ``handshake_timeouts``, ``rate_limited``, ``own_id``,
    ``sessions_full``, ``pending_full``.
    """

    __slots__ = (
        "_addr",
        "_admit",
        "_by_index",
        "_by_peer",
        "_identity_key",
        "_initiating",
        "_next_gc",
        "_payload",
        "_responding",
        "_send",
        "_static",
        "_tried",
        "config",
        "counters",
        "own_id",
    )

    def __init__(
        self,
        identity: Ed25519PrivateKey,
        address: str,
        send: Callable[[str, bytes, bytes | None], None],
        *,
        config: SessionConfig | None = None,
        admit: Callable[[str, float], bool] | None = None,
    ) -> None:
        addr = address.encode("utf-8")
        if len(addr) > MAX_ADDRESS_LEN:
            raise TransportConfigError(f"address too long for a session ({len(addr)} bytes)")
        self.config = config if config is not None else SessionConfig()
        self.counters: Counter[str] = Counter()
        self._send = send
        self._admit = admit
        ed_pub = public_bytes(identity)
        entry = public_key_entry(ed_pub)
        assert entry is not None
        self.own_id = entry[0]
        self._identity_key = identity
        self._addr = addr
        # the static key and its signed payload are made at the first handshake: a node that
        # never needs a session spends neither the ~0.5 KiB of an OpenSSL key nor the signature
        self._static: X25519PrivateKey | None = None
        self._payload = b""
        self._by_index: dict[int, _Session] = {}
        self._by_peer: dict[bytes, _Session] = {}  # the session we send on
        self._initiating: dict[int, _Pending] = {}  # our index -> handshake we started
        self._responding: dict[int, _Pending] = {}  # our index -> handshake we answered
        self._tried: dict[bytes, float] = {}  # peer -> when we last started a handshake
        self._next_gc = 0.0

    # ------------------------------------------------------------------ views
    def __len__(self) -> int:
        return len(self._by_index)

    def has_session(self, peer: bytes) -> bool:
        """True if a session to send to ``peer`` (20-byte id) is held."""
        return peer in self._by_peer

    # ------------------------------------------------------------------ sending
    def seal(self, peer: bytes, address: str, body: bytes, now: float) -> bytes | None:
        """A DATA frame carrying ``body`` to ``peer``, or None when no session may carry it
        (the caller signs it instead). Starts the rekey handshake when it is due."""
        cur = self._by_peer.get(peer)
        if cur is None:
            return None
        cfg = self.config
        s = cur
        if not cur.confirmed:
            # until the responder shows it holds the new session, send on the previous one
            if now - cur.created > cfg.handshake_timeout_s:
                self._maybe_initiate(peer, cur.address, now)  # its confirmation was lost
            prev = self._by_index.get(cur.prev_idx)
            if prev is None or not prev.confirmed:
                return None
            s = prev
        age = now - s.created
        if age >= cfg.expire_after_s - cfg.send_margin_s or s.n_send >= cfg.max_messages:
            if s is cur:
                del self._by_peer[peer]  # still valid for receiving until it expires
                self._maybe_initiate(peer, s.address, now)
            return None
        if (
            s is cur
            and age >= cfg.rekey_after_s
            and (s.initiator or age >= cfg.rekey_after_s + 2 * cfg.handshake_timeout_s)
            and s.n_send + s.hi + 1 >= cfg.handshake_after_frames
        ):
            # rekey only a session that carried traffic; a quiet one lapses to signed frames
            self._maybe_initiate(peer, s.address, now)
        return s.seal(body)

    def consider(
        self, peer: bytes, address: str, recent: int, now: float, threshold: int | None = None
    ) -> None:
        """``peer`` (at ``address``) sent us a signed (or pair) frame, its ``recent``-th within
        the replay window: start a handshake if that traffic is sustained (``threshold``
        frames; default ``handshake_after_frames``), or if we hold a session with it made long
        enough ago that the peer must have lost its end (a restart)."""
        s = self._by_peer.get(peer)
        if s is not None:
            if now - s.created < 2 * self.config.handshake_timeout_s:
                return  # the peer may still be finishing the handshake
        elif recent < (self.config.handshake_after_frames if threshold is None else threshold):
            return
        self._maybe_initiate(peer, address, now)

    def _maybe_initiate(self, peer: bytes, address: str, now: float) -> None:
        t = self._tried.get(peer)
        if t is not None and now - t < self.config.retry_after_s:
            return
        for p in self._responding.values():
            if p.address == address:
                return  # that peer is handshaking with us already (we learn who at message 3)
        self._initiate(peer, address, now)

    def _static_key(self) -> X25519PrivateKey:
        """This node's static X25519 key (made, and vouched for by the identity key, once)."""
        if self._static is None:
            self._static = X25519PrivateKey.generate()
            static_pub = public_raw(self._static)
            self._payload = _identity_payload(self._identity_key, static_pub, self._addr)
        return self._static

    def _new_index(self) -> int:
        while True:
            i = secrets.randbits(32)
            taken = i in self._by_index or i in self._initiating or i in self._responding
            if i and not taken:
                return i

    def _initiate(self, peer: bytes, address: str, now: float) -> None:
        if peer == self.own_id:
            return
        if len(self._initiating) >= self.config.max_pending:
            self.counters["pending_full"] += 1
            return
        idx = self._new_index()
        hs = XXHandshake(True, self._static_key(), PROLOGUE)
        msg = hs.write_message(_HELLO_PAD)
        self._initiating[idx] = _Pending(hs, peer, address, 0, now)
        self._tried[peer] = now
        self.counters["handshakes_started"] += 1
        self._send(address, b"\xf1" + idx.to_bytes(4, "big") + msg, peer)

    # ------------------------------------------------------------------ receiving
    def receive(self, src: str, data: bytes, now: float) -> Opened | None:
        """Handle one session frame from ``src``; the opened DATA record, or None (a
        handshake step, or a drop counted by reason)."""
        if now >= self._next_gc:
            self._gc(now)
        t = data[0] if data else 0
        if t == DATA:
            return self._on_data(src, data, now)
        if t == HELLO:
            self._on_hello(src, data, now)
        elif t == REPLY:
            self._on_reply(data, now)
        elif t == CONFIRM:
            self._on_confirm(data, now)
        elif t == UNKNOWN:
            self._on_unknown(src, data, now)
        else:
            self.counters["malformed"] += 1
        return None

    def _on_data(self, src: str, data: bytes, now: float) -> Opened | None:
        c = self.counters
        if len(data) < DATA_OVERHEAD:
            c["malformed"] += 1
            return None
        idx = _u32(data, 1)
        s = self._by_index.get(idx)
        if s is None and idx in self._responding:
            c["early"] += 1  # overtook the handshake's last message: no hint, that would undo it
            return None
        if s is None or now >= s.created + self.config.expire_after_s:
            c["unknown_session" if s is None else "expired"] += 1
            # tell the sender (it forgets that session and handshakes again); 5 bytes < 29
            if self._admit is None or self._admit(src, now):
                self._send(src, b"\xf5" + data[1:5], None)
            return None
        n = int.from_bytes(data[5:13], "big")
        try:
            body = s.open(n, data, self.config.window)
        except NoiseError:
            c["forged"] += 1
            return None
        if body is None:
            c["replayed"] += 1
            return None
        s.confirmed = True
        if not body:  # the responder's confirmation record
            c["confirmations"] += 1
            return None
        c["accepted"] += 1
        return Opened(s.peer, None, n, s.address, self.own_id, body)

    def _on_hello(self, src: str, data: bytes, now: float) -> None:
        c = self.counters
        if len(data) != HELLO_BYTES:
            c["malformed"] += 1
            return
        for mine in self._initiating.values():
            if mine.address == src and mine.hs is not None:
                # our HELLOs crossed: the handshake started by the lower id goes on, so both
                # ends keep one session, not two (src is only a hint: a forged HELLO can at most
                # make the higher id drop its own attempt and stay signed a while longer)
                if self.own_id < mine.peer:
                    c["crossed"] += 1
                    return
                mine.hs = None  # abandoned; a late answer to it is expected, not an attack
                break
        if self._admit is not None and not self._admit(src, now):
            c["rate_limited"] += 1
            return
        pending = self._responding
        if len(pending) >= self.config.max_pending:
            del pending[next(iter(pending))]  # the oldest: a flood displaces itself
            c["pending_full"] += 1
        hs = XXHandshake(False, self._static_key(), PROLOGUE)
        try:
            hs.read_message(data[5:])
            msg = hs.write_message(self._payload)
        except NoiseError:
            c["malformed"] += 1
            return
        idx = self._new_index()
        remote = _u32(data, 1)
        pending[idx] = _Pending(hs, b"", src, remote, now)
        c["handshakes_answered"] += 1
        self._send(src, b"\xf2" + idx.to_bytes(4, "big") + data[1:5] + msg, None)

    def _on_reply(self, data: bytes, now: float) -> None:
        c = self.counters
        if len(data) < _REPLY_MIN:
            c["malformed"] += 1
            return
        idx = _u32(data, 5)
        p = self._initiating.pop(idx, None)
        if p is None or now - p.started > self.config.handshake_timeout_s:
            c["handshake_unexpected"] += 1
            return
        hs = p.hs
        if hs is None:
            c["crossed"] += 1
            return
        try:
            payload = hs.read_message(data[9:])
        except NoiseError:
            c["handshake_forged"] += 1
            return
        who = self._identity(payload, hs.remote_static)
        if who is None:
            return
        peer, address = who
        if peer != p.peer:
            c["handshake_wrong_peer"] += 1
            return
        msg = hs.write_message(self._payload)
        remote = _u32(data, 1)
        k_send, k_recv = hs.split()
        if self._establish(idx, remote, peer, address, k_send + k_recv, now, True):
            self._send(p.address, b"\xf3" + remote.to_bytes(4, "big") + msg, peer)

    def _on_confirm(self, data: bytes, now: float) -> None:
        c = self.counters
        if len(data) < _CONFIRM_MIN:
            c["malformed"] += 1
            return
        idx = _u32(data, 1)
        p = self._responding.pop(idx, None)
        if p is None or p.hs is None or now - p.started > self.config.handshake_timeout_s:
            c["handshake_unexpected"] += 1
            return
        hs = p.hs
        try:
            payload = hs.read_message(data[5:])
        except NoiseError:
            c["handshake_forged"] += 1
            return
        who = self._identity(payload, hs.remote_static)
        if who is None:
            return
        k_send, k_recv = hs.split()
        if self._establish(idx, p.remote_idx, who[0], who[1], k_send + k_recv, now, False):
            # an empty record tells the initiator we hold the session: it sends on it only then
            # (a record that overtook message 3 would find no session here)
            self._send(p.address, self._by_index[idx].seal(b""), who[0])  # counter 0

    def _identity(self, payload: bytes, static: bytes) -> tuple[bytes, str] | None:
        """``(peer id, address)`` if ``payload`` is another node's key vouching for ``static``."""
        who = _read_identity(payload, static)
        if who is None:
            self.counters["handshake_forged"] += 1
        elif who[0] == self.own_id:
            self.counters["own_id"] += 1
            return None
        return who

    def _establish(
        self,
        idx: int,
        remote: int,
        peer: bytes,
        address: str,
        keys: bytes,
        now: float,
        initiator: bool,
    ) -> bool:
        by_index = self._by_index
        if len(by_index) >= self.config.max_sessions:
            self.counters["sessions_full"] += 1
            return False
        s = _Session(idx, remote, peer, address, keys, now, initiator)
        by_index[idx] = s
        old = self._by_peer.get(peer)
        if old is not None:
            if old.prev_idx:  # at most two sessions per peer: the new one and the last
                by_index.pop(old.prev_idx, None)
            old.prev_idx = 0
            s.prev_idx = old.idx
        self._by_peer[peer] = s
        self._tried.pop(peer, None)
        self.counters["established"] += 1
        return True

    def _on_unknown(self, src: str, data: bytes, now: float) -> None:
        c = self.counters
        if len(data) != 5:
            c["malformed"] += 1
            return
        if self._admit is not None and not self._admit(src, now):
            c["rate_limited"] += 1
            return
        ridx = _u32(data, 1)
        for s in self._by_peer.values():
            if s.remote_idx == ridx:
                break
        else:
            c["unknown_ignored"] += 1
            return
        c["unknown_hints"] += 1
        del self._by_peer[s.peer]
        self._by_index.pop(s.idx, None)
        t = self._tried.get(s.peer)
        if t is None or now - t >= self.config.handshake_timeout_s:
            self._initiate(s.peer, s.address, now)

    # ------------------------------------------------------------------ expiry
    def _gc(self, now: float) -> None:
        cfg = self.config
        self._next_gc = now + cfg.handshake_timeout_s
        exp = cfg.expire_after_s
        by_peer = self._by_peer
        for idx, s in [kv for kv in self._by_index.items() if now >= kv[1].created + exp]:
            del self._by_index[idx]
            if by_peer.get(s.peer) is s:
                del by_peer[s.peer]
        for table in (self._initiating, self._responding):
            late = [i for i, p in table.items() if now - p.started > cfg.handshake_timeout_s]
            for i in late:
                del table[i]
            if late:
                self.counters["handshake_timeouts"] += len(late)
        tried = self._tried
        for peer in [p for p, t in tried.items() if now - t >= cfg.retry_after_s]:
            del tried[peer]
