"""TCP transport: length-prefixed frames, one reused outgoing connection per peer, optional TLS 1.3.

Theory of operation:

* **Framing.** Each frame is a 4-byte big-endian length followed by that many bytes (the
  envelope of ``transports/codec.py``). A length above :data:`MAX_FRAME_BYTES` closes the
  connection and is counted; nothing is ever buffered beyond one frame.
* **Connections.** ``send_nowait`` puts the frame on the bounded queue of the outgoing
  connection to that address, creating it on first use; a task dials, (optionally) handshakes
  TLS, then writes frames until the connection is idle for ``idle_timeout_s`` or the peer
  fails. Each side dials its own outgoing connection to a peer's *listening* address (a peer
  never adopts an inbound connection for its overlay traffic, so an inbound peer cannot claim
  another node's address and divert that traffic). Queue overflow, dial failure and peer resets
  are dropped and counted — datagram semantics, as the cores expect.
* **Replies over the request's connection.** A frame that arrives on an inbound connection has
  the connection's remote address (``tcp://IP:EPHEMERAL``) as its source; ``send_nowait`` to
  that address writes back over the same connection, and frames that come back on an outgoing
  connection are received with the dialled address as their source. So a client that listens
  nowhere useful (bound to ``0.0.0.0``, behind a NAT) still gets its answer, and the answer goes
  only to whoever completed the TCP handshake — the address it claims is never dialled.
* **Bounded resources.** Inbound connections: at most ``max_connections``, and at most
  ``max_per_source`` from one IP. A new connection from a source at its cap replaces that
  source's least recently active connection; when the table is full it replaces the least
  recently active connection of the source holding the most — so one client opening idle
  sockets recycles its own slots and never locks other peers out. A connection must deliver a
  complete first frame within ``connect_timeout_s`` of the accept (a silent socket costs a slot
  for seconds, not minutes) and is closed after ``1.5 * idle_timeout_s`` without a frame (the
  dialling side closes its idle connections after ``idle_timeout_s``, so an honest peer has
  always hung up first). The receive channel and the send queues are bounded in bytes
  (``recv_buffer_bytes``, ``send_buffer_bytes``), each connection's read buffer by one frame.
* **TLS 1.3** (stdlib ``ssl``; docs/transports.md): given the node's Ed25519 key, the
  transport makes a self-signed X.509 certificate from it (:mod:`transports.tls`), serves it,
  and requires TLS 1.3.
  The dialling side does not use a CA; instead it reads the server's certificate after the
  handshake (which proved possession of the matching private key) and, when the caller knows
  whom it is dialling (``peer_id`` = SHA-1 of the peer's public key), closes the connection if
  the certificate key hashes to anything else. Client authentication is left to the signed
  envelopes (stdlib ``ssl`` cannot accept self-signed client certificates without a CA).
"""

from __future__ import annotations

import math
import socket as _stdsocket
import ssl
import struct
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from transports.address import AddressError, advertised_address, format_address, parse_address
from transports.codec import MAX_FRAME_BYTES
from transports.endpoint import ByteBudget, EndpointMixin
from transports.errors import TransportConfigError
from transports.tls import certificate_key_hash, make_certificate, make_ssl_contexts

__all__ = [
    "TcpTransport",
    "certificate_key_hash",
    "make_certificate",
    "make_ssl_contexts",
    "open_tcp",
]

_LEN = struct.Struct(">I")
#: what a broken, reset or closed connection raises (counted, never propagated)
_STREAM_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError)


class _Conn:
    """One TCP connection, dialled by us (``inbound`` False) or accepted."""

    __slots__ = (
        "address",
        "inbound",
        "last_active",
        "peer_id",
        "recv",
        "scope",
        "send",
        "source",
        "stream",
    )

    def __init__(
        self, address: str, peer_id: bytes | None, inbound: bool, source: str, now: float
    ) -> None:
        self.address = address  # outgoing: the dialled address; inbound: the remote address
        self.peer_id = peer_id
        self.inbound = inbound
        self.source = source  # the remote IP (per-source accounting of inbound connections)
        self.last_active = now
        #: frames queued for this connection (outgoing: from the start; inbound: on first reply)
        self.send: trio.MemorySendChannel[bytes] | None = None
        self.recv: trio.MemoryReceiveChannel[bytes] | None = None
        self.scope: trio.CancelScope | None = None
        self.stream: trio.abc.Stream | None = None  # inbound: set once the connection is up

    def open_queue(self, queue_len: int) -> None:
        self.send, self.recv = trio.open_memory_channel[bytes](queue_len)


class TcpTransport(EndpointMixin):
    """A TCP listener plus reused outgoing connections (implements ``Transport``)."""

    def __init__(
        self,
        nursery: trio.Nursery,
        listener: trio.SocketListener,
        *,
        tls: tuple[ssl.SSLContext, ssl.SSLContext] | None,
        max_connections: int,
        queue_len: int,
        idle_timeout_s: float,
        connect_timeout_s: float,
        max_per_source: int | None = None,
        recv_buffer_bytes: int = 4 * 1024 * 1024,
        send_buffer_bytes: int = 8 * 1024 * 1024,
        advertise: str | None = None,
    ) -> None:
        if max_connections < 1 or queue_len < 1:
            raise TransportConfigError("max_connections and queue_len must be >= 1")
        if not (idle_timeout_s > 0 and connect_timeout_s > 0):
            raise TransportConfigError("idle_timeout_s and connect_timeout_s must be > 0")
        self._nursery = nursery
        self._listener = listener
        host, port = listener.socket.getsockname()[:2]
        self._bound = format_address("tcp", host, port)
        self._address = (
            self._bound if advertise is None else advertised_address(self._bound, advertise)
        )
        self._tls = tls
        self._max_conns = max_connections
        self._max_per_source = (
            max(1, max_connections // 4) if max_per_source is None else max_per_source
        )
        if self._max_per_source < 1:
            raise TransportConfigError("max_per_source must be >= 1")
        self._queue_len = queue_len
        self._idle = idle_timeout_s
        self._idle_in = 1.5 * idle_timeout_s
        self._connect_timeout = connect_timeout_s
        self._out: dict[str, _Conn] = {}
        self._in: dict[str, _Conn] = {}
        self._per_source: Counter[str] = Counter()
        self._recv_budget = ByteBudget(recv_buffer_bytes)
        self._send_budget = ByteBudget(send_buffer_bytes)
        self._recv_send, self._recv_recv = trio.open_memory_channel[tuple[str, bytes]](4096)
        self.closed = False
        self.stats: Counter[str] = Counter()

    @property
    def address(self) -> str:
        """The address peers are told: the advertised one, else the bound one."""
        return self._address

    @property
    def bound_address(self) -> str:
        """The address the listener is bound to (may be a wildcard such as ``0.0.0.0``)."""
        return self._bound

    @property
    def tls(self) -> bool:
        """True when connections use TLS 1.3."""
        return self._tls is not None

    @property
    def queued_bytes(self) -> tuple[int, int]:
        """Bytes held now in (the receive channel, all send queues)."""
        return self._recv_budget.used, self._send_budget.used

    @property
    def connections(self) -> tuple[int, int]:
        """Open (outgoing, inbound) connections."""
        return len(self._out), len(self._in)

    # ------------------------------------------------------------------ sending
    def send_nowait(self, address: str, data: bytes, peer_id: bytes | None = None) -> None:
        """Queue a frame for ``address`` over an open or new connection (never blocks)."""
        if not self._admit(data):
            return
        conn = self._out.get(address)
        if conn is None:
            conn = self._in.get(address)
            if conn is not None and conn.send is None:
                # a reply to a peer that connected to us: back over its own connection
                conn.open_queue(self._queue_len)
                self._nursery.start_soon(self._reply_writer, conn)
        if conn is None:
            try:
                _, host, port = parse_address(address, "tcp")
            except AddressError:
                self.stats["send_bad_address"] += 1
                return
            if port == 0 or len(self._out) >= self._max_conns:
                self.stats["send_no_connection"] += 1
                return
            conn = _Conn(address, peer_id, False, host, trio.current_time())
            conn.open_queue(self._queue_len)
            self._out[address] = conn
            self._nursery.start_soon(self._run_out, conn, host, port)
        elif peer_id is not None and conn.peer_id is None and not conn.inbound:
            conn.peer_id = peer_id
        frame = _LEN.pack(len(data)) + data
        if not self._send_budget.take(len(frame)):
            self.stats["send_buffer_full"] += 1
            return
        assert conn.send is not None
        try:
            conn.send.send_nowait(frame)
        except trio.WouldBlock:
            self._send_budget.give(len(frame))
            self.stats["send_queue_full"] += 1
            return
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._send_budget.give(len(frame))
            self.stats["send_closed"] += 1
            return
        self.stats["sent"] += 1
        self.stats["bytes_sent"] += len(data)

    async def _dial(self, conn: _Conn, host: str, port: int) -> trio.abc.Stream | None:
        """Connect (and handshake TLS, checking the peer's key); None on a mismatch."""
        tcp = await trio.open_tcp_stream(host, port)
        tcp.setsockopt(_stdsocket.IPPROTO_TCP, _stdsocket.TCP_NODELAY, 1)
        if self._tls is None:
            return tcp
        tls = trio.SSLStream(tcp, self._tls[1], server_hostname=None)
        try:
            await tls.do_handshake()
            der = tls.getpeercert(binary_form=True)
        except BaseException:
            await trio.aclose_forcefully(tls)
            raise
        got = certificate_key_hash(der) if der else None
        if got is None or (conn.peer_id is not None and got != conn.peer_id):
            self.stats["tls_peer_mismatch"] += 1
            await trio.aclose_forcefully(tls)
            return None
        return tls

    async def _run_out(self, conn: _Conn, host: str, port: int) -> None:
        stream: trio.abc.Stream | None = None
        try:
            with trio.move_on_after(self._connect_timeout) as cs:
                stream = await self._dial(conn, host, port)
                if stream is None:
                    return
            if cs.cancelled_caught:
                self.stats["connect_timeout"] += 1
                return
            assert stream is not None
            self.stats["connections_out"] += 1
            conn.last_active = trio.current_time()
            async with trio.open_nursery() as nursery:
                conn.scope = nursery.cancel_scope
                # answers come back on the connection we dialled (see the module docstring)
                nursery.start_soon(self._read_out, conn, stream)
                try:
                    await self._write_frames(conn, stream)
                except _STREAM_ERRORS:
                    self.stats["connection_lost"] += 1
                nursery.cancel_scope.cancel()
        except _STREAM_ERRORS:
            self.stats["connect_failed" if stream is None else "connection_lost"] += 1
        finally:
            if self._out.get(conn.address) is conn:
                del self._out[conn.address]
            self._drain(conn)
            if stream is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await trio.aclose_forcefully(stream)

    async def _read_out(self, conn: _Conn, stream: trio.abc.Stream) -> None:
        """Frames the peer sends back on a connection we dialled; when it hangs up or fails,
        the whole connection closes (the next send dials again)."""
        try:
            await self._read_frames(conn, stream, None)
        except _STREAM_ERRORS:
            self.stats["connection_lost"] += 1
        finally:
            if conn.scope is not None:
                conn.scope.cancel()

    async def _write_frames(self, conn: _Conn, stream: trio.abc.Stream) -> None:
        """Write queued frames until the channel closes or nothing moved for ``idle``."""
        recv = conn.recv
        assert recv is not None
        idle = self._idle
        while True:
            frame = b""
            with trio.move_on_after(idle):
                try:
                    frame = await recv.receive()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    return  # the transport is closing
            if not frame:
                if trio.current_time() - conn.last_active < idle:
                    continue  # the peer spoke (an answer on our connection): not idle
                self.stats["idle_closed"] += 1
                return
            self._send_budget.give(len(frame))
            await stream.send_all(frame)
            conn.last_active = trio.current_time()

    async def _reply_writer(self, conn: _Conn) -> None:
        """Write replies back over an inbound connection until its reader ends."""
        recv = conn.recv
        assert recv is not None
        try:
            async for frame in recv:
                self._send_budget.give(len(frame))
                stream = conn.stream
                if stream is None:
                    self.stats["dropped_on_close"] += 1
                    continue
                await stream.send_all(frame)
                conn.last_active = trio.current_time()
        except _STREAM_ERRORS:
            self.stats["connection_lost"] += 1
            if conn.scope is not None:
                conn.scope.cancel()
        finally:
            self._drain(conn)

    def _drain(self, conn: _Conn) -> None:
        """Close a connection's queue and release (and count) the frames still in it."""
        if conn.send is not None:
            conn.send.close()
        recv = conn.recv
        if recv is None:
            return
        dropped = 0
        while True:
            try:
                frame = recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            self._send_budget.give(len(frame))
            dropped += 1
        if dropped:
            self.stats["dropped_on_close"] += dropped
        recv.close()

    # ------------------------------------------------------------------ receiving
    async def _serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while not self.closed:
            try:
                stream = await self._listener.accept()
            except (trio.ClosedResourceError, OSError):
                if self.closed:
                    return
                await trio.sleep(0.01)
                continue
            try:
                peer = stream.socket.getpeername()
            except OSError:
                await trio.aclose_forcefully(stream)
                continue
            self._make_room(str(peer[0]))
            conn = _Conn(
                format_address("tcp", peer[0], peer[1]),
                None,
                True,
                str(peer[0]),
                trio.current_time(),
            )
            self._in[conn.address] = conn
            self._per_source[conn.source] += 1
            self._nursery.start_soon(self._run_in, conn, stream)

    def _make_room(self, source: str) -> None:
        """Before admitting a connection from ``source``: evict one if a cap is reached."""
        victim: _Conn | None = None
        if self._per_source[source] >= self._max_per_source:
            victim = self._least_active(source)
            self.stats["inbound_evicted_source"] += 1
        elif len(self._in) >= self._max_conns:
            heaviest = max(self._per_source, key=lambda s: self._per_source[s])
            victim = self._least_active(heaviest)
            self.stats["inbound_evicted"] += 1
        if victim is not None:
            self._forget_in(victim)
            if victim.scope is not None:
                victim.scope.cancel()

    def _least_active(self, source: str) -> _Conn | None:
        cands = [c for c in self._in.values() if c.source == source]
        return min(cands, key=lambda c: c.last_active) if cands else None

    def _forget_in(self, conn: _Conn) -> None:
        if self._in.get(conn.address) is conn:
            del self._in[conn.address]
            n = self._per_source[conn.source] - 1
            if n > 0:
                self._per_source[conn.source] = n
            else:
                del self._per_source[conn.source]

    async def _run_in(self, conn: _Conn, tcp: trio.SocketStream) -> None:
        self.stats["connections_in"] += 1
        stream: trio.abc.Stream = tcp
        try:
            with trio.CancelScope() as scope:
                conn.scope = scope
                if conn.address not in self._in:  # evicted before it started
                    return
                if self._tls is not None:
                    tls = trio.SSLStream(tcp, self._tls[0], server_side=True)
                    stream = tls
                    with trio.fail_after(self._connect_timeout):
                        await tls.do_handshake()
                conn.stream = stream
                await self._read_frames(conn, stream, self._connect_timeout)
            if scope.cancelled_caught:
                self.stats["inbound_closed_evicted"] += 1
        except _STREAM_ERRORS:
            self.stats["connection_lost"] += 1
        except trio.TooSlowError:
            self.stats["tls_handshake_timeout"] += 1
        finally:
            self._forget_in(conn)
            conn.stream = None
            if conn.send is not None:
                conn.send.close()  # the reply writer drains what is left and ends
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await trio.aclose_forcefully(stream)

    async def _read_frames(
        self, conn: _Conn, stream: trio.abc.Stream, first_frame_s: float | None
    ) -> None:
        """Read length-prefixed frames into the receive channel until EOF, an oversized
        frame or (inbound) a silence: ``first_frame_s`` for the first frame, then the idle
        timeout. Outgoing connections (``first_frame_s`` None) are timed by their writer."""
        src = conn.address
        buf = bytearray()
        budget = self._recv_budget
        limit = first_frame_s
        got_frame = False
        while True:
            with trio.move_on_after(math.inf if limit is None else limit) as cs:
                chunk = await stream.receive_some(65536)
            if cs.cancelled_caught:
                if not got_frame:
                    self.stats["first_frame_timeout"] += 1
                else:
                    self.stats["idle_closed_in"] += 1
                return
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 4:
                (n,) = _LEN.unpack_from(buf)
                if n > MAX_FRAME_BYTES:
                    self.stats["recv_oversized"] += 1
                    return
                if len(buf) < 4 + n:
                    break
                frame = bytes(buf[4 : 4 + n])
                del buf[: 4 + n]
                conn.last_active = trio.current_time()
                got_frame = True
                if conn.inbound:
                    limit = self._idle_in
                if not budget.take(n):
                    self.stats["recv_queue_full"] += 1
                    continue
                try:
                    self._recv_send.send_nowait((src, frame))
                except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                    budget.give(n)
                    self.stats["recv_queue_full"] += 1
                    continue
                self.stats["received"] += 1
                self.stats["bytes_received"] += n

    async def receive(self) -> tuple[str, bytes]:
        """The next ``(source address, frame)``."""
        try:
            src, frame = await self._recv_recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise trio.ClosedResourceError("TCP transport is closed") from None
        self._recv_budget.give(len(frame))
        return src, frame

    async def aclose(self) -> None:
        """Close the listener and every connection."""
        if self.closed:
            return
        self.closed = True
        self._recv_send.close()
        for conn in [*self._out.values(), *self._in.values()]:
            if conn.send is not None:
                conn.send.close()
            if conn.scope is not None:
                conn.scope.cancel()
        await self._listener.aclose()


@asynccontextmanager
async def open_tcp(
    address: str = "tcp://127.0.0.1:0",
    *,
    tls_key: Ed25519PrivateKey | None = None,
    max_connections: int = 256,
    max_per_source: int | None = None,
    queue_len: int = 256,
    idle_timeout_s: float = 60.0,
    connect_timeout_s: float = 5.0,
    recv_buffer_bytes: int = 4 * 1024 * 1024,
    send_buffer_bytes: int = 8 * 1024 * 1024,
    advertise: str | None = None,
) -> AsyncIterator[TcpTransport]:
    """Listen on ``address`` (``tcp://IP:PORT``; port 0 = any) and close everything on exit.

    ``tls_key``: serve and dial TLS 1.3 with a certificate made from this Ed25519 key.
    ``max_connections`` bounds each kind (inbound, outgoing); ``max_per_source`` the inbound
    connections from one IP (default a quarter of ``max_connections``). ``idle_timeout_s``: an
    outgoing connection with no traffic for that long is closed (inbound: 1.5 times that);
    ``connect_timeout_s`` bounds a dial and TLS handshake, and the wait for an accepted
    connection's first frame. ``recv_buffer_bytes`` / ``send_buffer_bytes`` bound the frames
    waiting in user space. ``advertise``: the address to tell peers (``tcp://IP:PORT`` or a
    bare IP taking the bound port), for a listener bound to a wildcard.
    """
    _, host, port = parse_address(address, "tcp")
    fam = _stdsocket.AF_INET6 if ":" in host else _stdsocket.AF_INET
    sock = trio.socket.socket(fam, _stdsocket.SOCK_STREAM)
    try:
        sock.setsockopt(_stdsocket.SOL_SOCKET, _stdsocket.SO_REUSEADDR, 1)
        await sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    listener = trio.SocketListener(sock)
    tls = make_ssl_contexts(tls_key) if tls_key is not None else None
    async with trio.open_nursery() as nursery:
        t = TcpTransport(
            nursery,
            listener,
            tls=tls,
            max_connections=max_connections,
            queue_len=queue_len,
            idle_timeout_s=idle_timeout_s,
            connect_timeout_s=connect_timeout_s,
            max_per_source=max_per_source,
            recv_buffer_bytes=recv_buffer_bytes,
            send_buffer_bytes=send_buffer_bytes,
            advertise=advertise,
        )
        await nursery.start(t._serve)
        try:
            yield t
        finally:
            with trio.CancelScope(shield=True):  # never let a Cancelled replace the body's error
                await t.aclose()
            nursery.cancel_scope.cancel()
