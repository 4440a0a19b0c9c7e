"""Well-formed lies: random messages of every registered kind, from non-members, at live nodes.

Every message kind the overlay registers (``overlay.messages.REGISTRY``, the ``overlay.*``
modules: KBR, proximity, Pastry, small-world, multicast, control) is generated from its attrs
field annotations by a seeded generator: ints at the edges of their ranges, NaN and infinite
floats, ids next to the victims', handles of strangers, of members under a stranger's address
and of strangers under a member's address, nested messages as payloads. The messages cross the
wire (fidelity mode), so each is well-formed: it decodes and passes the wire's type checks. They
come from non-members (random ids at made-up or members' addresses) to three nodes of a Pastry
and of a small-world ring while the rings run their own maintenance.

Checked: no exception escapes (the engine would raise it), and none is swallowed by a core
except its own input validation (``ValueError`` and its subclasses; one known gap, below); the
state of the targets' cores (entries of every dict, set and list reachable from the core) stays
under a bound that does not depend on the number of events while the lies arrive, and once they
stop and every timer they armed has run out (an hour, the multicast session cap) it is back to
what it was, but for memos with fixed caps (checked against the caps); no non-member is left in
any table, every leaf set / near window is the oracle's, and every lookup, including those for
the targets' own keys, reaches the node the oracle names.

Found by this test and fixed (``test_a_multicast_query_with_a_non_numeric_goal_leaves_no_session``):
a ``McQuery`` whose First-Fit goal ``arg`` is not a number makes the built-in aggregators'
``done`` raise ``TypeError``; that happened after the child session was created, and the session
never ended. The goal is now checked before any session exists.

Events: ``FLOCKRING_FUZZ_EVENTS`` (default 10^4 per overlay, a few seconds; the issue's 10^5
with ``FLOCKRING_FUZZ_EVENTS=100000``, about ten times as long). The seed is fixed.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import random
import traceback
import types
import typing
from collections import Counter
from collections.abc import Hashable, Iterator
from typing import Any

import attrs
import pytest
from sim_oracles import lookups, sw_width, wrong_windows

import overlay.kbr
import overlay.live.control
import overlay.multicast
import overlay.pastry.messages
import overlay.proximity
import overlay.smallworld.messages
from overlay import NodeHandle, NodeId
from overlay.messages import REGISTRY, Message
from overlay.multicast import MULTICAST_APP
from overlay.smallworld.messages import LINK_APP
from sim_adapter import Network, SimNode
from sim_adapter.network import LOOKUP_APP

EVENTS = int(os.environ.get("FLOCKRING_FUZZ_EVENTS", "10000"))
#: entries one target's core may hold while lies arrive, whatever their number (measured: ~1,800
#: for Pastry, most of it the KBR duplicate window of 1,024 and DEAD verdicts kept 300 s)
STATE_BOUND = 3000
#: memos with fixed caps, excluded from the after-quiet comparison and checked on their own
MEMOS = {
    "_seen": 1024,  # KbrConfig.dedupe_window
    "_learned": 256,  # overlay.pastry.core._LEARNED_MEMO
    "_recent": 32,  # MulticastConfig.dedupe_window
    "_report_probed": 68,  # Pastry: 4 (L + 1) failure-report rate limits
    "_reported": 128,  # Pastry: failure reports heard, 8 L (purged by size, not by time)
    "gone": 200,  # Pastry's partition-healing history: time-bounded (gone_history_age_s, 1.5 h)
    "_told": 64,  # Pastry re-integration: one tell per accused per interval, at most 4 L
    #: the proximity table's reusable rows: capacity left by forgotten peers (a dict does not
    #: shrink either), reused by the next peer and given back when most of the table is free
    "_free": STATE_BOUND,
    "stats": 200,  # counter names
}
#: entries a target may hold above its pre-fuzz state once everything the lies armed ran out
QUIET_SLACK = 100


def _kinds() -> list[type[Message]]:
    """Every overlay message class, by tag (deterministic whatever else registered)."""
    return [c for _, c in sorted(REGISTRY.items()) if c.__module__.startswith("overlay.")]


class Gen:
    """Random values for annotations; biased to what hurts (edges, near ids, real addresses)."""

    def __init__(self, rng: random.Random, members: list[SimNode], victims: list[SimNode]):
        self.rng = rng
        self.members = members
        self.victims = victims
        #: sim addresses are node indices; these lead nowhere (replies to them are dropped)
        self.strangers = [NodeHandle(NodeId.random(rng), 1_000_000 + i) for i in range(40)]
        self.hints: dict[type[Any], dict[str, Any]] = {}

    # --------------------------------------------------------------- leaves
    def int_(self) -> int:
        r = self.rng
        edges = [0, 1, -1, 2, 7, 15, 39, 160, (1 << 63) - 1, -(1 << 63), (1 << 64) - 1]
        return r.choice([*edges, r.randrange(64), r.getrandbits(31), r.getrandbits(62)])

    def float_(self) -> float:
        r = self.rng
        return r.choice(
            [0.0, -1.0, 1e-9, 0.05, 1e12, -1e12, math.nan, math.inf, -math.inf, r.random() * 60]
        )

    def str_(self) -> str:
        r = self.rng
        return r.choice(
            [LOOKUP_APP, MULTICAST_APP, LINK_APP, "count", "sum", "", "x" * r.randrange(40)]
        )

    def node_id(self) -> NodeId:
        r = self.rng
        v = r.choice(self.victims)
        return r.choice(
            [
                NodeId.random(r),
                v.id,
                NodeId((int(v.id) + r.randrange(-(1 << 20), 1 << 20)) % (1 << 160)),
                r.choice(self.members).id,
            ]
        )

    def handle(self) -> NodeHandle:
        r = self.rng
        m = r.choice(self.members)
        return r.choice(
            [
                r.choice(self.strangers),  # a non-member
                NodeHandle(m.id, 2_000_000 + r.randrange(256)),  # a member, wrong address
                NodeHandle(NodeId.random(r), m.index),  # a stranger at a member's address
                NodeHandle(self.node_id(), m.index),  # an id near a victim's, same
                m.handle,  # a member as it is
            ]
        )

    # --------------------------------------------------------------- annotations
    def value(self, tp: Any, depth: int = 0) -> Any:
        r = self.rng
        if tp is Any or tp is object or tp is Hashable:
            return self.any_(depth)
        if tp is bool:
            return r.random() < 0.5
        if tp is int:
            return self.int_()
        if tp is float:
            return self.float_()
        if tp is str:
            return self.str_()
        if tp is bytes:
            return r.randbytes(r.choice([0, 16, 20, 32, 48]))
        if tp is NodeId:
            return self.node_id()
        if tp is NodeHandle:
            return self.handle()
        if tp is None or tp is type(None):
            return None
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Union or origin is types.UnionType:
            return self.value(r.choice(args), depth)
        if origin is typing.Literal:
            return r.choice(args)
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(self.value(args[0], depth + 1) for _ in range(r.randrange(5)))
            return tuple(self.value(a, depth + 1) for a in args)
        if origin in (list, frozenset, set):
            items = [self.value(args[0], depth + 1) for _ in range(r.randrange(4))]
            return origin(items)
        if origin is dict:
            return {self.value(args[0], depth + 1): self.value(args[1], depth + 1)}
        if isinstance(tp, type):
            if issubclass(tp, Message):
                return self.message(depth + 1, tp if tp is not Message else None)
            if issubclass(tp, enum.Enum):
                return r.choice(list(tp))
            if attrs.has(tp):
                return self.build(tp, depth + 1)
        raise AssertionError(f"the fuzz generator does not know {tp!r}")

    def any_(self, depth: int) -> Any:
        r = self.rng
        choices: list[Any] = [
            self.int_,
            self.float_,
            self.str_,
            self.handle,
            self.node_id,
            lambda: (self.int_(), self.handle(), self.handle()),  # a lookup-shaped payload
            lambda: None,
        ]
        if depth < 3:
            choices.append(lambda: self.message(depth + 1))
        return r.choice(choices)()

    def build(self, cls: type[Any], depth: int) -> Any:
        hints = self.hints.get(cls)
        if hints is None:
            hints = self.hints[cls] = typing.get_type_hints(cls)
        return cls(*(self.value(hints[a.name], depth) for a in attrs.fields(cls)))

    def message(self, depth: int = 0, cls: type[Message] | None = None) -> Message:
        """A random message (of ``cls``, or of any kind) that passes its own validators."""
        kinds = _kinds()
        for _ in range(50):
            c = cls if cls is not None else self.rng.choice(kinds)
            try:
                msg: Message = self.build(c, depth)
            except (ValueError, TypeError):  # the class's validators refused: not well-formed
                continue
            return msg
        raise AssertionError(f"cannot build a valid {cls}")


def _entries(obj: Any, seen: set[int], skip: Counter[str] | None = None, depth: int = 0) -> int:
    """Entries of every dict/set/list reachable from ``obj`` through overlay objects; with
    ``skip``, attributes named in :data:`MEMOS` are not counted but their sizes put in it."""
    if id(obj) in seen or depth > 6:
        return 0
    seen.add(id(obj))
    if isinstance(obj, (dict, set, frozenset, list)):
        n = len(obj)
        items = obj.values() if isinstance(obj, dict) else obj
        for v in items:
            if isinstance(v, (dict, set, list)) or _is_state(v):
                n += _entries(v, seen, skip, depth + 1)
        return n
    if not _is_state(obj):
        return 0
    n = 0
    for name in _attr_names(obj):
        v = getattr(obj, name, None)
        if skip is not None and name in MEMOS:
            skip[name] = max(skip[name], len(v) if v is not None else 0)
            continue
        if isinstance(v, (dict, set, frozenset, list)) or _is_state(v):
            n += _entries(v, seen, skip, depth + 1)
    return n


def _breakdown(
    obj: Any, path: str = "core", out: Counter[str] | None = None, seen: set[int] | None = None
) -> Counter[str]:
    """Entries per attribute path, memos left out (for the failure messages)."""
    out = Counter() if out is None else out
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return out
    seen.add(id(obj))
    if isinstance(obj, (dict, set, frozenset, list)):
        out[path] += len(obj)
        for v in obj.values() if isinstance(obj, dict) else obj:
            if _is_state(v):
                _breakdown(v, path + "[]", out, seen)
        return out
    for name in _attr_names(obj):
        v = getattr(obj, name, None)
        if name not in MEMOS and (isinstance(v, (dict, set, frozenset, list)) or _is_state(v)):
            _breakdown(v, f"{path}.{name}", out, seen)
    return out


def _is_state(v: Any) -> bool:
    mod = type(v).__module__
    return mod.startswith("overlay.") and not isinstance(v, (Message, NodeHandle, NodeId, type))


def _attr_names(obj: Any) -> Iterator[str]:
    for cls in type(obj).__mro__:
        yield from getattr(cls, "__slots__", ())
    yield from getattr(obj, "__dict__", {})


class _Swallowed(logging.Handler):
    """Exceptions a core caught and logged (``KbrCore.receive`` drops what raises)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.kinds: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[0] is not None:
            exc, _, tb = record.exc_info
            where = traceback.extract_tb(tb)[-1] if tb is not None else None
            if issubclass(exc, ValueError):
                self.kinds[exc.__name__] += 1
            elif where is not None and where.filename.endswith(_KNOWN_GAP) and where.name == "done":
                self.kinds["known gap: multicast aggregator done()"] += 1
            else:
                self.kinds[f"BUG {exc.__name__} at {where}"] += 1


_KNOWN_GAP = os.path.join("overlay", "multicast", "api.py")


@pytest.mark.parametrize("overlay_name", ["pastry", "smallworld"])
def test_wellformed_lies_from_non_members(overlay_name: str) -> None:
    net = Network(seed=31, fidelity=True)
    nodes = net.spawn(40, overlay=overlay_name, build="oracle")
    net.run(30.0)
    rng = random.Random(97)
    victims = [nodes[3], nodes[17], nodes[29]]
    gen = Gen(rng, nodes, victims)
    before = [_entries(v.core, set(), Counter()) for v in victims]
    shape = _breakdown(victims[0].core)
    swallowed = _Swallowed()
    log = logging.getLogger("overlay")
    old_level = log.level
    log.addHandler(swallowed)
    log.setLevel(logging.DEBUG)
    sizes: list[int] = []
    try:
        sent: Counter[str] = Counter()
        for i in range(EVENTS):
            msg = gen.message()
            sent[type(msg).__name__] += 1
            src = rng.choice(gen.strangers) if rng.random() < 0.7 else gen.handle()
            if src.id in {int(x.id) for x in nodes}:
                src = rng.choice(gen.strangers)  # non-members only
            net.inject(src, victims[i % 3], msg)
            net.run(0.1)
            if i % max(1, EVENTS // 20) == 0:
                sizes.append(max(_entries(v.core, set()) for v in victims))
        net.run(3700.0)  # every timer the lies armed runs out (multicast sessions: 1 h cap)
    finally:
        log.removeHandler(swallowed)
        log.setLevel(old_level)
    assert set(sent) == {c.__name__ for c in _kinds()}  # every kind was thrown
    fid = net.fidelity
    assert fid is not None and fid.stats["encode_errors"] == 0
    assert fid.stats["decoded"] > EVENTS  # the lies crossed the wire (besides real traffic)
    bugs = {k: n for k, n in swallowed.kinds.items() if k.startswith("BUG")}
    assert not bugs, (bugs, swallowed.kinds)
    # the cores' own count of what raised outside their input checks agrees (KbrCore.receive)
    known_gap = swallowed.kinds["known gap: multicast aggregator done()"]
    assert sum(x.core.stats["handler_errors"] for x in nodes) == known_gap
    assert max(sizes) <= STATE_BOUND, sizes
    memos: Counter[str] = Counter()
    after = [_entries(v.core, set(), memos) for v in victims]
    grown = _breakdown(victims[0].core)
    grown.subtract(shape)
    assert all(a <= b + QUIET_SLACK for a, b in zip(after, before, strict=True)), (
        before,
        after,
        [kv for kv in grown.most_common(8) if kv[1] > 0],
    )
    assert all(memos[k] <= cap for k, cap in MEMOS.items()), memos
    live = [x for x in nodes if x.alive]
    assert len(live) == len(nodes)
    members = {x.handle for x in nodes}
    assert all(set(v.core.known_nodes()) <= members for v in victims)
    if overlay_name == "pastry":
        assert wrong_windows(live, 8, lambda x: x.core.leaf.nodes()) == 0  # type: ignore[attr-defined]
    else:
        assert wrong_windows(live, sw_width, lambda x: x.core.near_connections()) == 0  # type: ignore[attr-defined]
    ok, _ = lookups(net, live, 300, seed=5)
    assert ok == 1.0
    keys = [NodeId((int(v.id) + d) % (1 << 160)) for v in victims for d in (0, 1, -1)]
    res = net.lookup_many([(nodes[(7 * j) % 40], k) for j, k in enumerate(keys)])
    assert [r.result for r in res] == [net.closest_live(int(k)) for k in keys]


def test_a_multicast_query_with_a_non_numeric_goal_leaves_no_session() -> None:
    net = Network(seed=9, fidelity=True)
    nodes = net.spawn(20, overlay="pastry", build="oracle")
    net.run(5.0)
    x, parent = nodes[4], nodes[11]
    q = overlay.multicast.McQuery(7, "count", "ten", 1, x.id, x.id, 5.0, 1.0, 20, 8, None, 99, 0)
    net.inject(parent.handle, x, q)
    net.run(3 * 3600.0)
    app = x.core.apps[MULTICAST_APP]
    assert isinstance(app, overlay.multicast.Multicast)
    assert not app._sessions
