"""The receive path of ``overlay.Node``: from a datagram on the socket to ``core.receive``.

Theory of operation (docs/transports.md; split from :mod:`overlay.live.node`, which inherits
:class:`Receiver`): a node reads its transport in one of two ways.

* A UDP socket (a transport with ``fileno()`` and ``receive_nowait()``) is registered with the
  process's :class:`~overlay.live.reactor.Reactor`, whose one poller calls
  :meth:`Receiver._on_readable` when the socket has input; it handles up to ``_BURST``
  datagrams and returns (the rest keeps the socket ready). No task per node.
* Any other transport (memory, TCP, wrappers) gets a receive task of its own in the node's
  nursery (:meth:`Receiver._receive_loop`), which awaits ``receive()`` and drains what is
  already queued.

Each datagram then takes :meth:`Receiver._on_datagram`: the per-source frame budget
(:mod:`overlay.live.ratelimit`) before anything costly; opening — a session record
(``transports/session.py``), a pair frame (``transports/pair.py``) or a signed envelope
(``transports/auth.py``); decoding (``overlay/wire.py``, the trust boundary); the per-kind
budget; the control protocol (:mod:`overlay.live.serving`); and finally the core, with the
sender's handle made from the id its key proves. Anything refused is counted, never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from overlay.kbr import KbrCore
from overlay.live.ratelimit import SourceLimiter
from overlay.live.serving import ControlServer
from overlay.wire import Wire, intern_handle
from transports.address import AddressError, parse_address
from transports.auth import Verifier
from transports.pair import PAIR, PairKeys
from transports.session import SessionConfig, Sessions, is_session_frame

if TYPE_CHECKING:
    from overlay.live.reactor import Reactor

__all__ = ["Receiver"]

log = logging.getLogger("overlay.live.node")

#: datagrams handled per wake-up before the node yields to the others and the scheduler
_BURST = 64
_PAIR_BYTE = bytes((PAIR,))


class Receiver(ControlServer):
    """The receive side of :class:`overlay.Node` (state is the node's own)."""

    __slots__ = ("_reading", "_scope")

    _closed: bool
    _core: KbrCore | None
    _limiter: SourceLimiter
    _session_config: SessionConfig | None
    _sessions: Sessions | None
    _pair_on: bool
    _verifier: Verifier
    _wire: Wire
    _own_id_bytes: bytes
    _use_reply_to: bool
    _scheme: str
    _scope: trio.CancelScope | None
    #: the socket registered with the reactor: (reactor, fd, reader), else None
    _reading: tuple[Reactor, int, Callable[[], None]] | None

    if TYPE_CHECKING:

        def _open_sessions(self, config: SessionConfig) -> Sessions:
            """The node's sessions, made at first use."""

        def _pair_keys(self) -> PairKeys:
            """The node's pair keys, made at first use."""

    def _start_receiving(self, reactor: Reactor, nursery: trio.Nursery | None) -> bool:
        """Register the socket with ``reactor`` if the transport allows it (True); else start
        a receive task in ``nursery`` if one is given (False)."""
        t = self.transport
        fileno = getattr(t, "fileno", None)
        if fileno is not None and getattr(t, "receive_nowait", None) is not None:
            fd = fileno()
            reader = self._on_readable
            if fd >= 0 and reactor.add_reader(fd, reader):
                self._reading = (reactor, fd, reader)
                return True
        if nursery is not None:
            nursery.start_soon(self._receive_loop)
        return False

    def _stop_receiving(self) -> None:
        if self._reading is not None:
            reactor, fd, reader = self._reading
            self._reading = None
            reactor.remove_reader(fd, reader)
        if self._scope is not None:
            self._scope.cancel()

    def _on_readable(self) -> None:
        """The reactor saw input on our socket: handle up to ``_BURST`` queued datagrams."""
        nowait = self.transport.receive_nowait  # type: ignore[attr-defined]
        for _ in range(_BURST):
            if self._closed:
                return
            item: tuple[str, bytes] | None = nowait()
            if item is None:
                return
            try:
                self._on_datagram(item[0], item[1])
            except Exception:  # a bug in a core must not kill the node: count and log
                self._counters["receive_errors"] += 1
                log.exception("error handling a datagram on %r", self.handle)

    async def _receive_loop(self) -> None:
        transport = self.transport
        # A transport may offer ``receive_nowait() -> (src, data) | None``: after each wake-up
        # the datagrams already queued are handled without a trip through the scheduler.
        nowait: Callable[[], tuple[str, bytes] | None] | None = getattr(
            transport, "receive_nowait", None
        )
        with trio.CancelScope() as scope:
            self._scope = scope
            while not self._closed:
                try:
                    item: tuple[str, bytes] | None = await transport.receive()
                except trio.ClosedResourceError:
                    return
                burst = 0
                while item is not None:
                    try:
                        self._on_datagram(item[0], item[1])
                    except Exception:  # a bug in a core must not kill the node: count and log
                        self._counters["receive_errors"] += 1
                        log.exception("error handling a datagram on %r", self.handle)
                    burst += 1
                    if nowait is None or burst >= _BURST or self._closed:
                        break
                    item = nowait()

    def _on_datagram(self, src_addr: str, data: bytes) -> None:
        now = trio.current_time()
        if not self._limiter.admit_frame(src_addr, now):  # before the costly opening
            return
        cfg = self._session_config
        pair = False
        if cfg is not None and is_session_frame(data):
            self._counters["session_frames"] += 1
            opened = self._open_sessions(cfg).receive(src_addr, data, now)
        elif data[:1] == _PAIR_BYTE and self._pair_on:
            opened = self._verifier.open_pair(data, self._pair_keys())
            pair = True
        else:
            opened = self._verifier.open(data)
        if opened is None:
            return
        msg = self._wire.decode(opened.body)
        if msg is None:
            return
        if opened.sender_hash == self._own_id_bytes:
            self._counters["own_id_dropped"] += 1
            return
        address = src_addr
        if self._use_reply_to:
            try:
                parse_address(opened.reply_to, self._scheme)
                address = opened.reply_to
            except AddressError:
                self._counters["bad_reply_address"] += 1
                return
        if not self._limiter.admit_message(src_addr, msg, now):
            return
        if self._control_message(msg, opened, src_addr, address, data):
            return
        src = intern_handle(opened.sender_hash, address)
        core = self._core
        if core is not None:
            if cfg is not None and opened.sender_key is not None:
                # a signed or pair frame from a member: sustained traffic earns a session
                recent = self._verifier.last_recent
                want = cfg.handshake_after_frames
                if pair:
                    want = cfg.handshake_after_pair_frames or 4 * want
                if self._sessions is not None or recent >= want:
                    self._open_sessions(cfg).consider(
                        opened.sender_hash, address, recent, now, want
                    )
            core.receive(src, msg)
