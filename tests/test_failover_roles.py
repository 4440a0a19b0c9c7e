"""The failover role machine (data) and the replica rules, against brute-force oracles."""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from discovery.failover import Failover, FailoverConfig, attach
from discovery.failover_manager import safe_holder_change
from discovery.failover_messages import (
    Alive,
    Epoch,
    Handoff,
    HandoffConsent,
    ManagerMissing,
    PreemptRequest,
    StateAck,
    StatePush,
    StateStamp,
    VoteKind,
    VoteReason,
    VoteReply,
    VoteRequest,
)
from discovery.failover_replica import ReplicaStore, Replicator, majority
from discovery.failover_roles import (
    IGNORED,
    MANAGER_ROLES,
    TRANSITIONS,
    Action,
    Event,
    Role,
    allowed,
    step,
)
from overlay import NodeHandle, NodeId
from overlay.errors import ConfigError
from overlay.pastry import PastryConfig, PastryCore
from overlay.runtime import ManualRuntime
from overlay.wire import Wire, encode_message


def test_every_pair_is_decided_exactly_once() -> None:
    for r in Role:
        for e in Event:
            assert ((r, e) in TRANSITIONS) != ((r, e) in IGNORED), (r, e)
            assert allowed(r, e)
    assert all(t.why for t in TRANSITIONS.values())


def test_the_papers_edges() -> None:
    # Butt et al. 2006 Fig. 4 and §4.2, through the intermediate roles
    assert step(Role.LISTENER, Event.MISSING_RECEIVED).target is Role.CANDIDATE  # type: ignore[union-attr]
    assert step(Role.CANDIDATE, Event.VOTES_QUORUM).target is Role.TAKING_OVER  # type: ignore[union-attr]
    assert step(Role.TAKING_OVER, Event.COMMIT_QUORUM).target is Role.MANAGER  # type: ignore[union-attr]
    t = step(Role.MANAGER, Event.MISSING_RECEIVED)
    assert t is not None and t.target is Role.MANAGER  # the live manager ignores it
    assert step(Role.LISTENER, Event.OTHER_MANAGER_HEARD).target is Role.PREEMPTING  # type: ignore[union-attr]
    assert step(Role.MANAGER, Event.PREEMPT_RECEIVED).target is Role.HANDING_OFF  # type: ignore[union-attr]
    assert step(Role.HANDING_OFF, Event.HIGHER_ALIVE).target is Role.LISTENER  # type: ignore[union-attr]
    assert step(Role.MANAGER, Event.HIGHER_ALIVE).target is Role.LISTENER  # type: ignore[union-attr]


def _reachable(src: Role) -> set[Role]:
    seen = {src}
    todo = deque([src])
    while todo:
        r = todo.popleft()
        for (a, _), t in TRANSITIONS.items():
            if a is r and t.target not in seen:
                seen.add(t.target)
                todo.append(t.target)
    return seen


def test_no_dead_ends() -> None:
    """Every role is reachable from Listener, and Listener from every role but Stopped; a
    manager role is only entered through a committed takeover (TAKING_OVER → MANAGER) or by
    resuming a handoff."""
    assert _reachable(Role.LISTENER) == set(Role)
    for r in Role:
        if r is not Role.STOPPED:
            assert Role.LISTENER in _reachable(r), r
    into_manager = {
        (a, e)
        for (a, e), t in TRANSITIONS.items()
        if t.target in MANAGER_ROLES and a not in MANAGER_ROLES
    }
    assert into_manager == {(Role.TAKING_OVER, Event.COMMIT_QUORUM)}


def test_every_action_has_a_handler() -> None:
    core = PastryCore(ManualRuntime(), NodeHandle(NodeId(5), 0), PastryConfig())
    fo = attach(core, FailoverConfig())
    assert set(fo._actions) == set(Action)
    assert {t.action for t in TRANSITIONS.values()} <= set(Action)


def test_unlisted_event_is_counted_not_raised() -> None:
    core = PastryCore(ManualRuntime(), NodeHandle(NodeId(5), 0), PastryConfig())
    fo = Failover(core)
    fo.fire(Event.COMMIT_QUORUM)
    assert fo.role is Role.LISTENER and fo.stats["events_ignored"] == 1


def test_config_validation() -> None:
    with pytest.raises(ConfigError):
        FailoverConfig(alive_period_s=0)
    with pytest.raises(ConfigError):
        FailoverConfig(missed_alives=1)
    with pytest.raises(ConfigError):
        FailoverConfig(replicas=4, quorum=5)
    c = FailoverConfig()
    assert c.lease_s < c.detection_s == c.startup_s


# ---------------------------------------------------------------------- replica store
def _e(term: int, node: int) -> Epoch:
    return Epoch(term, NodeId(node))


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 3)), max_size=30))
def test_a_holder_promises_each_term_to_one_candidate(reqs: list[tuple[int, int]]) -> None:
    s = ReplicaStore()
    granted: dict[int, set[int]] = {}
    for term, node in reqs:
        if s.vote(_e(term, node)) == VoteReason.GRANTED:
            granted.setdefault(term, set()).add(node)
    assert all(len(v) == 1 for v in granted.values())
    terms = [t for t, _ in reqs]
    if terms:  # oracle: the first request of the highest term requested is always granted
        assert max(terms) in granted


@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 3), st.integers(1, 3), st.integers(0, 5)),
        max_size=30,
    )
)
def test_store_keeps_newest_and_refuses_below_promise(
    ops: list[tuple[bool, int, int, int]],
) -> None:
    s = ReplicaStore()
    promised: Epoch | None = None
    newest: StateStamp | None = None
    for is_vote, term, node, version in ops:
        e = _e(term, node)
        if is_vote:
            ok = s.vote(e) == VoteReason.GRANTED
            if ok:
                promised = e
        else:
            stamp = StateStamp(e, version)
            ok = s.accept(stamp, b"%d" % version)
            assert ok == (promised is None or e >= promised)
            if ok:
                promised = max(promised, e) if promised else e
                newest = max(newest, stamp) if newest else stamp
    assert s.stamp == newest


def _handles(n: int) -> list[NodeHandle]:
    return [NodeHandle(NodeId(i + 1), i) for i in range(n)]


@given(st.integers(1, 6), st.lists(st.tuples(st.integers(0, 5), st.integers(1, 8)), max_size=40))
def test_replicator_commits_what_a_quorum_acked(n: int, acks: list[tuple[int, int]]) -> None:
    hs = _handles(n)
    rep = Replicator(_e(1, 99), hs, 0, b"")
    done: list[int] = []

    def record(v: int) -> Callable[[bool], None]:
        return lambda ok: done.append(v) if ok else None

    for v in range(1, 9):
        rep.new_version(b"%d" % v, record(v))
    best: dict[int, int] = {}
    for h, v in acks:
        if h < n:
            for cb in rep.ack(hs[h].id, v):
                assert cb is not None
                cb(True)
            best[h] = max(best.get(h, -1), v)
    # oracle: the highest version at least a majority acknowledged (that or later)
    want = max(
        (v for v in range(1, 9) if sum(b >= v for b in best.values()) >= majority(n)),
        default=-1,
    )
    assert rep.committed == want
    assert done == [v for v in range(1, 9) if v <= rep.committed]


@given(st.integers(1, 6), st.integers(0, 3), st.integers(0, 3), st.randoms())
def test_safe_holder_change_matches_brute_force(
    n: int, add: int, drop: int, rnd: random.Random
) -> None:
    old = _handles(n)
    extra = [NodeHandle(NodeId(100 + i), 100 + i) for i in range(add)]
    keep = old[: max(0, n - drop)]
    new = keep + extra
    if not new:
        return
    qc, qv = majority(len(new)), max(majority(n), n - min(majority(n), n) + 1)
    # oracle: every vote quorum of old meets every commit quorum of new
    ok = all(
        set(a) & set(b)
        for a in itertools.combinations([h.id for h in old], qv)
        for b in itertools.combinations([h.id for h in new], qc)
    )
    assert safe_holder_change(old, new, qc, qv) == ok


def test_messages_round_trip_the_wire_and_bad_ones_are_dropped() -> None:
    h = NodeHandle(NodeId(7), "udp://127.0.0.1:9")
    g = NodeHandle(NodeId(2**159 + 3), "udp://127.0.0.1:10")
    a = Alive(NodeId(1), h, 3, 9, 10.0, (h, g), 2, b"k" * 32, b"s" * 64)
    e = Epoch(3, NodeId(7))
    stamp = StateStamp(e, 4)
    consent = HandoffConsent(NodeId(1), h, 3, g, 11, b"k" * 32, b"s" * 64)
    msgs = [
        a,
        ManagerMissing(NodeId(1), h, 3, g, (h,)),
        VoteRequest(NodeId(1), g, 4, VoteKind.PREEMPT, 5, consent),
        VoteRequest(NodeId(1), g, 4, VoteKind.TAKEOVER, 5, None),
        VoteReply(NodeId(1), 4, 5, True, VoteReason.GRANTED, e, stamp, b"state", a),
        VoteReply(NodeId(1), 4, 5, False, VoteReason.LEASE, e),
        StatePush(NodeId(1), h, 3, 4, b"state"),
        StateAck(NodeId(1), 3, 4, False, e),
        PreemptRequest(NodeId(1), g, 3, 11, b"k" * 32, b"s" * 64),
        consent,
        Handoff(consent, stamp, b"state"),
    ]
    w = Wire()
    for m in msgs:
        assert w.decode(encode_message(m)) == m, type(m).__name__
    assert w.counters["decoded"] == len(msgs)
    truncated = encode_message(a)[:-10]
    assert w.decode(truncated) is None
    # a field of the wrong type (a str where the term goes) is dropped and counted
    import msgpack

    raw = msgpack.unpackb(encode_message(msgs[6]), raw=False, strict_map_key=False)
    raw[3] = "three"
    assert w.decode(msgpack.packb(raw, use_bin_type=True)) is None
    assert w.counters["bad_message"] == 1


def test_the_docs_list_every_transition() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "failover.md").read_text()
    roles = {r.value for r in Role}
    rows = set()
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] in roles:
            rows.add(tuple(cells[:4]))
    want = {(r.value, e.value, t.target.value, t.action.value) for (r, e), t in TRANSITIONS.items()}
    assert rows == want
