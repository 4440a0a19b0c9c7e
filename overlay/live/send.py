"""The send path of ``overlay.Node``: from ``runtime.send`` to bytes on the transport.

Theory of operation (docs/transports.md, docs/security.md; split from :mod:`overlay.live.node`,
which inherits :class:`Sender`): a message is encoded once (``overlay/wire.py``) and sealed in
the cheapest authenticated form the receiver is known to accept — a record of the Noise session
held with it (``transports/session.py``), else, for the core's traffic to a member whose key
this process verified, a pair frame (``transports/pair.py``: one X25519 and a BLAKE2s tag), else
an Ed25519-signed envelope (``transports/auth.py``) — and handed to the transport's
non-blocking ``send_nowait``. Sends never raise: an unencodable message or a bad address is
counted. Sessions and pair keys are made on first use (most nodes of a swarm never need one).
"""

from __future__ import annotations

import logging

import trio

from overlay.handle import Address
from overlay.identity import Identity
from overlay.ids import NodeId
from overlay.live.gate import TokenBucket
from overlay.live.receive import Receiver
from overlay.live.runtime import TrioRuntime
from overlay.messages import Message
from overlay.wire import WireError, encode_message
from transports.auth import Signer
from transports.pair import PairKeys, known_key
from transports.session import SessionConfig, Sessions

__all__ = ["Sender"]

log = logging.getLogger("overlay.live.node")

#: HELLOs answered (and unknown-session hints sent): 100/s, 200 at once — more than a joining
#: node meets; a flood costs < 2 % of a core (~120 µs each) and refused peers stay signed
_HANDSHAKE_RATE_PER_S, _HANDSHAKE_BURST = 100.0, 200.0


class Sender(Receiver):
    """The send side of :class:`overlay.Node` (state is the node's own)."""

    __slots__ = ("_pair", "_sessions")

    identity: Identity
    _signer: Signer
    _pair: PairKeys | None
    _runtime: TrioRuntime | None

    def _open_sessions(self, config: SessionConfig) -> Sessions:
        s = self._sessions
        if s is None:
            s = self._sessions = Sessions(
                self.identity.private_key,
                self._address,
                self.transport.send_nowait,
                config=config,
                admit=TokenBucket(_HANDSHAKE_RATE_PER_S, _HANDSHAKE_BURST).admit,
            )
        return s

    # ------------------------------------------------------------------ I/O
    def send_message(self, address: Address, msg: Message, peer: NodeId | None) -> None:
        """Encode, sign and send ``msg`` to ``address`` (``peer``: the receiver's id, if known)."""
        self._send(address, msg, peer, True)

    def send_to_member(self, address: Address, msg: Message, peer: NodeId) -> None:
        """Like :meth:`send_message` for the core's traffic to another member: a pair frame
        (``transports/pair.py``) when this process verified ``peer``'s key. Control replies and
        lookup answers, which may go to a tool that opens signed envelopes only, stay signed."""
        self._send(address, msg, peer, True, self._pair_on)

    def send_unbound(self, address: Address, msg: Message, peer: NodeId | None) -> None:
        """Like :meth:`send_message`, but the envelope is bound to no receiver id: a lookup
        answer that the node at ``address`` forwards as it is to its asker. ``peer`` still lets
        TLS check whom it reached."""
        self._send(address, msg, peer, False)

    def _send(
        self, address: Address, msg: Message, peer: NodeId | None, bind: bool, pair: bool = False
    ) -> None:
        if self._closed:
            return
        if not isinstance(address, str):
            self._counters["send_bad_address"] += 1
            return
        try:
            body = encode_message(msg)
        except WireError:
            self._counters["encode_errors"] += 1
            log.exception("cannot encode %s", type(msg).__name__)
            return
        to = peer.to_bytes_be() if peer is not None else None
        frame = None
        if bind and to is not None and self._sessions is not None:
            frame = self._sessions.seal(to, address, body, trio.current_time())
        if frame is None and pair and to is not None:
            frame = self._seal_pair(to, body)
        if frame is None:
            frame = self._signer.seal(self._address, body, to if bind else None)
        self.transport.send_nowait(address, frame, to)

    def _pair_keys(self) -> PairKeys:
        p = self._pair
        if p is None:
            cfg = self._session_config
            p = self._pair = PairKeys(
                self.identity.private_key,
                self._signer.sender,
                cache=cfg.pair_cache if cfg is not None else 128,
                clock=trio.current_time,
            )
            rt = self._runtime
            if rt is not None:
                rt.call_later(p.period_s, self._pair_idle)
        return p

    def _pair_idle(self) -> None:
        """Every period while pair keys are held: let the unused ones go, and once none is left
        drop the object; the next pair frame makes it again (~5 µs: a SHA-512 of the identity
        seed gives the X25519 scalar). A quiet node then holds none: generations otherwise turn
        over only at a use, so a node that went quiet kept up to ``2 x pair_cache`` keys (after
        a bring-up of 300 nodes, ~75 each)."""
        p = self._pair
        if p is None:
            return
        rt = self._runtime
        if p.expire() and rt is not None:
            rt.call_later(p.period_s, self._pair_idle)
            return
        self._counters["pair_derivations"] += p.derivations
        self._pair = None

    def _seal_pair(self, to: bytes, body: bytes) -> bytes | None:
        """A pair frame to ``to`` if this process verified its key, else None (sign)."""
        peer = known_key(to)
        if peer is None:
            return None
        frame = self._pair_keys().seal(peer, to, self._signer.next_seq(), self._address, body)
        if frame is not None:
            self._counters["pair_sent"] += 1
        return frame
