"""The Flocking Manager (Butt et al. 2006 §4.1): on only while overloaded, targets in
willing-list order (filtered by flock-to policy and the learned blacklist), off when underused;
decisions are versioned and published only when what they render changes."""

from __future__ import annotations

from flock_support import KeyedNode, announce, ident, keyed_node

from discovery.announce import FlockConfig
from discovery.decision import FlockDecision
from discovery.policy import Policy
from overlay import NodeHandle
from sim_adapter import Network, latency
from sim_adapter.plugins.flock import FixedPool, FlockSim

ORIGINS = [ident(500 + i) for i in range(6)]
RTTS = [0.030, 0.010, 0.050, 0.020, 0.040, 0.060]


def _manager(pool: FixedPool, policy: Policy | None = None, **cfg: object) -> KeyedNode:
    k = keyed_node(1, pool=pool, policy=policy, config=FlockConfig(**cfg))
    for i, o in enumerate(ORIGINS):
        h = NodeHandle(o.id, 600 + i)
        k.core.prox.sample(h, RTTS[i])
    k.rt.advance(10.0)
    for i, o in enumerate(ORIGINS):
        m = announce(
            o,
            address=600 + i,
            free=3 + i,
            issued=9.0,
            row=i % 2,
            collector=f"cm{i}.example.org:9618",
        )
        k.core.receive(NodeHandle(o.id, 600 + i), m)
    return k


def _expected_ids(k: KeyedNode) -> list[str]:
    return [f"{int(e.origin.id):040x}" for e in k.flock.willing_entries()]


def test_overloaded_pool_flocks_to_the_willing_list_in_order() -> None:
    k = _manager(FixedPool(10, 2, idle_jobs=7))
    d = k.flock.decide_now()
    assert d.enabled
    assert [t.node_id for t in d.targets] == _expected_ids(k)
    assert len(d.targets) == 6
    # nearest first: row 0 sublist (by RTT) then row 1
    assert [t.row for t in d.targets] == sorted(t.row for t in d.targets)
    t0 = d.targets[0]
    assert t0.collector.endswith(".example.org:9618") and t0.rtt_s is not None


def test_on_only_while_overloaded_off_when_underused() -> None:
    pool = FixedPool(10, 5, idle_jobs=0)
    k = _manager(pool)
    prev = False
    # (free, idle) steps; rule: idle > free → on; free > idle → off; equal → unchanged
    steps = [(5, 0), (2, 7), (3, 3), (0, 0), (4, 1), (0, 0), (0, 9), (6, 6), (9, 2)]
    for free, idle in steps:
        pool.free_machines, pool.idle_jobs = free, idle
        want = True if idle > free else False if free > idle else prev
        d = k.flock.decide_now()
        assert d.enabled is want, (free, idle)
        assert (len(d.targets) > 0) is want
        prev = want


def test_decisions_are_published_only_on_change_and_versioned() -> None:
    got: list[FlockDecision] = []
    pool = FixedPool(10, 1, idle_jobs=5)
    k = _manager(pool)
    k.flock.on_decision = got.append
    d1 = k.flock.decide_now()
    d2 = k.flock.decide_now()
    assert d1 is d2 and len(got) == 1
    pool.free_machines, pool.idle_jobs = 8, 0
    d3 = k.flock.decide_now()
    assert not d3.enabled and d3.newer_than(d1) and len(got) == 2
    k.flock.set_epoch(4)
    d4 = k.flock.decide_now()  # unchanged content, but a new epoch republishes
    assert d4.version == (4, 1) and d4.newer_than(d3) and len(got) == 3


def test_flock_to_policy_filters_targets() -> None:
    denied = f"{int(ORIGINS[1].id):040x}"
    pol = Policy.loads(f'[flock-to]\ndeny = ["id:{denied[:10]}", "host:cm3.*"]\n')
    k = _manager(FixedPool(10, 0, idle_jobs=5), policy=pol)
    ids = [t.node_id for t in k.flock.decide_now().targets]
    want = [
        x
        for x, e in zip(_expected_ids(k), k.flock.willing_entries(), strict=True)
        if x != denied and not e.collector.startswith("cm3.")
    ]
    assert ids == want and len(ids) == 4


def test_blacklisted_pool_is_skipped_for_the_stated_time() -> None:
    pol = Policy.loads("[sharing]\nblacklist_s = 300\n")
    k = _manager(FixedPool(10, 0, idle_jobs=5), policy=pol)
    first = k.flock.decide_now().targets[0]
    k.flock.report_failure(first.collector, "evicted 3 jobs")
    d = k.flock.decide_now()
    assert first.node_id not in [t.node_id for t in d.targets]
    assert k.flock.blacklist()[first.collector] == 300.0
    # after blacklist_s it is a target again (fresh offers keep the willing list populated)
    k.rt.advance(299.0)
    for i, o in enumerate(ORIGINS):
        m = announce(
            o,
            address=600 + i,
            free=3 + i,
            issued=k.rt.now(),
            seq=2,
            row=i % 2,
            collector=f"cm{i}.example.org:9618",
        )
        k.core.receive(NodeHandle(o.id, 600 + i), m)
    assert len(k.flock.willing_entries()) == 6
    assert first.node_id not in [t.node_id for t in k.flock.decide_now().targets]
    k.rt.advance(1.0)
    assert k.flock.decide_now().targets[0].node_id == first.node_id


def test_max_targets_caps_the_list() -> None:
    k = _manager(FixedPool(10, 0, idle_jobs=5), max_targets=2, require_signatures=True)
    d = k.flock.decide_now()
    assert [t.node_id for t in d.targets] == _expected_ids(k)[:2]


def test_manager_on_a_simulated_ring() -> None:
    """One loaded pool among free ones: it flocks to exactly its willing list, in order; the
    free pools do not flock; when its queue drains it turns flocking off."""
    net = Network(seed=11, latency=latency.TransitStub(seed=11))
    nodes = net.spawn(120, overlay="pastry", build="oracle")
    pools = {x.index: FixedPool(50, 10 + x.index % 7) for x in nodes}
    loaded = nodes[3]
    pools[loaded.index] = FixedPool(50, 0, idle_jobs=40)
    sim = FlockSim(net, pools, FlockConfig(ttl=2, require_signatures=False))
    sim.start()
    net.run(130.0)  # two manager periods, six announcement periods
    f = sim[loaded]
    d = f.decision
    assert d is not None and d.enabled
    assert [t.node_id for t in d.targets] == [
        f"{int(e.origin.id):040x}" for e in f.willing_entries()
    ]
    assert len(d.targets) > 5
    assert all(not (sim[x].decision and sim[x].decision.enabled) for x in nodes if x != loaded)
    pools[loaded.index].idle_jobs = 0
    pools[loaded.index].free_machines = 20
    net.run(61.0)
    assert f.decision is not None and not f.decision.enabled and f.decision.targets == ()
