"""Transport addresses: ``scheme://host:port`` strings (``udp``, ``tcp``, ``mem``).

Theory of operation: the overlay treats an address as an opaque hashable value
(``NodeHandle.address``); only the transport that owns a scheme parses it. Hosts must be IP
literals on the hot path (no DNS lookups inside ``send_nowait``); :func:`resolve` turns a host
name given by a user into a literal once, before any node starts. IPv6 literals are written in
brackets as in RFC 3986: ``udp://[::1]:9000``.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from transports.errors import OverlayError

__all__ = ["AddressError", "format_address", "parse_address", "resolve"]


class AddressError(OverlayError, ValueError):
    """A transport address that cannot be parsed (raised to API callers, never from a loop)."""


@lru_cache(maxsize=65536)
def parse_address(text: str, scheme: str | None = None) -> tuple[str, str, int]:
    """Split ``scheme://host:port`` into ``(scheme, host, port)``; host must be an IP literal.

    With ``scheme`` given, any other scheme is an error. Raises :class:`AddressError`.
    """
    if not isinstance(text, str):
        raise AddressError(f"address must be a string, got {type(text).__name__}")
    sch, sep, rest = text.partition("://")
    if not sep or not sch:
        raise AddressError(f"address {text!r} lacks a scheme (expected e.g. udp://127.0.0.1:9000)")
    sch = sch.lower()
    if scheme is not None and sch != scheme:
        raise AddressError(f"address {text!r} is not a {scheme}:// address")
    if sch == "mem":
        if not rest:
            raise AddressError(f"memory address {text!r} has no name")
        return sch, rest, 0
    if rest.startswith("["):
        host, close, tail = rest[1:].partition("]")
        if not close or not tail.startswith(":"):
            raise AddressError(f"bad IPv6 address {text!r} (use udp://[::1]:9000)")
        port_s = tail[1:]
    else:
        host, colon, port_s = rest.rpartition(":")
        if not colon:
            raise AddressError(f"address {text!r} lacks a port")
    try:
        port = int(port_s, 10)
    except ValueError:
        raise AddressError(f"address {text!r} has a bad port {port_s!r}") from None
    if not 0 <= port <= 65535:
        raise AddressError(f"address {text!r}: port {port} outside 0..65535")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise AddressError(
            f"address {text!r}: host {host!r} is not an IP literal (use resolve() first)"
        ) from None
    return sch, host, port


def format_address(scheme: str, host: str, port: int) -> str:
    """The inverse of :func:`parse_address` (brackets IPv6 literals)."""
    if ":" in host:
        return f"{scheme}://[{host}]:{port}"
    return f"{scheme}://{host}:{port}"


def resolve(text: str) -> str:
    """Return ``text`` with a host *name* replaced by an IP literal (blocking; CLI use only)."""
    sch, sep, rest = text.partition("://")
    if not sep:
        raise AddressError(f"address {text!r} lacks a scheme (expected e.g. udp://127.0.0.1:9000)")
    if sch.lower() == "mem":
        return text
    host, colon, port_s = rest.rpartition(":")
    if not colon or rest.startswith("["):
        parse_address(text)
        return text
    try:
        ipaddress.ip_address(host)
        parse_address(text)
        return text
    except ValueError:
        pass
    import socket  # only here: the codec path must not pull in socket (tests/test_sans_io.py)

    try:
        infos = socket.getaddrinfo(host, int(port_s), type=socket.SOCK_DGRAM)
    except (OSError, ValueError) as exc:
        raise AddressError(f"cannot resolve host in {text!r}: {exc}") from None
    ip = str(infos[0][4][0])
    out = format_address(sch.lower(), ip, int(port_s))
    parse_address(out)
    return out
