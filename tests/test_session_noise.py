"""The Noise XX handshake of ``transports.noise`` against the specification's test vectors and an
independent implementation.

* The cacophony test vector for ``Noise_XX_25519_ChaChaPoly_BLAKE2s`` (fixed keys, prologue and
  payloads): every handshake message, the handshake hash and three transport messages must match
  byte for byte.
* The ``noiseprotocol`` package (a separate Python implementation) talks to ours in both roles
  with fresh random keys; each side must read the other's payloads and agree on the keys.
* Tampered messages, small-order keys and out-of-turn calls raise ``NoiseError``.
"""

from __future__ import annotations

import random

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from transports.noise import NoiseError, XXHandshake, decrypt, encrypt, public_raw

# cacophony vectors (the Noise specification's test-vector set), entry
# "Noise_XX_25519_ChaChaPoly_BLAKE2s"
VEC = {
    "prologue": "4a6f686e2047616c74",
    "init_static": "e61ef9919cde45dd5f82166404bd08e38bceb5dfdfded0a34c8df7ed542214d1",
    "init_ephemeral": "893e28b9dc6ca8d611ab664754b8ceb7bac5117349a4439a6b0569da977c464a",
    "resp_static": "4a3acbfdb163dec651dfa3194dece676d437029c62a408b4c5ea9114246e4893",
    "resp_ephemeral": "bbdb4cdbd309f1a1f2e1456967fe288cadd6f712d65dc7b7793d5e63da6b375b",
    "handshake_hash": "6c4c56cf71612f72d05ceb96c0155e6f4ea54a26b504c93de632a2db4a49d200",
    "messages": [
        (
            "4c756477696720766f6e204d69736573",
            "ca35def5ae56cec33dc2036731ab14896bc4c75dbb07a61f879f8e3afa4c7944"
            "4c756477696720766f6e204d69736573",
        ),
        (
            "4d757272617920526f746862617264",
            "95ebc60d2b1fa672c1f46a8aa265ef51bfe38e7ccb39ec5be34069f144808843"
            "7c365eb362a1c991b0557fe8a7fb187d99346765d93ec63db6c1b01504ebeec5"
            "5a2298d2dbff80eff034d20595153f63a196a6cead1e11b2bb13e336fa13616d"
            "d3e8b0a070c882ed3f1a78c7c06c93",
        ),
        (
            "462e20412e20486179656b",
            "46c3307de83b014258717d97781c1f50936d8b7d50c0722a1739654d10392d41"
            "5b670c114f79b9a4f80541570f77ce88802efa4220cff733e7b5668ba38059ec"
            "904b4b8eef9448085faf51",
        ),
        ("4361726c204d656e676572", "d5e83adfaac5dc324a68f1862df54549e56d209fba707205f328b2"),
        (
            "4a65616e2d426170746973746520536179",
            "d102c9029b1f55c788f561ba7737afbccef9c9f1bf2f238167fd40ba9c1c134867",
        ),
        (
            "457567656e2042f6686d20766f6e2042617765726b",
            "cb1ce80960382c6d5d5e740ffb724d1432f0310b200fb6f8424120f506092744baa415e155",
        ),
    ],
}


def _key(name: str) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(bytes.fromhex(str(VEC[name])))


def test_cacophony_vector_byte_for_byte() -> None:
    prologue = bytes.fromhex(str(VEC["prologue"]))
    i = XXHandshake(True, _key("init_static"), prologue, ephemeral=_key("init_ephemeral"))
    r = XXHandshake(False, _key("resp_static"), prologue, ephemeral=_key("resp_ephemeral"))
    msgs = [(bytes.fromhex(p), bytes.fromhex(c)) for p, c in VEC["messages"]]
    writer, reader = i, r
    for payload, cipher in msgs[:3]:
        out = writer.write_message(payload)
        assert out == cipher
        assert reader.read_message(out) == payload
        writer, reader = reader, writer
    assert i.finished and r.finished
    assert i.handshake_hash.hex() == VEC["handshake_hash"] == r.handshake_hash.hex()
    assert r.remote_static == public_raw(_key("init_static"))
    assert i.remote_static == public_raw(_key("resp_static"))
    # transport messages alternate starting with the responder; nonces count per direction
    i_send, i_recv = i.split()
    r_send, r_recv = r.split()
    assert (i_send, i_recv) == (r_recv, r_send)
    (p3, c3), (p4, c4), (p5, c5) = msgs[3:]
    assert encrypt(r_send, 0, b"", p3) == c3 and decrypt(i_recv, 0, b"", c3) == p3
    assert encrypt(i_send, 0, b"", p4) == c4 and decrypt(r_recv, 0, b"", c4) == p4
    assert encrypt(r_send, 1, b"", p5) == c5 and decrypt(i_recv, 1, b"", c5) == p5


def _run_with_noiseprotocol(ours_initiates: bool, seed: int) -> None:
    noise_conn = pytest.importorskip("noise.connection")
    rng = random.Random(seed)
    mine = X25519PrivateKey.generate()
    theirs = X25519PrivateKey.generate()
    prologue = rng.randbytes(rng.randrange(0, 40))
    payloads = [rng.randbytes(rng.randrange(0, 300)) for _ in range(3)]
    conn = noise_conn.NoiseConnection.from_name(b"Noise_XX_25519_ChaChaPoly_BLAKE2s")
    conn.set_keypair_from_private_bytes(noise_conn.Keypair.STATIC, theirs.private_bytes_raw())
    conn.set_prologue(prologue)
    if ours_initiates:
        conn.set_as_responder()
    else:
        conn.set_as_initiator()
    conn.start_handshake()
    us = XXHandshake(ours_initiates, mine, prologue)
    for step, payload in enumerate(payloads):
        ours_writes = (step % 2 == 0) == ours_initiates
        if ours_writes:
            assert conn.read_message(us.write_message(payload)) == payload
        else:
            assert us.read_message(conn.write_message(payload)) == payload
    assert us.finished and conn.handshake_finished
    assert us.remote_static == public_raw(theirs)
    assert us.handshake_hash == conn.get_handshake_hash()
    send, recv = us.split()
    msg = rng.randbytes(64)
    assert conn.decrypt(encrypt(send, 0, b"", msg)) == msg
    assert decrypt(recv, 0, b"", conn.encrypt(msg)) == msg


@pytest.mark.parametrize("seed", range(4))
def test_interoperates_with_the_noiseprotocol_package_as_initiator(
    seed: int,
) -> None:
    _run_with_noiseprotocol(True, seed)


@pytest.mark.parametrize("seed", range(4))
def test_interoperates_with_the_noiseprotocol_package_as_responder(
    seed: int,
) -> None:
    _run_with_noiseprotocol(False, seed)


def _pair() -> tuple[XXHandshake, XXHandshake]:
    return (
        XXHandshake(True, X25519PrivateKey.generate(), b"p"),
        XXHandshake(False, X25519PrivateKey.generate(), b"p"),
    )


@pytest.mark.parametrize("step", [0, 1, 2])
def test_a_flipped_bit_in_any_encrypted_part_is_refused(step: int) -> None:
    rng = random.Random(step)
    for _ in range(20):
        i, r = _pair()
        msgs = []
        m = i.write_message(b"one")
        msgs.append(m)
        if step == 0:
            # message 1 is plaintext by design (only its ephemeral key and an unauthenticated
            # payload): a change there breaks the handshake hash, so message 2 cannot be read
            bad = bytearray(m)
            bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
            r.read_message(bytes(bad))
            with pytest.raises(NoiseError):
                i.read_message(r.write_message(b"two"))
            continue
        r.read_message(m)
        m = r.write_message(b"two")
        if step == 1:
            bad = bytearray(m)
            bad[rng.randrange(32, len(bad))] ^= 1 << rng.randrange(8)  # after the clear e
            with pytest.raises(NoiseError):
                i.read_message(bytes(bad))
            continue
        i.read_message(m)
        bad = bytearray(i.write_message(b"three"))
        bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        with pytest.raises(NoiseError):
            r.read_message(bytes(bad))


def test_small_order_keys_short_messages_and_wrong_turns_raise() -> None:
    i, r = _pair()
    with pytest.raises(NoiseError):
        r.write_message(b"")  # the initiator writes first
    with pytest.raises(NoiseError):
        r.read_message(bytes(31))
    _, r2 = _pair()
    r2.read_message(bytes(32))  # an all-zero (small-order) ephemeral key ...
    with pytest.raises(NoiseError):
        r2.write_message(b"")  # ... makes the first DH fail
    m1 = i.write_message(b"")
    r.read_message(m1)
    m2 = r.write_message(b"x")
    with pytest.raises(NoiseError):
        i.read_message(m2[:60])
    with pytest.raises(NoiseError):
        i.split()
