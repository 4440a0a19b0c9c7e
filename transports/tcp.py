"""TCP transport: length-prefixed frames, one reused outgoing connection per peer, optional TLS 1.3.

Theory of operation:

* **Framing.** Each frame is a 4-byte big-endian length followed by that many bytes (the
  envelope of ``transports/codec.py``). A length above :data:`MAX_FRAME_BYTES` closes the
  connection and is counted; nothing is ever buffered beyond one frame.
* **Connections.** ``send_nowait`` puts the frame on the bounded queue of the outgoing
  connection to that address, creating it on first use; a writer task dials, (optionally)
  handshakes TLS, then writes frames until the queue is idle for ``idle_timeout_s`` or the peer
  fails. Incoming connections are served by one reader task each and feed a single bounded
  receive channel. Each side dials its own outgoing connection (peers never adopt an inbound
  connection for sending, so an inbound peer cannot claim another node's address and divert its
  traffic). At most ``max_connections`` of each kind exist; queue overflow, dial failure and
  peer resets are dropped and counted — datagram semantics, as the cores expect.
* **TLS 1.3** (stdlib ``ssl``; docs/transports.md): given the node's Ed25519 key, the
  transport makes a self-signed X.509 certificate from it (``cryptography``), serves it, and
  requires TLS 1.3.
  The dialling side does not use a CA; instead it reads the server's certificate after the
  handshake (which proved possession of the matching private key) and, when the caller knows
  whom it is dialling (``peer_id`` = SHA-1 of the peer's public key), closes the connection if
  the certificate key hashes to anything else. Client authentication is left to the signed
  envelopes (stdlib ``ssl`` cannot accept self-signed client certificates without a CA).
"""

from __future__ import annotations

import datetime
import hashlib
import socket as _stdsocket
import ssl
import struct
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import NameOID

from transports.address import AddressError, format_address, parse_address
from transports.codec import MAX_FRAME_BYTES
from transports.endpoint import EndpointMixin

__all__ = [
    "TcpTransport",
    "certificate_key_hash",
    "make_certificate",
    "make_ssl_contexts",
    "open_tcp",
]

_LEN = struct.Struct(">I")


def make_certificate(key: Ed25519PrivateKey) -> bytes:
    """A self-signed X.509 certificate (PEM) for ``key``; CN is the hex SHA-1 of the key."""
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hashlib.sha1(pub).hexdigest())])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(int.from_bytes(hashlib.sha1(pub).digest()[:16], "big") >> 1)
        .not_valid_before(datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC))
        .not_valid_after(datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC))
        .sign(key, None)
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def certificate_key_hash(der: bytes) -> bytes | None:
    """SHA-1 of the raw Ed25519 public key in a DER certificate (None if not Ed25519)."""
    try:
        cert = x509.load_der_x509_certificate(der)
        pub = cert.public_key()
    except Exception:
        return None
    if not isinstance(pub, Ed25519PublicKey):
        return None
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha1(raw).digest()


def make_ssl_contexts(key: Ed25519PrivateKey) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) TLS 1.3 contexts that present a certificate made from ``key``."""
    cert_pem = make_certificate(key)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE  # no CA: the peer key is checked against its id instead
    with tempfile.TemporaryDirectory(prefix="flockring-tls-") as d:
        cf, kf = Path(d) / "cert.pem", Path(d) / "key.pem"
        kf.touch(mode=0o600)
        kf.write_bytes(key_pem)
        cf.write_bytes(cert_pem)
        for ctx in (server, client):
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3
            ctx.load_cert_chain(str(cf), str(kf))
    return server, client


class _Outgoing:
    __slots__ = ("address", "peer_id", "recv", "send")

    def __init__(self, address: str, peer_id: bytes | None, queue_len: int) -> None:
        self.address = address
        self.peer_id = peer_id
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
    ) -> None:
        self._nursery = nursery
        self._listener = listener
        host, port = listener.socket.getsockname()[:2]
        self._address = format_address("tcp", host, port)
        self._tls = tls
        self._max_conns = max_connections
        self._queue_len = queue_len
        self._idle = idle_timeout_s
        self._connect_timeout = connect_timeout_s
        self._out: dict[str, _Outgoing] = {}
        self._inbound = 0
        self._recv_send, self._recv_recv = trio.open_memory_channel[tuple[str, bytes]](4096)
        self.closed = False
        self.stats: Counter[str] = Counter()

    @property
    def address(self) -> str:
        return self._address

    @property
    def tls(self) -> bool:
        return self._tls is not None

    # ------------------------------------------------------------------ sending
    def send_nowait(self, address: str, data: bytes, peer_id: bytes | None = None) -> None:
        if not self._admit(data):
            return
        conn = self._out.get(address)
        if conn is None:
            try:
                _, host, port = parse_address(address, "tcp")
            except AddressError:
                self.stats["send_bad_address"] += 1
                return
            if port == 0 or len(self._out) >= self._max_conns:
                self.stats["send_no_connection"] += 1
                return
            conn = _Outgoing(address, peer_id, self._queue_len)
            self._out[address] = conn
            self._nursery.start_soon(self._writer, conn, host, port)
        elif peer_id is not None and conn.peer_id is None:
            conn.peer_id = peer_id
        try:
            conn.send.send_nowait(_LEN.pack(len(data)) + data)
        except trio.WouldBlock:
            self.stats["send_queue_full"] += 1
            return
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self.stats["send_closed"] += 1
            return
        self.stats["sent"] += 1
        self.stats["bytes_sent"] += len(data)

    async def _writer(self, conn: _Outgoing, host: str, port: int) -> None:
        stream: trio.abc.Stream | None = None
        try:
            with trio.move_on_after(self._connect_timeout) as cs:
                tcp = await trio.open_tcp_stream(host, port)
                tcp.setsockopt(_stdsocket.IPPROTO_TCP, _stdsocket.TCP_NODELAY, 1)
                stream = tcp
                if self._tls is not None:
                    tls = trio.SSLStream(tcp, self._tls[1], server_hostname=None)
                    stream = tls
                    await tls.do_handshake()
                    der = tls.getpeercert(binary_form=True)
                    got = certificate_key_hash(der) if der else None
                    if got is None or (conn.peer_id is not None and got != conn.peer_id):
                        self.stats["tls_peer_mismatch"] += 1
                        return
            if cs.cancelled_caught:
                self.stats["connect_timeout"] += 1
                return
            self.stats["connections_out"] += 1
            assert stream is not None
            while True:
                with trio.move_on_after(self._idle):
                    frame = await conn.recv.receive()
                    await stream.send_all(frame)
                    continue
                self.stats["idle_closed"] += 1
                return
        except trio.EndOfChannel:
            return  # the transport is closing
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
            self.stats["connect_failed" if stream is None else "connection_lost"] += 1
        finally:
            if self._out.get(conn.address) is conn:
                del self._out[conn.address]
            conn.send.close()
            dropped = 0
            while True:
                try:
                    conn.recv.receive_nowait()
                    dropped += 1
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
            if dropped:
                self.stats["dropped_on_close"] += dropped
            conn.recv.close()
            if stream is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await trio.aclose_forcefully(stream)

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
            if self._inbound >= self._max_conns:
                self.stats["inbound_refused"] += 1
                await trio.aclose_forcefully(stream)
                continue
            self._nursery.start_soon(self._reader, stream)

    async def _reader(self, tcp: trio.SocketStream) -> None:
        self._inbound += 1
        self.stats["connections_in"] += 1
        stream: trio.abc.Stream = tcp
        try:
            peer = tcp.socket.getpeername()
            src = format_address("tcp", peer[0], peer[1])
            if self._tls is not None:
                tls = trio.SSLStream(tcp, self._tls[0], server_side=True)
                stream = tls
                with trio.fail_after(self._connect_timeout):
                    await tls.do_handshake()
            buf = bytearray()
            while True:
                with trio.move_on_after(self._idle * 4):
                    chunk = await stream.receive_some(65536)
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
                        try:
                            self._recv_send.send_nowait((src, frame))
                        except trio.WouldBlock:
                            self.stats["recv_queue_full"] += 1
                            continue
                        self.stats["received"] += 1
                        self.stats["bytes_received"] += n
                    continue
                return  # idle inbound connection
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
            self.stats["connection_lost"] += 1
        except trio.TooSlowError:
            self.stats["tls_handshake_timeout"] += 1
        finally:
            self._inbound -= 1
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await trio.aclose_forcefully(stream)

    async def receive(self) -> tuple[str, bytes]:
        try:
            return await self._recv_recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise trio.ClosedResourceError("TCP transport is closed") from None

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._recv_send.close()
        for conn in list(self._out.values()):
            conn.send.close()
        await self._listener.aclose()


@asynccontextmanager
async def open_tcp(
    address: str = "tcp://127.0.0.1:0",
    *,
    tls_key: Ed25519PrivateKey | None = None,
    max_connections: int = 256,
    queue_len: int = 256,
    idle_timeout_s: float = 60.0,
    connect_timeout_s: float = 5.0,
) -> AsyncIterator[TcpTransport]:
    """Listen on ``address`` (``tcp://IP:PORT``; port 0 = any) and close everything on exit.

    ``tls_key``: serve and dial TLS 1.3 with a certificate made from this Ed25519 key.
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
        )
        await nursery.start(t._serve)
        try:
            yield t
        finally:
            with trio.CancelScope(shield=True):  # never let a Cancelled replace the body's error
                await t.aclose()
            nursery.cancel_scope.cancel()
