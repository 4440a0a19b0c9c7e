"""Shared pieces of the failover tests: a simulated pool ring and a commit ledger."""

from __future__ import annotations

import random

from discovery.failover import Failover, FailoverConfig, Role
from overlay import Identity, NodeId
from sim_adapter.latency import Uniform
from sim_adapter.network import Network
from sim_adapter.plugins.failover import FailoverPool, observe, signers_for
from sim_adapter.simnode import SimNode


def pool_ring(
    overlay: str,
    seed: int,
    *,
    n: int = 30,
    loss: float = 0.0,
    signed: bool = False,
    config: FailoverConfig | None = None,
) -> tuple[Network, list[SimNode], FailoverPool]:
    """A 30-node pool ring built by real joins, failover on every node, node 0 the original,
    the invariant observer installed; runs until the original serves and everyone agrees."""
    net = Network(seed=seed, latency=Uniform(0.01, 0.05, seed=seed), loss=loss)
    observe(net)
    ids = None
    signers = None
    if signed:
        rng = random.Random(seed)
        idents = [Identity.from_rng(rng) for _ in range(n)]
        ids = [i.id for i in idents]
        signers = signers_for(idents)
    nodes = net.spawn(n, overlay=overlay, join_interval_s=0.5, ids=ids)
    pool = FailoverPool(net, nodes, original=nodes[0], config=config, signers=signers)
    pool.start()
    t = pool.run_until(pool.agreed, 300.0)
    assert t == t, "the original never became the agreed manager"
    assert pool.the_manager() is not None
    assert pool.the_manager()[0].id == nodes[0].id  # type: ignore[index]
    return net, nodes, pool


def role(fo: Failover) -> Role:
    """``fo.role`` read through a call (so a type checker does not narrow it across steps)."""
    return fo.role


def manager_id(pool: FailoverPool) -> NodeId | None:
    """The id of the one serving manager, or None when there are none or several."""
    m = pool.the_manager()
    return m[0].id if m is not None else None


class Ledger:
    """Commits numbered states through whoever serves; remembers which were committed.

    A state is ``b"v%06d"``: its number orders the history, so "no committed state lost" is
    checkable: every manager's state number is at least the last committed one.
    """

    def __init__(self, pool: FailoverPool) -> None:
        self.pool = pool
        self.next = 0
        self.committed: list[int] = []
        self.failed: list[int] = []

    def commit(self) -> bool:
        """Commit the next state through the one serving manager (False if none/several)."""
        m = self.pool.the_manager()
        if m is None:
            return False
        fo = m[1]
        k = self.next
        self.next += 1

        def done(ok: bool) -> None:
            (self.committed if ok else self.failed).append(k)

        fo.commit(b"v%06d" % k, done)
        return True

    @property
    def last(self) -> int:
        return max(self.committed, default=-1)

    @staticmethod
    def number(fo: Failover) -> int:
        st = fo.state
        assert st is not None and st.startswith(b"v"), st
        return int(st[1:])

    def check(self, fo: Failover) -> None:
        """``fo`` (serving) holds the last committed state or a newer one."""
        assert self.number(fo) >= self.last, (self.number(fo), self.last)
