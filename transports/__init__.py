"""Transports move authenticated bytes and know nothing of overlays (docs/transports.md).

``MemoryNetwork`` (in-process, virtual-time friendly), ``open_udp`` / ``UdpTransport`` and
``open_tcp`` / ``TcpTransport`` (optional TLS 1.3); the envelope codec (``codec``), Ed25519
signing (``auth``) with a replay table (``replay``), pair frames (``pair``: static-static X25519
and ChaCha20-Poly1305 between two identity keys, no handshake) and authenticated sessions
(``session``: a Noise XX handshake, ``noise``, then AEAD records with a replay window).

The trio-based transports are imported on first use (PEP 562), so that ``overlay/wire.py`` can use
the codec without pulling trio and socket into the sans-io simulator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from transports.address import (
    AddressError,
    WildcardAddressError,
    advertised_address,
    format_address,
    is_wildcard,
    parse_address,
    resolve,
)
from transports.auth import Opened, Signer, Verifier
from transports.base import Transport
from transports.codec import MAX_FRAME_BYTES, VERSION, Codec, Envelope, Limits
from transports.session import SessionConfig, Sessions

if TYPE_CHECKING:
    from transports.memory import MemoryNetwork, MemoryTransport
    from transports.tcp import TcpTransport, open_tcp
    from transports.udp import UdpTransport, open_udp

_LAZY = {
    "MemoryNetwork": "transports.memory",
    "MemoryTransport": "transports.memory",
    "TcpTransport": "transports.tcp",
    "open_tcp": "transports.tcp",
    "UdpTransport": "transports.udp",
    "open_udp": "transports.udp",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'transports' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


__all__ = [
    "MAX_FRAME_BYTES",
    "VERSION",
    "AddressError",
    "Codec",
    "Envelope",
    "Limits",
    "MemoryNetwork",
    "MemoryTransport",
    "Opened",
    "SessionConfig",
    "Sessions",
    "Signer",
    "TcpTransport",
    "Transport",
    "UdpTransport",
    "Verifier",
    "WildcardAddressError",
    "advertised_address",
    "format_address",
    "is_wildcard",
    "open_tcp",
    "open_udp",
    "parse_address",
    "resolve",
]
