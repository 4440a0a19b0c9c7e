"""Latency models (sim_adapter.latency, sim_adapter.topology): determinism, symmetry, metric
properties checked against networkx, ranges, file parsing, and PondSim's per-sender draw."""

from __future__ import annotations

import math
import random
from array import array
from pathlib import Path
from typing import TypeVar

import networkx as nx
import pytest

from overlay.errors import ConfigError
from sim_adapter import latency, topology

M = TypeVar("M", bound=latency.LatencyModel)


def placed(model: M, n: int, seed: int = 7) -> M:
    rng = random.Random(seed)
    for i in range(n):
        model.place(i, rng)
    return model


def pairs(n: int, count: int, seed: int = 3) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    out: list[tuple[int, int]] = []
    while len(out) < count:
        a, b = rng.randrange(n), rng.randrange(n)
        if a != b:
            out.append((a, b))
    return out


def triples(n: int, count: int, seed: int = 5) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    out: list[tuple[int, int, int]] = []
    while len(out) < count:
        a, b, c = rng.randrange(n), rng.randrange(n), rng.randrange(n)
        if len({a, b, c}) == 3:
            out.append((a, b, c))
    return out


@pytest.fixture(scope="module")
def small_ts() -> latency.TransitStub:
    # Small graph: 12 transit routers in 3 domains, 60 stub routers in domains of 6.
    m = latency.TransitStub(transit=12, stub=60, seed=11, transit_domains=3, stub_domain_size=6)
    placed(m, 400)
    return m


# --------------------------------------------------------------------------------- protocol
def test_all_models_satisfy_protocol(small_ts: latency.TransitStub, tmp_path: Path) -> None:
    f = tmp_path / "m.txt"
    f.write_text("0 10\n10 0\n")
    models: list[latency.LatencyModel] = [
        latency.Uniform(0.05, 0.30),
        latency.Sphere(),
        small_ts,
        latency.Matrix.from_file(f),
        latency.PondSim(),
    ]
    for m in models:
        assert isinstance(m, latency.LatencyModel)
        if m is not small_ts:
            placed(m, 5)
        d = m.describe()
        assert d["name"] == m.name
        assert m.rtt_s(0, 1) == pytest.approx(m.one_way_s(0, 1) + m.one_way_s(1, 0))


def test_by_name_maps_cli_names(tmp_path: Path) -> None:
    f = tmp_path / "m.txt"
    f.write_text("0 1\n1 0\n")
    assert isinstance(latency.by_name("uniform"), latency.Uniform)
    assert isinstance(latency.by_name("sphere", diameter_s=0.1), latency.Sphere)
    assert isinstance(latency.by_name("pondsim", seed=2), latency.PondSim)
    assert isinstance(latency.by_name("matrix", path=str(f)), latency.Matrix)
    ts = latency.by_name("transit-stub", transit=4, stub=8, transit_domains=2, stub_domain_size=4)
    assert isinstance(ts, latency.TransitStub)
    for name in ("uniform", "sphere", "pondsim"):  # seed= is accepted by every model
        assert latency.by_name(name, seed=3).name == name
    assert latency.by_name("matrix", path=str(f), seed=3).name == "matrix"
    assert set(latency.MODEL_NAMES) == {"uniform", "sphere", "transit-stub", "matrix", "pondsim"}


def test_by_name_errors_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"unknown latency model 'king'.*uniform"):
        latency.by_name("king")
    with pytest.raises(ValueError):  # ConfigError is a ValueError
        latency.by_name("nope")
    with pytest.raises(ConfigError, match="needs path"):
        latency.by_name("matrix")
    with pytest.raises(ConfigError, match="bad options"):
        latency.by_name("sphere", radius=3)


def test_place_out_of_order_is_rejected() -> None:
    m = latency.Sphere()
    m.place(0, random.Random(1))
    with pytest.raises(ConfigError, match="expected index 1, got 5"):
        m.place(5, random.Random(1))


@pytest.mark.parametrize(
    "make",
    [
        lambda: latency.Uniform(0.3, 0.1),
        lambda: latency.Uniform(-1.0, 0.1),
        lambda: latency.Sphere(diameter_s=0.0),
        lambda: latency.PondSim(loss=1.5),
        lambda: latency.TransitStub(transit=4, stub=8, transit_domains=9),
        lambda: topology.LinkDelays(jitter=1.0),
    ],
)
def test_bad_parameters_raise_config_error(make: object) -> None:
    with pytest.raises(ConfigError):
        make()  # type: ignore[operator]


# --------------------------------------------------------------------------------- uniform
def test_uniform_range_symmetry_determinism() -> None:
    m = placed(latency.Uniform(0.05, 0.30, seed=4), 1000)
    same = placed(latency.Uniform(0.05, 0.30, seed=4), 1000)
    other = placed(latency.Uniform(0.05, 0.30, seed=5), 1000)
    ps = pairs(1000, 5000)
    vals = [m.one_way_s(a, b) for a, b in ps]
    assert all(0.05 <= v <= 0.30 for v in vals)
    assert vals == [same.one_way_s(a, b) for a, b in ps]
    assert all(m.one_way_s(a, b) == m.one_way_s(b, a) for a, b in ps)
    assert sum(v != other.one_way_s(a, b) for v, (a, b) in zip(vals, ps, strict=True)) > 4900
    # Roughly uniform: mean near the midpoint, each decile populated.
    assert sum(vals) / len(vals) == pytest.approx(0.175, abs=0.005)
    deciles = [0] * 10
    for v in vals:
        deciles[min(9, int((v - 0.05) / 0.025))] += 1
    assert min(deciles) > 400


# --------------------------------------------------------------------------------- sphere
def test_sphere_matches_freepastry_formula() -> None:
    m = placed(latency.Sphere(diameter_s=0.2), 300)
    for a, b in pairs(300, 500):
        ta, pa = m.position(a)
        tb, pb = m.position(b)
        # FreePastry: radius * acos(cos(phi - phi') cos(theta) cos(theta') + sin(theta) sin(theta'))
        c = math.cos(pa - pb) * math.cos(ta) * math.cos(tb) + math.sin(ta) * math.sin(tb)
        ref = max(0.002, (0.2 / math.pi) * math.acos(max(-1.0, min(1.0, c))))
        assert m.one_way_s(a, b) == pytest.approx(ref, abs=1e-9)


def test_sphere_range_symmetry_determinism() -> None:
    m = placed(latency.Sphere(diameter_s=0.2), 2000, seed=9)
    same = placed(latency.Sphere(diameter_s=0.2), 2000, seed=9)
    ps = pairs(2000, 20000)
    vals = [m.one_way_s(a, b) for a, b in ps]
    assert all(0.002 <= v <= 0.2 for v in vals)
    assert max(vals) > 0.19  # some pairs are nearly antipodal
    assert all(m.one_way_s(a, b) == m.one_way_s(b, a) for a, b in ps)
    assert vals == [same.one_way_s(a, b) for a, b in ps]
    # Uniform on the sphere: mean great-circle distance is a quarter turn -> diameter / 2.
    assert sum(vals) / len(vals) == pytest.approx(0.1, abs=0.003)


def test_sphere_triangle_inequality() -> None:
    m = placed(latency.Sphere(), 500)
    for a, b, c in triples(500, 20000):
        assert m.one_way_s(a, c) <= m.one_way_s(a, b) + m.one_way_s(b, c) + 1e-12


# --------------------------------------------------------------------------------- transit-stub
def test_topology_shape() -> None:
    t = topology.transit_stub_graph(random.Random(1))
    g = t.graph
    assert g.number_of_nodes() == 1050
    kinds = nx.get_node_attributes(g, "kind")
    assert sum(k == "transit" for k in kinds.values()) == 50
    assert sum(k == "stub" for k in kinds.values()) == 1000
    assert nx.is_connected(g)
    # Stub domains hang off the core by exactly one link each; no stub-stub links across domains.
    dom = nx.get_node_attributes(g, "domain")
    for u, v in g.edges():
        if kinds[u] == kinds[v] == "stub":
            assert dom[u] == dom[v]
    uplinks: dict[int, int] = {}
    for u, v, data in g.edges(data=True):
        if data["kind"] == "transit-stub":
            s = u if kinds[u] == "stub" else v
            uplinks[dom[s]] = uplinks.get(dom[s], 0) + 1
    assert len(uplinks) == t.stub_domains == 100
    assert set(uplinks.values()) == {1}
    d = topology.LinkDelays()
    for _u, _v, data in g.edges(data=True):
        mean = {"transit": d.transit_ms, "transit-stub": d.transit_stub_ms, "stub": d.stub_ms}[
            data["kind"]
        ]
        assert mean * 0.5 / 1000 <= data["delay_s"] <= mean * 1.5 / 1000


def test_topology_is_deterministic() -> None:
    a = topology.transit_stub_graph(random.Random(3), transit=10, stub=40, transit_domains=2)
    b = topology.transit_stub_graph(random.Random(3), transit=10, stub=40, transit_domains=2)
    assert sorted(a.graph.edges(data="delay_s")) == sorted(b.graph.edges(data="delay_s"))


def test_router_distances_equal_networkx_shortest_paths(small_ts: latency.TransitStub) -> None:
    g = small_ts.topology.graph
    stubs = list(small_ts.topology.stub_routers)
    fw = nx.floyd_warshall(g, weight="delay_s")  # an independent all-pairs algorithm
    for i, u in enumerate(stubs):
        for v in stubs[i:]:
            ref = nx.dijkstra_path_length(g, u, v, weight="delay_s")
            assert small_ts.router_distance_s(u, v) == pytest.approx(ref, rel=1e-12, abs=1e-15)
            assert fw[u][v] == pytest.approx(ref, rel=1e-12, abs=1e-15)
            assert small_ts.router_distance_s(v, u) == small_ts.router_distance_s(u, v)


def test_transit_stub_one_way_composition(small_ts: latency.TransitStub) -> None:
    g = small_ts.topology.graph
    for a, b in pairs(400, 300):
        ra, rb = small_ts.stub_router(a), small_ts.stub_router(b)
        path = 0.0 if ra == rb else nx.dijkstra_path_length(g, ra, rb, weight="delay_s")
        ref = (small_ts.access_s(a) + small_ts.access_s(b)) + path
        assert small_ts.one_way_s(a, b) == pytest.approx(ref, rel=1e-12)
        assert small_ts.one_way_s(a, b) == small_ts.one_way_s(b, a)
    lo, hi = small_ts.delays.access_range_s()
    assert all(lo <= small_ts.access_s(i) <= hi for i in range(400))
    # Two nodes on one stub router: just the two access links.
    by_router: dict[int, int] = {}
    for i in range(400):
        r = small_ts.stub_router(i)
        if r in by_router:
            j = by_router[r]
            assert small_ts.one_way_s(i, j) == small_ts.access_s(i) + small_ts.access_s(j)
            break
        by_router[r] = i
    else:
        pytest.fail("expected two nodes on one stub router")


def test_transit_stub_triangle_inequality(small_ts: latency.TransitStub) -> None:
    m = small_ts
    for a, b, c in triples(400, 20000):
        assert m.one_way_s(a, c) <= m.one_way_s(a, b) + m.one_way_s(b, c) + 1e-12


def test_transit_stub_determinism_and_seed() -> None:
    kw = {"transit": 8, "stub": 32, "transit_domains": 2, "stub_domain_size": 4}
    a = placed(latency.TransitStub(seed=1, **kw), 100, seed=2)  # type: ignore[arg-type]
    b = placed(latency.TransitStub(seed=1, **kw), 100, seed=2)  # type: ignore[arg-type]
    c = placed(latency.TransitStub(seed=9, **kw), 100, seed=2)  # type: ignore[arg-type]
    ps = pairs(100, 500)
    assert [a.one_way_s(x, y) for x, y in ps] == [b.one_way_s(x, y) for x, y in ps]
    assert [a.one_way_s(x, y) for x, y in ps] != [c.one_way_s(x, y) for x, y in ps]


def test_default_transit_stub_is_butt_sized() -> None:
    m = latency.TransitStub()
    d = m.describe()
    assert (d["transit_routers"], d["stub_routers"]) == (50, 1000)
    assert isinstance(m._dist, array) and len(m._dist) == 1000 * 1000
    # Paths across the core are far longer than paths inside a stub domain.
    assert 0.1 < m.router_mean_s < m.router_diameter_s < 2.0


def test_stub_distance_matrix_rejects_disconnected_graph() -> None:
    g = nx.Graph()
    g.add_edge(0, 1, delay_s=0.1)
    g.add_node(2)
    with pytest.raises(ConfigError, match="disconnected"):
        topology.stub_distance_matrix(g, [0, 2])


# --------------------------------------------------------------------------------- matrix
def test_matrix_from_file(tmp_path: Path) -> None:
    f = tmp_path / "king.txt"
    f.write_text("# a comment\n0 10 20\n\n12 0 30  # trailing\n20 31 0\n")
    m = placed(latency.Matrix.from_file(f), 7)
    assert m.one_way_s(0, 1) == pytest.approx(0.010)
    assert m.one_way_s(1, 0) == pytest.approx(0.012)  # rows are senders: may be asymmetric
    assert m.rtt_s(0, 1) == pytest.approx(0.022)
    assert m.one_way_s(4, 2) == pytest.approx(0.030)  # node 4 -> row 1
    assert m.one_way_s(0, 3) == pytest.approx(0.001)  # same row: same_row_s
    assert m.one_way_s(6, 5) == pytest.approx(0.020)
    us = latency.Matrix.from_file(f, unit_s=1e-6)
    assert us.one_way_s(0, 2) == pytest.approx(20e-6)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("0 1\n1 zero\n", r":2: column 2: 'zero' is not a number"),
        ("0 1 2\n1 0\n", r"not square: 2 rows, but row 1 has 3 values"),
        ("0 1\n1 0 2\n", r"not square: 2 rows, but row 2 has 3 values"),
        ("0 1\n", r"not square: 1 rows, but row 1 has 2 values"),
        ("# nothing\n\n", r"empty matrix"),
        ("0 -1\n1 0\n", r"row 1, column 2: latency -1.0 is not a finite value >= 0"),
        ("0 nan\n1 0\n", r"row 1, column 2"),
    ],
)
def test_matrix_bad_file(tmp_path: Path, text: str, pattern: str) -> None:
    f = tmp_path / "bad.txt"
    f.write_text(text)
    with pytest.raises(ConfigError, match=pattern):
        latency.Matrix.from_file(f)


def test_matrix_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        latency.Matrix.from_file(tmp_path / "absent.txt")


# --------------------------------------------------------------------------------- pondsim
def test_pondsim_per_sender_distribution() -> None:
    m = placed(latency.PondSim(), 20000, seed=12)
    edges = [m.edge_s(i) for i in range(20000)]
    assert all(0.200 <= e <= 0.599 for e in edges)
    # Whole milliseconds, as PondSim's C int truncation gives.
    assert all(abs(e * 1000 - round(e * 1000)) < 1e-9 for e in edges)
    assert min(edges) < 0.205 and max(edges) > 0.595
    assert sum(edges) / len(edges) == pytest.approx(0.3995, abs=0.004)
    # The latency belongs to the sender: the same for every destination.
    for a, b in pairs(20000, 2000):
        assert m.one_way_s(a, b) == m.edge_s(a)
        assert m.rtt_s(a, b) == m.edge_s(a) + m.edge_s(b)
    assert {m.one_way_s(0, b) for b in range(1, 500)} == {m.edge_s(0)}


def test_pondsim_determinism() -> None:
    a = placed(latency.PondSim(), 500, seed=1)
    b = placed(latency.PondSim(), 500, seed=1)
    c = placed(latency.PondSim(), 500, seed=2)
    assert [a.edge_s(i) for i in range(500)] == [b.edge_s(i) for i in range(500)]
    assert [a.edge_s(i) for i in range(500)] != [c.edge_s(i) for i in range(500)]


def test_pondsim_loss_and_retransmission() -> None:
    m = placed(latency.PondSim(), 50)
    assert m.loss == 0.005
    assert (1 - m.loss_per_message) ** 2 == pytest.approx(1 - m.loss)
    assert m.retransmit_s == pytest.approx(2 * 0.3995 + 1.5 * 0.3995)
    assert m.max_resends == 5 and m.backoff_cap_s == 10.0
    rng = random.Random(4)
    for a in range(50):
        e = m.edge_s(a)
        for attempt in (1, 2, 3, 8):
            d = m.retransmit_delay_s(a, attempt, rng)
            assert 2 * e <= d <= 2 * e + min(e * 2**attempt, 10.0) + 1e-12
    # Back-off grows with the attempt number on average, and is capped at 10 s.
    r1 = sum(m.retransmit_delay_s(0, 1, rng) for _ in range(2000)) / 2000
    r3 = sum(m.retransmit_delay_s(0, 3, rng) for _ in range(2000)) / 2000
    assert r3 > r1
    assert max(m.retransmit_delay_s(0, 30, rng) for _ in range(50)) <= 2 * m.edge_s(0) + 10.0
    with pytest.raises(ConfigError):
        m.retransmit_delay_s(0, 0)


def test_transit_stub_routers_are_built_once_per_parameters() -> None:
    """The router graph and delay matrix are cached per parameter set (they are a pure function
    of it); node placement is each model's own. The cached matrix is the one a fresh build
    gives, and other parameters give another graph."""
    kw = {"transit": 12, "stub": 60, "transit_domains": 3, "stub_domain_size": 6}
    a = latency.TransitStub(seed=12, **kw)  # type: ignore[arg-type]
    b = latency.TransitStub(seed=12, **kw)  # type: ignore[arg-type]
    assert a.topology is b.topology
    fresh = topology.stub_distance_matrix(a.topology.graph, list(a.topology.stub_routers))
    assert b._dist == fresh
    placed(a, 50)
    placed(b, 20)
    assert a.nodes == 50 and b.nodes == 20
    c = latency.TransitStub(seed=13, **kw)  # type: ignore[arg-type]
    assert c.topology is not a.topology and c._dist != a._dist
