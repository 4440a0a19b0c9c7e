"""The live bench's worker on a small loopback swarm: its per-type counts agree with the
transports' own datagram counters (the oracle), and the join counters it adds are the cores'."""

from __future__ import annotations

import pytest
import trio

from sim_adapter.bench import live


@pytest.mark.parametrize("signing", [False, True])
def test_bringup_by_type_adds_up_to_the_datagrams_the_transports_sent(signing: bool) -> None:
    n = 12
    res = trio.run(live._worker, n, 3, 5, signing, 3, True)
    assert res["join_failures"] == 0 and res["ready_nodes"] == n
    kinds = res["bringup_datagrams_by_type_per_join"]
    # every datagram a node sends goes through the counted send paths: the per-type counts
    # (per join) sum to the transports' ``sent`` counters over the bring-up
    assert sum(kinds.values()) * (n - 1) == pytest.approx(res["bringup_datagrams_total"], abs=n)
    # the consistent join: each leaf-set request answered (a 12-node ring is one leaf set)
    assert kinds["LeafSetRequest"] > 0 and kinds["LeafSetReply"] == kinds["LeafSetRequest"]
    counters = res["bringup_counters_per_join"]
    assert counters["join_locate_requests"] > 0
    assert res["lookup_success"] == "3/3"
    assert res["internal_errors"] == 0


def test_a_handler_that_raises_is_reported_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    # A core bug that raises inside a handler skips the rest of that handler's work and the
    # node goes on (receive.py counts and logs it): fewer probes, a faster bring-up. The bench
    # must report it (``internal_errors``), as many as were raised.
    from overlay.pastry.core import PastryCore

    raised = 0
    real = PastryCore.offer_hinted

    def faulty(self: PastryCore, *args: object, **kw: object) -> int:
        nonlocal raised
        if self.runtime.rng.random() < 0.3:
            raised += 1
            raise OverflowError("injected")
        return real(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(PastryCore, "offer_hinted", faulty)
    res = trio.run(live._worker, 12, 3, 5, False, 3, False)
    assert raised > 0 and res["internal_errors"] == raised


def test_repeated_rounds_report_medians_and_the_worst_round_where_a_target_must_always_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import argparse

    # three rounds of made-up figures: kademlia slower in two of them, ours lost a lookup once
    rounds = [
        (10.0, 12.0, 1.0, 0),  # ours signed s, kademlia s, success rate, internal errors
        (14.0, 11.0, 0.99, 0),
        (9.0, 10.0, 1.0, 2),
    ]
    it = iter(rounds)

    def fake_round(args: argparse.Namespace) -> dict[str, object]:
        ours, kad, ok, err = next(it)
        doc: dict[str, object] = {
            "bench": "live",
            "flockring_signed": {
                "impl": "x",
                "bringup_s": ours,
                "rss_per_node_KiB": 25.0,
                "lookup_success": f"{round(ok * 100)}/100",
                "lookup_success_rate": ok,
                "internal_errors": err,
                "bringup_gc": {"gen0": {}},
            },
            "kademlia": {"available": True, "bringup_s": kad, "rss_per_node_KiB": 28.0},
            "ratios_vs_kademlia": {"note": "n", "bringup_s_signed": round(ours / kad, 3)},
        }
        return doc

    monkeypatch.setattr(live, "_round", fake_round)
    res = live.run(argparse.Namespace(repeat=3, nodes=10))
    assert res["repeat"] == 3 and len(res["rounds"]) == 3
    sig = res["flockring_signed"]
    assert sig["bringup_s"] == 10.0 and sig["impl"] == "x" and "bringup_gc" not in sig
    assert sig["lookup_success_rate"] == 0.99 and sig["internal_errors"] == 2  # the worst round
    assert type(sig["internal_errors"]) is int and type(sig["bringup_s"]) is float
    assert sig["lookup_success"] == ["100/100", "99/100", "100/100"]
    # the median of the rounds' ratios (0.833, 1.273, 0.9), not the ratio of the medians
    assert res["ratios_vs_kademlia"]["bringup_s_signed"] == 0.9
    t = res["targets"]
    assert t["bringup_faster_than_kademlia_signed"] is True
    assert t["success_100pct_signed"] is False and t["no_internal_errors_signed"] is False
