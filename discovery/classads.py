"""Thin wrappers over HTCondor's own ClassAd library (``classad2``): parsing, matching, ranking.

Theory of operation (Thain et al. 2004 §5 "Planning and Scheduling", §5.1; PonD §3.1.1): a
job and a machine are ClassAds; they *match* when each ad's ``Requirements`` evaluates to true
with the other ad as ``TARGET`` (a symmetric match); among matching machines the job prefers
the one whose job ``Rank`` (evaluated with ``MY`` = the job and ``TARGET`` = the machine) is
highest. Nothing here evaluates an expression by hand: matching is ``ClassAd.symmetricMatch``
and every value comes from ``ExprTree.eval`` of the ``htcondor`` wheel.

* **Scoping.** ``import htcondor2`` switches the ClassAd library, process-wide, to the
  negotiator's semantics in which an unscoped name (``Memory``) falls back to the other ad when
  the own ad lacks it. This module imports it before any matching, so a job written as
  ``Memory > 1024`` means what it means to ``condor_negotiator``; ``MY.``/``TARGET.`` work
  either way.
* **Negotiator order** (Thain et al. 2004 §5: "the matchmaker chooses the one with the
  highest Rank value (non-integer values are treated as zero), breaking ties according to the
  provider's Rank value"; HTCondor's matchmaker reads ranks with ``EvalFloat``). Candidates are
  ordered by, best first: the job's ``Rank`` of the machine, the machine's own ``Rank`` of the
  job, then the smaller node id (the stated deterministic rule: ids are unique and known at
  every node, so the order is total and the top-k of a union is the top-k of the top-ks).
  A rank that evaluates to an integer, a real or a boolean is that number (``true`` = 1.0, as
  ``EvalFloat`` converts it); undefined, error, strings, lists, records, a NaN or a missing
  ``Rank`` count as 0.0.
* **Failures are outcomes, not exceptions.** An ad whose ``Requirements`` evaluate to
  ``ERROR`` does not match and is reported as :data:`ERROR`; one that evaluates to
  ``UNDEFINED`` (three-valued logic: an attribute the other ad lacks) or to a non-boolean is
  :data:`UNDEFINED`; both are counted by the caller, never raised. Only the *user's* text is
  checked eagerly: :func:`parse_expr` and :func:`parse_ad` raise :class:`QuerySyntaxError`
  carrying the parser's message and the offending text (the library itself reports no
  position, and its ``lastError()`` is sticky, so it is not used).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable, Mapping
from typing import Any

import classad2

from overlay.errors import OverlayError

__all__ = [
    "ERROR",
    "MATCH",
    "REJECT",
    "UNDEFINED",
    "ClassAd",
    "ExprTree",
    "JobAd",
    "QuerySyntaxError",
    "evaluate",
    "job_ad",
    "negotiator_key",
    "parse_ad",
    "parse_expr",
    "rank_number",
    "target_refs",
]

# the negotiator's scoping (see the module docstring); imported for its side effect
importlib.import_module("htcondor2")

ClassAd = classad2.ClassAd
ExprTree = classad2.ExprTree

#: outcomes of :func:`evaluate`
MATCH = "match"
REJECT = "reject"
UNDEFINED = "undefined"
ERROR = "error"

#: the machine's ``Requirements`` evaluated with this scope is how HTCondor's startd says START
_REQ = "Requirements"
_RANK = "Rank"


class QuerySyntaxError(OverlayError, ValueError):
    """A ClassAd expression or ad that HTCondor's parser rejects.

    ``what`` names the piece (``"Requirements"``, ``"Rank"``, ``"line 3"``), ``text`` is the
    offending text and ``parser_message`` what ``classad2`` said about it.
    """

    def __init__(self, what: str, text: str, parser_message: str) -> None:
        self.what = what
        self.text = text
        self.parser_message = parser_message
        super().__init__(f"invalid ClassAd {what}: {parser_message} in {text!r}")


def _parser_message(exc: BaseException) -> str:
    msg = str(exc).strip()
    return msg or type(exc).__name__


def parse_expr(text: str | classad2.ExprTree, what: str = "expression") -> classad2.ExprTree:
    """Parse one ClassAd expression (``Memory > 1024 && Arch == "X86_64"``).

    Raises :class:`QuerySyntaxError` for text HTCondor's parser rejects (including trailing
    garbage, which the parser reports too) and for an empty expression.
    """
    if isinstance(text, classad2.ExprTree):
        return text
    if not isinstance(text, str):
        raise QuerySyntaxError(what, repr(text), f"expected a string, got {type(text).__name__}")
    if not text.strip():
        raise QuerySyntaxError(what, text, "empty expression")
    try:
        return classad2.ExprTree(text)
    except Exception as exc:  # classad2 raises its own ClassAdException type
        raise QuerySyntaxError(what, text, _parser_message(exc)) from None


def parse_ad(text: str, what: str = "ClassAd") -> classad2.ClassAd:
    """Parse a whole ClassAd: new syntax (``[ a = 1; b = "x" ]``) or the old, line-based
    syntax of ``condor_status -long`` (``Name = value`` per line, ``#`` comments).

    Old syntax is parsed line by line so that an error names its line; new syntax is checked
    as one expression first because ``ClassAd(text)`` silently ignores trailing garbage.
    """
    if not isinstance(text, str):
        raise QuerySyntaxError(what, repr(text), f"expected a string, got {type(text).__name__}")
    body = text.strip()
    if body.startswith("["):
        tree = parse_expr(body, what)
        try:
            ad = tree.eval()
        except Exception as exc:
            raise QuerySyntaxError(what, text, _parser_message(exc)) from None
        if not isinstance(ad, classad2.ClassAd):
            raise QuerySyntaxError(what, text, "not a ClassAd record")
        return ad
    ad = classad2.ClassAd()
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        name, eq, expr = s.partition("=")
        name = name.strip()
        if not eq or not name.replace("_", "a").replace(".", "a").isalnum():
            raise QuerySyntaxError(f"{what} line {n}", line, "expected 'Name = expression'")
        ad[name] = parse_expr(expr.strip(), f"{what} line {n} ({name})")
    return ad


def job_ad(
    requirements: str | classad2.ExprTree,
    rank: str | float | classad2.ExprTree | None = None,
    attrs: Mapping[str, Any] | None = None,
) -> classad2.ClassAd:
    """A job ClassAd with these ``Requirements`` and ``Rank`` (strings are parsed eagerly:
    :class:`QuerySyntaxError` names which one is wrong) plus plain ``attrs``."""
    ad = classad2.ClassAd()
    ad["MyType"] = "Job"
    ad["TargetType"] = "Machine"
    for k, v in (attrs or {}).items():
        ad[k] = v
    ad[_REQ] = parse_expr(requirements, _REQ)
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, (int, float)):
            ad[_RANK] = parse_expr(rank, _RANK)
        else:
            ad[_RANK] = float(rank)
    return ad


def rank_number(v: Any) -> float:
    """A rank value as the negotiator reads it: int/real/bool as a number, anything else 0.0.

    ``classad2.Value`` (UNDEFINED/ERROR) is an ``IntEnum`` — an ``int`` to ``isinstance`` — so
    it is tested first.
    """
    if isinstance(v, classad2.Value):
        return 0.0
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        f = float(v)
        return 0.0 if math.isnan(f) else f
    return 0.0


def negotiator_key(job_rank: float, machine_rank: float, node_id: int) -> tuple[float, float, int]:
    """Sort key of a candidate, smallest = best (the negotiator order, module docstring)."""
    return (-job_rank, -machine_rank, node_id)


class JobAd:
    """A parsed job ad with its expressions looked up once (``classad2`` lookups are not free),
    and the text it travels as."""

    __slots__ = ("ad", "rank", "requirements", "text")

    def __init__(self, ad: classad2.ClassAd, text: str | None = None) -> None:
        self.ad = ad
        self.text = str(ad) if text is None else text
        self.requirements = ad.get(_REQ)
        self.rank = ad.get(_RANK)

    @classmethod
    def from_text(cls, text: str) -> JobAd:
        """Parse a job ad that came over the wire (raises :class:`QuerySyntaxError`)."""
        return cls(parse_ad(text, "job ad"), text)

    def __repr__(self) -> str:
        return f"JobAd({self.requirements!s})"


def _truth(v: Any) -> str:
    """Classify a ``Requirements`` value: MATCH for true, REJECT for false, else why not."""
    if isinstance(v, classad2.Value):
        return ERROR if v is classad2.Value.Error else UNDEFINED
    if v is True:
        return MATCH
    if v is False:
        return REJECT
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return MATCH if v != 0 else REJECT  # ``matches`` converts numbers as HTCondor does
    return UNDEFINED


def _eval(expr: Any, scope: classad2.ClassAd, target: classad2.ClassAd) -> Any:
    if expr is None:
        return classad2.Value.Undefined
    if not isinstance(expr, classad2.ExprTree):
        return expr  # a literal stored as a Python value
    try:
        return expr.eval(scope=scope, target=target)
    except Exception:  # the library refusing an expression is an evaluation error
        return classad2.Value.Error


def evaluate(job: JobAd, machine: classad2.ClassAd) -> tuple[str, float, float]:
    """Match ``job`` against ``machine``: ``(outcome, job rank, machine rank)``.

    The decision is ``symmetricMatch`` (HTCondor's own); when it says no, the two
    ``Requirements`` are evaluated once more only to say *why* (REJECT, UNDEFINED, ERROR).
    Ranks are 0.0 unless the outcome is MATCH. Never raises.
    """
    try:
        ok = job.ad.symmetricMatch(machine) is True
    except Exception:
        return ERROR, 0.0, 0.0
    if not ok:
        a = _truth(_eval(job.requirements, job.ad, machine))
        b = _truth(_eval(machine.get(_REQ), machine, job.ad))
        if ERROR in (a, b):
            return ERROR, 0.0, 0.0
        if UNDEFINED in (a, b):
            return UNDEFINED, 0.0, 0.0
        return REJECT, 0.0, 0.0
    jr = rank_number(_eval(job.rank, job.ad, machine)) if job.rank is not None else 0.0
    mr_expr = machine.get(_RANK)
    mr = rank_number(_eval(mr_expr, machine, job.ad)) if mr_expr is not None else 0.0
    return MATCH, jr, mr


def target_refs(job: classad2.ClassAd) -> tuple[str, ...]:
    """Names of the machine attributes the job's ``Requirements`` and ``Rank`` refer to
    (``TARGET.Memory`` and, under the negotiator's scoping, unscoped names the job lacks),
    sorted: what a query returns of each matched machine."""
    names: set[str] = set()
    for key in (_REQ, _RANK):
        e = job.get(key)
        if not isinstance(e, classad2.ExprTree):
            continue
        try:
            refs: Iterable[str] = job.externalRefs(e)
        except Exception:
            continue
        for r in refs:
            head = r.split(".")
            if len(head) >= 2 and head[0].upper() == "TARGET":
                names.add(head[1])
            elif len(head) == 1 and head[0]:
                names.add(head[0])
    return tuple(sorted(names, key=str.lower))
