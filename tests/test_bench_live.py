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
