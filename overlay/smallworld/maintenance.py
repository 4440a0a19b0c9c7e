"""Periodic maintenance of the small-world ring: one timer per node.

Theory of operation (docs/smallworld.md; Brunet's StructuredNearConnectionOverlord and
StructuredShortcutConnectionOverlord, which run on the node heartbeat):

Every ``maintenance_interval_s`` a ready node

1. **tops up or trims its shortcuts**: wanted = ceil(0.5·log2 N̂) (0 while N̂ ≤ 10); own
   shortcuts inside the near window do not count. Each missing one is a ConnectRequest routed
   to ``me ± d`` with d drawn log-uniformly (P(d) ∝ 1/d) on [2^160/N̂, 2^160]. An attempt that
   lands in the near window is wasted and redrawn on a later tick. More than
   ``wanted + shortcut_slack`` own shortcuts → random ones are dropped (Unlink);
2. **pings idle connections**: any connection not heard from for ``idle_ping_s`` (15 s) gets a
   proximity probe; no answer after the RFC 6298 retries → DEAD → the core drops it, repairs
   its near window at once and replaces a lost shortcut;
3. **stabilizes** every ``stabilize_interval_s``: a NearQuery walk on each side (Chord-style
   stabilization: catches nodes that joined next to us while their Link was lost).

Near repair (:func:`near_step`) walks node to node towards the requester's position on one
side, always to the connection nearest the requester on that side, and stops at the node that
knows nobody nearer: the requester's true neighbour there. Because every hop strictly reduces
the one-sided distance it cannot loop; it usually takes one or two hops, and long shortcuts
carry it across a gap left by many failures. Surplus near connections (pushed out of the
window by a closer node) are trimmed whenever a link is added.
"""

from __future__ import annotations

from overlay.handle import NodeHandle
from overlay.ids import RING
from overlay.smallworld.estimate import desired_shortcuts, draw_shortcut_target
from overlay.smallworld.messages import (
    LEFT,
    NEAR,
    RIGHT,
    SHORTCUT,
    SIDES,
    NearQuery,
    NearReply,
    Unlink,
)
from overlay.smallworld.state import SmallWorldHost


def tick(core: SmallWorldHost) -> None:
    """One maintenance round on a ready node: rejoin if isolated, keep the shortcut count, ping idle
    connections and, every stabilize interval, send near-repair walks and expire dead records."""
    if not core.ready:
        return
    if not len(core.table):
        core.rejoin()  # isolated: every connection failed; ask the seeds again
        return
    now = core.runtime.now()
    check_shortcuts(core)
    ping_idle(core, now)
    if now >= core.next_stabilize:
        core.next_stabilize = now + core.config.stabilize_interval_s
        walk_near(core)
        core.prox.expire_dead()


def check_shortcuts(core: SmallWorldHost) -> None:
    """Create missing shortcuts, or trim a clear surplus."""
    t = core.table
    cfg = core.config
    want = desired_shortcuts(t.n_hat, cfg)
    eff = t.effective_out()
    now = core.runtime.now()
    if core.shortcut_pending and now >= core.shortcut_deadline:
        core.shortcut_pending = 0
        core.shortcut_tokens = None  # late replies to expired requests are unsolicited
    need = want - len(eff) - core.shortcut_pending
    if need > 0:
        core.shortcut_deadline = now + cfg.connect_timeout_s
        rng = core.runtime.rng
        for _ in range(need):
            target = draw_shortcut_target(rng, core.id, t.n_hat)
            core.shortcut_pending += 1
            core.send_connect(target, SHORTCUT, core.next_token())
    elif len(eff) > want + cfg.shortcut_slack:
        rng = core.runtime.rng
        for _ in range(len(eff) - want):
            h = eff.pop(rng.randrange(len(eff)))
            t.discard_out(h)
            core.stats["shortcuts_trimmed"] += 1
            if t.needed(h):
                core.runtime.send(h, Unlink(SHORTCUT))
            else:
                core.drop(h, SHORTCUT)


def ping_idle(core: SmallWorldHost, now: float) -> None:
    """Probe every connection silent for ``idle_ping_s`` (Brunet edge keep-alive).

    A connection we never exchanged a probe with has no liveness record yet; it counts as
    heard at a point staggered across one idle period before our start (by its position in
    the table), so that a freshly built node — or a whole oracle-built network — spreads its
    first round of pings over three ticks instead of firing them all at once. Fewer probes in
    flight per node keep the probe tables and the event queue small at 10^6 nodes. (Pings
    are counted by ``prox.probes_sent``; per-node stats count only rarer events, since every
    distinct key costs memory in each of 10^6 counters.)
    """
    limit = core.config.idle_ping_s
    prox = core.prox
    peers = prox.peers
    started = core.started_at
    conns = core.table.all
    step = limit / len(conns) if conns else 0.0
    for i, h in enumerate(conns):
        p = peers.get(h)
        last = p.last_heard if p is not None else started - i * step
        if now - last >= limit:
            prox.probe(h)


def repair_near(core: SmallWorldHost, sides: tuple[int, ...] = SIDES) -> None:
    """Start a near-repair walk on each of ``sides`` from this node.

    A walk is a chain of datagrams with no acks: if it dies on a hop that failed too, the
    follow-up stabilization brought forward here repeats it two ticks later.
    """
    core.stats["near_repairs"] += 1
    soon = core.runtime.now() + 2 * core.config.maintenance_interval_s
    if core.next_stabilize > soon:
        core.next_stabilize = soon
    walk_near(core, sides)


def walk_near(core: SmallWorldHost, sides: tuple[int, ...] = SIDES) -> None:
    """Send one near-repair walk per side (stabilization: no follow-up scheduled)."""
    for side in sides:
        near_step(core, core.handle, side, 0)


def _side_metric(origin: int, side: int, x: int) -> int:
    """One-sided distance from ``origin`` to ``x``: clockwise for RIGHT, else counter-clockwise."""
    return (x - origin) % RING if side == RIGHT else (origin - x) % RING


def near_step(core: SmallWorldHost, origin: NodeHandle, side: int, hops: int) -> None:
    """One hop of a near-repair walk for ``origin`` (which may be this node)."""
    o = origin.id
    me = core.id
    best: NodeHandle | None = None
    bm = RING if me == o else _side_metric(o, side, me)
    bad = core.prox.bad
    for h in core.table.all:
        if h.id == o:
            continue
        m = (h.id - o) % RING if side == RIGHT else (o - h.id) % RING
        if m < bm and not (bad and h in bad):
            best, bm = h, m
    if best is not None:
        core.runtime.send(best, NearQuery(origin, side, hops + 1))
        return
    if me == o:
        return  # we know nobody on that side at all
    # Nobody nearer to the origin on that side: we are its neighbour there.
    k = 2 * core.config.near_per_side + 2
    nodes = core.closest_known(o, k, o, with_self=False)
    core.runtime.send(origin, NearReply(hops, nodes))
    t = core.table
    if origin not in t and t.fits_near(o) and origin not in bad:
        core.link(origin, NEAR)


__all__ = [
    "LEFT",
    "RIGHT",
    "check_shortcuts",
    "near_step",
    "ping_idle",
    "repair_near",
    "tick",
    "walk_near",
]
