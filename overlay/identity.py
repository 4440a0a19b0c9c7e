"""Node identity: an Ed25519 key pair whose SHA-1 public-key hash is the NodeId.

Theory of operation (docs/transports.md): ids are *self-certifying* (as in Castro et al., "Secure
routing for structured P2P overlay networks", 2002, and S/Kademlia): ``NodeId = SHA-1(raw 32-byte
Ed25519 public key)``. Every datagram a live node sends is authenticated by the key — signed
with it (``transports/auth.py``), or sealed in a session whose handshake the key vouched for
(``transports/session.py``) — and the receiver recomputes the id from the verified key, so
nobody can speak under an id without its private key. The key is stored as unencrypted PKCS#8
PEM in a file created with mode 0600; loading a key file that group or others may read is
refused, as OpenSSH refuses such private keys. This module does file I/O but no networking and
no clock; key generation uses the ``cryptography`` library's CSPRNG (OpenSSL), never the global
``random``.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
from pathlib import Path

import attrs
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from overlay.errors import OverlayError
from overlay.ids import NodeId

__all__ = ["Identity", "IdentityError"]


class IdentityError(OverlayError):
    """A key file that cannot be read, parsed, written, or is readable by others."""


def _fsync_dir(d: Path) -> None:
    """Make a new directory entry durable (POSIX: fsync the directory)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _raw_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@attrs.frozen(slots=True, eq=False, repr=False)
class Identity:
    """An Ed25519 private key and the NodeId derived from it."""

    private_key: Ed25519PrivateKey
    public_bytes: bytes = attrs.field(init=False)
    id: NodeId = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.private_key, Ed25519PrivateKey):
            raise IdentityError("Identity needs an Ed25519 private key")
        pub = _raw_public(self.private_key)
        object.__setattr__(self, "public_bytes", pub)
        object.__setattr__(self, "id", NodeId.hash_of(pub))

    def __repr__(self) -> str:
        return f"Identity({self.id.short()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identity) and other.public_bytes == self.public_bytes

    def __hash__(self) -> int:
        return hash(self.public_bytes)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def generate(cls) -> Identity:
        """A fresh key from the operating system's CSPRNG (through OpenSSL)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """Deterministic identity from 32 seed bytes (tests and in-memory swarms only)."""
        if not isinstance(seed, bytes) or len(seed) != 32:
            raise IdentityError("Identity.from_seed needs exactly 32 bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def from_rng(cls, rng: random.Random) -> Identity:
        """Deterministic identity drawn from a seeded generator (simulations, test swarms)."""
        return cls.from_seed(rng.getrandbits(256).to_bytes(32, "big"))

    # ------------------------------------------------------------------ files
    def private_pem(self) -> bytes:
        """The private key as unencrypted PKCS#8 PEM (what :meth:`save` writes)."""
        return self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def save(self, path: str | Path) -> None:
        """Write the key to a new file with mode 0600 (an existing file is an error).

        Atomic: the key is written and fsync-ed into a private temporary file in the same
        directory, which is then hard-linked to ``path`` (``link`` fails if ``path`` exists, so
        two processes racing to create the same key file cannot overwrite each other) and
        removed. A crash leaves either no key file or a whole one, never an empty one.
        """
        p = Path(path)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.fchmod(fd, 0o600)  # O_CREAT honours the umask, which may only remove bits
                os.write(fd, self.private_pem())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.link(tmp, p)
            _fsync_dir(p.parent)
        except FileExistsError:
            raise IdentityError(f"key file {p} already exists") from None
        except OSError as exc:
            raise IdentityError(f"cannot write key file {p}: {exc.strerror or exc}") from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    @classmethod
    def load(cls, path: str | Path) -> Identity:
        """Read a PKCS#8 PEM Ed25519 key; refuses files readable by group or others."""
        p = Path(path)
        try:
            mode = p.stat().st_mode
            data = p.read_bytes()
        except OSError as exc:
            raise IdentityError(f"cannot read key file {p}: {exc.strerror or exc}") from None
        if mode & 0o077:
            raise IdentityError(
                f"key file {p} is accessible by others (mode {mode & 0o777:o}); run: chmod 600 {p}"
            )
        if not data.strip():
            raise IdentityError(f"key file {p} is empty (delete it to create a new identity)")
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise IdentityError(f"key file {p} is not a PEM private key: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(f"key file {p} holds a {type(key).__name__}, not Ed25519")
        return cls(key)

    @classmethod
    def load_or_create(cls, path: str | Path) -> Identity:
        """Load the key at ``path``, or create one there (mode 0600) if the file is absent."""
        p = Path(path)
        if not p.exists():
            ident = cls.generate()
            try:
                ident.save(p)
            except IdentityError:
                if not p.exists():
                    raise
                return cls.load(p)  # lost a creation race: use the winner's key
            return ident
        return cls.load(p)
