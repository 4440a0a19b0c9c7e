"""What pair frames cost a signed bring-up beyond an unsigned one, bounded by stubbing.

Runs the worker of ``flockring bench live`` (one swarm on loopback UDP in this process) with
parts of the pair-frame path replaced by stand-ins, so that the difference between runs is what
those parts cost (docs/live.md, "Footprint"):

* ``--stub none``: the real thing (as ``python -m sim_adapter.bench.live --worker``);
* ``--stub x25519``: each X25519 replaced by a BLAKE2s of the two X25519 public keys (symmetric,
  so both sides of a pair still agree on the key and every frame still opens);
* ``--stub all``: the X25519 as above, the BLAKE2s tag replaced by a constant and the replay
  table's checks by "accept".

Measurement only: a stubbed run authenticates nothing. Compare with ``--signing off`` (the
worker's own unsigned mode) in the same sitting, interleaving the runs, since the machine's
load moves between them. Run:
``.venv/bin/python benchmarks/pair_cost_bounds.py --stub all --nodes 1000 --lookups 100``
(every argument after ``--stub`` goes to the worker; ``--signing on`` is its default).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from typing import Any

from nacl.bindings import crypto_scalarmult_base

import transports.auth as auth
import transports.pair as pair
from sim_adapter.bench.live import _worker_main

_REAL_BLAKE2S = hashlib.blake2s


def _stub_x25519() -> None:
    publics: dict[bytes, bytes] = {}

    def fake(scalar: bytes, peer_public: bytes) -> bytes:
        mine = publics.get(scalar)
        if mine is None:
            mine = publics[scalar] = crypto_scalarmult_base(scalar)
        lo, hi = sorted((mine, peer_public))
        return _REAL_BLAKE2S(lo + hi).digest()

    vars(pair)["crypto_scalarmult"] = fake  # the name transports.pair calls


class _ConstantTag:
    def digest(self) -> bytes:
        return bytes(pair.TAGLEN)


class _HashlibWithoutTags:
    """``hashlib`` as ``transports.pair`` uses it, with the 16-byte tag made constant."""

    sha512 = staticmethod(hashlib.sha512)

    @staticmethod
    def blake2s(data: Any = b"", *, key: bytes = b"", digest_size: int = 32) -> Any:
        if digest_size == pair.TAGLEN:
            return _ConstantTag()
        return _REAL_BLAKE2S(data, key=key, digest_size=digest_size)


def _stub_tag_and_replay() -> None:
    vars(pair)["hashlib"] = _HashlibWithoutTags

    def replayed(self: auth.Verifier, sender: bytes, seq: int) -> bool:
        return False

    def replay_ok(self: auth.Verifier, sender: bytes, seq: int) -> bool:
        self.last_recent = 1
        return True

    auth.Verifier._replayed = replayed  # type: ignore[method-assign]
    auth.Verifier._replay_ok = replay_ok  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--stub", choices=("none", "x25519", "all"), required=True)
    a, rest = ap.parse_known_args(argv)
    if a.stub in ("x25519", "all"):
        _stub_x25519()
    if a.stub == "all":
        _stub_tag_and_replay()
    return _worker_main(["--worker", *rest])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
