"""The job ledger: every job of a simulation, as columns, for exactly-once accounting.

Theory of operation. Butt et al. 2006 §5.2 drives 1000 pools with traces that add up to about
10^7 jobs; experiments must then say, for each job, where it ran and how long it waited, and
check that it ran exactly once. One Python object per job would cost hundreds of bytes, so the
jobs of one simulation are rows of typed arrays (``array.array``) shared by its pools: a job id
is a row number, and a pool's queue and running set hold only ids. The pools write the rows;
analysis reads the arrays (``numpy.frombuffer`` gives a view without a copy).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import Protocol

import attrs

from overlay.errors import OverlayError

__all__ = ["JobLedger", "LedgerCheck", "PoolError"]


class PoolError(OverlayError, ValueError):
    """Misuse of a pool model: time running backwards, a negative duration, an unknown job."""


@attrs.frozen(slots=True)
class LedgerCheck:
    """Result of :meth:`JobLedger.check` (all zero except ``jobs`` when every job ran once)."""

    jobs: int
    never_started: int
    started_more_than_once: int
    unfinished: int
    finished_more_than_once: int

    @property
    def exactly_once(self) -> bool:
        """True when every job started once and finished once."""
        return not (
            self.never_started
            or self.started_more_than_once
            or self.unfinished
            or self.finished_more_than_once
        )


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class JobLedger:
    """Every job of one simulation as columns of typed arrays (about 38 bytes a job).

    A job id is its row. ``origin``/``ran_at`` are pool indexes (:attr:`pool_names`), ``user``
    an index into :attr:`user_names`; ``start`` is NaN and ``ran_at`` -1 until the job starts.
    ``starts``/``finishes`` count events (they should end at exactly 1). The arrays are public
    for analysis (``numpy.frombuffer`` reads them without a copy); only pools write them.
    """

    __slots__ = (
        "_nesting",
        "_pool_index",
        "_pools",
        "_user_index",
        "duration",
        "finishes",
        "origin",
        "pool_names",
        "ran_at",
        "running_of",
        "start",
        "starts",
        "submit",
        "user",
        "user_names",
    )

    def __init__(self) -> None:
        self.pool_names: list[str] = []
        self._pool_index: dict[str, int] = {}
        # the pools themselves, opaque here (a ledger knows their names; the pool module knows
        # what they are), so that this module does not import the one that imports it
        self._pools: list[object] = []
        self.user_names: list[str] = []
        self._user_index: dict[str, int] = {}
        self.origin = array("i")
        self.user = array("i")
        self.submit = array("d")
        self.duration = array("d")
        self.start = array("d")
        self.ran_at = array("i")
        self.starts = array("B")
        self.finishes = array("B")
        #: jobs of pool i running now, wherever they run
        self.running_of: list[int] = []
        # depth of offers in progress: a pool advanced from another pool's flocking does not
        # flock itself before its own turn, which bounds the recursion to one level
        self._nesting = 0

    def __len__(self) -> int:
        return len(self.origin)

    def _add_pool(self, pool: _Named) -> int:
        if pool.name in self._pool_index:
            raise PoolError(f"a pool named {pool.name!r} is already in this ledger")
        idx = len(self.pool_names)
        self.pool_names.append(pool.name)
        self._pool_index[pool.name] = idx
        self._pools.append(pool)
        self.running_of.append(0)
        return idx

    def pool(self, index: int) -> object:
        """The pool registered under ``index`` (a ``SimulatedPool``)."""
        return self._pools[index]

    def user_id(self, name: str) -> int:
        """Intern a user name."""
        u = self._user_index.get(name)
        if u is None:
            u = len(self.user_names)
            self.user_names.append(name)
            self._user_index[name] = u
        return u

    def _append(self, origin: int, user: int, submit_s: float, duration_s: float) -> int:
        j = len(self.origin)
        self.origin.append(origin)
        self.user.append(user)
        self.submit.append(submit_s)
        self.duration.append(duration_s)
        self.start.append(math.nan)
        self.ran_at.append(-1)
        self.starts.append(0)
        self.finishes.append(0)
        return j

    def _extend(
        self, origin: int, user: int, submits: Sequence[float], durations: Sequence[float]
    ) -> range:
        first = len(self.origin)
        n = len(submits)
        self.origin.extend([origin] * n)
        self.user.extend([user] * n)
        self.submit.extend(submits)
        self.duration.extend(durations)
        self.start.extend([math.nan] * n)
        self.ran_at.extend([-1] * n)
        self.starts.frombytes(bytes(n))
        self.finishes.frombytes(bytes(n))
        return range(first, first + n)

    def wait_s(self, job: int) -> float:
        """Queue wait of a started job (start - submit); NaN if it has not started."""
        return self.start[job] - self.submit[job]

    def where(self, job: int) -> str | None:
        """Name of the pool the job ran (runs) on, or None."""
        at = self.ran_at[job]
        return None if at < 0 else self.pool_names[at]

    def check(self) -> LedgerCheck:
        """Count jobs that did not start exactly once or did not finish exactly once."""
        n = len(self.origin)
        s, f = self.starts, self.finishes
        s1, s0, f1, f0 = s.count(1), s.count(0), f.count(1), f.count(0)
        return LedgerCheck(
            jobs=n,
            never_started=s0,
            started_more_than_once=n - s0 - s1,
            unfinished=f0,
            finished_more_than_once=n - f0 - f1,
        )
