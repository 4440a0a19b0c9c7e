"""Message <-> msgpack mapping, with field-type validation on decode (docs/transports.md).

Theory of operation: a registered :class:`~overlay.messages.Message` travels as the msgpack array
``[tag, field_1, …, field_n]`` in attrs field order (no names, no pickle). Values map as:

==============================  =============================================================
Python                          msgpack
==============================  =============================================================
None/bool/int/float/str/bytes   native (ints outside the 64-bit range: ext 4, signed bytes)
tuple, list                     array (decoded as tuple; a ``list[...]`` field gets a list)
dict                            map
NodeId                          ext 1 (20 big-endian bytes)
NodeHandle                      ext 2 ([id bytes, address])
nested Message                  ext 3 ([tag, fields…], decoded and validated recursively)
frozenset / set                 ext 5 (array)
enum.Enum                       its value (rebuilt from the field annotation on decode)
other attrs instance            array of its fields (rebuilt from the field annotation)
==============================  =============================================================

Decoding is the trust boundary: the codec limits (``transports.codec``) bound sizes and nesting;
then every field is checked against its *resolved annotation* (``int`` refuses ``bool``, a
``tuple[NodeHandle, ...]`` must hold handles, ``X | None`` tries each arm, ``Any``/``object``
accept any decoded value) and the class is built with its own attrs validators. Any mismatch
drops the message and counts it (``bad_message``); nothing raises out of :meth:`Wire.decode`.
Messages built inside the process are not validated (mypy checks them; the 10^6-node simulator
cannot afford it — see ``overlay/messages.py``). Checkers are compiled once per class.

Ids and handles are interned, and their encodings memoised, in process-wide caches
(:class:`transports.memo.Memo`). Every one is bounded in *bytes* (an estimate of what its entries
hold), not only in entries: a handle's address may be 512 characters, so 200 000 entries of
attacker-made handles would hold ~250 MiB. A full memo drops its older half; an evicted entry
costs one re-decode, and objects the routing tables still hold stay alive regardless.
"""

from __future__ import annotations

import enum
import logging
import types
import typing
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import attrs
import msgpack

from overlay.errors import OverlayError
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.messages import REGISTRY, Message
from transports.codec import DEFAULT_LIMITS, DecodeError, Limits, check_depth, safe_unpackb
from transports.memo import Memo

__all__ = [
    "Wire",
    "WireError",
    "decode_message",
    "encode_message",
    "intern_handle",
    "intern_id",
    "memo_bytes",
]

log = logging.getLogger(__name__)

EXT_NODEID = 1
EXT_HANDLE = 2
EXT_MESSAGE = 3
EXT_BIGINT = 4
EXT_SET = 5

_I64_MIN = -(1 << 63)
_U64_MAX = (1 << 64) - 1


class WireError(OverlayError):
    """A message that cannot be encoded (a programming error: an unsupported field value)."""


class _Invalid(DecodeError):
    """Internal: a decoded value does not match its field annotation."""


# ---------------------------------------------------------------------------------- encoding
def _bigint(v: int) -> msgpack.ExtType:
    n = (v.bit_length() + 8) // 8
    return msgpack.ExtType(EXT_BIGINT, v.to_bytes(n, "big", signed=True))


#: bytes an entry costs besides its variable part: dict slot, key and value objects (CPython)
_ENTRY_COST = 200
#: memo budgets: a few tens of thousands of peers' ids and handles each (a 10^3-node process
#: mentions ~10^3), ~32 MiB in all however many distinct handles peers send
ID_MEMO_BYTES = 4 << 20
HANDLE_MEMO_BYTES = 8 << 20

#: Encoded ids and handles, process-wide: a swarm mentions the same few thousand handles in
#: every leaf-set and row message, and packing one is a nested msgpack call.
_EXT_IDS = Memo(ID_MEMO_BYTES)
_EXT_HANDLES = Memo(HANDLE_MEMO_BYTES)


def _address_cost(address: str | int) -> int:
    return len(address) if isinstance(address, str) else 8


def _default(v: Any) -> Any:
    """msgpack ``default`` hook (strict_types): everything that is not a plain primitive."""
    tv = type(v)
    if tv is NodeHandle:  # before tuple: a handle is a NamedTuple
        e = _EXT_HANDLES.data.get(v)
        if e is None:
            e = msgpack.ExtType(EXT_HANDLE, _pack([_prim(v.id), v.address]))
            _EXT_HANDLES.put(v, e, _ENTRY_COST + 2 * _address_cost(v.address))
        return e
    if tv is NodeId:
        e = _EXT_IDS.data.get(v)
        if e is None:
            e = msgpack.ExtType(EXT_NODEID, int(v).to_bytes(20, "big"))
            _EXT_IDS.put(v, e, _ENTRY_COST)
        return e
    if tv is tuple:
        return list(v)
    if isinstance(v, NodeId):
        return msgpack.ExtType(EXT_NODEID, int(v).to_bytes(20, "big"))
    if isinstance(v, NodeHandle):
        return msgpack.ExtType(EXT_HANDLE, _pack([_prim(v.id), v.address]))
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, Message):
        return msgpack.ExtType(EXT_MESSAGE, _pack(_message_array(v)))
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (frozenset, set)):
        return msgpack.ExtType(EXT_SET, _pack(list(v)))
    if isinstance(v, int) and not isinstance(v, bool):
        if _I64_MIN <= v <= _U64_MAX:
            return int(v)
        return _bigint(v)
    if isinstance(v, (str, bytes, float)):  # subclasses of primitives
        return type(v).__mro__[-2](v)
    if attrs.has(type(v)):
        return [getattr(v, a.name) for a in attrs.fields(type(v))]
    raise WireError(f"cannot encode a {type(v).__name__} on the wire")


def _prim(v: Any) -> Any:
    if isinstance(v, NodeId):
        return int(v).to_bytes(20, "big")
    return v


def _message_array(m: Message) -> list[Any]:
    if m.TAG == 0 or REGISTRY.get(m.TAG) is not type(m):
        raise WireError(f"{type(m).__name__} is not a registered message")
    out: list[Any] = [m.TAG]
    out.extend(getattr(m, name) for name in _field_names(type(m)))
    return out


def _fix_bigints(v: Any) -> Any:
    """Slow path for the rare value holding ints beyond 64 bits (strict packer rejects them)."""
    if isinstance(v, bool) or v is None or isinstance(v, (str, bytes, float)):
        return v
    if isinstance(v, int) and not isinstance(v, NodeId):
        return v if _I64_MIN <= v <= _U64_MAX else _bigint(v)
    if isinstance(v, NodeHandle):
        return v  # packed by _default as an ext type
    if isinstance(v, (tuple, list)):
        return [_fix_bigints(x) for x in v]
    if isinstance(v, dict):
        return {_fix_bigints(k): _fix_bigints(x) for k, x in v.items()}
    return v


def _pack(value: Any) -> bytes:
    try:
        out: bytes = msgpack.packb(value, default=_default, use_bin_type=True, strict_types=True)
    except OverflowError:
        out = msgpack.packb(
            _fix_bigints(value), default=_default, use_bin_type=True, strict_types=True
        )
    except (TypeError, ValueError) as exc:
        raise WireError(f"cannot encode: {exc}") from None
    return out


_FIELD_NAMES: dict[type[Message], tuple[str, ...]] = {}


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = tuple(a.name for a in attrs.fields(cls))
        _FIELD_NAMES[cls] = names
    return names


def encode_message(msg: Message) -> bytes:
    """The wire bytes of ``msg`` (raises :class:`WireError` for unencodable content)."""
    return _pack(_message_array(msg))


# ---------------------------------------------------------------------------------- checkers
Checker = Callable[[Any], Any]


def _any(v: Any) -> Any:
    return v


def _is_hashable(v: Any) -> Any:
    try:
        hash(v)
    except TypeError:
        raise _Invalid("unhashable") from None
    return v


def _exact(tp: type) -> Checker:
    def check(v: Any) -> Any:
        if type(v) is not tp:
            raise _Invalid(f"expected {tp.__name__}")
        return v

    return check


def _check_int(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _Invalid("expected int")
    return v


def _check_float(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Invalid("expected float")
    return float(v)


def _isinstance(tp: type) -> Checker:
    def check(v: Any) -> Any:
        if not isinstance(v, tp):
            raise _Invalid(f"expected {tp.__name__}")
        return v

    return check


class _Compiler:
    """Turns resolved annotations into checker functions (cached per class)."""

    def __init__(self) -> None:
        self.by_class: dict[type[Any], tuple[Checker, ...]] = {}

    def fields(self, cls: type[Any]) -> tuple[Checker, ...]:
        got = self.by_class.get(cls)
        if got is not None:
            return got
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # unresolvable forward reference: accept anything, once logged
            log.warning("wire: cannot resolve annotations of %s; fields unchecked", cls.__name__)
            hints = {}
        out = tuple(self.checker(hints.get(a.name, Any)) for a in attrs.fields(cls))
        self.by_class[cls] = out
        return out

    def checker(self, tp: Any) -> Checker:
        if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
            return _any
        if tp is None or tp is type(None):
            return lambda v: v if v is None else _raise("expected None")
        if tp is bool:
            return _exact(bool)
        if tp is int:
            return _check_int
        if tp is float:
            return _check_float
        if tp is str:
            return _exact(str)
        if tp is bytes:
            return _exact(bytes)
        if tp is NodeId:
            return _isinstance(NodeId)
        if tp is NodeHandle:
            return _isinstance(NodeHandle)
        if tp is Hashable:
            return _is_hashable
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is typing.Union or origin is types.UnionType:
            arms = [self.checker(a) for a in args]
            return lambda v: _first(arms, v)
        if origin is typing.Literal:
            allowed = {(type(a), a) for a in args}
            return lambda v: v if (type(v), v) in allowed else _raise("literal")
        if origin is typing.ClassVar:
            return _any
        if origin is typing.Annotated:
            return self.checker(args[0])
        if isinstance(tp, type):
            if issubclass(tp, Message):
                return _isinstance(tp)
            if issubclass(tp, enum.Enum):
                return lambda v: _enum(tp, v)
            if attrs.has(tp):
                return lambda v: self._attrs_instance(tp, v)
        if origin in (tuple,) or tp is tuple:
            if not args:
                return _tuple_of(_any)
            if len(args) == 2 and args[1] is Ellipsis:
                return _tuple_of(self.checker(args[0]))
            if args == ((),):
                return lambda v: v if v == () else _raise("expected ()")
            items = [self.checker(a) for a in args]
            return lambda v: _fixed_tuple(items, v)
        if origin in (list, Sequence) or tp in (list,):
            inner = self.checker(args[0]) if args else _any
            if origin is list or tp is list:
                return lambda v: list(_tuple_of(inner)(v))
            return _tuple_of(inner)
        if origin in (frozenset, set) or tp in (frozenset, set):
            inner = self.checker(args[0]) if args else _any
            ctor = frozenset if (origin is frozenset or tp is frozenset) else set
            return lambda v: _set_of(inner, ctor, v)
        if origin in (dict, Mapping) or tp is dict:
            kc = self.checker(args[0]) if args else _any
            vc = self.checker(args[1]) if len(args) > 1 else _any
            return lambda v: _dict_of(kc, vc, v)
        if isinstance(tp, type):
            return _isinstance(tp)
        log.debug("wire: annotation %r not understood; accepting any value", tp)
        return _any

    def _attrs_instance(self, cls: type[Any], v: Any) -> Any:
        if isinstance(v, cls):
            return v
        if not isinstance(v, tuple):
            raise _Invalid(f"expected {cls.__name__}")
        checks = self.fields(cls)
        if len(v) != len(checks):
            raise _Invalid(f"{cls.__name__} needs {len(checks)} fields")
        try:
            return cls(*[c(x) for c, x in zip(checks, v, strict=True)])  # see Wire._build
        except _Invalid:
            raise
        except Exception as exc:
            raise _Invalid(f"{cls.__name__}: {exc}") from None


def _raise(why: str) -> Any:
    raise _Invalid(why)


def _first(arms: list[Checker], v: Any) -> Any:
    for c in arms:
        try:
            return c(v)
        except _Invalid:
            continue
    raise _Invalid("no union arm matched")


def _enum(tp: type[enum.Enum], v: Any) -> Any:
    if isinstance(v, tp):
        return v
    try:
        return tp(v)
    except (ValueError, TypeError):
        raise _Invalid(f"not a {tp.__name__}") from None


def _tuple_of(inner: Checker) -> Checker:
    if inner is _any:
        return lambda v: v if isinstance(v, tuple) else _raise("expected array")

    def check(v: Any) -> Any:
        if not isinstance(v, tuple):
            raise _Invalid("expected array")
        return tuple([inner(x) for x in v])  # a list: see Wire._build

    return check


def _fixed_tuple(items: list[Checker], v: Any) -> Any:
    if not isinstance(v, tuple) or len(v) != len(items):
        raise _Invalid("expected fixed-length array")
    return tuple([c(x) for c, x in zip(items, v, strict=True)])  # see Wire._build


def _set_of(inner: Checker, ctor: type, v: Any) -> Any:
    if not isinstance(v, frozenset):
        raise _Invalid("expected set")
    return ctor(inner(x) for x in v)


def _dict_of(kc: Checker, vc: Checker, v: Any) -> Any:
    if not isinstance(v, dict):
        raise _Invalid("expected map")
    return {kc(k): vc(x) for k, x in v.items()}


_COMPILER = _Compiler()  # checkers depend only on classes: one cache for the whole process


# ---------------------------------------------------------------------------------- decoding
#: Decoded ids and handles are interned process-wide: a swarm's routing tables then share one
#: object per peer instead of one per message that mentioned it (tens of KiB per node at 10^3).
_IDS = Memo(ID_MEMO_BYTES)
_HANDLES = Memo(HANDLE_MEMO_BYTES)


def intern_id(raw: bytes) -> NodeId:
    """The shared NodeId for 20 big-endian bytes."""
    v: NodeId | None = _IDS.data.get(raw)
    if v is None:
        v = NodeId(int.from_bytes(raw, "big"))
        _IDS.put(raw, v, _ENTRY_COST)
    return v


def intern_handle(raw_id: bytes, address: str | int) -> NodeHandle:
    """The shared NodeHandle for (id bytes, address)."""
    k = (raw_id, address)
    h: NodeHandle | None = _HANDLES.data.get(k)
    if h is None:
        h = NodeHandle(intern_id(raw_id), address)
        _HANDLES.put(k, h, _ENTRY_COST + 2 * _address_cost(address))
    return h


def memo_bytes() -> int:
    """Estimated bytes held by all of the wire's process-wide memos (bounded)."""
    return sum(m.used for m in (_IDS, _HANDLES, _HANDLES_BY_EXT, _EXT_IDS, _EXT_HANDLES))


#: ext payload bytes -> the handle they decoded to (valid ones only; a differently spelled but
#: equal handle simply misses and takes the checked path)
_HANDLES_BY_EXT = Memo(HANDLE_MEMO_BYTES)
#: a handle's inner array holds two scalars: no ext types, no maps, no nesting worth a walk
#: (msgpack's own C stack bounds any nesting an attacker sends before the type check refuses it)
_HANDLE_KW: dict[str, Any] = {
    "raw": False,
    "use_list": False,
    "max_str_len": 512,
    "max_bin_len": 20,
    "max_array_len": 2,
    "max_map_len": 0,
    "max_ext_len": 0,
}


class Wire:
    """Decoder of untrusted message bytes. Never raises; counts every rejection.

    Counters: ``malformed`` (msgpack/limits), ``too_deep``, ``unknown_tag``, ``bad_message``
    (wrong arity or field types), ``decoded``.
    """

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self.counters: Counter[str] = Counter()
        self._compiler = _COMPILER
        self._depth = 0

    def _ext_hook(self, code: int, data: bytes) -> Any:
        if code == EXT_HANDLE:
            h = _HANDLES_BY_EXT.data.get(data)
            if h is not None:  # these exact bytes were a valid handle before
                return h
            return self._handle(data)
        if code == EXT_NODEID:
            if len(data) != 20:
                raise _Invalid("NodeId needs 20 bytes")
            return intern_id(data)
        if code == EXT_BIGINT:
            if not 0 < len(data) <= 64:
                raise _Invalid("bad big int")
            return int.from_bytes(data, "big", signed=True)
        self._depth += 1
        try:
            if self._depth > self.limits.max_depth:
                raise DecodeError("too deep")
            inner = safe_unpackb(data, self.limits, self._ext_hook)
            check_depth(inner, self.limits.max_depth - self._depth)
            if code == EXT_HANDLE:
                if (
                    not isinstance(inner, tuple)
                    or len(inner) != 2
                    or not isinstance(inner[0], bytes)
                    or len(inner[0]) != 20
                ):
                    raise _Invalid("bad NodeHandle")
                addr = inner[1]
                if not isinstance(addr, (str, int)) or isinstance(addr, bool):
                    raise _Invalid("bad NodeHandle address")
                return intern_handle(inner[0], addr)
            if code == EXT_MESSAGE:
                return self._build(inner)
            if code == EXT_SET:
                if not isinstance(inner, tuple):
                    raise _Invalid("bad set")
                return frozenset(_is_hashable(x) for x in inner)
            raise _Invalid(f"unknown ext type {code}")
        finally:
            self._depth -= 1

    def _handle(self, data: bytes) -> NodeHandle:
        """Decode a NodeHandle ext: ``[20-byte id, address]``, scalars only (no depth walk)."""
        try:
            inner = msgpack.unpackb(data, **_HANDLE_KW)
        except Exception:
            raise _Invalid("bad NodeHandle") from None
        if type(inner) is not tuple or len(inner) != 2:
            raise _Invalid("bad NodeHandle")
        raw, addr = inner
        if type(raw) is not bytes or len(raw) != 20:
            raise _Invalid("bad NodeHandle")
        if type(addr) is not str and type(addr) is not int:
            raise _Invalid("bad NodeHandle address")
        h = intern_handle(raw, addr)
        _HANDLES_BY_EXT.put(data, h, _ENTRY_COST + len(data))
        return h

    def _build(self, arr: Any) -> Message:
        if not isinstance(arr, tuple) or not arr or type(arr[0]) is not int:
            raise _Invalid("message is not [tag, fields...]")
        cls = REGISTRY.get(arr[0])
        if cls is None:
            raise _UnknownTag(arr[0])
        checks = self._compiler.fields(cls)
        vals = arr[1:]
        if len(vals) != len(checks):
            raise _Invalid(f"{cls.__name__} needs {len(checks)} fields, got {len(vals)}")
        try:
            # A list, never a generator, wherever a decoded value becomes a tuple (here the
            # call's arguments): CPython builds tuple(<generator>) in a 10-slot tuple resized
            # to fit, so each datagram would move a block from the 10-item tuple freelist to
            # the final length's, where up to 2000 a length stay parked until a full
            # collection (~5 KiB of RSS per node at N = 300; tests/test_live_memory.py).
            return cls(*[c(v) for c, v in zip(checks, vals, strict=True)])
        except _Invalid:
            raise
        except Exception as exc:  # the class's own attrs validators, NodeId range, …
            raise _Invalid(f"{cls.__name__}: {exc}") from None

    def decode(self, data: bytes) -> Message | None:
        """The message in ``data``, or None (with the reason counted)."""
        self._depth = 0
        try:
            raw = safe_unpackb(data, self.limits, self._ext_hook)
            check_depth(raw, self.limits.max_depth)
            msg = self._build(raw)
        except _UnknownTag:
            self.counters["unknown_tag"] += 1
            return None
        except _Invalid:
            self.counters["bad_message"] += 1
            return None
        except DecodeError as exc:
            self.counters["too_deep" if "deep" in str(exc) else "malformed"] += 1
            return None
        except RecursionError:
            self.counters["too_deep"] += 1
            return None
        except Exception:  # belt and braces: nothing escapes into a receive loop
            self.counters["malformed"] += 1
            log.debug("wire: unexpected decode failure", exc_info=True)
            return None
        self.counters["decoded"] += 1
        return msg

    def encode(self, msg: Message) -> bytes:
        """Same as :func:`encode_message`."""
        return encode_message(msg)


class _UnknownTag(_Invalid):
    pass


_DEFAULT_WIRE: Wire | None = None


def decode_message(data: bytes) -> Message | None:
    """Decode with a module-wide :class:`Wire` (counters in ``Wire`` instances are per node)."""
    global _DEFAULT_WIRE
    if _DEFAULT_WIRE is None:
        _DEFAULT_WIRE = Wire()
    return _DEFAULT_WIRE.decode(data)
