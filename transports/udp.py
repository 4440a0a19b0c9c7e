"""UDP transport on trio sockets (DESIGN §1, §3: ``open_udp``).

Theory of operation: one datagram socket per node, bound at open (port 0 lets the kernel pick;
``address`` reports the real port afterwards). Receiving goes through the trio wrapper of the
socket (``await recvfrom``). Sending uses the *same* file descriptor through the stdlib socket in
non-blocking mode, so ``send_nowait`` is synchronous like a datagram send in the sans-io cores:
a full kernel buffer (``BlockingIOError``) or any ``OSError`` is counted and the datagram is
dropped — exactly the loss the overlays already tolerate. Frames over :data:`MAX_FRAME_BYTES` or
over the IPv4/IPv6 UDP payload bound are never sent. Addresses are ``udp://IP:PORT`` strings
(``transports.address``); parsing is cached.
"""

from __future__ import annotations

import socket as _stdsocket
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from transports.address import AddressError, format_address, parse_address
from transports.codec import MAX_FRAME_BYTES

__all__ = ["UdpTransport", "open_udp"]

_UDP_MAX_PAYLOAD = 65507  # 65535 - 8 (UDP header) - 20 (IPv4 header)


class UdpTransport:
    """A bound UDP endpoint (implements ``transports.base.Transport``)."""

    def __init__(self, sock: _stdsocket.socket, recv_buffer: int = MAX_FRAME_BYTES) -> None:
        self._std = sock
        self._sock = trio.socket.from_stdlib_socket(sock)
        host, port = sock.getsockname()[:2]
        self._address = format_address("udp", host, port)
        self._family = sock.family
        self._recv_buffer = recv_buffer
        self._max_send = min(MAX_FRAME_BYTES, _UDP_MAX_PAYLOAD)
        self._dest: dict[str, tuple[str, int] | None] = {}
        self.closed = False
        self.stats: Counter[str] = Counter()

    @property
    def address(self) -> str:
        return self._address

    def _sockaddr(self, address: str) -> tuple[str, int] | None:
        d = self._dest.get(address, ())
        if d != ():
            return d  # type: ignore[return-value]
        out: tuple[str, int] | None
        try:
            _, host, port = parse_address(address, "udp")
            fam = _stdsocket.AF_INET6 if ":" in host else _stdsocket.AF_INET
            out = (host, port) if fam == self._family and port != 0 else None
        except AddressError:
            out = None
        if len(self._dest) > 100_000:
            self._dest.clear()
        self._dest[address] = out
        return out

    def send_nowait(self, address: str, data: bytes, peer_id: bytes | None = None) -> None:
        if self.closed:
            self.stats["send_closed"] += 1
            return
        if len(data) > self._max_send:
            self.stats["send_oversized"] += 1
            return
        dst = self._sockaddr(address)
        if dst is None:
            self.stats["send_bad_address"] += 1
            return
        try:
            self._std.sendto(data, dst)
        except BlockingIOError:
            self.stats["send_buffer_full"] += 1
            return
        except OSError:
            self.stats["send_error"] += 1
            return
        self.stats["sent"] += 1
        self.stats["bytes_sent"] += len(data)

    async def receive(self) -> tuple[str, bytes]:
        while True:
            if self.closed:
                raise trio.ClosedResourceError("UDP transport is closed")
            try:
                data, addr = await self._sock.recvfrom(self._recv_buffer + 1)
            except (trio.ClosedResourceError, OSError) as exc:
                if self.closed or isinstance(exc, trio.ClosedResourceError):
                    raise trio.ClosedResourceError("UDP transport is closed") from None
                self.stats["recv_error"] += 1  # e.g. ICMP errors reported on the socket
                await trio.lowlevel.checkpoint()
                continue
            if len(data) > self._recv_buffer:
                self.stats["recv_oversized"] += 1
                continue
            self.stats["received"] += 1
            self.stats["bytes_received"] += len(data)
            return format_address("udp", addr[0], addr[1]), data

    def __aiter__(self) -> UdpTransport:
        return self

    async def __anext__(self) -> tuple[str, bytes]:
        try:
            return await self.receive()
        except trio.ClosedResourceError:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._sock.close()
        await trio.lowlevel.checkpoint()


@asynccontextmanager
async def open_udp(
    address: str = "udp://127.0.0.1:0", *, rcvbuf_bytes: int | None = None
) -> AsyncIterator[UdpTransport]:
    """Bind a UDP endpoint at ``address`` (``udp://IP:PORT``; port 0 = any) and close it on exit.

    Raises :class:`transports.address.AddressError` for a malformed address and ``OSError``
    when the address cannot be bound.
    """
    _, host, port = parse_address(address, "udp")
    fam = _stdsocket.AF_INET6 if ":" in host else _stdsocket.AF_INET
    sock = _stdsocket.socket(fam, _stdsocket.SOCK_DGRAM)
    try:
        if rcvbuf_bytes is not None:
            sock.setsockopt(_stdsocket.SOL_SOCKET, _stdsocket.SO_RCVBUF, rcvbuf_bytes)
        sock.bind((host, port))
        sock.setblocking(False)
        t = UdpTransport(sock)
    except BaseException:
        sock.close()
        raise
    try:
        yield t
    finally:
        with trio.CancelScope(shield=True):  # never let a Cancelled replace the body's error
            await t.aclose()
