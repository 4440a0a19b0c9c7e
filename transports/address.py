"""Transport addresses: ``scheme://host:port`` strings (``udp``, ``tcp``, ``mem``).

Theory of operation: the overlay treats an address as an opaque hashable value
(``NodeHandle.address``); only the transport that owns a scheme parses it. Hosts must be IP
literals on the hot path (no DNS lookups inside ``send_nowait``); :func:`resolve` turns a host
name given by a user into a literal once, before any node starts. IPv6 literals are written in
brackets as in RFC 3986: ``udp://[::1]:9000``.

A socket bound to a wildcard (``0.0.0.0``, ``::``) listens on every interface but has no address
a peer could send to, so a wildcard must never be *advertised* (put in handles, join requests or
reply addresses). :func:`advertised_address` decides what a node advertises: the address the
operator gave (``--advertise``; a bare host takes the bound port), else the bound address if it
is not a wildcard, else :class:`WildcardAddressError` — as libp2p and most servers, a node
refuses to start rather than tell its peers an address that cannot reach it.
"""

from __future__ import annotations

import ipaddress
import sys
from functools import lru_cache

from transports.errors import AddressError, WildcardAddressError

__all__ = [
    "AddressError",
    "WildcardAddressError",
    "advertised_address",
    "format_address",
    "is_wildcard",
    "parse_address",
    "resolve",
]


#: longer than any real address ("udp://[" + a scoped IPv6 literal + "]:65535"); anything longer
#: is refused before it reaches the parse cache, which peers' reply addresses would fill
MAX_ADDRESS_LEN = 128


def parse_address(text: str, scheme: str | None = None) -> tuple[str, str, int]:
    """Split ``scheme://host:port`` into ``(scheme, host, port)``; host must be an IP literal.

    With ``scheme`` given, any other scheme is an error. Raises :class:`AddressError`.
    """
    if not isinstance(text, str):
        raise AddressError(f"address must be a string, got {type(text).__name__}")
    if len(text) > MAX_ADDRESS_LEN:
        raise AddressError(f"address of {len(text)} characters (at most {MAX_ADDRESS_LEN})")
    if scheme is not None:
        # checked before the rest of the parse, as the errors have always been ordered; the
        # cache is keyed by the text alone, so an address parsed with and without a scheme is
        # one entry, not two
        sch, sep, _ = text.partition("://")
        if sep and sch and sch.lower() != scheme:
            raise AddressError(f"address {text!r} is not a {scheme}:// address")
    return _parse(text)


@lru_cache(maxsize=4096)  # parsing is a pure function of the string: hot addresses hit
def _parse(text: str) -> tuple[str, str, int]:
    sch, sep, rest = text.partition("://")
    if not sep or not sch:
        raise AddressError(f"address {text!r} lacks a scheme (expected e.g. udp://127.0.0.1:9000)")
    # the scheme and host strings are interned: the cached parses of a swarm's addresses share
    # one "udp" and one string per host instead of a copy per address (~110 bytes each)
    sch = sys.intern(sch.lower())
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
    return sch, sys.intern(host), port


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


def is_wildcard(address: str) -> bool:
    """True if ``address`` names the unspecified host (``0.0.0.0`` or ``::``): bindable, but
    not an address anyone can send to. Malformed addresses are not wildcards."""
    try:
        _, host, _ = parse_address(address)
    except AddressError:
        return False
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a memory address's name
        return False


def advertised_address(bound: str, advertise: str | None = None) -> str:
    """The address a node bound at ``bound`` tells its peers.

    ``advertise`` may be a full address of the same scheme (port 0: the bound port) or a bare
    IP literal (scheme and port of ``bound``). Without it, ``bound`` itself, unless that is a
    wildcard. Raises :class:`WildcardAddressError` when the result would be a wildcard, and
    :class:`AddressError` for a malformed or mismatched ``advertise``.
    """
    sch, _, port = parse_address(bound)
    if advertise is None:
        if is_wildcard(bound):
            raise WildcardAddressError(
                f"bound to the wildcard address {bound}, which peers cannot reach: "
                "give the address to advertise (advertise= / --advertise ADDR)"
            )
        return bound
    if sch == "mem":
        raise AddressError(f"memory endpoints ({bound}) advertise their own name only")
    text = advertise.strip()
    if "://" not in text:
        host = text[1:-1] if text.startswith("[") and text.endswith("]") else text
        text = format_address(sch, host, port)
    a_sch, a_host, a_port = parse_address(text)
    if a_sch != sch:
        raise AddressError(f"advertised address {advertise!r} is not a {sch}:// address")
    if a_port == 0:
        text = format_address(sch, a_host, port)
    if is_wildcard(text):
        raise WildcardAddressError(
            f"cannot advertise the wildcard address {advertise!r}: give the host's own address"
        )
    return text
