"""How a live node admits and answers control requests (mixed into ``overlay.Node``).

Theory of operation (docs/live.md; :mod:`overlay.live.control` defines the messages,
:mod:`overlay.live.gate` the cookies and rate limits):

* Every request passes the per-source token bucket. A source that has not proven its address
  (no valid cookie) gets only a :class:`~overlay.live.control.CookieReply`, and only if that is
  no larger than its request: nothing sent to an unproven (possibly spoofed) address is larger
  than what arrived from it.
* The answer goes to the address the request was *observed* from — on UDP the datagram's
  source, on TCP the connection it arrived on (``transports.tcp`` writes back over it) — never
  to an address the asker claims.
* A lookup is routed with the asker's id but *this* node's address as the way back, and the
  answer is relayed: the responsible node sends its signed :class:`~overlay.live.control.
  LookupReply`, bound to no receiver, here; this node forwards those exact bytes to where the
  asker was observed, so the asker still checks the responsible node's own signature. A client
  that cannot be dialled (bound to ``0.0.0.0``, behind a NAT, on another host over TCP) gets its
  answer all the same. Relays are bounded (``_RELAY_MAX``) and expire (``_RELAY_TTL_S``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import trio

from overlay.errors import OverlayError
from overlay.handle import Address, NodeHandle
from overlay.ids import NodeId
from overlay.kbr import KbrCore
from overlay.live.apps import LOOKUP_APP
from overlay.live.control import (
    CookieReply,
    LookupReply,
    LookupRequest,
    Proven,
    StatusReply,
    StatusRequest,
)
from overlay.live.gate import ControlGate
from overlay.messages import Message
from overlay.wire import encode_message, intern_handle
from transports.auth import Opened, Signer
from transports.base import Transport

__all__ = ["ControlHandler", "ControlServer"]

log = logging.getLogger("overlay.live.node")

#: ``handler(src, request, reply)``: answer a control request by calling ``reply(message)``
ControlHandler = Callable[[NodeHandle, Message, Callable[[Message], None]], None]

#: control lookups relayed at once (each waits for the responsible node's answer) and how long
#: one waits: a client retries within its own timeout (5 s by default in ControlClient)
_RELAY_MAX = 1024
_RELAY_TTL_S = 30.0


class ControlServer:
    """The control-request side of :class:`overlay.Node` (state is the node's own)."""

    __slots__ = ("_gate_",)

    transport: Transport
    _address: str
    _core: KbrCore | None
    _counters: Counter[str]
    _gate_: ControlGate | None
    _signer: Signer
    _relays: dict[int, tuple[str, float]]
    _control_handlers: dict[type[Message], ControlHandler]
    _ctl_waiters: dict[int, Callable[[Message], None]]
    _started_at: float
    overlay: str

    if TYPE_CHECKING:

        @property
        def handle(self) -> NodeHandle:
            """The node's handle."""

        @property
        def ready(self) -> bool:
            """True once joined."""

        @property
        def leaf_set(self) -> tuple[NodeHandle, ...]:
            """Ring neighbours."""

        @property
        def routing_table(self) -> tuple[tuple[NodeHandle, ...], ...]:
            """Routing-table rows."""

        @property
        def stats(self) -> Mapping[str, int]:
            """All counters."""

        def send_message(self, address: Address, msg: Message, peer: NodeId | None) -> None:
            """Sign and send a message."""

    def _gate(self) -> ControlGate:
        """The node's control gate, made at the first control request (~0.5 KiB; most members
        of a swarm are never asked)."""
        g = self._gate_
        if g is None:
            g = self._gate_ = ControlGate()
        return g

    def _control_message(
        self, msg: Message, opened: Opened, src_addr: str, address: str, data: bytes
    ) -> bool:
        """Handle ``msg`` (from the frame ``data``, opened as ``opened``, observed from
        ``src_addr``; ``address``: where its sender listens) if it belongs to the control
        protocol — requests, their answers and lookup answers to relay. True if it did."""
        t = type(msg)
        if t is Proven or t is StatusRequest or t is LookupRequest or t in self._control_handlers:
            # control answers go where the request was observed from (UDP: its source; TCP: back
            # over its connection), never to a claimed address
            asker = intern_handle(opened.sender_hash, src_addr)
            if t is Proven:
                assert isinstance(msg, Proven)
                proven = self._gate().valid(msg.cookie, src_addr, trio.current_time())
                self._admit_control(asker, msg.request, proven, len(data))
            else:
                self._admit_control(asker, msg, False, len(data))
            return True
        if t is LookupReply:
            assert isinstance(msg, LookupReply)
            if msg.responsible.id.to_bytes_be() != opened.sender_hash:
                # only the responsible node itself may answer (its key proves its id): an echo
                # of the nonce from anyone else would redirect the lookup
                self._counters["lookup_reply_forged"] += 1
                return True
            relay = self._relays.get(msg.nonce) if opened.sender_key is not None else None
            if relay is not None:
                # an answer for a client we routed for: forward its exact bytes (signed by the
                # responsible node, which the client checks) over the client's own path
                del self._relays[msg.nonce]
                self._counters["lookups_relayed"] += 1
                self.transport.send_nowait(relay[0], data, None)
                return True
            self.deliver_reply(msg)
            return True
        if t is StatusReply:
            self.deliver_reply(msg)
            return True
        return False

    def deliver_reply(self, msg: Message) -> None:
        """Hand a control reply to the request waiting for its nonce (or count it)."""
        waiter = self._ctl_waiters.pop(getattr(msg, "nonce", -1), None)
        if waiter is not None:
            waiter(msg)
        else:
            self._counters["unexpected_reply"] += 1

    def status_reply(self, nonce: int = 0) -> StatusReply:
        """This node's :class:`StatusReply` (what ``flockring status`` shows)."""
        stats = tuple(sorted((k, int(v)) for k, v in self.stats.items()))
        core = self._core
        rows = tuple([len(r) for r in self.routing_table]) if core is not None else ()
        return StatusReply(
            nonce,
            self.handle,
            self.overlay,
            self.ready,
            max(0.0, trio.current_time() - self._started_at),
            self.leaf_set,
            rows,
            len(core.known_nodes()) if core is not None else 0,
            stats[:200],
        )

    def _admit_control(self, src: NodeHandle, msg: Message, proven: bool, size: int) -> None:
        """Rate-limit, then answer a control request; a source that has not proven its
        address gets only a cookie, and only if that answer is no larger than its request
        (``size`` bytes): :mod:`overlay.live.gate`, no amplification."""
        now = trio.current_time()
        addr = str(src.address)
        if not self._gate().admit(addr, now):
            self._counters["control_rate_limited"] += 1
            return
        t = type(msg)
        if not proven:
            nonce = getattr(msg, "nonce", None)
            if not isinstance(nonce, int):
                self._counters["control_unknown"] += 1
                return
            body = encode_message(CookieReply(nonce, self._gate().cookie(addr, now)))
            frame = self._signer.seal(self._address, body, None)
            if len(frame) > size:
                self._counters["control_unpadded"] += 1
                return
            self._counters["control_cookies_sent"] += 1
            self.transport.send_nowait(addr, frame, None)
            return
        if t is StatusRequest or t is LookupRequest:
            self._on_control(src, msg)
            return
        handler = self._control_handlers.get(t)
        if handler is not None:
            self._on_extra_control(handler, src, msg)
            return
        self._counters["control_unknown"] += 1

    def _on_control(self, src: NodeHandle, msg: Message) -> None:
        core = self._core
        if core is None:
            return
        if isinstance(msg, StatusRequest):
            self.send_message(src.address, self.status_reply(msg.nonce), src.id)
        elif isinstance(msg, LookupRequest):
            if not core.ready:
                self._counters["lookup_not_ready"] += 1
                return
            if not self._add_relay(msg.nonce, str(src.address)):
                self._counters["lookup_relay_refused"] += 1
                return
            # the asker's id, but our address: the responsible node answers here (LookupApp)
            asker = NodeHandle(src.id, self._address)
            core.route(msg.key, LOOKUP_APP, (msg.nonce, asker, self.handle))

    def _add_relay(self, nonce: int, address: str) -> bool:
        """Remember where to forward the answer to lookup ``nonce`` (bounded, expiring)."""
        now = trio.current_time()
        relays = self._relays
        while relays:
            first = next(iter(relays))
            if relays[first][1] > now and len(relays) < _RELAY_MAX:
                break
            del relays[first]  # expired, or the oldest when full
        old = relays.get(nonce)
        if old is not None and old[0] != address:
            return False  # another asker's nonce: never redirect its answer
        relays.pop(nonce, None)
        relays[nonce] = (address, now + _RELAY_TTL_S)
        return True

    def relay_reply(self, msg: Message) -> None:
        """This node is responsible for a lookup it routed for a client: answer the client
        (``msg`` is the :class:`~overlay.live.control.LookupReply`)."""
        if not isinstance(msg, LookupReply):
            return
        relay = self._relays.pop(msg.nonce, None)
        if relay is None:
            self._counters["unexpected_reply"] += 1
            return
        self._counters["lookups_relayed"] += 1
        self.send_message(relay[0], msg, None)

    def add_control_handler(self, request: type[Message], handler: ControlHandler) -> None:
        """Answer control requests of class ``request`` (tools such as the CLI send them).

        ``handler(src, msg, reply)`` runs in the receive loop and must not block; it calls
        ``reply(message)`` when it has the answer — at once, or later from a timer or a plugin's
        completion callback (a discovery query). A handler that raises is counted
        (``control_errors``) and the request dropped; the node keeps serving.
        """
        if request in (StatusRequest, LookupRequest):
            raise OverlayError(f"{request.__name__} is answered by the node itself")
        if request in self._control_handlers:
            raise OverlayError(f"a control handler for {request.__name__} is already set")
        self._control_handlers[request] = handler

    def _on_extra_control(self, handler: ControlHandler, src: NodeHandle, msg: Message) -> None:
        def reply(answer: Message) -> None:
            self.send_message(src.address, answer, src.id)

        try:
            handler(src, msg, reply)
        except Exception:
            self._counters["control_errors"] += 1
            log.exception("control handler for %s failed", type(msg).__name__)
