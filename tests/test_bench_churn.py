"""The churn benchmark's accounting at a tiny size: every measured lookup is delivered (correctly
or not) or lost with a cause, the population really churns, the same seed repeats, and a bad
trace file is named by file and line. Its figures are a benchmark's, never asserted here."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from overlay.errors import ConfigError
from overlay.ids import ring_distance
from sim_adapter.bench import churn


def args(**kw: Any) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    churn.register(p.add_subparsers())
    base = ["churn", "--nodes", "60", "--session-min", "4", "--hours", "0.1", "--warmup-min", "2"]
    ns = p.parse_args([*base, "--sample-s", "120", "--lookup-rate", "0.05"])
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


@pytest.mark.parametrize("overlay", ["pastry", "smallworld"])
def test_every_lookup_is_accounted_for(overlay: str) -> None:
    r = churn.run(args(overlay=overlay))
    assert r["launched"] > 50
    assert r["arrivals"] > 10 and r["departures"] > 10
    lost = r["source_crashed"] + r["holder_crashed"] + r["dropped"]
    assert r["lost"] == lost
    assert r["delivered"] + lost == r["launched"] and r["unaccounted"] == 0
    assert r["handler_errors"] == 0  # no handler raised outside its input checks
    assert r["correct"] + r["incorrect"] == r["delivered"]
    assert sum(w["launched"] for w in r["windows"]) == r["launched"]
    # each window's outcomes are those of the lookups launched in it
    assert sum(w["correct"] for w in r["windows"]) == r["correct"]
    assert sum(w["lost"] for w in r["windows"]) == r["lost"]
    assert all(w["correct"] + w["lost"] <= w["launched"] for w in r["windows"])
    assert len(r["windows"]) == 3


def test_control_figure_weighs_windows_by_node_seconds() -> None:
    r = churn.run(args(overlay="pastry", sample_s=150.0))  # windows of 150, 150 and 60 s
    ws = r["windows"]
    assert [w["seconds"] for w in ws] == [150.0, 150.0, 60.0]
    # the rate over the measured node-seconds, recomputed by brute force from the windows: the
    # short last window weighs by its length, not as much as a whole one
    node_s = sum(w["active"] * w["seconds"] for w in ws)
    rate = sum(w["control_msgs_per_s_per_node"] * w["active"] * w["seconds"] for w in ws) / node_s
    assert r["control_msgs_per_s_per_node_mean"] == pytest.approx(rate, abs=1e-4)
    unweighted = sum(w["control_msgs_per_s_per_node"] for w in ws) / len(ws)
    assert abs(rate - unweighted) > 1e-4  # the two differ here, so the check can fail


def test_same_seed_same_figures() -> None:
    a = churn.run(args(loss=0.01))
    b = churn.run(args(loss=0.01))
    for x in (a, b):
        for k in ("wall_s", "peak_rss_mib"):
            x.pop(k)
    assert a == b
    assert a["dropped_loss"] > 0


def test_trace_mode_follows_the_file(tmp_path: Path) -> None:
    f = tmp_path / "sessions.txt"
    lines = ["# arrive_s depart_s"] + [f"0 {400 + 10 * i}" for i in range(30)]
    lines += [f"{130 + 5 * i} {900 + i}" for i in range(20)]
    f.write_text("\n".join(lines) + "\n")
    r = churn.run(args(trace=str(f), warmup_min=1.0, hours=0.2))
    # 20 arrivals from the file, all after the warm-up; departures of the 30 first sessions
    # fall inside the measured window (400..690 s), the later ones at 900+ s after it ends
    assert r["arrivals"] == 20
    assert r["departures"] == 30


def test_bad_trace_line_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("0 100\n5 oops\n")
    with pytest.raises(ConfigError, match=r"t\.txt:2: expected"):
        churn.run(args(trace=str(f)))


@pytest.mark.parametrize("tries", [1, 3])
def test_correct_fraction_is_checked_against_brute_force_and_every_cause_is_named(
    monkeypatch: pytest.MonkeyPatch, tries: int
) -> None:
    """Re-derive every delivery's verdict by brute force over the active nodes at that moment
    (joined and alive, ring distance, ties to the smaller id), independently of the bench's
    own oracle, and check the report's split of deliveries and losses against it."""
    verdicts: list[bool] = []
    real = churn._ChurnRun.delivered

    def delivered(self: Any, lid: int, at: Any, k: int = 0) -> None:
        rec = self.recs.get(lid)
        if rec is not None and not rec.done and rec.window >= 0:
            key = int(rec.key)
            best = min(self.active, key=lambda n: (ring_distance(n.id, key), int(n.id)))
            verdicts.append(best is at)
        real(self, lid, at, k)

    monkeypatch.setattr(churn._ChurnRun, "delivered", delivered)
    r = churn.run(args(overlay="pastry", loss=0.01, tries=tries))
    assert r["delivered"] == len(verdicts) > 100
    assert r["correct"] == sum(verdicts)
    assert r["incorrect"] == len(verdicts) - sum(verdicts)
    assert r["correct_fraction"] == pytest.approx(sum(verdicts) / r["launched"], abs=1e-6)
    # every incorrect delivery has a classified cause, every loss one of the named ones
    assert sum(r["incorrect_causes"].values()) == r["incorrect"]
    assert set(r["incorrect_causes"]) <= {
        "root_young",
        "root_unknown",
        "root_suspected",
        "root_not_in_leaf_set",
        "root_excluded",
    }
    assert r["source_crashed"] + r["holder_crashed"] + r["dropped"] == r["lost"]
    assert r["unaccounted"] == 0
    # the control figure's breakdown: lookups' own hops and maintenance both show up
    by_type = r["msgs_per_s_per_node_by_type"]
    assert by_type["RouteMsg"] > 0 and by_type["Ping"] > 0
    assert r["dropped_loss"] > 0


def test_set_overrides_the_pastry_config_and_counters_explain_the_probes() -> None:
    both = churn.run(args(overlay="pastry", set=["heartbeat_left_only=false"]))
    left = churn.run(args(overlay="pastry"))
    hb_both = both["node_stats_per_s_per_node"]["heartbeats_sent"]
    hb_left = left["node_stats_per_s_per_node"]["heartbeats_sent"]
    # the default, MSPastry's left neighbour only: one heartbeat per node per period, not two
    assert 0.4 < hb_left / hb_both < 0.6
    # the counters' probes are the Ping datagrams the network carried
    for r in (both, left):
        assert r["node_stats_per_s_per_node"]["probes_sent"] == pytest.approx(
            r["msgs_per_s_per_node_by_type"]["Ping"], rel=0.02
        )
    assert both["config_overrides"] == ["heartbeat_left_only=false"]
    with pytest.raises(ConfigError, match="heartbeat_left_only"):  # a Pastry knob
        churn.run(args(overlay="smallworld", set=["heartbeat_left_only=false"]))


def test_set_overrides_the_small_world_config() -> None:
    """``--set`` reaches the ring's nodes too, a nested field as well: the oracle build's nodes
    and those that arrive later all run with three near neighbours a side and 4 reroutes."""
    seen: list[int] = []
    real = churn._ChurnRun.attach

    def attach(self: Any, node: Any) -> None:
        seen.append(node.core.config.near_per_side * 10 + node.core.kbr_config.max_reroutes)
        real(self, node)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(churn._ChurnRun, "attach", attach)
        r = churn.run(args(overlay="smallworld", set=["near_per_side=3", "kbr.max_reroutes=4"]))
    assert r["config_overrides"] == ["near_per_side=3", "kbr.max_reroutes=4"]
    assert r["arrivals"] > 10 and set(seen) == {34}
    assert r["msgs_per_s_per_node_by_type"]["NearList"] > 0


def _one_lookup(
    tries: int,
    key_seed: int,
    crash: Callable[[Any, Any, Any, Any], None],
    n: int = 300,
    custody: bool = True,
) -> tuple[dict[str, int], Any, Any]:
    """One lookup from node 0 of a settled ``n``-node Pastry ring (one-way if ``tries`` is 1),
    with ``crash(net, run, node, next_hop)`` called after each ``forward`` upcall on the way
    so that it can crash nodes as the lookup passes. Returns the run's counters, the network
    and the source."""
    import random

    import attrs

    from overlay.ids import NodeId
    from overlay.pastry import PastryConfig
    from sim_adapter.network import Network

    net = Network(seed=5)
    cr = churn._ChurnRun(args(tries=tries), net)
    base = PastryConfig()
    config = attrs.evolve(base, kbr=attrs.evolve(base.kbr, custody=custody))
    nodes = net.spawn(n, overlay="pastry", build="oracle", config=config)
    for x in nodes:
        cr.attach(x)
        cr.activate(x)
    net.run(30.0)
    cr.measuring = True
    src = nodes[0]
    real_forward = churn._Probe.forward

    def forward(self: Any, k: NodeId, payload: Any, next_hop: Any) -> Any:
        out = real_forward(self, k, payload, next_hop)
        crash(net, cr, self.node, next_hop)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(churn._Probe, "forward", forward)
        cr.rng = random.Random(key_seed)  # the lookup's key
        cr.active = [src]  # the one lookup leaves ``src``
        cr.pos = {src.index: 0}
        cr.launch()
        cr.active = [x for x in nodes if x.alive]
        cr.pos = {x.index: i for i, x in enumerate(cr.active)}
        net.run(cr.args.lookup_timeout_s + 1.0)
    return cr.c, net, src


def _lookup_through_a_crashing_holder(
    tries: int, key_seed: int, custody: bool = False
) -> tuple[dict[str, int], bool, Any]:
    """One lookup on a settled 300-node ring whose second hop ``B`` finds its next hop ``C``
    crashed unseen and then crashes itself while it waits for ``C``'s ack: the case the per-hop
    acks cannot save (the previous hop already has ``B``'s ack) unless the previous hop keeps
    custody of the message (``KbrConfig.custody``). Returns the run's counters, whether the
    crash happened (the lookup took at least three hops), and the network."""
    fired: list[bool] = []

    def crash(net: Any, cr: Any, node: Any, next_hop: Any) -> None:
        if not fired and node.index != 0:
            fired.append(True)
            c = net.node_by_id(int(next_hop.id))
            # C is dead before the message reaches it; B dies 50 ms later, inside its RTO
            cr.deactivate(c)
            net.crash(c)
            net.engine.push(net.now + 0.05, cr.depart, (node,))

    c, net, _ = _one_lookup(tries, key_seed, crash, custody=custody)
    return c, bool(fired), net


def _first_key_seed_through_a_crashing_holder() -> int:
    """The first key whose lookup from node 0 takes three hops or more."""
    return next(s for s in range(40) if _lookup_through_a_crashing_holder(1, s)[1])


def test_end_to_end_retry_recovers_a_lookup_whose_holder_crashed() -> None:
    # without custody (each hop forgets the message once the next one acked it)
    seed = _first_key_seed_through_a_crashing_holder()
    one_way, _, _ = _lookup_through_a_crashing_holder(1, seed)
    assert one_way["launched"] == 1 and one_way["holder_crashed"] == 1  # lost, cause named
    assert one_way["retries"] == 0
    rr, fired, _ = _lookup_through_a_crashing_holder(3, seed)
    assert fired
    assert rr["holder_crashed"] == 0 and rr["correct"] == 1  # the source's retry delivered it
    assert rr["retries"] >= 1 and rr["recovered_by_retry"] == 1


def test_custody_delivers_a_one_way_lookup_whose_holder_crashed() -> None:
    # the same crash, one-way (no retry by the source): the hop before the crashed holder kept
    # a custody copy, probed the holder when no notice came, and routed the copy again once
    # the holder was declared dead — delivered once, at the live node closest to the key
    seed = _first_key_seed_through_a_crashing_holder()
    c, fired, net = _lookup_through_a_crashing_holder(1, seed, custody=True)
    assert fired
    assert c["launched"] == 1 and c["retries"] == 0
    assert c["holder_crashed"] == 0 and c["dropped"] == 0
    assert c["correct"] == 1 and c["incorrect"] == 0 and c["duplicate"] == 0
    stats = sum((n.core.stats for n in net.nodes), Counter[str]())
    assert stats["custody_rerouted"] == 1
    assert stats["custody_held"] >= 2 and stats["custody_released"] >= 1


def test_a_source_that_dies_before_its_first_hop_acks_is_named_as_the_cause() -> None:
    """One-way: the first hop has crashed (not yet detected) and the source crashes 1 ms after
    it sent its lookup there, before it could retransmit or reroute. Nobody else ever held the
    lookup: the loss is ``source_crashed``, not a holder's."""

    def crash(net: Any, cr: Any, node: Any, next_hop: Any) -> None:
        if node.index == 0 and node.alive:
            first = net.node_by_id(int(next_hop.id))
            cr.deactivate(first)
            net.crash(first)
            net.engine.push(net.now + 0.001, cr.depart, (node,))

    c, _, src = _one_lookup(1, 3, crash, n=100)
    assert not src.alive and c["launched"] == 1 and c["correct"] == 0
    assert c["source_crashed"] == 1 and c["holder_crashed"] == 0 and c["dropped"] == 0


def test_bad_tries_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--tries"):
        churn.run(args(tries=0))


def test_set_reaches_nested_configs_and_names_bad_ones() -> None:
    from sim_adapter.bench.pastry import _config

    c = _config(["proximity.probe_backoff=1.5", "kbr.max_reroutes=4", "leaf_set_size=8"])
    assert c.proximity.probe_backoff == 1.5 and c.kbr.max_reroutes == 4
    assert c.leaf_set_size == 8
    # the fields not named keep Pastry's own defaults, not the generic ones
    assert c.proximity.probe_retries == 2
    for bad, msg in (
        ("nope.x=1", "no nested config 'nope'"),
        ("proximity.nope=1", "nope"),
        ("proximity.probe_backoff=0.5", "probe_backoff"),
    ):
        with pytest.raises(ConfigError, match=msg):
            _config([bad])


@pytest.mark.parametrize("overlay", ["pastry", "smallworld"])
def test_only_the_custody_notices_of_lookups_are_taken_out_of_control(
    monkeypatch: pytest.MonkeyPatch, overlay: str
) -> None:
    """Oracle: every message sent, classified by the application of the RouteMsg a notice names.
    The overlays' own routed messages — Pastry's joins, the small-world ring's connect
    requests — retry end to end and have no notices, so every notice is a lookup's (and
    a count by message class would be as good, as long as that holds)."""
    from overlay.kbr import HandedOff, RouteMsg
    from overlay.pastry import JOIN_APP
    from overlay.smallworld.messages import LINK_APP
    from sim_adapter.delivery import Delivery

    app_of: dict[int, str] = {}
    notices: Counter[str] = Counter()
    send0 = Delivery._send

    def send(self: Any, src: int, dst: Any, msg: Any) -> None:
        if type(msg) is RouteMsg:
            app_of[msg.msg_id] = msg.app
        elif type(msg) is HandedOff:
            notices[app_of[msg.msg_id]] += 1
        send0(self, src, dst, msg)

    monkeypatch.setattr(Delivery, "_send", send)
    r = churn.run(args(overlay=overlay, loss=0.01))
    assert r["lookup_notices"] == notices[churn.CHURN_APP] > 0
    own = JOIN_APP if overlay == "pastry" else LINK_APP
    assert own in app_of.values() and set(notices) == {churn.CHURN_APP}


def test_request_response_lookups_get_no_custody() -> None:
    # ``--tries`` measures what ``overlay.Node.lookup`` gets: its lookups retry end to end, and
    # like the live lookup application they get no custody copies or notices
    r = churn.run(args(overlay="pastry", tries=3))
    assert r["lookup_notices"] == 0 and r["delivered"] > 50
    assert r["node_stats_per_s_per_node"].get("custody_held", 0.0) == 0.0


def test_second_deliveries_are_counted_and_checked_against_brute_force(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Small-world ring at short sessions (spare first hops on): every second delivery of a
    measured lookup is a ``duplicate``, and ``duplicate_at_root`` those that came to the
    active node then closest to the key (brute force over the active nodes, independently
    of the bench's own oracle)."""
    seconds: list[bool] = []
    real = churn._ChurnRun.delivered

    def delivered(self: Any, lid: int, at: Any, k: int = 0) -> None:
        rec = self.recs.get(lid)
        if rec is not None and rec.done and rec.window >= 0:
            key = int(rec.key)
            best = min(self.active, key=lambda n: (ring_distance(n.id, key), int(n.id)))
            seconds.append(best is at)
        real(self, lid, at, k)

    monkeypatch.setattr(churn._ChurnRun, "delivered", delivered)
    r = churn.run(args(overlay="smallworld", session_min=2.0, seed=3))
    assert r["node_stats_per_s_per_node"].get("spare_first_hops", 0) > 0
    assert r["duplicate"] == len(seconds) > 0
    assert r["duplicate_at_root"] == sum(seconds)
