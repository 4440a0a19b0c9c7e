"""First-Fit ClassAd tree query: HTCondor matchmaking at every node, top-k by the negotiator.

Theory of operation (PonD, Lee et al. 2012, §3.1.1–§3.1.4, §4.1; Thain et al. 2004 §5):

* **Where it runs.** A query is an aggregation of the recursive-partition multicast
  (``overlay.multicast``): the root sends a :class:`~discovery.query_messages.QueryArg` (the job
  ClassAd as text, k, the mode, the attributes to return) down the tree; every node *maps* by
  matching the job against its own machine ad **as it is now** (:class:`~discovery.machine.
  MachineAd` with its dynamic provider, PonD §3.1.1), then *reduces* its children's answers
  into the best k in the negotiator order and answers its parent once (PonD §3.1.2). The map
  and reduce are the plug-in :class:`ClassAdTopK`, registered by name
  (:data:`QUERY_AGGREGATOR`) on the multicast application of every node by :func:`attach`;
  it finds the node's :class:`ResourceQuery` (and so its machine ad) through the core's
  application registry. Multicast needs no change for this: its aggregator registry by name
  and its opaque, wire-encoded ``arg`` carry everything.
* **Matchmaking** is HTCondor's own (:mod:`discovery.classads`): ``symmetricMatch`` of job and
  machine, the job's ``Rank`` evaluated with ``MY`` = job and ``TARGET`` = machine, ties broken
  by the machine's ``Rank`` of the job, then by the smaller node id. A node whose ad cannot be
  evaluated answers "no match" and counts it (``errors``/``undefined``), a machine already in a
  Pool on Demand answers no (``claimed``; the stamp is exclusive, see ``docs/query.md``).
* **O(k) per edge** (PonD §4.1). A reply holds at most k matches (node handle, two ranks, the
  projected attributes: those the job's expressions name, plus ``Name``/``Machine``) and fixed
  counters; reduce keeps the top k of the union, deduplicated by node id, so the result is the
  exact top k of every node that answered.
* **Modes** (PonD §3.1.3). ``best`` waits for the whole tree. ``first_fit`` lets a node answer
  as soon as its reduction holds **at least k** matches (threshold ``>= k``: PonD's "larger
  than the number requested" read as "enough to fill the request"; with ``> k`` a subtree would
  wait for one match it then throws away). Such an answer is flagged ``early``; the parts of
  the tree it did not wait for are not reported as missing — they were not needed.
* **Redundant trees** (PonD §3.1.4): ``redundant=True`` runs the clockwise and the
  counter-clockwise tree; the root merges the two top-k lists by node id and reports a range as
  missing only if both trees missed it.
* **Errors at the caller.** Every expression is parsed before anything is sent:
  :class:`~discovery.classads.QuerySyntaxError` carries the parser's message and the text.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs

from discovery.classads import (
    ERROR,
    MATCH,
    REJECT,
    UNDEFINED,
    ClassAd,
    ExprTree,
    JobAd,
    QuerySyntaxError,
    evaluate,
    job_ad,
    parse_ad,
    target_refs,
)
from discovery.machine import MachineAd
from discovery.query_messages import MODES, QueryArg, QueryMatch, QueryValue
from overlay.errors import ConfigError, OverlayError
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.kbr import BaseApplication
from overlay.multicast import MULTICAST_APP, Multicast, MulticastHost, MulticastResult, Range

if TYPE_CHECKING:
    from overlay.kbr import KbrCore

__all__ = [
    "MAX_K",
    "QUERY_AGGREGATOR",
    "QUERY_APP",
    "ClassAdTopK",
    "Match",
    "QueryConfig",
    "QueryResult",
    "ResourceQuery",
    "attach",
    "counters",
    "prepare_query",
]

#: the application name of :class:`ResourceQuery` on every core
QUERY_APP = "discovery.query"
#: the multicast aggregator name of :class:`ClassAdTopK`
QUERY_AGGREGATOR = "discovery.classad"
#: largest k a node honours (a reply is O(k); the codec bounds a datagram anyway)
MAX_K = 1000
#: attributes returned with every match besides those the job's expressions name
ALWAYS_RETURNED = ("Name", "Machine")


@attrs.frozen
class QueryConfig:
    """Knobs of a node's query application."""

    #: bound on a whole query (s); None: the multicast's own per-level deadlines, which size
    #: themselves to the tree (overlay.multicast.MulticastConfig.level_s, PonD's WAN model).
    timeout_s: float | None = None
    #: parsed job ads remembered, process-wide (a job is parsed once, not once per node or
    #: query: in a simulation every node shares the cache; parsed ads are never mutated).
    job_cache: int = 256


class Match(NamedTuple):
    """One matched machine: its node, the job's rank of it, its projected attributes."""

    handle: NodeHandle
    rank: float
    ad: ClassAd


@attrs.frozen(slots=True)
class QueryResult:
    """What the root learns from one query."""

    matches: tuple[Match, ...]  #: best first, in the negotiator order, at most k
    visited: int  #: nodes that evaluated the query (redundant: the larger tree's count)
    missing: tuple[Range, ...]  #: clockwise ranges no tree covered (nodes there not seen)
    elapsed_s: float  #: from the call to the answer, on the runtime's clock
    early: bool  #: First-Fit: some subtree answered before all its nodes did
    depth: int = 0
    matched: int = 0  #: matching machines seen (may exceed ``len(matches)``)
    rejected: int = 0
    undefined: int = 0
    errors: int = 0  #: ads that could not be evaluated (counted, not raised)
    claimed: int = 0  #: machines in a pond, which answered no
    no_ad: int = 0  #: nodes without a machine ad
    machine_ranks: tuple[float, ...] = ()  #: the machines' own ranks, parallel to ``matches``
    audit: frozenset[NodeId] | None = None  #: ids of every node that evaluated (audit mode)
    qid: int = 0

    @property
    def complete(self) -> bool:
        """Every node answered: nothing missing and no early finish."""
        return not self.missing and not self.early


# ---------------------------------------------------------------------- the aggregator
def _key(m: QueryMatch) -> tuple[float, float, int]:
    return (-m.rank, -m.machine_rank, int(m.node.id))


def _top(k: int, groups: Iterable[Iterable[QueryMatch]]) -> tuple[QueryMatch, ...]:
    """The best ``k`` of the union, one entry per node id (the better one wins)."""
    best: dict[int, QueryMatch] = {}
    for m in itertools.chain.from_iterable(groups):
        if type(m) is not QueryMatch or math.isnan(m.rank) or math.isnan(m.machine_rank):
            continue  # a peer's malformed entry cannot poison the order
        nid = int(m.node.id)
        old = best.get(nid)
        if old is None or _key(m) < _key(old):
            best[nid] = m
    return tuple(sorted(best.values(), key=_key)[:k])


def _k(arg: QueryArg) -> int:
    k = arg.k
    return 1 if k < 1 else MAX_K if k > MAX_K else k


_COUNTS = ("visited", "matched", "rejected", "undefined", "errors", "claimed", "no_ad")


def _value(matches: tuple[QueryMatch, ...], c: list[int], audit: tuple[NodeId, ...]) -> QueryValue:
    return QueryValue(matches, c[0], c[1], c[2], c[3], c[4], c[5], c[6], audit)


class ClassAdTopK:
    """The multicast plug-in: match locally, keep the best k, answer early in First-Fit.

    Registered under :data:`QUERY_AGGREGATOR` on every node (:func:`attach`). Values that came
    over the network are checked before use; nothing here raises on a peer's bad value.
    """

    def map(self, mc: MulticastHost, arg: Any) -> QueryValue | None:
        """Evaluate the query on this node's machine ad (None for a malformed argument; a node
        without the query application counts as visited with no ad)."""
        core = mc.core
        if type(arg) is not QueryArg:
            core.stats["query_bad_arg"] += 1
            return None
        app = core.apps.get(QUERY_APP)
        if not isinstance(app, ResourceQuery):
            return QueryValue((), 1, 0, 0, 0, 0, 0, 1, (core.id,) if arg.audit else ())
        return app.evaluate(arg)

    def reduce(self, arg: Any, acc: QueryValue, child: Any) -> QueryValue:
        """Keep the best k matches of both and add up the counters (a bad child is ignored)."""
        if type(child) is not QueryValue or type(arg) is not QueryArg:
            return acc
        return _value(
            _top(_k(arg), (acc.matches, child.matches)),
            [getattr(acc, c) + getattr(child, c) for c in _COUNTS],
            acc.audit + child.audit if arg.audit else (),
        )

    def done(self, arg: Any, acc: QueryValue) -> bool:
        # First-Fit threshold: at least k distinct matches held (module docstring)
        """First-Fit: done once at least k distinct matches are held; the best mode never ends
        early."""
        return type(arg) is QueryArg and arg.mode == "first_fit" and len(acc.matches) >= _k(arg)

    def merge(self, arg: Any, a: QueryValue, b: QueryValue) -> QueryValue:
        """Clockwise + counter-clockwise: union by node id; counters are the larger tree's
        (a lower bound of the union's, as for counting)."""
        k = _k(arg) if type(arg) is QueryArg else MAX_K
        audit = tuple(sorted(set(a.audit) | set(b.audit)))
        counts = [max(getattr(a, c), getattr(b, c)) for c in _COUNTS]
        return _value(_top(k, (a.matches, b.matches)), counts, audit)


#: one stateless instance serves every node
AGGREGATOR = ClassAdTopK()


# ---------------------------------------------------------------------- building a query
def prepare_query(
    requirements: str | ExprTree | None = None,
    rank: str | float | ExprTree | None = None,
    *,
    k: int,
    mode: str = "best",
    job: ClassAd | str | None = None,
    job_id: str = "",
    attrs: Sequence[str] = (),
    audit: bool = False,
) -> tuple[QueryArg, JobAd]:
    """Validate and build a query argument; raises before anything could be sent.

    Either ``requirements`` (and ``rank``) or a whole ``job`` ad (a ``classad2.ClassAd`` or its
    text; ``requirements``/``rank`` given too override its own). Raises
    :class:`~discovery.classads.QuerySyntaxError` for text the ClassAd parser rejects and
    :class:`~overlay.errors.ConfigError` for a bad ``k`` or ``mode``.
    """
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ConfigError(f"k must be an int in 1..{MAX_K}, got {k!r}")
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(job_id, str):
        raise ConfigError(f"job_id must be a string, got {type(job_id).__name__}")
    if job is None:
        if requirements is None:
            raise ConfigError("a query needs requirements or a job ad")
        ad = job_ad(requirements, rank)
    else:
        ad = parse_ad(job, "job ad") if isinstance(job, str) else _copy(job)
        if requirements is not None or rank is not None:
            extra = job_ad(requirements if requirements is not None else "true", rank)
            if requirements is not None:
                ad["Requirements"] = extra["Requirements"]
            if rank is not None:
                ad["Rank"] = extra.lookup("Rank")
        if "Requirements" not in ad:
            raise QuerySyntaxError("job ad", str(ad), "no Requirements (it would never match)")
    if job_id:
        ad["PondJobId"] = job_id
    parsed = JobAd(ad)
    JobAd.from_text(parsed.text)  # what every node will parse: prove it round-trips
    names = {n.lower(): n for n in (*ALWAYS_RETURNED, *target_refs(ad), *attrs)}
    arg = QueryArg(parsed.text, k, mode, tuple(sorted(names.values())), job_id, audit)
    return arg, parsed


def _copy(ad: ClassAd) -> ClassAd:
    if not isinstance(ad, ClassAd):
        raise ConfigError(f"job must be a classad2.ClassAd or its text, not {type(ad).__name__}")
    out = ClassAd()
    out.update(ad)
    return out


# ---------------------------------------------------------------------- the application
#: job text -> parsed job (None: unparseable), shared by every node of the process
_JOBS: OrderedDict[str, JobAd | None] = OrderedDict()


class ResourceQuery(BaseApplication):
    """A node's query application: answers queries with its machine ad, starts queries.

    ``machine`` is this node's :class:`~discovery.machine.MachineAd` (None on a node that
    offers no machine: it answers ``no_ad``). ``stats`` counts outcomes of local evaluations
    (``query_match``, ``query_reject``, ``query_undefined``, ``query_error``,
    ``query_claimed``, ``query_bad_job``) and of queries started here.
    """

    def __init__(
        self, core: KbrCore, machine: MachineAd | None = None, config: QueryConfig | None = None
    ) -> None:
        self.core = core
        self.machine = machine
        self.config = config if config is not None else QueryConfig()
        self.stats: Counter[str] = Counter()

    # ------------------------------------------------------------------ the map
    def _job(self, text: str) -> JobAd | None:
        jobs = _JOBS
        j = jobs.get(text, False)
        if j is not False:
            jobs.move_to_end(text)
            return j  # type: ignore[return-value]
        try:
            parsed: JobAd | None = JobAd.from_text(text)
        except QuerySyntaxError:
            parsed = None
        jobs[text] = parsed
        if len(jobs) > self.config.job_cache:
            jobs.popitem(last=False)
        return parsed

    def evaluate(self, arg: QueryArg) -> QueryValue:
        """Match ``arg``'s job against this node's current machine ad (the map). Never raises."""
        core = self.core
        audit = (core.id,) if arg.audit else ()
        m = self.machine
        if m is None:
            self.stats["query_no_ad"] += 1
            return QueryValue((), 1, 0, 0, 0, 0, 0, 1, audit)
        job = self._job(arg.job_ad)
        if job is None:
            self.stats["query_bad_job"] += 1
            return QueryValue((), 1, 0, 0, 0, 1, 0, 0, audit)
        if m.stamp is not None:
            self.stats["query_claimed"] += 1
            return QueryValue((), 1, 0, 0, 0, 0, 1, 0, audit)
        ad = m.current()
        outcome, jr, mr = evaluate(job, ad)
        self.stats["query_" + outcome] += 1
        if outcome == MATCH:
            match = QueryMatch(core.handle, jr, mr, m.project(arg.projection, ad))
            return QueryValue((match,), 1, 1, 0, 0, 0, 0, 0, audit)
        return QueryValue(
            (),
            1,
            0,
            1 if outcome == REJECT else 0,
            1 if outcome == UNDEFINED else 0,
            1 if outcome == ERROR else 0,
            0,
            0,
            audit,
        )

    # ------------------------------------------------------------------ the root
    def query(
        self,
        requirements: str | ExprTree | None = None,
        rank: str | float | ExprTree | None = None,
        *,
        k: int,
        on_done: Callable[[QueryResult], None],
        mode: str = "best",
        redundant: bool = False,
        job: ClassAd | str | None = None,
        job_id: str = "",
        attrs: Sequence[str] = (),
        timeout_s: float | None = None,
        level_s: float | None = None,
        audit: bool = False,
    ) -> int:
        """Find the best ``k`` machines (``mode="best"``) or the first ``k`` that fit
        (``mode="first_fit"``) for a job; ``on_done(QueryResult)`` is called once (it may run
        before this returns when the ring holds only this node). Returns the query id.

        Raises :class:`~discovery.classads.QuerySyntaxError` or
        :class:`~overlay.errors.ConfigError` before anything is sent.
        """
        arg, _ = prepare_query(
            requirements, rank, k=k, mode=mode, job=job, job_id=job_id, attrs=attrs, audit=audit
        )
        return self.run(arg, on_done, redundant=redundant, timeout_s=timeout_s, level_s=level_s)

    def run(
        self,
        arg: QueryArg,
        on_done: Callable[[QueryResult], None],
        *,
        redundant: bool = False,
        timeout_s: float | None = None,
        level_s: float | None = None,
    ) -> int:
        """Start a query from a prepared argument (:func:`prepare_query`)."""
        mc = self.core.apps.get(MULTICAST_APP)
        if not isinstance(mc, Multicast):
            raise OverlayError("this node has no multicast application (overlay.multicast)")
        self.stats["queries_started"] += 1

        def done(r: MulticastResult) -> None:
            res = self._result(r, arg)
            self.stats["queries_done"] += 1
            on_done(res)

        return mc.aggregate(
            QUERY_AGGREGATOR,
            arg,
            on_done=done,
            direction="both" if redundant else "cw",
            timeout_s=timeout_s if timeout_s is not None else self.config.timeout_s,
            level_s=level_s,
        )

    def _result(self, r: MulticastResult, arg: QueryArg) -> QueryResult:
        v = r.value
        if type(v) is not QueryValue:
            v = QueryValue((), 0, 0, 0, 0, 0, 0, 0)
        matches = []
        for m in v.matches:
            try:
                ad = parse_ad(m.ad, "matched machine ad")
            except QuerySyntaxError:
                self.stats["query_bad_match_ad"] += 1
                ad = ClassAd()
            matches.append(Match(m.node, m.rank, ad))
        return QueryResult(
            matches=tuple(matches),
            visited=v.visited,
            missing=tuple(r.missing),
            elapsed_s=r.elapsed_s,
            early=r.early,
            depth=r.depth,
            matched=v.matched,
            rejected=v.rejected,
            undefined=v.undefined,
            errors=v.errors,
            claimed=v.claimed,
            no_ad=v.no_ad,
            machine_ranks=tuple(m.machine_rank for m in v.matches),
            audit=frozenset(v.audit) if arg.audit else None,
            qid=r.qid,
        )

    # ------------------------------------------------------------------ KBR upcall
    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        """The query travels inside multicast messages; nothing is routed to this app."""
        self.stats["query_dropped"] += 1


def attach(
    core: KbrCore,
    machine: MachineAd | None = None,
    config: QueryConfig | None = None,
) -> ResourceQuery:
    """Create the query application for ``core``, register it as :data:`QUERY_APP`, and
    register :class:`ClassAdTopK` on the core's multicast application (which must be
    attached already: ``overlay.multicast.attach``)."""
    mc = core.apps.get(MULTICAST_APP)
    if not isinstance(mc, Multicast):
        raise OverlayError("attach the multicast application (overlay.multicast) first")
    app = ResourceQuery(core, machine, config)
    core.register(QUERY_APP, app)
    mc.add_aggregator(QUERY_AGGREGATOR, AGGREGATOR)
    return app


def counters(stats: Mapping[str, int]) -> dict[str, int]:
    """The ``query_*`` counters of a stats mapping (for status tables)."""
    return {k: v for k, v in stats.items() if k.startswith("query")}
