"""UDP transport on trio sockets: ``open_udp`` (docs/transports.md).

Theory of operation: one datagram socket per node, bound at open (port 0 lets the kernel pick;
``address`` reports the real port afterwards), used in non-blocking mode. ``send_nowait`` is
synchronous like a datagram send in the sans-io cores: a full kernel buffer
(``BlockingIOError``) or any ``OSError`` is counted and the datagram is dropped — exactly the loss
the overlays already tolerate. Frames over :data:`MAX_FRAME_BYTES` or over the IPv4/IPv6 UDP
payload bound are never sent. Addresses are ``udp://IP:PORT`` strings (``transports.address``);
their parsing is cached once per process (a pure function of the string). ``address`` is what
the endpoint tells peers: the ``advertise`` address when one was given (a socket bound to
``0.0.0.0`` has no address of its own that peers can reach), else the bound address
(``bound_address``).

Receiving waits with ``trio.lowlevel.wait_readable`` and then reads with ``recvfrom_into`` into
one 64 KiB buffer shared by every UDP transport of the process (trio runs one task at a time and
nothing awaits between the read and the copy), then copies out exactly the datagram. Reading with
``recvfrom(65536)`` instead would make the C library allocate a 64 KiB block per datagram and
shrink it: in a process with a thousand sockets that leaves the heap fragmented (~20 KiB per node
of free-but-unreturnable memory at 300 nodes). ``receive_nowait`` returns the next datagram
already queued in the kernel, or ``None``, so a receive loop can drain a burst per wake-up.
"""

from __future__ import annotations

import platform
import socket as _stdsocket
import struct
import sys
import time
from collections import Counter
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from transports.address import AddressError, advertised_address, format_address, parse_address
from transports.codec import MAX_FRAME_BYTES
from transports.endpoint import EndpointMixin
from transports.lag import RECEIVE_LAG, SAMPLE_EVERY
from transports.memo import Memo

__all__ = ["UdpTransport", "open_udp"]

_UDP_MAX_PAYLOAD = 65507  # 65535 - 8 (UDP header) - 20 (IPv4 header)

#: one receive buffer for the whole process (see the module docstring); +1 detects oversize
_RECV_BUF = bytearray(MAX_FRAME_BYTES + 1)
_RECV_VIEW = memoryview(_RECV_BUF)

#: "udp://IP:PORT" -> (family, (host, port)) or None; shared by all transports of the process.
#: Keys come from handles peers send and sources anyone can spoof: both memos are bounded in
#: bytes (transports.memo), ~10^4 entries each.
_DEST = Memo(2 << 20)
#: source (host, port[, …]) -> "udp://…" string, so each datagram does not format it anew
_SRC = Memo(2 << 20)
_ENTRY_COST = 200

#: Linux's receive timestamps (socket(7)). Python's socket module does not name the option:
#: 35 is its number in the generic Linux ABI (asm-generic/socket.h) of x86, arm, arm64 and
#: riscv; elsewhere no lag is measured.
_GENERIC_ABI = ("x86_64", "i686", "i386", "aarch64", "armv7l", "armv8l", "riscv64")
_SO_TIMESTAMPNS: int | None = getattr(_stdsocket, "SO_TIMESTAMPNS", None)
if _SO_TIMESTAMPNS is None and sys.platform == "linux" and platform.machine() in _GENERIC_ABI:
    _SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@qq")
_ANC_SPACE = _stdsocket.CMSG_SPACE(_TIMESPEC.size) if _SO_TIMESTAMPNS is not None else 0
#: datagrams left to read until the next one read with its stamp (transports.lag)
_until_sample = [SAMPLE_EVERY]


def _src_address(addr: tuple[Any, ...]) -> str:
    s: str | None = _SRC.data.get(addr)
    if s is None:
        s = format_address("udp", addr[0], addr[1])
        _SRC.put(addr, s, _ENTRY_COST + len(s))
    return s


def _parse_dest(address: str) -> tuple[int, tuple[str, int]] | None:
    try:
        _, host, port = parse_address(address, "udp")
    except AddressError:
        return None
    if port == 0:
        return None
    fam = _stdsocket.AF_INET6 if ":" in host else _stdsocket.AF_INET
    return fam, (host, port)


class UdpTransport(EndpointMixin):
    """A bound UDP endpoint (implements ``transports.base.Transport``)."""

    __slots__ = (
        "_address",
        "_bound",
        "_family",
        "_max_send",
        "_recv_buffer",
        "_stamped",
        "_std",
        "closed",
        "stats",
    )

    def __init__(
        self,
        sock: _stdsocket.socket,
        recv_buffer: int = MAX_FRAME_BYTES,
        *,
        advertise: str | None = None,
    ) -> None:
        if recv_buffer > MAX_FRAME_BYTES:
            raise ValueError(f"recv_buffer may not exceed {MAX_FRAME_BYTES}")
        sock.setblocking(False)
        self._std = sock
        host, port = sock.getsockname()[:2]
        self._bound = format_address("udp", host, port)
        self._address = (
            self._bound if advertise is None else advertised_address(self._bound, advertise)
        )
        self._family = sock.family
        self._recv_buffer = recv_buffer
        self._max_send = min(MAX_FRAME_BYTES, _UDP_MAX_PAYLOAD)
        self.closed = False
        self.stats: Counter[str] = Counter()
        # kernel arrival stamps, read on one datagram in SAMPLE_EVERY (transports.lag)
        self._stamped = False
        if _SO_TIMESTAMPNS is not None:
            try:
                sock.setsockopt(_stdsocket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self._stamped = True
            except OSError:
                pass

    @property
    def address(self) -> str:
        """The address peers are told: the advertised one, else the bound one."""
        return self._address

    @property
    def bound_address(self) -> str:
        """The address the socket is bound to (may be a wildcard such as ``0.0.0.0``)."""
        return self._bound

    def _sockaddr(self, address: str) -> tuple[str, int] | None:
        d: tuple[int, tuple[str, int]] | None
        try:
            d = _DEST.data[address]
        except KeyError:
            if type(address) is not str:
                return None
            d = _parse_dest(address)
            _DEST.put(address, d, _ENTRY_COST + len(address))
        except TypeError:  # unhashable: not an address at all
            return None
        if d is None or d[0] != self._family:
            return None
        return d[1]

    def fileno(self) -> int:
        """The socket's descriptor (-1 once closed), for a poller that serves many sockets."""
        return self._std.fileno()

    def send_nowait(self, address: str, data: bytes, peer_id: bytes | None = None) -> None:
        """Send one datagram (never blocks; an error is counted, not raised)."""
        if not self._admit(data, self._max_send):
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

    def receive_nowait(self) -> tuple[str, bytes] | None:
        """The next datagram already queued, or None (never blocks; closed: None)."""
        std = self._std
        limit = self._recv_buffer
        stats = self.stats
        while not self.closed:
            try:
                if self._stamped and _until_sample[0] <= 0:
                    n, addr = self._read_stamped(std)
                    _until_sample[0] = SAMPLE_EVERY - 1  # this one and 7 plain reads
                else:
                    n, addr = std.recvfrom_into(_RECV_BUF)
                    _until_sample[0] -= 1  # (an empty read raised above: datagrams only)
            except BlockingIOError:
                return None
            except OSError:
                if self.closed:
                    return None
                stats["recv_error"] += 1  # e.g. ICMP errors reported on the socket
                continue
            if n > limit:
                stats["recv_oversized"] += 1
                continue
            stats["received"] += 1
            stats["bytes_received"] += n
            return _src_address(addr), bytes(_RECV_VIEW[:n])
        return None

    @staticmethod
    def _read_stamped(std: _stdsocket.socket) -> tuple[int, Any]:
        """Read one datagram with its kernel arrival stamp and sample the process's receive lag
        with it (the stamp is wall-clock time)."""
        n, anc, _flags, addr = std.recvmsg_into([_RECV_BUF], _ANC_SPACE)
        for level, kind, data in anc:
            if (
                level == _stdsocket.SOL_SOCKET
                and kind == _SO_TIMESTAMPNS
                and len(data) >= _TIMESPEC.size
            ):
                sec, nsec = _TIMESPEC.unpack_from(data)
                RECEIVE_LAG.sample(time.time() - (sec + nsec * 1e-9))
        return n, addr

    async def receive(self) -> tuple[str, bytes]:
        """The next ``(source address, datagram)``."""
        while True:
            if self.closed:
                raise trio.ClosedResourceError("UDP transport is closed")
            try:
                await trio.lowlevel.wait_readable(self._std)
            except (trio.ClosedResourceError, OSError):
                raise trio.ClosedResourceError("UDP transport is closed") from None
            got = self.receive_nowait()
            if got is not None:
                return got

    async def aclose(self) -> None:
        """Close the socket; a pending ``receive`` ends."""
        if self.closed:
            return
        self.closed = True
        trio.lowlevel.notify_closing(self._std)  # a task waiting in receive() gets Closed…
        self._std.close()
        await trio.lowlevel.checkpoint()


class _OpenUdp:
    """``async with open_udp(...) as t``: binds on entry, closes on exit. A small object
    rather than an ``@asynccontextmanager`` generator, whose suspended frame would cost each
    open endpoint ~0.4 KiB for as long as it is open."""

    __slots__ = ("_address", "_advertise", "_rcvbuf", "_t")

    def __init__(self, address: str, rcvbuf_bytes: int | None, advertise: str | None) -> None:
        self._address = address
        self._rcvbuf = rcvbuf_bytes
        self._advertise = advertise
        self._t: UdpTransport | None = None

    async def __aenter__(self) -> UdpTransport:
        _, host, port = parse_address(self._address, "udp")
        fam = _stdsocket.AF_INET6 if ":" in host else _stdsocket.AF_INET
        sock = _stdsocket.socket(fam, _stdsocket.SOCK_DGRAM)
        try:
            if self._rcvbuf is not None:
                sock.setsockopt(_stdsocket.SOL_SOCKET, _stdsocket.SO_RCVBUF, self._rcvbuf)
            sock.bind((host, port))
            sock.setblocking(False)
            self._t = UdpTransport(sock, advertise=self._advertise)
        except BaseException:
            sock.close()
            raise
        await trio.lowlevel.checkpoint()
        return self._t

    async def __aexit__(self, *exc: object) -> None:
        t, self._t = self._t, None
        if t is not None:
            with trio.CancelScope(shield=True):  # never let a Cancelled replace the body's error
                await t.aclose()


def open_udp(
    address: str = "udp://127.0.0.1:0",
    *,
    rcvbuf_bytes: int | None = None,
    advertise: str | None = None,
) -> AbstractAsyncContextManager[UdpTransport]:
    """Bind a UDP endpoint at ``address`` (``udp://IP:PORT``; port 0 = any) and close it on exit.

    ``advertise``: the address to tell peers (``udp://IP:PORT``, or a bare IP taking the bound
    port), for a socket bound to a wildcard. Raises :class:`transports.address.AddressError` for
    a malformed address and ``OSError`` when the address cannot be bound (on entry).
    """
    return _OpenUdp(address, rcvbuf_bytes, advertise)
