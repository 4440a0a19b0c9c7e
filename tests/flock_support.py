"""Shared pieces of the flock tests: keyed nodes on a ManualRuntime, announcements built by
hand, and brute-force propagation oracles over routing tables / connection tables."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from discovery.announce import Flock, FlockConfig
from discovery.flock_messages import FlockAnnounce, IdentitySigner, sign_announce
from discovery.policy import Policy
from overlay import NodeHandle, NodeId
from overlay.identity import Identity
from overlay.pastry import PastryCore
from overlay.runtime import ManualRuntime
from sim_adapter.plugins.flock import FixedPool
from sim_adapter.simnode import SimNode


def ident(n: int) -> Identity:
    """A deterministic Ed25519 identity number ``n``."""
    return Identity.from_seed(n.to_bytes(32, "big"))


@attrs.define
class KeyedNode:
    ident: Identity
    handle: NodeHandle
    core: PastryCore
    rt: ManualRuntime
    flock: Flock
    pool: FixedPool


def keyed_node(
    n: int,
    *,
    seed: int = 0,
    pool: FixedPool | None = None,
    policy: Policy | None = None,
    config: FlockConfig | None = None,
    signed: bool = True,
) -> KeyedNode:
    """A Pastry core on a ManualRuntime (address ``n``) with a Flock, keyed by identity ``n``."""
    me = ident(n)
    h = NodeHandle(me.id, n)
    rt = ManualRuntime(seed=seed)
    core = PastryCore(rt, h)
    p = pool if pool is not None else FixedPool(10, 5)
    cfg = config if config is not None else FlockConfig(require_signatures=signed)
    f = Flock(
        core,
        p,
        cfg,
        policy=policy,
        signer=IdentitySigner(me) if signed else None,
        collector=f"cm{n}.example.org:9618",
        pool_name=f"pool{n}",
    )
    return KeyedNode(me, h, core, rt, f, p)


def put_in_table(core: PastryCore, h: NodeHandle) -> int:
    """Install ``h`` in ``core``'s routing table; returns its row."""
    slot = core.table.slot_of(h.id)
    assert slot is not None
    core.table.put(slot[0], slot[1], h)
    return slot[0]


def announce(
    origin: Identity | NodeHandle,
    *,
    address: int = 999,
    free: int = 5,
    idle: int = 0,
    util: float = 0.5,
    issued: float = 0.0,
    valid: float = 60.0,
    ttl: int = 1,
    row: int = 0,
    seq: int = 1,
    to: NodeId | None = None,
    hops: int = 0,
    collector: str = "cm.example.org:9618",
    sign: bool = True,
) -> FlockAnnounce:
    """An announcement built by hand, signed by ``origin`` when it is an Identity."""
    h = NodeHandle(origin.id, address) if isinstance(origin, Identity) else origin
    m = FlockAnnounce(
        h, b"", collector, "p", free, idle, util, issued, valid, ttl, row, seq, to, b"", hops
    )
    if sign and isinstance(origin, Identity):
        m = sign_announce(m, IdentitySigner(origin))
        m = attrs.evolve(m, hops=hops)
    return m


def pump(nodes: Iterable[KeyedNode], rounds: int = 20) -> None:
    """Deliver every queued message between ManualRuntime nodes until none is left."""
    by_addr = {k.handle.address: k for k in nodes}
    for _ in range(rounds):
        moved = False
        for k in by_addr.values():
            for dst, msg in k.rt.take_sent():
                target = by_addr.get(dst.address if isinstance(dst, NodeHandle) else dst)
                if target is not None:
                    target.core.receive(k.handle, msg)
                    moved = True
        if not moved:
            return


# ---------------------------------------------------------------------------- oracles
def pastry_oracle(nodes: list[SimNode], ttl: int) -> dict[NodeId, dict[NodeId, int]]:
    """receiver -> {origin: sublist} by brute force over every routing table: the origin O
    sends along row r to every entry of its row r; a receiver with TTL left forwards to every
    entry of the same row of its own table (not back to O or to the sender). The sublist is
    the origin's row; an origin heard along several rows is listed under the smallest."""
    by_id = {n.id: n for n in nodes}
    out: dict[NodeId, dict[NodeId, int]] = {}
    for o in nodes:
        for r in range(40):
            frontier = [(h.id, o.id) for h in o.core.routing_row(r)]  # (receiver, sender)
            left = ttl
            while frontier and left > 0:
                nxt = []
                for rid, sid in frontier:
                    if rid == o.id:
                        continue
                    got = out.setdefault(rid, {})
                    got[o.id] = min(got.get(o.id, r), r)
                    if left - 1 > 0:
                        nxt.extend(
                            (h.id, rid)
                            for h in by_id[rid].core.routing_row(r)
                            if h.id != o.id and h.id != sid
                        )
                frontier = list(set(nxt))
                left -= 1
    return out


def smallworld_oracle(nodes: list[SimNode], ttl: int) -> dict[NodeId, dict[NodeId, int]]:
    """receiver -> {origin: fewest forwarding hops} by breadth-first search over every node's
    connections, at most ``ttl`` links from the origin."""
    by_id = {n.id: n for n in nodes}
    out: dict[NodeId, dict[NodeId, int]] = {}
    for o in nodes:
        seen = {o.id: -1}
        frontier = [o.id]
        for hops in range(ttl):
            nxt = []
            for x in frontier:
                for h in by_id[x].core.known_nodes():
                    if h.id not in seen:
                        seen[h.id] = hops
                        nxt.append(h.id)
            frontier = nxt
        for rid, hops in seen.items():
            if rid != o.id:
                out.setdefault(rid, {})[o.id] = hops
    return out


def willing_map(flock: Flock) -> dict[NodeId, int]:
    """origin -> sublist index of one flock's willing list."""
    return {e.origin.id: e.row for sub in flock.willing_list() for e in sub}
