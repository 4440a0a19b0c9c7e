"""SimulatedPool against a brute-force reference dispatcher and a schedule invariant checker.

The reference below is written independently of the pool (lists of running jobs, list queues,
every event time recomputed from scratch) and implements Butt et al. 2006 §5's rules: FIFO
queues, local jobs first, remote jobs only on a machine free now, never preempted, plus the
accepting side's sharing rules (admission, quotas, idle-machine threshold). On small random
traces the pool must give every job the same start time and place as the reference; with the
pool's own automatic flocking (explicit clock and Runtime-driven) every schedule must pass the
invariant checker.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from discovery.pool import (
    JobLedger,
    PoolError,
    PoolState,
    Refusal,
    SharingRules,
    SimulatedPool,
)
from overlay.runtime import ManualRuntime, Timer

Quota = Callable[[str, "str | None"], "int | None"]
Admit = Callable[[str, str], bool]


# -- random scenarios --------------------------------------------------------------------------


class Scenario:
    def __init__(self, seed: int, *, zero_durations: bool = False) -> None:
        rng = random.Random(seed)
        self.n = rng.randint(2, 5)
        self.names = [f"p{i}" for i in range(self.n)]
        self.machines = [rng.randint(1, 4) for _ in range(self.n)]
        self.threshold = [rng.choice([0, 0, 1]) for _ in range(self.n)]
        # quota[target][origin] (pool-wide) and per-user quota[target][(origin, user)]
        self.pool_quota = [
            {o: rng.choice([None, None, 1, 2]) for o in self.names} for _ in range(self.n)
        ]
        self.user_quota = [
            {(o, u): rng.choice([None, None, 1]) for o in self.names for u in ("u0", "u1")}
            for _ in range(self.n)
        ]
        self.admit = [{o: rng.random() < 0.8 for o in self.names} for _ in range(self.n)]
        lo = 0 if zero_durations else 1
        self.traces: list[list[tuple[float, float, str]]] = []
        for _ in range(self.n):
            k = rng.randint(0, 22)
            times = sorted(float(rng.randint(0, 20)) for _ in range(k))
            self.traces.append(
                [(t, float(rng.randint(lo, 6)), rng.choice(["u0", "u1"])) for t in times]
            )
        self.targets = [
            rng.sample([i for i in range(self.n) if i != p], rng.randint(0, self.n - 1))
            for p in range(self.n)
        ]

    def quota_fn(self, p: int) -> Quota:
        def q(origin: str, user: str | None) -> int | None:
            if user is None:
                return self.pool_quota[p][origin]
            return self.user_quota[p][(origin, user)]

        return q

    def admit_fn(self, p: int) -> Admit:
        return lambda origin, user: self.admit[p][origin]

    def build(self, runtime: ManualRuntime | None = None) -> tuple[JobLedger, list[SimulatedPool]]:
        ledger = JobLedger()
        pools = [
            SimulatedPool(
                self.names[p],
                self.machines[p],
                ledger=ledger,
                runtime=runtime,
                sharing=SharingRules(
                    admit=self.admit_fn(p),
                    quota=self.quota_fn(p),
                    idle_machines_threshold=self.threshold[p],
                ),
            )
            for p in range(self.n)
        ]
        # one trace per user, submitted the way an experiment would: all jobs up front
        for p, trace in enumerate(self.traces):
            for user in ("u0", "u1"):
                mine = [(t, d) for t, d, u in trace if u == user]
                pools[p].load_trace([t for t, _ in mine], [d for _, d in mine], user=user)
        return ledger, pools


# -- the reference dispatcher ------------------------------------------------------------------


def reference(sc: Scenario) -> list[tuple[float, str]]:
    """(start, pool) of every job, in ledger order, by brute force."""
    jobs: list[tuple[int, str, float, float]] = []  # origin, user, submit, duration
    for p, trace in enumerate(sc.traces):
        for user in ("u0", "u1"):
            jobs += [(p, u, t, d) for t, d, u in trace if u == user]
    n = len(jobs)
    start: list[float | None] = [None] * n
    ran: list[int | None] = [None] * n
    running: list[list[int]] = [[] for _ in range(sc.n)]
    queue: list[list[int]] = [[] for _ in range(sc.n)]
    arrived = [False] * n

    def begin(j: int, p: int, t: float) -> None:
        start[j], ran[j] = t, p
        running[p].append(j)

    def accepts(p: int, j: int, t: float) -> bool:
        o, u = jobs[j][0], jobs[j][1]
        if not sc.admit[p][sc.names[o]]:
            return False
        free = sc.machines[p] - len(running[p])
        if free == 0 or queue[p] or free <= sc.threshold[p]:
            return False
        mine = [k for k in running[p] if jobs[k][0] == o]
        q = sc.pool_quota[p][sc.names[o]]
        if q is not None and len(mine) >= q:
            return False
        qu = sc.user_quota[p][(sc.names[o], u)]
        return qu is None or len([k for k in mine if jobs[k][1] == u]) < qu

    while True:
        times = [jobs[j][2] for j in range(n) if not arrived[j]]
        times += [start[j] + jobs[j][3] for p in range(sc.n) for j in running[p]]  # type: ignore[operator]
        if not times:
            break
        t = min(times)
        for p in range(sc.n):
            running[p] = [j for j in running[p] if start[j] + jobs[j][3] > t]  # type: ignore[operator]
        for j in sorted(range(n), key=lambda j: (jobs[j][2], j)):
            if not arrived[j] and jobs[j][2] <= t:
                arrived[j] = True
                queue[jobs[j][0]].append(j)
        for p in range(sc.n):
            while queue[p] and len(running[p]) < sc.machines[p]:
                begin(queue[p].pop(0), p, t)
        for o in range(sc.n):
            for p in sc.targets[o]:
                while queue[o] and accepts(p, queue[o][0], t):
                    begin(queue[o].pop(0), p, t)
    out: list[tuple[float, str]] = []
    for s, r in zip(start, ran, strict=True):
        assert s is not None and r is not None
        out.append((s, sc.names[r]))
    return out


def drive_explicit(sc: Scenario, pools: list[SimulatedPool]) -> None:
    """Step every pool through the global event order; flock by the scenario's plan."""
    while True:
        nxt = [t for t in (p.next_event_s() for p in pools) if t is not None]
        if not nxt:
            return
        t = min(nxt)
        for p in pools:
            p.advance(t)
        for o in range(sc.n):
            for tg in sc.targets[o]:
                pools[o].flock_to(pools[tg], t)


# -- the invariant checker ---------------------------------------------------------------------


def check_schedule(sc: Scenario, ledger: JobLedger, pools: list[SimulatedPool]) -> None:
    c = ledger.check()
    assert c.exactly_once, c
    n = len(ledger)
    start, dur, sub = ledger.start, ledger.duration, ledger.submit
    for p in pools:
        here = [j for j in range(n) if ledger.ran_at[j] == p.index]
        # capacity (no job is ever squeezed in or preempted): finishes before starts at a tie
        events = sorted([(start[j], 1) for j in here] + [(start[j] + dur[j], -1) for j in here])
        level = 0
        for _, d in events:
            level += d
            assert level <= p.machines
        local = [j for j in here if ledger.origin[j] == p.index]
        for r in (j for j in here if ledger.origin[j] != p.index):
            t = start[r]
            origin = ledger.pool_names[ledger.origin[r]]
            user = ledger.user_names[ledger.user[r]]
            # local first: no local job was waiting when a remote one started
            assert not [j for j in local if sub[j] <= t < start[j]], (r, t)
            assert sc.admit[p.index][origin]
            # quotas at claim time, counting the job itself
            same = [
                j
                for j in here
                if ledger.origin[j] == ledger.origin[r] and start[j] <= t < start[j] + dur[j]
            ]
            q = sc.pool_quota[p.index][origin]
            assert q is None or len(same) <= q
            qu = sc.user_quota[p.index][(origin, user)]
            assert qu is None or len([j for j in same if ledger.user[j] == ledger.user[r]]) <= qu
    for p in pools:  # FIFO: a pool's jobs start in arrival order, wherever they run
        mine = sorted(
            (j for j in range(n) if ledger.origin[j] == p.index), key=lambda j: (sub[j], j)
        )
        starts = [start[j] for j in mine]
        assert starts == sorted(starts)
        assert all(start[j] >= sub[j] for j in mine)


# -- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_matches_reference_dispatcher(seed: int) -> None:
    sc = Scenario(seed)
    ledger, pools = sc.build()
    drive_explicit(sc, pools)
    got = [(ledger.start[j], ledger.where(j)) for j in range(len(ledger))]
    assert got == reference(sc)
    check_schedule(sc, ledger, pools)


@pytest.mark.parametrize("seed", range(25))
def test_automatic_flocking_invariants_explicit_clock(seed: int) -> None:
    sc = Scenario(1000 + seed, zero_durations=True)
    ledger, pools = sc.build()
    for p, pool in enumerate(pools):
        pool.set_flock_targets([pools[t] for t in sc.targets[p]])
    while True:
        nxt = [t for t in (pool.next_event_s() for pool in pools) if t is not None]
        if not nxt:
            break
        for pool in pools:
            pool.advance(min(nxt))
    check_schedule(sc, ledger, pools)


class CountingRuntime(ManualRuntime):
    """Counts timers that are scheduled and neither fired nor cancelled."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.max_live = 0

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        t = super().call_later(delay_s, fn)
        live = sum(1 for _, _, x in self._heap if not x.cancelled)
        self.max_live = max(self.max_live, live)
        return t


@pytest.mark.parametrize("seed", range(25))
def test_automatic_flocking_invariants_runtime(seed: int) -> None:
    sc = Scenario(2000 + seed, zero_durations=True)
    rt = CountingRuntime()
    ledger, pools = sc.build(rt)
    for p, pool in enumerate(pools):
        pool.set_flock_targets([pools[t] for t in sc.targets[p]])
    rt.advance(1000.0)
    check_schedule(sc, ledger, pools)
    assert rt.max_live <= len(pools)  # one timer a pool at most, never one a job


def test_runtime_and_explicit_clock_agree_for_one_pool() -> None:
    rng = random.Random(7)
    times = sorted(rng.uniform(0, 50) for _ in range(200))
    durs = [rng.uniform(0, 8) for _ in times]
    a = SimulatedPool("a", 5)
    a.load_trace(times, durs)
    while (t := a.next_event_s()) is not None:
        a.advance(t)
    rt = ManualRuntime()
    b = SimulatedPool("b", 5, runtime=rt)
    b.load_trace(times, durs)
    rt.advance(500.0)
    assert list(a.ledger.start) == list(b.ledger.start)
    assert a.ledger.check().exactly_once


def test_remote_job_is_never_preempted_by_a_later_local_job() -> None:
    ledger = JobLedger()
    a = SimulatedPool("a", 1, ledger=ledger)
    b = SimulatedPool("b", 1, ledger=ledger)
    a.submit(1.0, now=0.0)
    remote = a.submit(10.0, now=0.0)  # waits at a, then flocks to b
    assert a.flock_to(b, 0.0) == (1, None)
    local = b.submit(2.0, now=1.0)  # b's own job arrives while b runs a's job
    assert b.idle_jobs == 1 and b.remote_running == 1
    b.advance(20.0)
    assert ledger.where(remote) == "b" and ledger.start[remote] == 0.0
    assert ledger.start[local] == 10.0  # waited for the remote job to finish
    assert ledger.wait_s(local) == 9.0


def test_quota_of_two_never_lets_a_third_remote_job_in() -> None:
    ledger = JobLedger()
    a = SimulatedPool("a", 0, ledger=ledger)
    b = SimulatedPool("b", 10, ledger=ledger, quota=lambda o, u: 2 if u is None else None)
    for _ in range(5):
        a.submit(5.0, user="alice", now=0.0)
    assert a.flock_to(b, 0.0) == (2, Refusal.QUOTA)
    assert b.remote_running_from("a") == 2 and b.free_machines == 8
    assert a.flock_to(b, 4.0) == (0, Refusal.QUOTA)
    assert a.flock_to(b, 5.0) == (2, Refusal.QUOTA)  # the first two finished at 5
    assert b.stats["refused_quota"] == 3


def test_per_user_quota_and_admission() -> None:
    ledger = JobLedger()
    a = SimulatedPool("a", 0, ledger=ledger)
    b = SimulatedPool(
        "b",
        10,
        ledger=ledger,
        quota=lambda o, u: 1 if u == "alice" else None,
        admit=lambda o, u: u != "mallory",
    )
    j1 = a.submit(5.0, user="alice", now=0.0)
    j2 = a.submit(5.0, user="alice", now=0.0)
    assert b.offer(j1, 0.0) is None
    assert b.offer(j2, 0.0) is Refusal.QUOTA
    a2 = SimulatedPool("a2", 0, ledger=ledger)
    m = a2.submit(5.0, user="mallory", now=0.0)
    assert b.offer(m, 0.0) is Refusal.NOT_ADMITTED


def test_one_way_agreement_never_flocks_backwards() -> None:
    ledger = JobLedger()
    # a may flock to b; b may not flock to a (a admits nobody)
    a = SimulatedPool("a", 2, ledger=ledger, admit=lambda o, u: False)
    b = SimulatedPool("b", 2, ledger=ledger, admit=lambda o, u: o == "a")
    a.set_flock_targets([b])
    b.set_flock_targets([a])
    rng = random.Random(3)
    # each pool overloaded while the other is idle: a in [0, 30), b in [40, 70)
    for pool, t0 in ((a, 0.0), (b, 40.0)):
        times = sorted(rng.uniform(t0, t0 + 30) for _ in range(60))
        pool.load_trace(times, [rng.uniform(1, 6) for _ in times])
    while nxt := [t for t in (a.next_event_s(), b.next_event_s()) if t is not None]:
        a.advance(min(nxt))
        b.advance(min(nxt))
    assert ledger.check().exactly_once
    ran_at_a_from_b = [
        j for j in range(len(ledger)) if ledger.origin[j] == b.index and ledger.ran_at[j] == a.index
    ]
    assert ran_at_a_from_b == []
    assert a.stats["flocked_out"] > 0  # the other direction did flock
    assert b.stats["flocked_out"] == 0 and a.stats["refused_not-admitted"] > 0


def test_idle_machine_threshold() -> None:
    ledger = JobLedger()
    a = SimulatedPool("a", 0, ledger=ledger)
    b = SimulatedPool("b", 3, ledger=ledger, sharing=SharingRules(idle_machines_threshold=1))
    for _ in range(3):
        a.submit(5.0, now=0.0)
    # free 3 > 1: accept; free 2 > 1: accept; free 1 is not above the threshold
    assert a.flock_to(b, 0.0) == (2, Refusal.IDLE_THRESHOLD)
    b.submit(1.0, now=0.0)  # a local job still gets the last machine
    assert b.free_machines == 0


def test_local_jobs_go_first() -> None:
    ledger = JobLedger()
    a = SimulatedPool("a", 0, ledger=ledger)
    b = SimulatedPool("b", 1, ledger=ledger)
    b.submit(3.0, now=0.0)
    waiting = b.submit(3.0, now=0.0)
    r = a.submit(1.0, now=0.0)
    assert b.offer(r, 2.0) is Refusal.NO_FREE_MACHINE
    assert b.offer(r, 3.0) is Refusal.NO_FREE_MACHINE  # freed at 3, but b's own job took it
    assert ledger.start[waiting] == 3.0
    assert b.offer(r, 6.0) is None


def test_pool_state_protocol_and_counters() -> None:
    ledger = JobLedger()
    a = SimulatedPool("a", 4, ledger=ledger, collector="cm.a.example.org:9618")
    b = SimulatedPool("b", 2, ledger=ledger)
    assert isinstance(a, PoolState)
    assert a.collector == "cm.a.example.org:9618" and b.collector == "b"
    for _ in range(6):
        a.submit(10.0, now=0.0)
    assert (a.machines, a.free_machines, a.idle_jobs, a.running_jobs) == (4, 0, 2, 4)
    assert a.utilization == 1.0 and b.utilization == 0.0
    assert a.queued_jobs() == [4, 5] and a.queued_jobs(1) == [4]
    a.flock_to(b, 1.0)
    assert (a.idle_jobs, a.running_jobs, b.running_jobs, b.busy_machines) == (0, 6, 0, 2)
    a.advance(10.0)
    b.advance(11.0)
    assert a.running_jobs == 0 and a.free_machines == 4 and b.free_machines == 2
    assert ledger.check().exactly_once


def test_misuse_raises_pool_error() -> None:
    ledger = JobLedger()
    a = SimulatedPool("a", 1, ledger=ledger)
    b = SimulatedPool("b", 1, ledger=ledger)
    a.advance(5.0)
    with pytest.raises(PoolError, match="backwards"):
        a.advance(4.0)
    with pytest.raises(PoolError):
        a.submit(-1.0)
    with pytest.raises(PoolError):
        SimulatedPool("a", 1, ledger=ledger)  # duplicate name
    with pytest.raises(PoolError):
        a.load_trace([6.0, 5.5], [1.0, 1.0])  # unsorted
    with pytest.raises(PoolError):
        a.set_flock_targets([a])
    with pytest.raises(PoolError):
        a.set_flock_targets([SimulatedPool("x", 1)])  # another ledger
    a.submit(1.0, now=5.0)
    j1 = a.submit(1.0, now=5.0)
    j2 = a.submit(1.0, now=5.0)
    with pytest.raises(PoolError, match="head"):
        b.offer(j2, 5.0)  # FIFO: only the head may leave
    with pytest.raises(PoolError, match="local"):
        a.offer(j1, 5.0)
    with pytest.raises(PoolError, match="unknown"):
        b.offer(999, 5.0)


def test_ledger_check_catches_a_double_start() -> None:
    a = SimulatedPool("a", 2)
    j = a.submit(1.0, now=0.0)
    a.advance(2.0)
    assert a.ledger.check().exactly_once
    a.ledger.starts[j] = 2  # what a buggy dispatcher would leave
    c = a.ledger.check()
    assert not c.exactly_once and c.started_more_than_once == 1


def test_new_flock_targets_flock_at_the_current_time() -> None:
    rt = ManualRuntime()
    ledger = JobLedger()
    a = SimulatedPool("a", 1, ledger=ledger, runtime=rt)
    b = SimulatedPool("b", 5, ledger=ledger, runtime=rt)
    jobs = [a.submit(100.0) for _ in range(3)]
    rt.advance(40.0)
    b.submit(1.0)  # b's clock is at 40; a's last event was at 0
    assert (a.now, b.now) == (0.0, 40.0)
    a.set_flock_targets([b])
    rt.advance(0.0)
    assert [ledger.where(j) for j in jobs] == ["a", "b", "b"]
    assert [ledger.start[j] for j in jobs] == [0.0, 40.0, 40.0]
    rt.advance(100.0)  # t = 140: every job above has finished
    a.submit(100.0)
    late = a.submit(5.0)  # a's only machine is busy: it flocks on arrival, not at a later event
    assert ledger.where(late) == "b" and ledger.start[late] == 140.0
