"""The Noise XX handshake ``Noise_XX_25519_ChaChaPoly_BLAKE2s`` on ``cryptography`` (security.md).

Theory of operation: this is the handshake of the Noise Protocol Framework (Trevor Perrin, "The
Noise Protocol Framework", revision 34, 2018), restricted to what sessions between two live
nodes need, and written against the specification's own pseudo-code so it can be read side by
side with it:

* §4 crypto functions: ``DH`` = X25519, ``ENCRYPT`` = ChaCha20-Poly1305 (IETF, 96-bit nonce =
  32 zero bits + the 64-bit counter little-endian, §12.3), ``HASH`` = BLAKE2s (32 bytes, block
  64), ``HKDF`` built on HMAC-BLAKE2s exactly as §4.3 defines it;
* §5.1 :class:`CipherState`-like ``k, n`` and §5.2 :class:`SymmetricState` (``MixKey``,
  ``MixHash``, ``EncryptAndHash``, ``DecryptAndHash``, ``Split``);
* §5.3 :class:`XXHandshake`, a ``HandshakeState`` for the one pattern used (§7.5)::

      XX:
        -> e
        <- e, ee, s, es
        -> s, se

XX is the pattern for peers that do not know each other's static key in advance (a node knows
a peer only by its id, the SHA-1 of an Ed25519 key, and its address): both static keys travel
encrypted, the responder's in message 2 (under ``ee``), the initiator's in message 3 (under
``ee`` + ``es``). The static keys here are X25519 keys; which node identity a static key speaks
for is carried in the handshake payloads and checked by :mod:`transports.session`.

Checked against the cacophony test vector for this protocol name and against the
``noiseprotocol`` package (``tests/test_session_noise.py``). Anything malformed raises
:class:`NoiseError` (callers count and drop; nothing else escapes).
"""

from __future__ import annotations

import hashlib
import hmac

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

__all__ = [
    "DHLEN",
    "PROTOCOL_NAME",
    "TAGLEN",
    "NoiseError",
    "SymmetricState",
    "XXHandshake",
    "decrypt",
    "encrypt",
    "hkdf",
    "public_raw",
]

PROTOCOL_NAME = b"Noise_XX_25519_ChaChaPoly_BLAKE2s"
DHLEN = 32
HASHLEN = 32
TAGLEN = 16
#: §5.1: 2^64 - 1 is reserved; a CipherState refuses to use it
MAX_NONCE = (1 << 64) - 1

#: §7.5 pattern XX, message by message (initiator writes messages 0 and 2)
_XX = (("e",), ("e", "ee", "s", "es"), ("s", "se"))


class NoiseError(ValueError):
    """A handshake or transport message that does not decrypt or does not parse."""


def public_raw(key: X25519PrivateKey) -> bytes:
    """The raw 32-byte X25519 public key of ``key``."""
    return key.public_key().public_bytes_raw()


def _nonce(n: int) -> bytes:
    return b"\x00\x00\x00\x00" + n.to_bytes(8, "little")


def encrypt(k: bytes, n: int, ad: bytes, plaintext: bytes) -> bytes:
    """§4.2 ``ENCRYPT(k, n, ad, plaintext)``: ChaCha20-Poly1305, ciphertext || 16-byte tag.

    The AEAD object is made per call (~1 µs): one held per session would cost ~2.5 KiB of
    OpenSSL context each."""
    return ChaCha20Poly1305(k).encrypt(_nonce(n), plaintext, ad)


def decrypt(k: bytes, n: int, ad: bytes, ciphertext: bytes) -> bytes:
    """§4.2 ``DECRYPT``; raises :class:`NoiseError` when the tag does not verify."""
    try:
        return ChaCha20Poly1305(k).decrypt(_nonce(n), ciphertext, ad)
    except InvalidTag:
        raise NoiseError("authentication failed") from None


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.blake2s).digest()


def hkdf(chaining_key: bytes, ikm: bytes) -> tuple[bytes, bytes]:
    """§4.3 ``HKDF(chaining_key, input_key_material, 2)``."""
    temp = _hmac(chaining_key, ikm)
    out1 = _hmac(temp, b"\x01")
    out2 = _hmac(temp, out1 + b"\x02")
    return out1, out2


def _dh(private: X25519PrivateKey, public: bytes) -> bytes:
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError:  # not a point, or a small-order point (an all-zero shared secret)
        raise NoiseError("bad public key") from None


class SymmetricState:
    """§5.2: chaining key ``ck``, handshake hash ``h`` and the CipherState ``k``, ``n``."""

    __slots__ = ("ck", "h", "k", "n")

    def __init__(self, protocol_name: bytes = PROTOCOL_NAME) -> None:
        if len(protocol_name) <= HASHLEN:
            h = protocol_name.ljust(HASHLEN, b"\x00")
        else:
            h = hashlib.blake2s(protocol_name).digest()
        self.h = h
        self.ck = h
        self.k: bytes | None = None
        self.n = 0

    def mix_key(self, ikm: bytes) -> None:
        """``MixKey``: ``ck, temp_k = HKDF(ck, ikm, 2)``; ``InitializeKey(temp_k)``."""
        self.ck, self.k = hkdf(self.ck, ikm)
        self.n = 0

    def mix_hash(self, data: bytes) -> None:
        """``MixHash``: ``h = HASH(h || data)``."""
        self.h = hashlib.blake2s(self.h + data).digest()

    def encrypt_and_hash(self, plaintext: bytes) -> bytes:
        """``EncryptAndHash`` (plaintext passes unchanged before the first ``MixKey``)."""
        if self.k is None:
            out = plaintext
        else:
            out = encrypt(self.k, self.n, self.h, plaintext)
            self.n += 1
        self.mix_hash(out)
        return out

    def decrypt_and_hash(self, data: bytes) -> bytes:
        """``DecryptAndHash``; raises :class:`NoiseError` if the tag does not verify."""
        if self.k is None:
            out = data
        else:
            out = decrypt(self.k, self.n, self.h, data)
            self.n += 1
        self.mix_hash(data)
        return out

    def split(self) -> tuple[bytes, bytes]:
        """``Split``: the two transport keys (initiator-to-responder, responder-to-initiator)."""
        return hkdf(self.ck, b"")


class XXHandshake:
    """One side of a Noise XX handshake (§5.3 ``HandshakeState`` for pattern XX).

    ``XXHandshake(initiator, static, prologue)``; then alternately :meth:`write_message` and
    :meth:`read_message` — the initiator writes messages 1 and 3, the responder message 2. After
    the third message :meth:`split` gives ``(send_key, receive_key)`` for this side and
    :attr:`remote_static` is the peer's authenticated static key. ``ephemeral`` is for test
    vectors only (the default draws a fresh key from the OS CSPRNG through OpenSSL).
    """

    __slots__ = ("_e", "_re", "_s", "_step", "initiator", "remote_static", "ss")

    def __init__(
        self,
        initiator: bool,
        static: X25519PrivateKey,
        prologue: bytes = b"",
        *,
        ephemeral: X25519PrivateKey | None = None,
    ) -> None:
        self.initiator = initiator
        self._s = static
        self._e = ephemeral
        self._re = b""
        self.remote_static = b""
        self._step = 0
        self.ss = SymmetricState()
        self.ss.mix_hash(prologue)  # XX has no pre-messages

    @property
    def finished(self) -> bool:
        """True after the third message (keys may be split)."""
        return self._step == len(_XX)

    @property
    def handshake_hash(self) -> bytes:
        """``h``: after the handshake, a unique identifier of this session (§11.2)."""
        return self.ss.h

    def _my_turn(self) -> bool:
        return (self._step % 2 == 0) == self.initiator

    def _dh_token(self, token: str) -> bytes:
        # "ee": DH(e, re); "es": initiator DH(e, rs), responder DH(s, re);
        # "se": initiator DH(s, re), responder DH(e, rs)
        assert self._e is not None
        if token == "ee":
            return _dh(self._e, self._re)
        mine_e = (token == "es") == self.initiator
        if mine_e:
            return _dh(self._e, self.remote_static)
        return _dh(self._s, self._re)

    def write_message(self, payload: bytes) -> bytes:
        """The next handshake message, carrying ``payload`` (encrypted once keys exist)."""
        if self.finished or not self._my_turn():
            raise NoiseError("not this side's turn to write")
        ss = self.ss
        out: list[bytes] = []
        for token in _XX[self._step]:
            if token == "e":
                if self._e is None:
                    self._e = X25519PrivateKey.generate()
                pub = public_raw(self._e)
                ss.mix_hash(pub)
                out.append(pub)
            elif token == "s":
                out.append(ss.encrypt_and_hash(public_raw(self._s)))
            else:
                ss.mix_key(self._dh_token(token))
        out.append(ss.encrypt_and_hash(payload))
        self._step += 1
        return b"".join(out)

    def read_message(self, message: bytes) -> bytes:
        """Process the peer's next handshake message; return its payload (NoiseError if bad)."""
        if self.finished or self._my_turn():
            raise NoiseError("not this side's turn to read")
        ss = self.ss
        message = bytes(message)  # a bytearray or memoryview would reach cryptography's API
        pos = 0
        for token in _XX[self._step]:
            if token == "e":
                if len(message) < pos + DHLEN:
                    raise NoiseError("short handshake message")
                self._re = message[pos : pos + DHLEN]
                pos += DHLEN
                ss.mix_hash(self._re)
            elif token == "s":
                n = DHLEN + (TAGLEN if ss.k is not None else 0)
                if len(message) < pos + n:
                    raise NoiseError("short handshake message")
                self.remote_static = ss.decrypt_and_hash(message[pos : pos + n])
                pos += n
            else:
                ss.mix_key(self._dh_token(token))
        if ss.k is not None and len(message) - pos < TAGLEN:
            raise NoiseError("short handshake message")
        payload = ss.decrypt_and_hash(message[pos:])
        self._step += 1
        return payload

    def split(self) -> tuple[bytes, bytes]:
        """``(send_key, receive_key)`` for this side once the handshake is finished."""
        if not self.finished:
            raise NoiseError("handshake not finished")
        k1, k2 = self.ss.split()
        return (k1, k2) if self.initiator else (k2, k1)
