"""Bookkeeping records of the multicast protocol: sessions, children, the redundant-tree pair.

Split from :mod:`overlay.multicast.app` (theory of operation there; PonD §3.1). A
:class:`Session` is one node's part in one tree of one query; it exists only on roots and
internal nodes (a leaf answers at once and keeps only a :data:`Cached` answer). Each child the
session sent the query to has a :class:`ChildRecord` whose ``state`` walks
``SENT -> ACKED -> ANSWERED`` (or ``FAILED`` after its deadline or its ack retries), with the
timestamps the one session timer needs for retransmission (``ack_by``) and the deadline. A
:class:`Pair` merges the clockwise and counter-clockwise trees at the root. Plain slotted
classes: they are allocated per query per internal node.
"""

from __future__ import annotations

from typing import Any

from overlay.handle import NodeHandle
from overlay.multicast.api import Aggregator, MulticastResult, ResultCallback
from overlay.multicast.messages import McQuery, McReply, Range
from overlay.multicast.ranges import CW
from overlay.runtime import Timer

__all__ = [
    "ACKED",
    "ANSWERED",
    "EPS",
    "FAILED",
    "INF",
    "NO_SESSIONS",
    "SENT",
    "Cached",
    "ChildRecord",
    "Pair",
    "Session",
]

INF = float("inf")
NO_SESSIONS: dict[int, Any] = {}  # shared empty map until a node first holds a session
EPS = 1e-9


#: states of a :class:`ChildRecord`
SENT, ACKED, ANSWERED, FAILED = 0, 1, 2, 3

#: a leaf's remembered answer (value, missing, nodes), re-sent when its parent retransmits
Cached = tuple[Any, tuple[Range, ...], int]


class ChildRecord:
    """One child of a session: the sub-query sent to it, its timers and its state (SENT, ACKED,
    ANSWERED or FAILED)."""

    __slots__ = ("ack_by", "attempts", "deadline", "handle", "msg", "sent_at", "state")

    def __init__(self, handle: NodeHandle, msg: McQuery, now: float, ack_by: float) -> None:
        self.handle = handle
        self.msg = msg
        self.sent_at = now
        self.ack_by = ack_by
        self.deadline = now + msg.budget_s + msg.level_s
        self.attempts = 0
        self.state = SENT


class Session:
    """One node's part in one tree of one query (exists only on internal nodes and roots)."""

    __slots__ = (
        "acc",
        "agg",
        "answer_by",
        "arg",
        "children",
        "closed",
        "depth",
        "direction",
        "early",
        "level_s",
        "missing",
        "n_est",
        "name",
        "nodes",
        "on_done",
        "p_slot",
        "p_token",
        "parent",
        "pending",
        "qid",
        "reply",
        "t0",
        "timer",
        "token",
    )

    def __init__(self, token: int, qid: int, name: str, agg: Aggregator, arg: Any) -> None:
        self.token = token
        self.qid = qid
        self.name = name
        self.agg = agg
        self.arg = arg
        self.direction = CW
        self.level_s = 1.0
        self.n_est = 1
        self.parent: NodeHandle | None = None
        self.p_token = 0
        self.p_slot = 0
        self.acc: Any = None
        self.nodes = 0
        self.depth = 0
        self.missing: list[Range] = []
        self.children: list[ChildRecord] = []
        self.pending = 0
        self.answer_by = INF
        self.timer: Timer | None = None
        self.on_done: ResultCallback | None = None
        self.t0 = 0.0
        self.early = False
        self.closed = False
        self.reply: McReply | None = None  # kept until acknowledged


class Pair:
    """Root-side merge of the two redundant trees."""

    __slots__ = ("agg", "arg", "cb", "done", "results")

    def __init__(self, agg: Aggregator, arg: Any, cb: ResultCallback) -> None:
        self.agg = agg
        self.arg = arg
        self.cb = cb
        self.results: list[MulticastResult] = []
        self.done = False
