"""Wire codec: today's msgpack + per-field validation (``overlay/wire.py``) against ``msgspec``.

Both sides decode the *same bytes* (what ``encode_message`` produces for four representative
messages: a probe, a routed lookup, a leaf-set heartbeat, a join reply) and both validate every
field's type. The msgspec side mirrors each message as a ``msgspec.Struct`` with
``array_like=True`` and an integer ``tag`` — which spells exactly our ``[tag, field, ...]``
layout — and maps our ext types (NodeId, NodeHandle, nested messages) with ``ext_hook``. It is
measured twice: decoding into the Structs alone (what adopting msgspec fully would cost, i.e.
every message class rewritten as a Struct) and decoding then building our attrs message (what
keeping the attrs classes would cost). Encoding: ``encode_message`` against
``msgspec.msgpack.Encoder`` of the Struct — comparable only where msgspec produces our bytes:
NodeHandle is a NamedTuple, which msgspec encodes natively as a plain array without asking
``enc_hook``, so messages holding handles come out in another format (flagged in the output).

Run: ``.venv/bin/python benchmarks/codec_msgspec.py [--n N] [--json]`` (needs ``msgspec``).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from typing import Any

import msgspec

from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.kbr import RouteMsg
from overlay.messages import Message
from overlay.pastry.messages import Heartbeat, JoinReply
from overlay.proximity import Ping
from overlay.wire import EXT_HANDLE, EXT_NODEID, Wire, encode_message, intern_handle, intern_id


# ------------------------------------------------------------------ the msgspec mirror
def _handles(v: Any) -> None:
    if type(v) is not tuple or not all(type(h) is NodeHandle for h in v):
        raise TypeError("expected handles")


class PingS(msgspec.Struct, array_like=True, tag=Ping.TAG, frozen=True):
    """Mirror of ``overlay.proximity.Ping``."""

    nonce: int
    sent_at: float


class RouteS(msgspec.Struct, array_like=True, tag=RouteMsg.TAG, frozen=True):
    """Mirror of ``overlay.kbr.RouteMsg``."""

    key: NodeId
    app: str
    payload: Any
    origin: Any  # NodeHandle: a NamedTuple, which msgspec would take for a plain array
    msg_id: int
    hops: int

    def __post_init__(self) -> None:
        if type(self.origin) is not NodeHandle:
            raise TypeError("origin: expected a NodeHandle")


class HeartbeatS(msgspec.Struct, array_like=True, tag=Heartbeat.TAG, frozen=True):
    """Mirror of ``overlay.pastry.messages.Heartbeat``."""

    leaves: tuple[Any, ...]
    failed: tuple[tuple[Any, float], ...] = ()

    def __post_init__(self) -> None:
        _handles(self.leaves)
        _handles(tuple(h for h, _ in self.failed))


class JoinReplyS(msgspec.Struct, array_like=True, tag=JoinReply.TAG, frozen=True):
    """Mirror of ``overlay.pastry.messages.JoinReply``."""

    nonce: int
    leaves: tuple[Any, ...]
    entries: tuple[Any, ...]
    rtts: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        _handles(self.leaves)
        _handles(self.entries)


MIRROR: dict[type[Message], type[msgspec.Struct]] = {
    Ping: PingS,
    RouteMsg: RouteS,
    Heartbeat: HeartbeatS,
    JoinReply: JoinReplyS,
}
_HANDLE_DEC = msgspec.msgpack.Decoder(tuple[bytes, str])
#: ext bytes -> handle, as overlay/wire.py memoises them (so both sides skip re-decoding)
_BY_EXT: dict[bytes, NodeHandle] = {}


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == EXT_NODEID:
        if len(data) != 20:
            raise ValueError("NodeId needs 20 bytes")
        return intern_id(bytes(data))
    if code == EXT_HANDLE:
        key = bytes(data)
        h = _BY_EXT.get(key)
        if h is not None:
            return h
        raw, addr = _HANDLE_DEC.decode(data)
        if len(raw) != 20:
            raise ValueError("bad NodeHandle")
        h = _BY_EXT[key] = intern_handle(raw, addr)
        return h
    raise ValueError(f"ext {code} not in this benchmark")


def _dec_hook(tp: type, obj: Any) -> Any:
    if isinstance(obj, tp):
        return obj
    raise TypeError(f"expected {tp.__name__}")


def _enc_hook(obj: Any) -> Any:
    if type(obj) is NodeId:
        return msgspec.msgpack.Ext(EXT_NODEID, int(obj).to_bytes(20, "big"))
    if type(obj) is NodeHandle:
        raw = int(obj.id).to_bytes(20, "big")
        return msgspec.msgpack.Ext(EXT_HANDLE, msgspec.msgpack.encode([raw, obj.address]))
    raise TypeError(f"cannot encode {type(obj).__name__}")


# ------------------------------------------------------------------ representative messages
def messages(rng: random.Random) -> dict[str, Message]:
    """Four messages of the shapes a live Pastry node sends most."""

    def handle() -> NodeHandle:
        return intern_handle(rng.randbytes(20), f"udp://10.0.{rng.randrange(256)}.1:9000")

    lookup = (rng.getrandbits(62), handle(), handle())
    return {
        "Ping": Ping(rng.getrandbits(40), 123.456),
        "RouteMsg(lookup)": RouteMsg(
            NodeId.random(rng), "flockring.lookup", lookup, handle(), 7, 2
        ),
        "Heartbeat(16)": Heartbeat(tuple(handle() for _ in range(16))),
        "JoinReply(16+15)": JoinReply(
            rng.getrandbits(40),
            tuple(handle() for _ in range(16)),
            tuple(handle() for _ in range(15)),
            tuple(rng.random() / 10 for _ in range(15)),
        ),
    }


def _rate(fn: Callable[[], object], n: int) -> float:
    """Operations per second."""
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t)


def _one(msg: Message, wire: Wire, n: int) -> dict[str, Any]:
    data = encode_message(msg)
    cls = type(msg)
    struct_cls = MIRROR[cls]
    fields = struct_cls.__struct_fields__
    dec = msgspec.msgpack.Decoder(struct_cls, ext_hook=_ext_hook, dec_hook=_dec_hook)
    enc = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
    assert wire.decode(data) == msg
    s = dec.decode(data)
    # msgspec's untyped `Any` gives lists where ours gives tuples (the lookup payload)
    if not isinstance(msg, RouteMsg):
        assert cls(*(getattr(s, f) for f in fields)) == msg
    struct_value = struct_cls(*(getattr(msg, f) for f in fields))

    def to_attrs() -> Message:
        x = dec.decode(data)
        return cls(*(getattr(x, f) for f in fields))

    return {
        "bytes": len(data),
        "decode_ours_per_s": round(_rate(lambda: wire.decode(data), n)),
        "decode_msgspec_struct_per_s": round(_rate(lambda: dec.decode(data), n)),
        "decode_msgspec_to_attrs_per_s": round(_rate(to_attrs, n)),
        "encode_ours_per_s": round(_rate(lambda: encode_message(msg), n)),
        "encode_msgspec_per_s": round(_rate(lambda: enc.encode(struct_value), n)),
        "msgspec_encodes_the_same_bytes": enc.encode(struct_value) == data,
    }


def measure(n: int) -> dict[str, Any]:
    """Encode/decode rates (operations per second) per message and codec."""
    wire = Wire()
    msgs = messages(random.Random(1))
    return {
        "msgspec": msgspec.__version__,
        "n": n,
        "messages": {name: _one(msg, wire, n) for name, msg in msgs.items()},
    }


def main() -> None:
    """Parse arguments, measure, print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = measure(a.n)
    if a.json:
        print(json.dumps(res, indent=1))
        return
    print(f"msgspec {res['msgspec']}, {res['n']} operations each (per second, higher is better)")
    for name, r in res["messages"].items():
        print(f"\n{name} ({r['bytes']} bytes)")
        for k, v in r.items():
            if k != "bytes":
                print(f"  {k:34} {v}")


if __name__ == "__main__":
    main()
