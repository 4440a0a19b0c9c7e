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
