"""ClassAd tree query against brute force over every node's ad (PonD §3.1; Thain et al. 2004 §5).

Static rings of 1,000 nodes (oracle build, both overlays) with random machine ads (Memory, Cpus,
Arch, PonD's ZipfAttribute; some machine Ranks not numeric, some ads that cannot be evaluated).
The oracle evaluates the job against *every* live node's current ad with ``classad2`` directly
— ``symmetricMatch``, the job's Rank with MY = job / TARGET = machine, the machine's Rank with
MY = machine / TARGET = job — and sorts by (job rank, machine rank, smaller id), non-numeric
ranks as 0.0: the negotiator order the docs state.
"""

from __future__ import annotations

import math
import random
from typing import Any

import classad2
import pytest

# importing discovery.classads imports htcondor2: the negotiator's scoping for this oracle too
from discovery.classads import QuerySyntaxError
from discovery.machine import DictProvider, MachineAd, random_machine_ad
from discovery.query import QueryResult
from overlay.errors import ConfigError
from overlay.ids import RING
from sim_adapter import Network, SimNode
from sim_adapter.latency import Uniform
from sim_adapter.plugins import query as pq

N = 1000
OVERLAYS = ("smallworld", "pastry")

#: jobs: (requirements, rank, extra job attributes) — ties, strings, undefined, scoping
JOBS: list[tuple[str, str | None, dict[str, Any]]] = [
    (
        'TARGET.Memory >= 2048 && TARGET.Arch == "X86_64"',
        "TARGET.Memory",
        {"Department": "physics"},
    ),
    ("TARGET.ZipfAttribute <= 2", "TARGET.Cpus * 1.5 + TARGET.ZipfAttribute", {}),
    ("TARGET.Cpus >= 4", "TARGET.Arch", {"Department": "physics"}),  # rank a string: all 0.0
    ("Memory > 1024", "TARGET.NoSuchAttribute", {}),  # unscoped names; undefined rank
    ("TARGET.KFlops > 1000000", "TARGET.KFlops > 1500000", {"Owner": "mallory"}),  # bool rank
    ("TARGET.Memory >= 16384 && TARGET.Cpus >= 16", None, {}),  # few matches, no Rank
]


def _ads(node: SimNode, rng: random.Random) -> MachineAd:
    ad = random_machine_ad(
        rng, f"slot1@node{node.index}", odd_rank_fraction=0.2, unevaluable_fraction=0.02
    )
    return MachineAd(ad, DictProvider())


def ring(overlay: str, seed: int = 3) -> tuple[Network, list[SimNode]]:
    net = Network(seed=seed, latency=Uniform(0.01, 0.05, seed=seed))
    nodes = net.spawn(N, overlay=overlay, build="oracle")
    pq.attach(net, machine_ad=_ads, seed=seed + 100, pond=False)
    return net, nodes


_RINGS: dict[str, tuple[Network, list[SimNode]]] = {}


def shared_ring(overlay: str) -> tuple[Network, list[SimNode]]:
    if overlay not in _RINGS:
        _RINGS[overlay] = ring(overlay)
    return _RINGS[overlay]


def job_text(req: str, rank: str | None, extra: dict[str, Any]) -> str:
    parts = ['MyType = "Job"', f"Requirements = {req}"]
    if rank is not None:
        parts.append(f"Rank = {rank}")
    parts += [f"{k} = {classad2.quote(v) if isinstance(v, str) else v}" for k, v in extra.items()]
    return "[ " + "; ".join(parts) + " ]"


def num(v: Any) -> float:
    """The negotiator's reading of a rank (stated rule): numbers and booleans, else 0.0."""
    if isinstance(v, classad2.Value):
        return 0.0
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return 0.0 if math.isnan(v) else float(v)
    return 0.0


def oracle(
    nodes: list[SimNode], text: str, k: int, only: set[int] | None = None
) -> tuple[list[tuple[float, float, int]], int]:
    """Brute force: the best k (as sort keys) over every live node, and how many ads cannot
    evaluate the job's Requirements (ERROR)."""
    job = classad2.ClassAd(text)
    req = job.lookup("Requirements")
    keys = []
    errors = 0
    for n in nodes:
        if not n.alive or (only is not None and int(n.id) not in only):
            continue
        m = pq.machine_of(n)
        assert m is not None
        ad = m.snapshot()
        if req.eval(scope=job, target=ad) is classad2.Value.Error:
            errors += 1
        if not job.symmetricMatch(ad):
            continue
        jr = num(job.lookup("Rank").eval(scope=job, target=ad)) if "Rank" in job else 0.0
        mr = num(ad.lookup("Rank").eval(scope=ad, target=job)) if "Rank" in ad else 0.0
        keys.append((-jr, -mr, int(n.id)))
    keys.sort()
    return keys[:k], errors


def keys_of(r: QueryResult) -> list[tuple[float, float, int]]:
    return [
        (-m.rank, -mr, int(m.handle.id)) for m, mr in zip(r.matches, r.machine_ranks, strict=True)
    ]


def in_ranges(x: int, ranges: tuple[tuple[Any, Any], ...]) -> bool:
    return any(lo == hi or (x - lo) % RING < (hi - lo) % RING for lo, hi in ranges)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("redundant", [False, True])
def test_best_top_k_equals_brute_force(overlay: str, redundant: bool) -> None:
    net, nodes = shared_ring(overlay)
    src = nodes[17]
    for i, (req, rank, extra) in enumerate(JOBS):
        text = job_text(req, rank, extra)
        k = 10 if i % 2 == 0 else 25
        r = pq.query(net, src, job=text, k=k, mode="best", redundant=redundant)
        want, errors = oracle(nodes, text, k)
        assert keys_of(r) == want, f"job {i}: {req!r} rank {rank!r}"
        assert r.complete and r.visited == N
        assert r.errors == errors  # unevaluable ads are counted, never raised
        # the returned attributes are the machine's own
        for m in r.matches:
            ad = pq.machine_of(net.node_by_id(int(m.handle.id)))
            assert ad is not None and m.ad["Name"] == ad.current()["Name"]


def test_oracle_exercises_ties_and_non_numeric_ranks() -> None:
    """The ads make the stated tie rules matter (else the equality above proves little)."""
    net, nodes = shared_ring("smallworld")
    text = job_text(*JOBS[0])
    top, _ = oracle(nodes, text, 50)
    assert len({t[0] for t in top}) < len(top)  # job-rank ties
    assert len({t[:2] for t in top}) < len(top)  # ties down to the node id
    assert len({t[1] for t in top}) > 1  # machine ranks break some
    text = job_text(*JOBS[2])
    top, _ = oracle(nodes, text, 10)
    assert {t[0] for t in top} == {-0.0}  # a string rank reads 0.0 for everyone
    r = pq.query(net, nodes[3], job=text, k=10)
    assert all(m.rank == 0.0 for m in r.matches)


@pytest.mark.parametrize(
    ("overlay", "redundant"),
    [
        # after two ring-consecutive crashes the small-world parent cannot relay past them:
        # the stretch must then be reported missing, never declared empty
        ("smallworld", False),
        ("smallworld", True),  # the counter-clockwise tree reaches the stretch the other lost
        ("pastry", False),
        ("pastry", True),
    ],
)
def test_crashed_nodes_every_node_answered_or_in_missing_range(
    overlay: str, redundant: bool
) -> None:
    net, nodes = ring(overlay, seed=11)
    pick = random.Random(5)
    src = nodes[0]
    net.crash(pick.sample(nodes[1:], N // 20))  # 5 % fail just before the query
    text = job_text(*JOBS[0])
    r = pq.query(net, src, job=text, k=10, audit=True, redundant=redundant)
    assert r.audit is not None
    live = {int(n.id) for n in nodes if n.alive}
    assert r.audit <= live  # crashed nodes never answer
    lost = [n for n in nodes if n.alive and int(n.id) not in r.audit]
    # exhaustive: every live node matched-or-rejected (in the audit), or reported missing
    assert all(in_ranges(int(n.id), r.missing) for n in lost), lost
    assert not any(int(n.id) in r.audit for n in nodes if not n.alive)
    covered = {x for x in live if not in_ranges(x, r.missing)}
    assert keys_of(r) == oracle(nodes, text, 10, only=covered)[0]
    assert r.visited == len(r.audit) if not redundant else r.visited <= len(r.audit)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_first_fit_is_earlier_and_every_match_is_valid(overlay: str) -> None:
    net, nodes = shared_ring(overlay)
    text = job_text("TARGET.ZipfAttribute <= 3", "TARGET.Memory", {})
    for src in (nodes[5], nodes[500]):
        best = pq.query(net, src, job=text, k=10, mode="best")
        ff = pq.query(net, src, job=text, k=10, mode="first_fit")
        assert len(ff.matches) >= 10 and ff.early
        assert ff.elapsed_s < best.elapsed_s
        assert ff.visited < best.visited
        job = classad2.ClassAd(text)
        for m in ff.matches:  # re-checked by classad2 against the machine's current ad
            ad = pq.machine_of(net.node_by_id(int(m.handle.id)))
            assert ad is not None and job.symmetricMatch(ad.snapshot())
        assert len({int(m.handle.id) for m in ff.matches}) == len(ff.matches)


def test_first_fit_threshold_is_at_least_k() -> None:
    """Stated rule: a subtree answers as soon as it holds >= k matches. With k = 1 and a root
    whose own machine matches, the root answers from its own ad without sending anything
    (with a '> k' rule it would have to query the tree for a second match)."""
    net, nodes = shared_ring("smallworld")
    src = nodes[42]
    name = pq.machine_of(src).current()["Name"]  # type: ignore[union-attr]
    sent = net.message_count
    r = pq.query(net, src, f'TARGET.Name == "{name}" || TARGET.Cpus >= 1', k=1, mode="first_fit")
    assert net.message_count == sent
    assert r.early and [int(m.handle.id) for m in r.matches] == [int(src.id)]
    r2 = pq.query(net, src, f'TARGET.Name == "{name}" || TARGET.Cpus >= 1', k=2, mode="first_fit")
    assert net.message_count > sent and len(r2.matches) == 2


@pytest.mark.parametrize(
    ("req", "rank"),
    [("Memory >", None), ("TARGET.Memory > 1024", "1 +"), ('Arch == "X86_64', None), ("", None)],
)
def test_invalid_expressions_raise_before_anything_is_sent(req: str, rank: str | None) -> None:
    net, nodes = shared_ring("pastry")
    sent = net.message_count
    with pytest.raises(QuerySyntaxError) as ei:
        pq.query(net, nodes[1], req, rank, k=3)
    assert net.message_count == sent
    bad = rank if rank is not None else req
    assert ei.value.text == bad and repr(bad) in str(ei.value)
    assert ei.value.what == ("Rank" if rank is not None else "Requirements")


def test_bad_job_ad_and_bad_arguments_raise_before_sending() -> None:
    net, nodes = shared_ring("pastry")
    sent = net.message_count
    with pytest.raises(QuerySyntaxError):
        pq.query(net, nodes[1], job="[ Requirements = Memory > ; ]", k=3)
    with pytest.raises(QuerySyntaxError):
        pq.query(net, nodes[1], job="[ Requirements = true ] trailing garbage", k=3)
    with pytest.raises(ConfigError):
        pq.query(net, nodes[1], "true", k=0)
    with pytest.raises(ConfigError):
        pq.query(net, nodes[1], "true", k=3, mode="fastest")
    assert net.message_count == sent


def test_dynamic_attributes_are_read_at_query_time() -> None:
    net, nodes = ring("smallworld", seed=21)
    text = job_text("TARGET.ZipfAttribute == 10 && TARGET.LoadAvg < 0.5", "TARGET.Memory", {})
    before = pq.query(net, nodes[0], job=text, k=5)
    for n in nodes[:300]:  # these machines get busy and change their Zipf value
        m = pq.machine_of(n)
        assert m is not None and isinstance(m.provider, DictProvider)
        m.provider.set(LoadAvg=0.9, ZipfAttribute=10)
    after = pq.query(net, nodes[0], job=text, k=5)
    assert keys_of(after) == oracle(nodes, text, 5)[0]
    assert keys_of(before) != keys_of(after) or not before.matches
    busy = {int(n.id) for n in nodes[:300]}
    assert not busy & {int(m.handle.id) for m in after.matches}
