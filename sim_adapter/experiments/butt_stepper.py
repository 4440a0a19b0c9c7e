"""Time-stepped model of a thousand pools (Butt et al. 2006 §5.2.1) and its flocking policies.

Theory of operation. Butt et al. 2006 §5.2 simulate 1000 pools in discrete time units: jobs of
integer length arrive at integer times, "a Condor manager attempts to schedule a job request to
the machines in the local pool and invokes the flocking mechanism only if all the local machines
are busy. Job requests are queued if they cannot be scheduled immediately and each queue is
maintained as a FIFO", and a run ends when every queue is empty. At ~10^7 jobs a per-job Python
event costs minutes, so :class:`Grid` advances all pools one unit at a time with numpy:

1. completions due at ``t`` free their machines (a ring buffer of per-pool counts by finish
   time, so a job costs no event of its own);
2. arrivals at ``t`` join their pool's queue (a per-pool count matrix by submit time);
3. local dispatch: every pool starts ``min(free, queued)`` jobs from the head of its queue —
   one vectorised step for all pools (local jobs first);
4. the policy moves jobs from the pools that still have a queue (so all their machines are
   busy) to free machines of other pools, pools taken in a seeded random order each unit. A
   moved job starts at ``t`` on the remote machine and is never preempted; a pool with a queue
   of its own has no free machine, so no job is ever queued remotely.

Each pool's jobs are one contiguous range of the job arrays, sorted by submit time, and its queue
is always the sub-range ``[head, arrived)``: FIFO, whichever machine takes the head. Job ``j``'s
wait is ``start[j] - sub[j]`` units; ``ran[j]`` is the pool that ran it.

Policies (:class:`NoFlocking`, :class:`StaticFlocking`, :class:`GatewayFlocking`; the
self-organized one, which needs the overlay, is in :mod:`sim_adapter.experiments.butt_1000`):

* **static** (HTCondor's ``FLOCK_TO``, Thain et al. 2004 §3 "direct flocking"): a fixed list of
  pools per pool, chosen at configuration time, tried in order each unit; a remote negotiator
  grants only its free machines.
* **gateway** (Epema et al. 1996 §4.1, §4.3): each pool's gateway is connected to configured
  neighbour pools; every ``period`` units each gateway sends its pool's count of idle machines to
  its neighbours; a gateway represents *one* machine to its central manager at a time, so it
  takes at most ``slots`` jobs a unit (``slots`` gateway machines), and sends each to a pool
  chosen "at random ... from a randomly chosen pool" whose list shows an idle machine; if that
  pool has none left (the list was stale) the job "remains queued at the submission machine and
  has to be rescheduled" (next unit).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol

import attrs
import numpy as np

__all__ = [
    "GatewayFlocking",
    "Grid",
    "GridTraces",
    "NoFlocking",
    "Policy",
    "StaticFlocking",
    "make_grid_traces",
]


@attrs.frozen(slots=True, eq=False)
class GridTraces:
    """The pools and job traces of one replicate (numpy arrays; see the module docstring)."""

    #: machines of each pool
    machines: Any
    #: pool p's jobs are rows off[p]..off[p+1]-1
    off: Any
    #: submit time of each job (integer units), sorted within each pool
    sub: Any
    #: length of each job (integer units, >= 1)
    dur: Any
    #: sequences merged into each pool's trace
    sequences: Any

    @property
    def pools(self) -> int:
        """Number of pools."""
        return len(self.machines)

    @property
    def jobs(self) -> int:
        """Number of jobs."""
        return len(self.sub)

    def pool_of_job(self) -> Any:
        """The origin pool of every job (an int32 array)."""
        return np.repeat(np.arange(self.pools, dtype=np.int32), np.diff(self.off))


def make_grid_traces(
    pools: int,
    seed: int,
    *,
    machines: tuple[int, int] = (25, 225),
    sequences: tuple[int, int] = (25, 225),
    seq_len: int = 100,
    step: tuple[int, int] = (1, 17),
) -> GridTraces:
    """Butt et al. 2006 §5.2.1's load: per pool U[machines] machines and a trace merging
    U[sequences] sequences of ``seq_len`` jobs, inter-arrival and length U[step] units (integer
    uniform: "a random uniform distribution between 1 and 17, giving an average of 9")."""
    rng = np.random.default_rng([seed, 2006])
    m = rng.integers(machines[0], machines[1] + 1, size=pools, dtype=np.int64)
    nseq = rng.integers(sequences[0], sequences[1] + 1, size=pools, dtype=np.int64)
    off = np.zeros(pools + 1, dtype=np.int64)
    np.cumsum(nseq * seq_len, out=off[1:])
    sub = np.empty(int(off[-1]), dtype=np.int32)
    dur = np.empty(int(off[-1]), dtype=np.int16)
    for p in range(pools):
        n = int(nseq[p])
        gaps = rng.integers(step[0], step[1] + 1, size=(n, seq_len), dtype=np.int32)
        times = np.cumsum(gaps, axis=1, dtype=np.int32).reshape(-1)
        lens = rng.integers(step[0], step[1] + 1, size=n * seq_len, dtype=np.int16)
        order = np.argsort(times, kind="stable")
        sub[off[p] : off[p + 1]] = times[order]
        dur[off[p] : off[p + 1]] = lens[order]
    return GridTraces(m, off, sub, dur, nseq)


class Grid:
    """Every pool's queue and machines, advanced one time unit at a time (module docstring)."""

    def __init__(self, traces: GridTraces, seed: int) -> None:
        self.traces = tr = traces
        self.pools = n = tr.pools
        self.machines = np.asarray(tr.machines, dtype=np.int64)
        self.free = self.machines.copy()
        self.off = np.asarray(tr.off, dtype=np.int64)
        self.count = np.diff(self.off)
        self.head = np.zeros(n, dtype=np.int64)
        self.arrived = np.zeros(n, dtype=np.int64)
        self.sub = tr.sub
        self.dur = tr.dur
        self.start = np.full(tr.jobs, -1, dtype=np.int32)
        self.ran = np.full(tr.jobs, -1, dtype=np.int32)
        self.ring = int(tr.dur.max()) + 1 if tr.jobs else 1
        self.ends = np.zeros((n, self.ring), dtype=np.int64)
        self._ends_flat = self.ends.reshape(-1)
        last = int(tr.sub.max()) if tr.jobs else 0
        flat = tr.pool_of_job().astype(np.int64) * (last + 1) + tr.sub
        self.arrivals = np.bincount(flat, minlength=n * (last + 1)).reshape(n, last + 1)
        self.rng = random.Random(f"butt-grid-{seed}")
        self.t = -1
        self.moved = 0
        #: per unit: jobs waiting after the policy ran (for plots of the backlog)
        self.backlog: list[int] = []

    # -- state ---------------------------------------------------------------------------
    def queued(self, p: int) -> int:
        """Jobs of pool ``p`` that arrived and have not started."""
        return int(self.arrived[p] - self.head[p])

    def done(self) -> bool:
        """Every job arrived and started (the run's end: every queue is empty)."""
        return bool((self.head == self.count).all())

    # -- one unit ------------------------------------------------------------------------
    def tick(self, t: int, policy: Policy) -> None:
        """Advance every pool to time ``t`` (completions, arrivals, local dispatch, policy)."""
        if t != self.t + 1:
            raise ValueError(f"ticks must be consecutive: {self.t} then {t}")
        self.t = t
        slot = t % self.ring
        self.free += self.ends[:, slot]
        self.ends[:, slot] = 0
        if t < self.arrivals.shape[1]:
            self.arrived += self.arrivals[:, t]
        self._dispatch_local(t)
        policy.exchange(self, t)
        waiting = np.flatnonzero(self.arrived > self.head)
        if waiting.size and policy.flocking:
            order = waiting.tolist()
            self.rng.shuffle(order)
            for p in order:
                policy.flock(self, p, t)
        self.backlog.append(int((self.arrived - self.head).sum()))

    def _dispatch_local(self, t: int) -> None:
        k = np.minimum(self.free, self.arrived - self.head)
        nz = np.flatnonzero(k)
        if not nz.size:
            return
        kk = k[nz]
        first = self.off[nz] + self.head[nz]
        csum = np.cumsum(kk)
        idx = np.arange(int(csum[-1]), dtype=np.int64) + np.repeat(first - (csum - kk), kk)
        pools = np.repeat(nz, kk)
        self.start[idx] = t
        self.ran[idx] = pools
        slots = (t + self.dur[idx].astype(np.int64)) % self.ring
        self._ends_flat += np.bincount(pools * self.ring + slots, minlength=self._ends_flat.size)
        self.free -= k
        self.head += k

    def move(self, p: int, q: int, most: int, t: int) -> int:
        """Start up to ``most`` jobs from the head of ``p``'s queue on free machines of ``q``
        now; returns how many moved (0 when ``q`` has no free machine: no remote queueing)."""
        n = min(most, int(self.free[q]), int(self.arrived[p] - self.head[p]))
        if n <= 0:
            return 0
        a = int(self.off[p] + self.head[p])
        b = a + n
        self.start[a:b] = t
        self.ran[a:b] = q
        slots = (t + self.dur[a:b].astype(np.int64)) % self.ring
        self.ends[q] += np.bincount(slots, minlength=self.ring)
        self.free[q] -= n
        self.head[p] += n
        self.moved += n
        return n

    def run(self, policy: Policy, *, limit: int = 10_000_000) -> int:
        """Tick until every queue is empty; returns the number of units simulated."""
        t = self.t + 1
        while not self.done():
            if t > limit:
                raise RuntimeError("the grid did not drain its queues")
            self.tick(t, policy)
            t += 1
        return t


class Policy(Protocol):
    """How jobs leave a pool whose machines are all busy."""

    #: False: the grid never calls :meth:`flock`
    flocking: bool

    def exchange(self, grid: Grid, t: int) -> None:
        """Information exchange of unit ``t`` (after local dispatch, before flocking)."""

    def flock(self, grid: Grid, p: int, t: int) -> None:
        """Move jobs from pool ``p``'s queue (every machine of ``p`` is busy)."""


class NoFlocking:
    """Configuration I at scale: every pool alone."""

    flocking = False

    def exchange(self, grid: Grid, t: int) -> None:
        """Nothing is exchanged."""

    def flock(self, grid: Grid, p: int, t: int) -> None:
        """Never called."""


class StaticFlocking:
    """A fixed ``FLOCK_TO`` list per pool, tried in order every unit (the remote negotiator
    grants only free machines; no announcement, so no cap beyond that)."""

    flocking = True

    def __init__(self, flock_to: Sequence[Sequence[int]]) -> None:
        self.flock_to = [list(x) for x in flock_to]

    def exchange(self, grid: Grid, t: int) -> None:
        """Static flocking exchanges nothing."""

    def flock(self, grid: Grid, p: int, t: int) -> None:
        """Offer the queue head to each pool of ``FLOCK_TO[p]`` in order."""
        for q in self.flock_to[p]:
            grid.move(p, q, 1 << 30, t)
            if grid.arrived[p] == grid.head[p]:
                return


class GatewayFlocking:
    """Epema et al. 1996 gateways (module docstring): availability lists every ``period``
    units over symmetric connections, ``slots`` jobs a unit per pool, random target choice."""

    flocking = True

    def __init__(
        self, neighbours: Sequence[Sequence[int]], period: int, slots: int, seed: int
    ) -> None:
        if period < 1 or slots < 1:
            raise ValueError("gateway period and slots must be >= 1")
        self.neighbours = [list(x) for x in neighbours]
        self.period = period
        self.slots = slots
        n = len(self.neighbours)
        self.rng = random.Random(f"butt-gateway-{seed}")
        # each gateway sends on its own phase (exchanges are not synchronised)
        self.phase = [self.rng.randrange(period) for _ in range(n)]
        self._by_phase = [[q for q in range(n) if self.phase[q] == k] for k in range(period)]
        self._nbr = [np.asarray(x, dtype=np.int64) for x in self.neighbours]
        #: avail[p, q]: idle machines of q as p's gateway last heard (its copy, decremented
        #: as p sends jobs there)
        self.avail = np.zeros((n, n), dtype=np.int64)

    def exchange(self, grid: Grid, t: int) -> None:
        """Gateways whose phase falls on ``t`` send their pool's idle machines to neighbours."""
        for q in self._by_phase[t % self.period]:
            nb = self._nbr[q]
            if nb.size:
                self.avail[nb, q] = grid.free[q]

    def flock(self, grid: Grid, p: int, t: int) -> None:
        """Up to ``slots`` jobs, each to a random neighbour whose list shows an idle machine."""
        row = self.avail[p]
        nbrs = self.neighbours[p]
        for _ in range(self.slots):
            cands = [q for q in nbrs if row[q] > 0]
            if not cands:
                return
            q = cands[self.rng.randrange(len(cands))]
            if grid.move(p, q, 1, t):
                row[q] -= 1
            else:  # stale list: the job stays queued and is rescheduled next unit
                row[q] = 0
                return
            if grid.arrived[p] == grid.head[p]:
                return


def symmetric_neighbours(dist: Any, k: int) -> list[list[int]]:
    """Connect every pool to its ``k`` nearest pools by ``dist`` (a square matrix); a connection
    is a pair of gateways, one in either pool (Epema et al. 1996 §4.1), so the graph is the
    symmetric closure. Lists are sorted by distance."""
    n = len(dist)
    d = np.asarray(dist, dtype=np.float64)
    sets: list[set[int]] = [set() for _ in range(n)]
    for p in range(n):
        order = [int(q) for q in np.argsort(d[p], kind="stable") if q != p][:k]
        for q in order:
            sets[p].add(q)
            sets[q].add(p)
    out = []
    for p, s in enumerate(sets):
        row = d[p]
        out.append(sorted(s, key=lambda q: (float(row[q]), q)))
    return out


def static_lists(dist: Any, k: int, choice: str, seed: int) -> list[list[int]]:
    """``FLOCK_TO`` of every pool: its ``k`` nearest pools (nearest first) or ``k`` pools drawn
    at random (in the drawn order), fixed at configuration time."""
    n = len(dist)
    d = np.asarray(dist, dtype=np.float64)
    if choice == "nearest":
        return [[int(q) for q in np.argsort(d[p], kind="stable") if q != p][:k] for p in range(n)]
    if choice == "random":
        rng = random.Random(f"butt-static-{seed}")
        return [rng.sample([q for q in range(n) if q != p], min(k, n - 1)) for p in range(n)]
    raise ValueError(f"unknown static choice {choice!r}: 'nearest' or 'random'")
