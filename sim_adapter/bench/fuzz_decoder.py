"""The decoder target of ``flockring bench fuzz`` and the mutator both targets use.

The campaign as a whole (``flockring bench fuzz``, :mod:`sim_adapter.bench.fuzz`):

Theory of operation. Two targets, each fed ``--inputs`` inputs, every one counted:

* **decoder** (in process, no sockets): seed messages of every registered overlay kind are drawn
  by hypothesis from the classes' attrs annotations (ids at the ring's edges, handles, NaN and
  infinite floats, nested messages as payloads), encoded (``overlay/wire.py``) and sealed in a
  signed envelope (``transports/codec.py``). Each input is a seed frame or body, as it is or
  mutated (bit flips, byte stores, truncation, random insertions and deletions, splices of two
  seeds, a msgpack length header set to 2^32 − 1, deep nesting, oversized padding). Frames go
  through the envelope decoder, and the body of any frame that parses through the message
  decoder; bodies go through the message decoder alone. Counted: decoded, dropped by reason
  (the codec's and the wire's counters) and crashes (an exception out of a decoder; must be 0).
  A decoded message must encode again, and an unmutated seed must decode to itself.
* **live**: a node on loopback UDP (signed, sessions on, rate limits counting but not dropping,
  so that every input reaches the deepest layer it can) in a ring of three. Captured real
  traffic (the frames its two peers sent it while joining, routing lookups and probing) is
  replayed as it is and mutated; random datagrams (some with a session frame's first byte);
  envelopes with a flipped signature or a body changed under a valid signature (``forged``);
  unsigned envelopes claiming an id; *spoofed ids*: messages signed by a valid key that claim
  another node's id as their origin or handle (SHA-1 of the key does not match); mutated message
  bodies re-signed with a valid key (so the wire decoder sees them behind a good signature);
  well-formed random messages; oversized (60 KiB) and deeply nested (200 levels) payloads. The
  fuzzer sends in batches and waits until the node has read each batch, so the kernel drops
  nothing unseen; the node's stats then account for every datagram
  (:func:`overlay.live.ratelimit.account`: received = delivered + consumed by the session layer +
  dropped by reason). Crashes: exceptions the node counted and survived — in its receive loop,
  its timers, or a core's handler outside its input checks
  (:func:`sim_adapter.bench.internal_errors`); the node must still answer a lookup and a
  status request at the end.

``--engine atheris`` runs the decoder target under atheris (coverage-guided libFuzzer) instead
of the seeded mutator, where atheris is installed (a throwaway venv: see docs/security.md).
"""

from __future__ import annotations

import importlib
import math
import random
import sys
import traceback
import types
import typing
from collections import Counter
from collections.abc import Hashable
from typing import Any

from sim_adapter import bench

__all__ = [
    "DecoderHarness",
    "atheris_main",
    "hypothesis_seeds",
    "message_strategy",
    "mutate",
    "run_decoder",
]

_EDGE_INTS = (0, 1, -1, 2, 15, 39, 160, (1 << 31) - 1, (1 << 63) - 1, -(1 << 63), (1 << 64) - 1)
_EDGE_FLOATS = (0.0, -1.0, 1e-9, 1e12, -1e12, math.nan, math.inf, -math.inf)


# ------------------------------------------------------------------------- hypothesis seeds
def _kinds() -> list[type[Any]]:
    import overlay.kbr
    import overlay.live.control
    import overlay.multicast
    import overlay.pastry.messages
    import overlay.proximity
    import overlay.smallworld.messages  # noqa: F401
    from overlay.messages import REGISTRY

    return [c for _, c in sorted(REGISTRY.items()) if c.__module__.startswith("overlay.")]


def message_strategy(max_depth: int = 2) -> Any:
    """A hypothesis strategy for messages of every overlay kind (valid for their validators)."""
    import attrs
    from hypothesis import assume
    from hypothesis import strategies as st

    from overlay.handle import NodeHandle
    from overlay.ids import NodeId
    from overlay.messages import Message

    ids = st.one_of(
        st.integers(0, (1 << 160) - 1), st.sampled_from((0, 1, (1 << 159), (1 << 160) - 1))
    ).map(NodeId)
    addrs = st.one_of(
        st.sampled_from(("udp://127.0.0.1:1", "udp://[::1]:9", "mem://3", "")),
        st.integers(-5, 1 << 20),
        st.text(max_size=40),
    )
    handles = st.builds(NodeHandle, ids, addrs)
    scalars: dict[Any, Any] = {
        int: st.one_of(st.sampled_from(_EDGE_INTS), st.integers(-(1 << 63), (1 << 64) - 1)),
        float: st.one_of(st.sampled_from(_EDGE_FLOATS), st.floats()),
        str: st.one_of(st.sampled_from(("flockring.lookup", "multicast", "")), st.text()),
        bytes: st.binary(max_size=64),
        bool: st.booleans(),
        NodeId: ids,
        NodeHandle: handles,
        type(None): st.none(),
        None: st.none(),
    }
    kinds = _kinds()
    hints: dict[type[Any], dict[str, Any]] = {}

    def value(tp: Any, depth: int) -> Any:
        if tp in scalars:
            return scalars[tp]
        if tp is Any or tp is object or tp is Hashable:
            leaves = st.one_of(scalars[int], scalars[float], scalars[str], handles, st.none())
            if depth >= max_depth:
                return leaves
            return st.one_of(leaves, st.tuples(leaves, leaves), message(depth + 1))
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Union or origin is types.UnionType:
            return st.one_of(*(value(a, depth) for a in args))
        if origin is typing.Literal:
            return st.sampled_from(args)
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return st.lists(value(args[0], depth + 1), max_size=4).map(tuple)
            return st.tuples(*(value(a, depth + 1) for a in args))
        if origin in (list, frozenset, set):
            return st.lists(value(args[0], depth + 1), max_size=3).map(origin)
        if origin is dict:
            return st.dictionaries(value(args[0], depth + 1), value(args[1], depth + 1), max_size=2)
        if isinstance(tp, type) and issubclass(tp, Message):
            return message(depth + 1)
        if isinstance(tp, type) and attrs.has(tp):
            return build(tp, depth + 1)
        return st.none()

    def build(cls: type[Any], depth: int) -> Any:
        h = hints.get(cls)
        if h is None:
            h = hints[cls] = typing.get_type_hints(cls)
        fields = [value(h[a.name], depth) for a in attrs.fields(cls)]

        def make(vals: tuple[Any, ...]) -> Any:
            try:
                return cls(*vals)
            except Exception:  # the class's own validators refused: draw again
                assume(False)
                raise

        return st.tuples(*fields).map(make)

    def message(depth: int) -> Any:
        return st.sampled_from(kinds).flatmap(lambda c: build(c, depth))

    return message(0)


def hypothesis_seeds(count: int, seed: int) -> list[Any]:
    """``count`` messages drawn by hypothesis (derandomized by ``seed``; no database)."""
    import warnings

    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seed_with

    out: list[Any] = []

    @settings(
        max_examples=count, database=None, deadline=None,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @seed_with(seed)
    @given(message_strategy())
    def collect(m: Any) -> None:
        out.append(m)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collect()
    return out


# ------------------------------------------------------------------------- mutation
def _deep(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"  # [[[...[nil]...]]]


def mutate(data: bytes, rng: random.Random, pool: list[bytes]) -> bytes:
    """One random mutation of ``data`` (``pool``: other inputs to splice with)."""
    b = bytearray(data)
    op = rng.randrange(12)
    n = len(b)
    if op == 0 and n:  # flip a few bits
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(n)
            b[i] ^= 1 << rng.randrange(8)
    elif op == 1 and n:  # store interesting bytes
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(n)] = rng.choice((0, 0x7F, 0x80, 0xC0, 0xC1, 0xDC, 0xDD, 0xDF, 0xFF))
    elif op == 2 and n:  # truncate
        del b[rng.randrange(n) :]
    elif op == 3:  # insert random bytes
        i = rng.randrange(n + 1)
        b[i:i] = rng.randbytes(rng.randint(1, 16))
    elif op == 4 and n:  # delete a range
        i = rng.randrange(n)
        del b[i : i + rng.randint(1, 16)]
    elif op == 5 and pool:  # splice with another input
        o = rng.choice(pool)
        b = b[: rng.randrange(n + 1)] + o[rng.randrange(len(o) + 1) :]
    elif op == 6 and n:  # a length header claiming 2^32 - 1 items / bytes
        i = rng.randrange(n)
        b[i : i + 1] = rng.choice((b"\xdd", b"\xdf", b"\xc6", b"\xdb")) + b"\xff\xff\xff\xff"
    elif op == 7:  # deep nesting spliced in
        i = rng.randrange(n + 1)
        b[i:i] = _deep(rng.choice((30, 200, 5000)))
    elif op == 8:  # oversized: pad towards / past the frame limit
        b += bytes(rng.choice((1000, 40_000, 70_000)))
    elif op == 9 and n:  # duplicate a chunk
        i = rng.randrange(n)
        b[i:i] = b[i : i + rng.randint(1, 64)]
    elif op == 10 and n:  # overwrite a random int-like region
        i = rng.randrange(n)
        b[i : i + 8] = rng.randbytes(8)
    else:  # random bytes in place of the input
        b = bytearray(rng.randbytes(rng.randint(0, 300)))
    return bytes(b)


# ------------------------------------------------------------------------- decoder target
class DecoderHarness:
    """Feeds inputs to the envelope and message decoders and counts each one's fate."""

    def __init__(self) -> None:
        from overlay.wire import Wire
        from transports.codec import Codec, Limits

        self.codec = Codec(Limits())
        self.wire = Wire(Limits())
        self.fates: Counter[str] = Counter()
        self.crashes: list[str] = []

    def _decode_body(self, body: bytes) -> Any:
        from overlay.wire import encode_message

        msg = self.wire.decode(body)
        if msg is None:
            return None
        try:
            encode_message(msg)
        except Exception:
            self.fates["reencode_failed"] += 1
        return msg

    def frame(self, data: bytes) -> None:
        """One input: a whole envelope."""
        try:
            f = self.codec.unpack_fields(data)
            if f is None:
                self.fates["frame_dropped"] += 1
            elif self._decode_body(f[5]) is None:
                self.fates["frame_body_dropped"] += 1
            else:
                self.fates["frame_decoded"] += 1
        except Exception:
            self.fates["crash"] += 1
            if len(self.crashes) < 5:
                self.crashes.append(traceback.format_exc())

    def body(self, data: bytes) -> None:
        """One input: a message body."""
        try:
            ok = self._decode_body(data) is not None
            self.fates["body_decoded" if ok else "body_dropped"] += 1
        except Exception:
            self.fates["crash"] += 1
            if len(self.crashes) < 5:
                self.crashes.append(traceback.format_exc())

    def report(self) -> dict[str, Any]:
        """Inputs, fates, drop reasons and the balance check."""
        f = self.fates
        inputs = sum(v for k, v in f.items() if k != "reencode_failed")
        codec_drops = dict(self.codec.counters)
        wire = dict(self.wire.counters)
        wire_drops = {k: v for k, v in wire.items() if k != "decoded"}
        bodies_in = f["frame_body_dropped"] + f["frame_decoded"] + f["body_dropped"]
        bodies_in += f["body_decoded"]
        balanced = (
            sum(codec_drops.values()) == f["frame_dropped"]
            and sum(wire.values()) == bodies_in
            and wire.get("decoded", 0) == f["frame_decoded"] + f["body_decoded"]
        )
        return {
            "inputs": inputs,
            "decoded": f["frame_decoded"] + f["body_decoded"],
            "dropped": {**{"codec." + k: v for k, v in sorted(codec_drops.items())},
                        **{"wire." + k: v for k, v in sorted(wire_drops.items())}},
            "fates": dict(sorted(f.items())),
            "crashes": f["crash"],
            "crash_tracebacks": self.crashes,
            "balanced": balanced and inputs == sum(codec_drops.values()) + bodies_in + f["crash"],
        }  # fmt: skip


def _seed_inputs(seeds: list[Any], seed: int) -> tuple[list[bytes], list[bytes], int]:
    """Bodies and signed frames of the seed messages; round-trip mismatches counted."""
    from overlay.identity import Identity
    from overlay.wire import Wire, WireError, encode_message
    from transports.auth import Signer

    signer = Signer(Identity.from_rng(random.Random(seed)).private_key)
    wire = Wire()
    bodies: list[bytes] = []
    frames: list[bytes] = []
    mismatches = 0
    for m in seeds:
        try:
            body = encode_message(m)
        except WireError:
            continue  # a value the wire refuses to send (e.g. an int past 64 bits)
        back = wire.decode(body)
        if back is None or (back != m and repr(back) != repr(m)):  # NaN != NaN: compare reprs
            mismatches += 1
        bodies.append(body)
        frames.append(signer.seal("udp://127.0.0.1:9", body, bytes(20)))
    return bodies, frames, mismatches


def run_decoder(inputs: int, seed: int = 1, seeds: int = 2000) -> dict[str, Any]:
    """The decoder target: ``inputs`` inputs from ``seeds`` hypothesis-drawn messages."""
    from transports.codec import pack_envelope

    rng = random.Random(seed)
    with bench.stopwatch() as gen:
        msgs = hypothesis_seeds(seeds, seed)
        bodies, frames, mismatches = _seed_inputs(msgs, seed)
        for depth in (25, 200, 1000):  # deep nesting inside a valid message, as it is
            bodies.append(deep_body(depth))
            frames.append(pack_envelope(bytes(32), 1, "", None, bodies[-1], bytes(64)))
    h = DecoderHarness()
    with bench.stopwatch() as t:
        for i in range(inputs):
            as_frame = i % 2 == 0
            pool = frames if as_frame else bodies
            data = pool[rng.randrange(len(pool))]
            if rng.random() < 0.95:
                data = mutate(data, rng, pool)
            (h.frame if as_frame else h.body)(data)
    out = h.report()
    out.update(
        seed_messages=len(msgs),
        seed_kinds=len({type(m) for m in msgs}),
        seed_roundtrip_mismatches=mismatches,
        hypothesis_s=bench.r(gen(), 1),
        fuzz_s=bench.r(t(), 1),
        inputs_per_s=bench.r(inputs / t(), 0) if t() else None,
    )
    return out


def atheris_main(runs: int, seed: int) -> None:
    """Run the decoder target under atheris for ``runs`` inputs (atheris must be importable)."""
    atheris: Any = importlib.import_module("atheris")

    h = DecoderHarness()  # imports the decoders
    import inspect

    import overlay.wire
    import transports.codec

    # coverage feedback from the decoders' code (already imported: instrumented in place; the
    # whole process with instrument_all() takes minutes to set up)
    for mod in (overlay.wire, transports.codec):
        for obj in vars(mod).values():
            members = vars(obj).values() if inspect.isclass(obj) else (obj,)
            for f in members:
                if inspect.isfunction(f) and f.__module__ == mod.__name__:
                    atheris.instrument_func(f)
    bodies, frames, _ = _seed_inputs(hypothesis_seeds(200, seed), seed)
    import os
    import tempfile

    d = tempfile.mkdtemp(prefix="flockring-atheris-")
    for i, c in enumerate(frames + bodies):
        with open(os.path.join(d, f"seed{i}"), "wb") as fh:
            fh.write(c)

    def target(data: bytes) -> None:
        if data[:1] == b"\x98":  # an envelope's array header: the frame decoder
            h.frame(data)
        else:
            h.body(data)
        if h.fates["crash"]:
            raise RuntimeError(h.crashes[-1])
        if sum(h.fates.values()) - h.fates["reencode_failed"] == runs:  # libFuzzer's last run
            import json

            print(json.dumps({"engine": "atheris", **h.report()}, indent=1), flush=True)

    argv = [sys.argv[0], f"-runs={runs}", f"-seed={seed}", "-max_len=70000", "-print_final_stats=1"]
    atheris.Setup([*argv, d], target)
    atheris.Fuzz()


def deep_body(depth: int) -> bytes:
    """A ``RouteMsg`` body whose payload is ``depth`` nested arrays (valid msgpack)."""
    from overlay.handle import NodeHandle
    from overlay.ids import NodeId
    from overlay.kbr import RouteMsg
    from overlay.wire import encode_message

    m = RouteMsg(NodeId(7), "x", b"DEEP", NodeHandle(NodeId(9), "udp://127.0.0.1:9"), 1, 0)
    return encode_message(m).replace(b"\xc4\x04DEEP", _deep(depth), 1)
