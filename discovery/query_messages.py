"""Wire values of the ClassAd tree query (tags 130–131): the query argument and a subtree's
reduced answer.

They travel *inside* the multicast messages (``McQuery.arg`` and ``McReply.value``) as nested
registered messages, so the wire codec validates every field against its annotation on
arrival (a ``tuple[QueryMatch, ...]`` must hold match records, counts must be ints, ...).
Sizes follow PonD §4.1: a query is O(S_D + S_Q) — the job ad's text and a few numbers — and a
reply is O(S_A · k): at most ``k`` matches, each a node handle, two ranks and the projected
machine attributes, plus fixed counters. ``audit`` (the ids of every node that evaluated the
query) is O(N) and exists only for exhaustive tests on small rings; it is empty otherwise.
"""

from __future__ import annotations

import attrs

from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.messages import Message, register

__all__ = ["MODES", "QueryArg", "QueryMatch", "QueryValue"]

#: query modes: wait for the whole tree and keep the best k, or answer once k fit (PonD §3.1.3)
MODES = ("best", "first_fit")


@register(130)
@attrs.frozen(slots=True)
class QueryArg(Message):
    """What every node of the tree needs to match locally and reduce (``McQuery.arg``)."""

    job_ad: str  #: the job ClassAd in new syntax (its ``Requirements`` and ``Rank``)
    k: int  #: matches wanted (``best``: top k; ``first_fit``: a subtree answers once it has k)
    mode: str  #: one of :data:`MODES`
    projection: tuple[str, ...]  #: machine attributes returned with each match
    job_id: str  #: the job (autocluster) the query is for; "" for a plain discovery query
    audit: bool  #: also return the ids of every node that evaluated (O(N): tests only)


@attrs.frozen(slots=True)
class QueryMatch:
    """One matched machine: its node, the job's rank of it, its own rank of the job, the
    projected attributes (new-syntax ClassAd text)."""

    node: NodeHandle
    rank: float
    machine_rank: float
    ad: str


@register(131)
@attrs.frozen(slots=True)
class QueryValue(Message):
    """A subtree's reduction: its best ``k`` matches in negotiator order and counters."""

    matches: tuple[QueryMatch, ...]
    visited: int  #: nodes that evaluated the query (matched, rejected or failed)
    matched: int  #: nodes whose ad matched (may exceed ``len(matches)``)
    rejected: int  #: Requirements false on one side
    undefined: int  #: Requirements undefined / not boolean on one side
    errors: int  #: Requirements evaluated to ERROR (or the job ad could not be read)
    claimed: int  #: machines already in a pond (stamped), which answer no
    no_ad: int  #: nodes without a machine ad (submit-only nodes)
    audit: tuple[NodeId, ...] = ()
