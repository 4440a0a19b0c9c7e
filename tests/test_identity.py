"""Ed25519 identities: key files with mode 0600, self-certifying ids, clear errors."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest

from overlay.errors import OverlayError
from overlay.identity import Identity, IdentityError
from overlay.ids import NodeId


def test_load_or_create_persists_with_mode_0600(tmp_path: Path) -> None:
    p = tmp_path / "node.key"
    a = Identity.load_or_create(p)
    assert p.stat().st_mode & 0o777 == 0o600
    b = Identity.load_or_create(p)
    assert a == b and a.id == b.id
    assert a.id == NodeId(int.from_bytes(hashlib.sha1(a.public_bytes).digest(), "big"))
    assert len(a.public_bytes) == 32
    assert b"PRIVATE KEY" in p.read_bytes()


def test_fresh_identities_differ_and_seeded_ones_repeat() -> None:
    assert Identity.generate().id != Identity.generate().id
    assert Identity.from_seed(b"\x07" * 32) == Identity.from_seed(b"\x07" * 32)
    assert Identity.from_rng(random.Random(3)).id == Identity.from_rng(random.Random(3)).id


def test_refuses_group_readable_key(tmp_path: Path) -> None:
    p = tmp_path / "k"
    Identity.generate().save(p)
    p.chmod(0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        Identity.load(p)


@pytest.mark.parametrize("content", [b"", b"not a key", b"-----BEGIN PRIVATE KEY-----\nxx\n"])
def test_garbage_key_file_is_a_clear_error(tmp_path: Path, content: bytes) -> None:
    p = tmp_path / "k"
    p.write_bytes(content)
    p.chmod(0o600)
    with pytest.raises(IdentityError, match=r"key file .*k (is empty|is not a PEM private key)"):
        Identity.load_or_create(p)


def test_wrong_key_type_and_io_errors(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    p = tmp_path / "ec"
    p.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    p.chmod(0o600)
    with pytest.raises(IdentityError, match="not Ed25519"):
        Identity.load(p)
    with pytest.raises(IdentityError, match="cannot read"):
        Identity.load(tmp_path / "missing")
    with pytest.raises(IdentityError, match="cannot write"):
        Identity.generate().save(tmp_path / "no" / "such" / "dir")
    with pytest.raises(IdentityError, match="already exists"):
        Identity.generate().save(p)
    with pytest.raises(OverlayError):
        Identity.from_seed(b"short")


def test_save_is_atomic_and_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "node.key"
    real_write = os.write

    def crash_mid_write(fd: int, data: bytes) -> int:
        real_write(fd, data[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", crash_mid_write)
    with pytest.raises(IdentityError, match=r"node\.key"):
        Identity.generate().save(p)
    monkeypatch.undo()
    assert not p.exists()  # no empty or half-written key under the real name
    assert list(tmp_path.iterdir()) == []  # and no temporary file left behind
    ident = Identity.load_or_create(p)  # so the next start creates a whole key
    assert Identity.load(p) == ident
    assert p.stat().st_mode & 0o777 == 0o600


def test_second_save_never_overwrites_the_first(tmp_path: Path) -> None:
    p = tmp_path / "node.key"
    first, second = Identity.generate(), Identity.generate()
    first.save(p)
    with pytest.raises(IdentityError, match="already exists"):
        second.save(p)
    assert Identity.load(p) == first
    assert sorted(x.name for x in tmp_path.iterdir()) == ["node.key"]


def test_empty_key_file_is_an_error_naming_it_not_a_new_identity(tmp_path: Path) -> None:
    p = tmp_path / "empty.key"
    p.touch(mode=0o600)
    p.chmod(0o600)
    with pytest.raises(IdentityError, match=r"empty\.key.*empty"):
        Identity.load_or_create(p)
    assert p.read_bytes() == b""  # left for the operator to look at
