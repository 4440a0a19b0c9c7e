"""Control requests that tools (the ``flockring`` CLI) send to a live node's discovery plugins.

A node answers them through ``overlay.Node.add_control_handler`` (so they pass the node's
return-routability cookie check and per-source rate limit, see ``overlay/live/gate.py``).
Replies carry plain msgpack-able data (dicts of strings and numbers) built by the pure
functions below, so what a tool prints and what a test checks come from one place.

Tags 190–197 (the discovery plugins' spare range). Sans-io: no trio here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from overlay.messages import Message, register

if TYPE_CHECKING:
    from discovery.announce import Flock
    from discovery.pond_scheduler import PondScheduler
    from discovery.pond_types import PondResult, ReleaseResult
    from discovery.query import QueryResult

__all__ = [
    "FlockInfoRequest",
    "InfoReply",
    "ManagerInfoRequest",
    "PondMemberRequest",
    "PondQueueRequest",
    "PondReleaseRequest",
    "PondRequest",
    "QueryRequest",
    "flock_info",
    "pond_info",
    "pond_queue_info",
    "query_info",
    "release_info",
]

#: attributes of a matched machine ad a query reply shows (PonD §3.1: the projection)
SHOWN_ATTRS = ("Name", "Machine", "Arch", "OpSys", "Cpus", "Memory", "LoadAvg", "State")


@register(190)
@attrs.frozen(slots=True)
class FlockInfoRequest(Message):
    """Ask a node for its willing list, flocking decision and (optionally) HTCondor config."""

    nonce: int
    condor_config: bool = False


@register(191)
@attrs.frozen(slots=True)
class QueryRequest(Message):
    """Run a ClassAd tree query from the node and answer with its result."""

    nonce: int
    requirements: str
    rank: str
    k: int
    mode: str
    redundant: bool


@register(192)
@attrs.frozen(slots=True)
class PondRequest(Message):
    """Form a pond managed by the node (query + invitations) and answer with its members."""

    nonce: int
    requirements: str
    rank: str
    k: int


@register(193)
@attrs.frozen(slots=True)
class PondReleaseRequest(Message):
    """Release a pond the node manages."""

    nonce: int
    pond_id: int


@register(194)
@attrs.frozen(slots=True)
class ManagerInfoRequest(Message):
    """Ask a node of a pool ring who the manager is (faultD status)."""

    nonce: int


@register(196)
@attrs.frozen(slots=True)
class PondQueueRequest(Message):
    """Queue-driven ponds on the node (PonD §3.2): ``action`` is ``start`` (with the scheduler's
    minimum interval and pond cap), ``status``, or ``stop`` (stop and release every pond)."""

    nonce: int
    action: str
    interval_s: float = 5.0
    max_pond: int = 64


@register(197)
@attrs.frozen(slots=True)
class PondMemberRequest(Message):
    """Ask a machine which pond it is in and which ponds it joined and left."""

    nonce: int


@register(195)
@attrs.frozen(slots=True)
class InfoReply(Message):
    """The answer to any request above: ``ok`` with ``data``, or not ok with ``error``."""

    nonce: int
    ok: bool
    data: Any
    error: str = ""


def _ad_values(ad: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in SHOWN_ATTRS:
        try:
            v = ad.eval(name)
        except Exception:  # an attribute that cannot be evaluated is shown as absent
            continue
        if isinstance(v, bool | int | float | str):
            out[name] = v
    return out


def query_info(r: QueryResult) -> dict[str, Any]:
    """A query result as plain data (matches best first)."""
    return {
        "matches": [
            {
                "node": str(m.handle.id),
                "address": str(m.handle.address),
                "rank": m.rank,
                "ad": _ad_values(m.ad),
            }
            for m in r.matches
        ],
        "visited": r.visited,
        "missing": [[str(a), str(b)] for a, b in r.missing],
        "elapsed_s": round(r.elapsed_s, 4),
        "early": r.early,
        "matched": r.matched,
        "rejected": r.rejected,
        "errors": r.errors,
        "claimed": r.claimed,
    }


def pond_info(r: PondResult) -> dict[str, Any]:
    """A pond-forming round as plain data."""
    return {
        "pond_id": r.pond_id,
        "job_id": r.job_id,
        "members": [[str(h.id), str(h.address)] for h in r.members],
        "declined": dict(r.declined),
        "lost": len(r.lost),
        "surplus": len(r.surplus),
        "elapsed_s": round(r.elapsed_s, 4),
        "query": query_info(r.query) if r.query is not None else None,
    }


def release_info(r: ReleaseResult) -> dict[str, Any]:
    """A pond release as plain data."""
    return {
        "pond_id": r.pond_id,
        "acked": len(r.acked),
        "unacked": len(r.unacked),
        "elapsed_s": round(r.elapsed_s, 4),
    }


def flock_info(flock: Flock, now_s: float, condor_fragment: str | None = None) -> dict[str, Any]:
    """The willing list by row, the current decision, the rendered configuration and the
    blacklists."""
    rows = []
    for i, sub in enumerate(flock.willing_list()):
        rows.append(
            [
                {
                    "row": i,
                    "node": str(e.origin.id),
                    "pool": e.pool_name,
                    "collector": e.collector,
                    "rtt_ms": round(e.rtt_s * 1e3, 2) if e.rtt_s is not None else None,
                    "free": e.free_machines,
                    "expires_in_s": round(e.expires_at_s - now_s, 1),
                }
                for e in sub
            ]
        )
    d = flock.decision
    pool = flock.pool
    return {
        "pool": {
            "name": flock.pool_name,
            "collector": flock.collector,
            "machines": pool.machines,
            "free": pool.free_machines,
            "idle_jobs": pool.idle_jobs,
            "running_jobs": pool.running_jobs,
        },
        "willing": rows,
        "decision": None
        if d is None
        else {
            "enabled": d.enabled,
            "targets": [t.collector for t in d.targets],
            "epoch": d.epoch,
            "seq": d.seq,
        },
        "condor_config": condor_fragment,
        # pool -> seconds left: our own (§3.2.1), and what trusted pools told us (with whom)
        "blacklist": {k: round(v, 1) for k, v in flock.blacklist().items()},
        "blacklist_learned": {
            k: {"left_s": round(v, 1), "from": list(by)}
            for k, (v, by) in flock.learned_blacklist().items()
        },
        "stats": {k: int(v) for k, v in flock.stats.items()},
    }


#: the most dispatched / finished jobs a queue-pond reply lists (the newest are kept)
MAX_LISTED_JOBS = 2000


def pond_queue_info(
    sched: PondScheduler,
    *,
    running: bool,
    dispatched: list[list[Any]],
    finished: list[list[Any]],
    violations: list[str],
    queue_empty: bool | None,
) -> dict[str, Any]:
    """A queue-driven pond scheduler as plain data: counters, one row per autocluster pond,
    the jobs dispatched (``[job id, machine id, pond job id]``) and finished (``[job id,
    machine id, start, end]``, simulated queues only), and any start on a machine that was not a
    member of the job's pond (``violations``, expected empty)."""
    clusters = []
    for key, c in sched.clusters.items():
        req, _, rank = key.partition("\x00")
        members: list[str] = []
        if c.pond_id is not None and c.pond_id in sched.pond.ponds:
            members = [str(h.id) for h in sched.pond.members(c.pond_id)]
        clusters.append(
            {
                "requirements": req,
                "rank": rank,
                "job_id": c.job_id,
                "pond_id": c.pond_id,
                "members": members,
                "pending": c.pending,
            }
        )
    src = sched.source
    st = sched.stats
    return {
        "running": running,
        "cycles": int(st["cycles"]),
        "ponds_formed": int(st["ponds_formed"]),
        "ponds_grown": int(st["ponds_grown"]),
        "ponds_released": int(st["ponds_released"]),
        "members_shrunk": int(st["members_shrunk"]),
        "idle_jobs": len(src.idle_jobs()),
        "running_jobs": len(src.running_jobs()),
        "queue_empty": queue_empty,
        "clusters": clusters,
        "dispatched": dispatched[-MAX_LISTED_JOBS:],
        "finished": finished[-MAX_LISTED_JOBS:],
        "violations": violations[:50],
        "pond_stats": {k: int(v) for k, v in sched.pond.stats.items()},
    }
