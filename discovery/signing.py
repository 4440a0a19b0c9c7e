"""Origin signatures for the discovery plugins' multi-hop and role-changing messages.

The transport authenticates each datagram's *sender*; messages whose *origin* matters beyond
one hop (flock announcements forwarded by other pools, pond invitations, a manager's alives and
hand-over consents) carry the origin's own Ed25519 signature too. The key travels in the
message and must hash (SHA-1) to the origin's node id, so ids stay self-certifying
(``overlay/identity.py``). Signed bytes start with a per-protocol domain string, so a signature
made for one protocol can never be replayed as another's.

One signer serves every plugin of a node: :class:`Ed25519Signer` over the node's identity key.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol, TypeVar, cast

import attrs
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from overlay.ids import NodeId
from overlay.messages import Message
from overlay.wire import encode_message

__all__ = [
    "PUBLIC_KEY_BYTES",
    "SIGNATURE_BYTES",
    "Ed25519Signer",
    "KeyCache",
    "Signer",
    "check",
    "sign_message",
    "verify_message",
]

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64


class Signer(Protocol):
    """Signs on behalf of this node (injected into each plugin; the identity key on live
    nodes, optional in large simulations)."""

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte Ed25519 public key (its SHA-1 is this node's id)."""
        ...

    def sign(self, data: bytes) -> bytes:
        """A 64-byte Ed25519 signature of ``data``."""
        ...


class Ed25519Signer:
    """A :class:`Signer` over an Ed25519 private key (e.g. ``overlay.Identity.private_key``)."""

    __slots__ = ("_key", "public_key")

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        self._key = private_key
        self.public_key = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @classmethod
    def from_identity(cls, identity: Any) -> Ed25519Signer:
        """The signer of an ``overlay.Identity`` (anything with an Ed25519 ``private_key``)."""
        key = getattr(identity, "private_key", None)
        if not isinstance(key, Ed25519PrivateKey):
            raise TypeError("Ed25519Signer.from_identity needs an Identity with an Ed25519 key")
        return cls(key)

    def sign(self, data: bytes) -> bytes:
        """An Ed25519 signature of ``data``."""
        return self._key.sign(data)


class KeyCache:
    """Parsed Ed25519 public keys by raw bytes (a small LRU: parsing costs more than a lookup)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._keys: OrderedDict[bytes, Ed25519PublicKey] = OrderedDict()

    def get(self, raw: bytes) -> Ed25519PublicKey:
        """The public key of ``raw`` (raises ``ValueError`` for a point not on the curve)."""
        k = self._keys.get(raw)
        if k is not None:
            self._keys.move_to_end(raw)
            return k
        k = Ed25519PublicKey.from_public_bytes(raw)
        self._keys[raw] = k
        if len(self._keys) > self.size:
            self._keys.popitem(last=False)
        return k


M = TypeVar("M", bound=Message)


def _evolve(msg: M, **changes: bytes) -> M:
    # attrs' evolve typed for any message class that has these fields
    out: M = attrs.evolve(cast(Any, msg), **changes)
    return out


def _signed_bytes(msg: Message, domain: bytes) -> bytes:
    return domain + encode_message(_evolve(msg, sig=b""))


def sign_message(msg: M, signer: Signer, domain: bytes) -> M:
    """``msg`` (a message with ``key`` and ``sig`` bytes fields) with ``key`` set to the
    signer's public key and ``sig`` to its signature over ``domain`` + the encoded message."""
    m = _evolve(msg, key=signer.public_key, sig=b"")
    return _evolve(m, sig=signer.sign(_signed_bytes(m, domain)))


def check(
    key: bytes, sig: bytes, data: bytes, claimed: NodeId, keys: KeyCache | None = None
) -> str | None:
    """None when ``sig`` is ``claimed``'s signature of ``data`` made with ``key``, else why not:
    ``"unsigned"`` (no key or signature), ``"forged"`` (the key does not hash to ``claimed``, or
    is no valid key: someone speaking for an id whose key it does not hold) or ``"tampered"``
    (the signature does not verify: a field changed after signing)."""
    if not key or not sig:
        return "unsigned"
    if len(key) != PUBLIC_KEY_BYTES or NodeId.hash_of(key) != claimed:
        return "forged"
    if len(sig) != SIGNATURE_BYTES:
        return "tampered"
    try:
        pub = keys.get(key) if keys is not None else Ed25519PublicKey.from_public_bytes(key)
        pub.verify(sig, data)
    except InvalidSignature:
        return "tampered"
    except ValueError:
        return "forged"
    return None


def verify_message(
    msg: Message, claimed: NodeId, domain: bytes, keys: KeyCache | None = None
) -> bool:
    """True if ``msg`` (with ``key``/``sig`` fields) is signed by ``claimed``'s key."""
    key: bytes = getattr(msg, "key", b"")
    sig: bytes = getattr(msg, "sig", b"")
    if not key or not sig:
        return False
    return check(key, sig, _signed_bytes(msg, domain), claimed, keys) is None
