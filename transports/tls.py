"""TLS 1.3 for the TCP transport: a self-signed certificate made from the node's Ed25519 key.

Theory of operation: there is no CA. The server presents a certificate over its own node key
(CN = hex SHA-1 of the raw public key, i.e. its node id); the TLS handshake proves possession of
the private key, and the dialling side (:mod:`transports.tcp`) hashes the certificate's key and
hangs up unless it is the id it meant to reach. Clients are authenticated by the signed
envelopes instead (stdlib ``ssl`` cannot accept self-signed client certificates without a CA).
"""

from __future__ import annotations

import datetime
import hashlib
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import NameOID

__all__ = ["certificate_key_hash", "make_certificate", "make_ssl_contexts"]


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
