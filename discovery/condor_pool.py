"""CondorPool: a live HTCondor pool's state, read through the official bindings.

Theory of operation. The Flocking Manager (Butt et al. 2006 §4.1) needs the local pool's
machines, free machines and queued jobs. In HTCondor those live in two places: the collector
holds one ad per startd *slot* (``condor_status -long``), and each schedd holds the job queue
(``condor_q -long``). :class:`CondorPool` reads both through two injectable *ad sources* —
callables returning ``classad2.ClassAd`` objects — so the same counting code runs on a live
pool (:func:`htcondor_ad_sources`: ``htcondor2.Collector.query`` of startd ads and
``htcondor2.Schedd.query`` of each schedd's jobs) and on recorded ad text in tests
(:func:`parse_ad_text`, :meth:`CondorPool.from_files`).

What is counted (one "machine" is one job slot, as in Butt's model of one job a machine):

* a **static** slot is one machine, free when ``State == "Unclaimed" && Activity == "Idle"``
  (what ``condor_status -avail`` calls available; Owner, Matched, Claimed, Preempting,
  Drained and Backfill are not free);
* a **partitionable** slot is ``TotalSlotCpus / job_cpus`` machines; while it is Unclaimed its
  free part is what a typical job could still carve out of the *remaining* resources,
  ``min(Cpus // job_cpus, Memory // job_memory_mb)``;
* a **dynamic** slot is carved out of its partitionable parent and already counted there;
* ads with ``Absent == true`` (startds that stopped reporting) are ignored.

Jobs: ``JobStatus == 1`` is idle, ``2`` running, ``5`` held (reported, not counted as idle).

Reads happen in :meth:`CondorPool.refresh` (a blocking call: a live driver runs it in a worker
thread once a period); the :class:`~discovery.pool.PoolState` properties read the last
snapshot and refresh only the first time. Nothing here was run against a live pool: the live
sources are exercised only against an unreachable collector, and the counting against
hand-written ads in the exact ``condor_status -long`` / ``condor_q -long`` format.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from importlib import import_module
from pathlib import Path
from typing import Any

import attrs

from discovery.condor_syntax import CondorError, is_valid_contact

__all__ = [
    "JOB_PROJECTION",
    "STARTD_PROJECTION",
    "AdSource",
    "CondorPool",
    "PoolSnapshot",
    "htcondor_ad_sources",
    "parse_ad_text",
]

#: returns ClassAds (``classad2.ClassAd``); raises on failure
AdSource = Callable[[], Iterable[Any]]

#: attributes the slot count reads (a projection keeps the collector's answer small)
STARTD_PROJECTION = (
    "Name",
    "Machine",
    "State",
    "Activity",
    "SlotType",
    "PartitionableSlot",
    "DynamicSlot",
    "Cpus",
    "Memory",
    "TotalSlotCpus",
    "TotalSlotMemory",
    "Absent",
)
#: attributes of a job the counts and the PonD scheduler's autoclusters read
JOB_PROJECTION = (
    "ClusterId",
    "ProcId",
    "JobStatus",
    "Owner",
    "User",
    "RequestCpus",
    "RequestMemory",
    "Requirements",
    "Rank",
)
#: the schedd constraint: idle, running and held jobs
JOB_CONSTRAINT = "JobStatus == 1 || JobStatus == 2 || JobStatus == 5"

IDLE, RUNNING, HELD = 1, 2, 5
_ATTR_LINE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*?)\s*")


def parse_ad_text(text: str, *, source: str = "ads") -> list[Any]:
    """Parse ``condor_status -long`` / ``condor_q -long`` text (old ClassAd syntax, ads
    separated by blank lines) with ``classad2.parseAds``.

    ``parseAds`` silently skips, and sometimes repairs, what it cannot parse, so every line is
    first parsed on its own as ``Attr = expression`` and each block must then give exactly
    one ad with all its attributes; otherwise :class:`CondorError` names the source, the line
    and the text.
    """
    classad2: Any = import_module("classad2")
    blocks: list[tuple[int, list[str]]] = []
    cur: list[str] = []
    first = 0
    for n, raw in enumerate(text.splitlines(), 1):
        if raw.strip():
            if not cur:
                first = n
            cur.append(raw)
        elif cur:
            blocks.append((first, cur))
            cur = []
    if cur:
        blocks.append((first, cur))
    ads: list[Any] = []
    for first, lines in blocks:
        attrs_ = [ln for ln in lines if not ln.lstrip().startswith("#")]
        if not attrs_:
            continue
        for k, ln in enumerate(lines):
            if ln.lstrip().startswith("#"):
                continue
            # the old-syntax parser quietly repairs or drops a bad value; parse each alone
            m = _ATTR_LINE.fullmatch(ln)
            try:
                ok = m is not None and classad2.ExprTree(m.group(2)) is not None
            except Exception:
                ok = False
            if not ok:
                raise CondorError(f"{source}, line {first + k}: not 'Attr = expression': {ln!r}")
        body = "\n".join(lines) + "\n"
        try:
            got = list(classad2.parseAds(body, classad2.ParserType.Old))
        except Exception as e:
            raise CondorError(f"{source}, line {first}: {e}: {body[:200]!r}") from e
        if len(got) != 1 or len(got[0]) != len(attrs_):
            raise CondorError(
                f"{source}, line {first}: not one well-formed ClassAd: {body[:200]!r}"
            )
        ads.append(got[0])
    return ads


@attrs.frozen(slots=True)
class PoolSnapshot:
    """One reading of the pool."""

    machines: int
    free_machines: int
    idle_jobs: int
    running_jobs: int
    held_jobs: int
    #: slots by kind: static, partitionable, dynamic; and ads skipped (absent, unreadable)
    slots: dict[str, int] = attrs.field(factory=dict)
    #: the idle job ads (for the PonD scheduler's autoclusters)
    idle_job_ads: tuple[Any, ...] = attrs.field(default=(), repr=False)


def _get(ad: Any, attr: str, default: Any = None) -> Any:
    """Evaluate ``attr`` in ``ad`` (literal or expression); ``default`` if missing or not a
    plain value (undefined / error)."""
    if attr not in ad:
        return default
    try:
        v = ad.eval(attr)
    except Exception:
        return default
    return v if isinstance(v, int | float | str | bool) and not _is_special(v) else default


def _is_special(v: Any) -> bool:
    # classad2.Value (Undefined / Error) is an IntEnum: exclude it from "plain" ints
    return type(v).__name__ == "Value"


def _slot_kind(ad: Any) -> str:
    kind = _get(ad, "SlotType")
    if isinstance(kind, str) and kind.lower() in ("static", "partitionable", "dynamic"):
        return kind.lower()
    if _get(ad, "PartitionableSlot") is True:
        return "partitionable"
    if _get(ad, "DynamicSlot") is True:
        return "dynamic"
    return "static"


def count_slots(
    ads: Iterable[Any], *, job_cpus: int = 1, job_memory_mb: int = 1024
) -> tuple[int, int, dict[str, int]]:
    """``(machines, free machines, slots by kind)`` from startd ads (module notes)."""
    machines = free = 0
    kinds: Counter[str] = Counter()
    for ad in ads:
        if _get(ad, "Absent") is True:
            kinds["absent"] += 1
            continue
        kind = _slot_kind(ad)
        kinds[kind] += 1
        state, activity = _get(ad, "State"), _get(ad, "Activity")
        if kind == "static":
            machines += 1
            if state == "Unclaimed" and activity == "Idle":
                free += 1
        elif kind == "partitionable":
            cpus = _get(ad, "Cpus", 0)
            total = _get(ad, "TotalSlotCpus", cpus)
            mem = _get(ad, "Memory", 0)
            if not all(isinstance(x, int | float) for x in (cpus, total, mem)):
                kinds["unreadable"] += 1
                continue
            machines += int(total) // job_cpus
            if state == "Unclaimed":
                free += max(0, min(int(cpus) // job_cpus, int(mem) // job_memory_mb))
    return machines, free, dict(kinds)


def count_jobs(ads: Iterable[Any]) -> tuple[int, int, int, list[Any]]:
    """``(idle, running, held, idle ads)`` from job ads."""
    idle = running = held = 0
    idle_ads: list[Any] = []
    for ad in ads:
        st = _get(ad, "JobStatus")
        if st == IDLE:
            idle += 1
            idle_ads.append(ad)
        elif st == RUNNING:
            running += 1
        elif st == HELD:
            held += 1
    return idle, running, held, idle_ads


def htcondor_ad_sources(collector: str | None = None) -> tuple[AdSource, AdSource]:
    """Live ad sources for the pool whose collector is ``collector`` (None: this machine's
    ``COLLECTOR_HOST``): startd ads from the collector, and the jobs of every schedd the
    collector knows. ``htcondor2`` is imported on first use (importing it switches ClassAd
    evaluation process-wide to the negotiator's semantics)."""

    def startds() -> list[Any]:
        h: Any = import_module("htcondor2")
        return list(
            h.Collector(collector).query(
                h.AdType.Startd, constraint="true", projection=list(STARTD_PROJECTION)
            )
        )

    def jobs() -> list[Any]:
        h: Any = import_module("htcondor2")
        out: list[Any] = []
        for location in h.Collector(collector).locateAll(h.DaemonType.Schedd):
            out.extend(
                h.Schedd(location).query(constraint=JOB_CONSTRAINT, projection=list(JOB_PROJECTION))
            )
        return out

    return startds, jobs


class CondorPool:
    """A live HTCondor pool as a :class:`~discovery.pool.PoolState` (module notes)."""

    def __init__(
        self,
        name: str,
        collector: str,
        *,
        startd_ads: AdSource | None = None,
        job_ads: AdSource | None = None,
        job_cpus: int = 1,
        job_memory_mb: int = 1024,
    ) -> None:
        if not is_valid_contact(collector):
            raise CondorError(f"invalid collector contact {collector!r}")
        if job_cpus < 1 or job_memory_mb < 1:
            raise CondorError("job_cpus and job_memory_mb must be >= 1")
        live_startds, live_jobs = htcondor_ad_sources(collector)
        self._name = name
        self._collector = collector
        self._startds = startd_ads if startd_ads is not None else live_startds
        self._jobs = job_ads if job_ads is not None else live_jobs
        #: the resources of the typical job a "machine" is counted for (a partitionable
        #: slot's free part); 1 core and 1024 MB unless the site says otherwise
        self.job_cpus = job_cpus
        self.job_memory_mb = job_memory_mb
        self._snap: PoolSnapshot | None = None

    @classmethod
    def from_files(
        cls,
        name: str,
        collector: str,
        status_long: str | Path,
        queue_long: str | Path,
        **kw: Any,
    ) -> CondorPool:
        """A pool read from saved ``condor_status -long`` and ``condor_q -long`` output."""
        st, q = Path(status_long), Path(queue_long)

        def startds() -> list[Any]:
            return parse_ad_text(st.read_text(), source=str(st))

        def jobs() -> list[Any]:
            return parse_ad_text(q.read_text(), source=str(q))

        return cls(name, collector, startd_ads=startds, job_ads=jobs, **kw)

    def refresh(self) -> PoolSnapshot:
        """Read both sources now (blocking) and keep the snapshot; :class:`CondorError` if
        either fails (the previous snapshot is kept)."""
        try:
            slot_ads = list(self._startds())
            job_ads = list(self._jobs())
        except CondorError:
            raise
        except Exception as e:
            raise CondorError(f"reading pool {self._name} ({self._collector}): {e}") from e
        machines, free, kinds = count_slots(
            slot_ads, job_cpus=self.job_cpus, job_memory_mb=self.job_memory_mb
        )
        idle, running, held, idle_ads = count_jobs(job_ads)
        self._snap = PoolSnapshot(
            machines=machines,
            free_machines=free,
            idle_jobs=idle,
            running_jobs=running,
            held_jobs=held,
            slots=kinds,
            idle_job_ads=tuple(idle_ads),
        )
        return self._snap

    @property
    def snapshot(self) -> PoolSnapshot:
        """The last reading (read once now if there is none)."""
        return self._snap if self._snap is not None else self.refresh()

    @property
    def name(self) -> str:
        """The pool's name."""
        return self._name

    @property
    def collector(self) -> str:
        """The pool's collector (central manager) contact."""
        return self._collector

    @property
    def machines(self) -> int:
        """Job slots of the pool (module notes)."""
        return self.snapshot.machines

    @property
    def free_machines(self) -> int:
        """Job slots free now."""
        return self.snapshot.free_machines

    @property
    def idle_jobs(self) -> int:
        """Idle jobs (``JobStatus == 1``) in the pool's schedds."""
        return self.snapshot.idle_jobs

    @property
    def running_jobs(self) -> int:
        """Running jobs (``JobStatus == 2``) of the pool's schedds."""
        return self.snapshot.running_jobs

    @property
    def utilization(self) -> float:
        """Fraction of job slots not free (0.0 for an empty pool)."""
        s = self.snapshot
        return (s.machines - s.free_machines) / s.machines if s.machines else 0.0

    def idle_job_ads(self) -> list[Any]:
        """The idle job ads of the last reading."""
        return list(self.snapshot.idle_job_ads)
