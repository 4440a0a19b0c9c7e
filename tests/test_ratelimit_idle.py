"""Forgetting idle sources (``RateLimits(forget_idle=True)``, the live node's default) changes
no decision: oracle = the same limiter keeping every source."""

from __future__ import annotations

import random

from overlay.live.ratelimit import RateLimits, SourceLimiter
from overlay.proximity import Ping


def test_forgetting_idle_sources_changes_no_decision() -> None:
    rng = random.Random(3)
    kw = {"frames_per_s": 50.0, "frames_burst": 20.0, "probe_per_s": 5.0, "probe_burst": 4.0}
    keep = SourceLimiter(RateLimits(**kw, max_sources=10_000))  # type: ignore[arg-type]
    forget = SourceLimiter(RateLimits(**kw, max_sources=10_000, forget_idle=True))  # type: ignore[arg-type]
    ping = Ping(1, 0.0)
    now = 0.0
    sizes = []
    for _ in range(30_000):
        now += rng.expovariate(200.0) if rng.random() < 0.995 else rng.uniform(1.0, 10.0)
        src = f"udp://10.0.0.{rng.randrange(40 if rng.random() < 0.9 else 255)}:1"
        assert keep.admit_frame(src, now) == forget.admit_frame(src, now)
        assert keep.admit_message(src, ping, now) == forget.admit_message(src, ping, now)
        sizes.append(len(forget))
    assert keep.counters == forget.counters  # the same drops and admissions, and no evictions
    assert keep.dropped() > 0  # the limits did bind
    assert len(forget) < len(keep) and min(sizes[100:]) < 10


def test_a_quiet_table_shrinks() -> None:
    lim = SourceLimiter(RateLimits(forget_idle=True))
    for i in range(500):
        lim.admit_frame(f"udp://10.0.{i // 256}.{i % 256}:1", 0.0)
    assert len(lim) == 500
    lim.admit_frame("udp://10.9.9.9:1", 100.0)  # every other source has refilled by now
    assert len(lim) == 1 and len(lim._data) == 5


def test_a_table_shrinks_without_new_sources_and_gives_back_its_dict() -> None:
    lim = SourceLimiter(RateLimits(forget_idle=True))
    old = "udp://10.0.0.1:1"
    for i in range(500):
        lim.admit_frame(f"udp://10.0.{i // 256}.{i % 256}:1", 0.0)
    big = lim._table
    assert len(lim) == 500
    lim.admit_frame(old, 100.0)  # a source already known: still a sweep
    assert len(lim) == 1 and len(lim._data) == 5
    assert lim._table is not big and list(lim._table) == [old]
    # the swept source is a new entry again: a full burst, as if never seen
    fresh = SourceLimiter(RateLimits(forget_idle=True))
    fresh.admit_frame(old, 100.0)
    assert lim._data.tolist() == fresh._data.tolist()


def test_a_source_is_forgotten_as_soon_as_its_buckets_refill_and_no_decision_changes() -> None:
    # every kind of bucket, owed for as long as its own refill takes (a frame: milliseconds; a
    # burst of joins: seconds); oracle = the same limiter keeping every source
    import overlay.kbr
    import overlay.pastry.messages as pm
    from overlay.proximity import Ping

    msgs = {
        "routed": overlay.kbr.RouteMsg.__new__(overlay.kbr.RouteMsg),
        "probe": Ping(1, 0.0),
        "join": pm.JoinRequest.__new__(pm.JoinRequest),
        "other": object(),
    }
    rng = random.Random(9)
    kw = {"join_per_s": 2.0, "join_burst": 3.0, "probe_per_s": 10.0, "probe_burst": 5.0}
    keep = SourceLimiter(RateLimits(**kw, max_sources=10_000))  # type: ignore[arg-type]
    forget = SourceLimiter(RateLimits(**kw, max_sources=10_000, forget_idle=True))  # type: ignore[arg-type]
    now = 0.0
    sizes = []
    for _ in range(40_000):
        now += rng.expovariate(2000.0) if rng.random() < 0.999 else rng.uniform(0.5, 3.0)
        src = f"udp://10.0.{rng.randrange(4)}.{rng.randrange(250)}:1"
        kind = rng.choice(("routed", "probe", "join", "other", "other"))
        assert keep.admit_frame(src, now) == forget.admit_frame(src, now)
        m = msgs[kind]
        assert keep.admit_message(src, m, now) == forget.admit_message(src, m, now)
        sizes.append(len(forget))
    assert keep.counters == forget.counters
    assert keep.dropped() > 0
    # the sources still owed tokens, not every source of the last few seconds (forgetting
    # after the slowest bucket's refill time alone kept ~640 of these 1,000 on average)
    tail = sizes[1000:]
    assert len(keep) > 900 and sum(tail) / len(tail) < len(keep) / 3
