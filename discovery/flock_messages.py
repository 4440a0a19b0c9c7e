"""The flock's messages — the announcement and its origin signature, the blacklist share —
(wire tags 110–129).

Theory of operation (Butt et al. 2006 §3.2.1, §3.2.2, §4.1): a pool with free machines sends
an announcement — who it is, how to reach its collector, what it offers, how long the offer is
valid, its TTL and the routing-table row it used — to the pools of its routing table; receivers
forward it while the TTL allows. Because forwarded copies travel through other pools, the
*origin* signs the announcement (its hop-by-hop transport signature would only vouch for the
last forwarder):

* the signature is Ed25519 (``cryptography``) over a canonical msgpack encoding of every field
  the origin sets (:func:`signed_bytes`), prefixed with a domain string so that it can never be
  mistaken for a signature over some other structure;
* the announcement carries the origin's raw public key; a receiver checks that
  ``SHA-1(public key)`` is the origin's node id (ids are self-certifying, see
  ``overlay/identity.py``), so nobody can announce for a pool whose key it does not hold;
* ``hops`` is the one field a forwarder changes and so the one field outside the signature —
  as IPsec AH leaves IP's TTL out of its integrity check (RFC 4302 §3.3.3.1.1.1). A forwarder
  that lies about ``hops`` can at most change how much further honest pools forward it, which
  the signed ``ttl`` still bounds;
* freshness: ``issued_at_s`` (origin clock) + ``valid_for_s`` bounds the life of a copy, and a
  per-origin sequence number makes a replayed older copy detectable (see ``announce.py``).

In the simulator signing may be switched off for speed (no key, empty signature); a receiver
with ``require_signatures`` drops unsigned announcements.

A :class:`BlacklistShare` goes from a pool to a pool it trusts: one hop to a pool it knows,
where the transport's authentication of its sender is all the origin it needs, or routed over
the overlay to a pool named by its node id, signed by its sender like an announcement (see
:mod:`discovery.flock_blacklist`).
"""

from __future__ import annotations

import attrs
import msgpack

from discovery.signing import (
    Ed25519Signer,
    KeyCache,
    Signer,
    check,
    sign_message,
    verify_message,
)
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.messages import Message, register

__all__ = [
    "ANNOUNCE_DOMAIN",
    "BLACKLIST_DOMAIN",
    "FLOCK_APP",
    "AnnounceSigner",
    "BlacklistShare",
    "FlockAnnounce",
    "IdentitySigner",
    "KeyCache",
    "sign_announce",
    "sign_share",
    "signed_bytes",
    "verify_announce",
    "verify_share",
]

#: prefix of the signed bytes (domain separation: a signature over an announcement can never
#: verify as a signature over anything else the project signs)
ANNOUNCE_DOMAIN = b"flockring/flock-announce/v1"


@register(110)
@attrs.frozen(slots=True)
class FlockAnnounce(Message):
    """A pool's resource announcement (Butt et al. 2006 §3.2, §4.1)."""

    #: the announcing pool's central manager on the overlay (id + address)
    origin: NodeHandle
    #: raw Ed25519 public key of the origin (empty when unsigned); SHA-1 of it is ``origin.id``
    public_key: bytes
    #: the origin's collector as HTCondor names it (``host`` or ``host:port``): what FLOCK_TO
    #: lists when we flock there
    collector: str
    #: the origin pool's name (informational)
    pool_name: str
    #: free machines offered to the receiver (0 withdraws an earlier offer)
    free_machines: int
    #: the origin's idle (queued) jobs
    idle_jobs: int
    #: the origin's utilization, busy machines / machines, in [0, 1]
    utilization: float
    #: origin clock (wall clock on live nodes, virtual time in the simulator) when signed
    issued_at_s: float
    #: how long the offer is valid after ``issued_at_s``
    valid_for_s: float
    #: the TTL the origin chose (Butt et al. 2006 §3.2.2); receivers forward while
    #: ``ttl - hops - 1 > 0``
    ttl: int
    #: the origin's routing-table row this copy was sent along (Pastry); 0 on the small-world
    #: ring, where the receiver's sublist is the hop count instead
    row: int
    #: per-origin sequence number, the same for every copy of one announcement round
    seq: int
    #: the one receiver a tailored offer is meant for (never forwarded); None for the public
    #: offer that forwarders may pass on
    to: NodeId | None
    #: Ed25519 signature of :func:`signed_bytes` (empty when unsigned)
    signature: bytes
    #: forwarding hops so far (0 from the origin); mutable, so not signed
    hops: int = 0


@register(111)
@attrs.frozen(slots=True)
class BlacklistShare(Message):
    """A pool's own blacklist, sent to the pools it trusts with it (Butt et al. 2006 §3.2.1:
    pools "can dynamically learn of 'black listed' pools from other trusted pools")."""

    #: ``(pool, seconds it stays blacklisted at the sender)``, the pool named as the sender's
    #: blacklist names it: 40 hex digits of a node id, or a collector contact; first-hand
    #: entries only (what the sender learned from others is never passed on)
    entries: tuple[tuple[str, float], ...]
    #: per-sender, strictly increasing (milliseconds of its clock): an older share that
    #: arrives late never replaces a newer one
    seq: int
    #: a share routed over the overlay to a pool named by its node id travels through other
    #: pools, so it carries its sender's raw Ed25519 key and signature (empty on a direct,
    #: one-hop share, whose sender the transport authenticated)
    key: bytes = b""
    sig: bytes = b""


#: the application name a Flock registers on its core (routed blacklist shares travel under it)
FLOCK_APP = "flock"

#: prefix of the bytes a routed blacklist share's sender signs
BLACKLIST_DOMAIN = b"flockring/blacklist-share/v1"


def sign_share(m: BlacklistShare, signer: Signer) -> BlacklistShare:
    """``m`` with the signer's key and its signature (for a share routed through others)."""
    return sign_message(m, signer, BLACKLIST_DOMAIN)


def verify_share(m: BlacklistShare, claimed: NodeId, keys: KeyCache | None = None) -> bool:
    """True if ``m`` is signed by ``claimed``'s key."""
    return verify_message(m, claimed, BLACKLIST_DOMAIN, keys)


def signed_bytes(m: FlockAnnounce) -> bytes:
    """The canonical bytes the origin signs: every field but ``signature`` and ``hops``."""
    addr = m.origin.address
    if not isinstance(addr, (int, str)):
        addr = str(addr)
    body = [
        ANNOUNCE_DOMAIN,
        int(m.origin.id).to_bytes(20, "big"),
        addr,
        m.public_key,
        m.collector,
        m.pool_name,
        m.free_machines,
        m.idle_jobs,
        float(m.utilization),
        float(m.issued_at_s),
        float(m.valid_for_s),
        m.ttl,
        m.row,
        m.seq,
        None if m.to is None else int(m.to).to_bytes(20, "big"),
    ]
    out: bytes = msgpack.packb(body, use_bin_type=True)
    return out


#: what the Flock needs to sign its announcements (one signer serves every plugin of a node)
AnnounceSigner = Signer


def IdentitySigner(identity: object) -> Ed25519Signer:
    """The signer of an ``overlay.Identity`` (see :meth:`Ed25519Signer.from_identity`)."""
    return Ed25519Signer.from_identity(identity)


def sign_announce(m: FlockAnnounce, signer: AnnounceSigner) -> FlockAnnounce:
    """``m`` with the signer's public key and a signature over its fields."""
    m = attrs.evolve(m, public_key=signer.public_key, signature=b"")
    return attrs.evolve(m, signature=signer.sign(signed_bytes(m)))


def verify_announce(m: FlockAnnounce, keys: KeyCache | None = None) -> str | None:
    """Check the origin signature. Returns None when valid, else the reason:
    ``"unsigned"`` (no key or signature), ``"forged"`` (the key does not hash to the origin's
    id: someone announcing for a pool whose key it does not hold) or ``"tampered"`` (the
    signature does not verify: a field changed after signing, or a signature not made with
    the origin's key)."""
    if not m.public_key or not m.signature:
        return "unsigned"
    return check(m.public_key, m.signature, signed_bytes(m), m.origin.id, keys)
