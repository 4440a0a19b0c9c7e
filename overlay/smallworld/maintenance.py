"""Periodic maintenance of the small-world ring: one timer per node.

Theory of operation (docs/smallworld.md; Brunet's StructuredNearConnectionOverlord and
StructuredShortcutConnectionOverlord, which run on the node heartbeat):

Every ``maintenance_interval_s`` a ready node

1. **tops up or trims its shortcuts**: wanted = ceil(0.5·log2 N̂) (0 while N̂ ≤ 10); own
   shortcuts inside the near window do not count. Each missing one is a ConnectRequest routed
   to ``me ± d`` with d drawn log-uniformly (P(d) ∝ 1/d) on [2^160/N̂, 2^160]. An attempt that
   lands in the near window is wasted and redrawn on a later tick. More than
   ``wanted + shortcut_slack`` own shortcuts → the suspected and longest-silent are dropped
   (Unlink);
2. **exchanges near lists** every ``near_exchange_s`` (20 s): its near window goes to the
   closest near neighbour on each side, which links what it was missing and answers with what
   we are missing (:mod:`overlay.smallworld.exchange`: what makes concurrent joins converge,
   and the keep-alive of those connections);
3. **pings idle connections**: a closest neighbour not heard from for ``idle_ping_s`` (22 s: a
   live neighbour's periodic list arrives first), an outer near neighbour silent for
   ``outer_idle_ping_s`` (60 s; 22 s while a closer one on its side is suspected) or a
   shortcut silent for ``shortcut_idle_ping_s`` (120 s) gets a proximity probe; no answer
   after the RFC 6298 retries → DEAD → the core drops it, pushes its changed window (the
   neighbours left on that side answer with the node that fills the gap) and replaces a lost
   shortcut. Any message from a peer (lists, routed traffic, acks) counts as hearing it. When
   every near neighbour of a side is suspected, a repair walk goes out at once;
4. **stabilizes** every ``stabilize_interval_s`` (300 s): a NearQuery walk on each side, a
   safety net under the exchange; and **heals partitions**: a node that declared connections
   dead in the last 90 min asks one of them where it belongs (:func:`heal_partition`; FreePastry
   ``PartitionHandler``), so two rings that a partition made merge once it heals.

A node left with fewer live connections than a near window after losing some rejoins through
its seeds (:func:`check_isolated`): an island cut off by a mass failure cannot be found by
exchanges or walks, which only follow connections.

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
from overlay.smallworld import exchange, offers
from overlay.smallworld.estimate import desired_shortcuts, draw_shortcut_target, ttl_hops
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
from overlay.smallworld.validate import MalformedInput, check_handle, check_int


def tick(core: SmallWorldHost) -> None:
    """One maintenance round on a ready node: rejoin if isolated, keep the shortcut count, send the
    near list every exchange period (and expire stale records), ping silent connections and,
    every stabilize interval, send near-repair walks."""
    if not core.ready:
        return
    if not len(core.table):
        core.rejoin()  # isolated: every connection failed; ask the seeds again
        return
    now = core.runtime.now()
    check_shortcuts(core)
    if now >= core.next_exchange:
        core.next_exchange = now + core.config.near_exchange_s
        exchange.push_near(core, periodic=True)
        exchange.expire_proposals(core, now)
        core.prox.expire_dead()
    ping_idle(core, now)
    if now >= core.next_stabilize:
        core.next_stabilize = now + core.config.stabilize_interval_s
        walk_near(core)
        heal_partition(core, now)


def remember_gone(core: SmallWorldHost, h: NodeHandle) -> None:
    """A connection was declared dead: remember it for partition healing (FreePastry
    ``PartitionHandler``'s history: the newest ``gone_history_size``)."""
    size = core.config.gone_history_size
    if size <= 0:
        return
    g = core.gone
    if g is None:
        g = core.gone = {}
    g.pop(h, None)
    g[h] = core.runtime.now()
    if len(g) > size:
        del g[next(iter(g))]


def heal_partition(core: SmallWorldHost, now: float) -> None:
    """Ask one connection declared dead in the last ``gone_history_age_s`` (at random; not one
    we hold again) where we belong: if a partition cut it off, its ring answers and the rings
    merge (join.probe_partition). Walks and exchanges follow connections only, and after a
    partition none crosses it: without this the two rings stay two rings for ever."""
    g = core.gone
    if not g:
        return
    age = core.config.gone_history_age_s
    t = core.table
    heard = core.prox.heard_since
    # forgotten: too old, held again, or heard from since (alive, so in our ring after all)
    for h in [h for h, at in g.items() if now - at > age or h in t or heard(h, at)]:
        del g[h]
    if not g:
        core.gone = None
        return
    if core.join_state is None:
        core.probe_partition(core.runtime.rng.choice(list(g)).address)


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
    need = want - len(eff) - core.shortcut_pending - offers.live_offers(core, now)
    if need > 0:
        core.shortcut_deadline = now + cfg.connect_timeout_s
        rng = core.runtime.rng
        for _ in range(need):
            target = draw_shortcut_target(rng, core.id, t.n_hat)
            core.shortcut_pending += 1
            core.send_connect(target, SHORTCUT, core.next_token())
    elif len(eff) > want + cfg.shortcut_slack:
        # Drop the suspected ones first, then those heard from longest ago: when N̂ falls
        # because many nodes failed at once, the surplus is mostly shortcuts to failed nodes
        # not yet detected, and a live one may be the last link to the rest of the ring.
        # (Staleness is independent of the shortcut's length: the 1/d law is kept.)
        prox = core.prox
        bad = prox.bad
        peers = prox.peers

        def freshness(h: NodeHandle) -> tuple[bool, float]:
            p = peers.get(h)
            return (h not in bad, p.last_heard if p is not None else -1.0)

        eff.sort(key=freshness)
        for h in eff[: len(eff) - want]:
            t.discard_out(h)
            core.stats["shortcuts_trimmed"] += 1
            if t.needed(h, bad):
                core.runtime.send(h, Unlink(SHORTCUT))
            else:
                core.drop(h, SHORTCUT)


def check_isolated(core: SmallWorldHost) -> None:
    """After losing connections: with fewer live ones left than a near window holds, this node
    may be cut off from the ring (all its links failed at once but for a few nodes cut off with
    it), and no exchange or walk can leave such an island. Ask the seeds where we belong (a
    rejoin: its reply links us to the nodes closest to our id wherever they are). In a ring
    that small anyway, the rejoin finds the nodes we already hold and changes nothing."""
    if not core.ready or core.join_state is not None or core.stopped:
        return
    bad = core.prox.bad
    live = sum(1 for h in core.table.all if h not in bad)
    if live < 2 * core.table.near:
        core.rejoin()


def ping_idle(core: SmallWorldHost, now: float) -> None:
    """Probe every connection silent for its idle period (Brunet edge keep-alive): ``idle_ping_s``
    for the closest neighbours, which send us their lists every ``near_exchange_s`` anyway;
    ``outer_idle_ping_s`` for the rest of the near window, watched through those lists
    (``idle_ping_s`` while a near neighbour on their side is suspected, as for the connections
    next in line); ``shortcut_idle_ping_s`` for the rest. A side whose near neighbours are all
    suspected gets a repair walk now.

    A connection we never exchanged a probe with has no liveness record yet. A near one is
    pinged at once: its first RTT sample sets the timeout with which its failure would be
    probed (the lists' echoes refine it from the second round on). A shortcut counts as heard
    at a point staggered across one idle period before our start (by its position in the
    table), so that a freshly built node — or a whole oracle-built network — spreads its first
    round of pings over many ticks instead of firing them all at once. Fewer probes in flight
    per node keep the probe tables and the event queue small at 10^6 nodes. (Pings are counted
    by ``prox.probes_sent``; per-node stats count only rarer events, since every distinct key
    costs memory in each of 10^6 counters.)
    """
    cfg = core.config
    prox = core.prox
    peers = prox.peers
    bad = prox.bad
    started = core.started_at
    conns = core.table.all
    n = len(conns)
    k = core.table.near
    e = min(cfg.exchange_per_side, k)
    near_idle = cfg.idle_ping_s
    outer_idle = max(near_idle, cfg.outer_idle_ping_s)
    if n <= 2 * k:  # a tiny ring: everything is near, and cheap
        for h in conns:
            p = peers.get(h)
            if p is None or now - p.last_heard >= near_idle:
                prox.probe(h)
        return
    # A suspected near neighbour is probably gone, and the connections next in line on its side
    # will take its place: check those now too (if silent), in parallel with its probe, so that
    # after correlated failures the window is not refilled with nodes that failed as well. The
    # same alarm brings the outer near neighbours of that side down to the short idle period.
    right_alarm = left_alarm = False
    if bad:
        right_alarm = any(h in bad for h in conns[:k])
        left_alarm = any(h in bad for h in conns[n - k :])
        # Every near neighbour of a side suspected (two neighbours failed together): the nodes
        # beyond them are unknown to us, and their keys would be delivered here until the
        # probes end. Walk for them now rather than when the probes declare them dead.
        for side, members in ((RIGHT, conns[:k]), (LEFT, conns[n - k :])):
            if all(h in bad for h in members):
                core.stats["near_side_walks"] += 1
                walk_near(core, (side,))
    for i, h in enumerate(conns):
        p = peers.get(h)
        right = i < 2 * k
        left = i >= n - 2 * k
        if i < e or i >= n - e:  # closest neighbours: they send us their lists
            limit = near_idle
        elif i < k or i >= n - k:  # outer near: watched through the closest one's lists
            limit = near_idle if (right and right_alarm) or (left and left_alarm) else outer_idle
        elif (right and right_alarm) or (left and left_alarm):  # next in line
            limit = near_idle
        else:
            limit = cfg.shortcut_idle_ping_s
            last = p.last_heard if p is not None else started - limit * i / n
            if now - last >= limit:
                # One retry, not two: a shortcut wrongly given up costs one replacement, never
                # a wrong delivery, and most silent shortcuts under churn have failed (a
                # lookup that finds one suspects it, which upgrades the probe to full strength).
                prox.probe(h, hint=True)
            continue
        if p is None or now - p.last_heard >= limit:
            prox.probe(h)


def near_lost(
    core: SmallWorldHost, h: NodeHandle, side_id: int, side: tuple[NodeHandle, ...]
) -> None:
    """Near neighbour ``h`` on ``side_id`` was declared dead; ``side`` was that side of the
    window before. The push of the changed window (``_near_changed``) asks the neighbours left
    on that side, which answer with the node that fills the gap — if they are alive. Under
    short sessions the one left is often dead too, not yet detected (it is heard from only
    every ``outer_idle_ping_s``), or a shortcut that slid into the window after an earlier
    loss and knows nobody near us; then the gap stays until the next stabilization, and the
    keys of the dead node are delivered here (the ``root_unknown`` deliveries of the churn
    benchmark at 5-minute sessions, docs/smallworld.md "Short sessions"). So the survivors not
    heard from within ``idle_ping_s`` are probed now, and unless one that was a near neighbour
    before is fresh, that side walks now, past the stale ones."""
    t = core.table
    prox = core.prox
    bad = prox.bad
    peers = prox.peers
    now = core.runtime.now()
    fresh_s = core.config.idle_ping_s
    stale: list[NodeHandle] = []
    fresh = False
    for x in side:
        if x == h or x not in t or x in bad:
            continue
        p = peers.get(x)
        if p is not None and now - p.last_heard < fresh_s:
            fresh = True
        else:
            stale.append(x)
    for x in stale:
        prox.probe(x)
    if not fresh:
        repair_near(core, (side_id,), frozenset(stale))


def repair_near(
    core: SmallWorldHost, sides: tuple[int, ...] = SIDES, avoid: frozenset[NodeHandle] = frozenset()
) -> None:
    """Start a near-repair walk on each of ``sides`` from this node.

    A walk is a chain of datagrams with no acks: if it dies on a hop that failed too, the
    follow-up stabilization brought forward here repeats it two ticks later.
    """
    core.stats["near_repairs"] += 1
    soon = core.runtime.now() + 2 * core.config.maintenance_interval_s
    if core.next_stabilize > soon:
        core.next_stabilize = soon
    walk_near(core, sides, avoid)


def walk_near(
    core: SmallWorldHost, sides: tuple[int, ...] = SIDES, avoid: frozenset[NodeHandle] = frozenset()
) -> None:
    """Send one near-repair walk per side (stabilization: no follow-up scheduled); its first hop
    is not one of ``avoid`` (connections that may have failed)."""
    for side in sides:
        near_step(core, core.handle, side, 0, avoid)


def _side_metric(origin: int, side: int, x: int) -> int:
    """One-sided distance from ``origin`` to ``x``: clockwise for RIGHT, else counter-clockwise."""
    return (x - origin) % RING if side == RIGHT else (origin - x) % RING


def on_near_query(core: SmallWorldHost, m: NearQuery) -> None:
    """Check a received near-repair walk and take its next step."""
    origin = check_handle(m.origin)
    hops = check_int(m.hops)
    if m.side not in SIDES:
        raise MalformedInput(f"unknown side {m.side!r}")
    if origin.id == core.id:
        raise MalformedInput("near query for our own id came back to us")
    if hops > ttl_hops(core.table.n_hat, core.config):
        core.stats["ttl_expired"] += 1
        return
    near_step(core, origin, m.side, hops)


def on_near_reply(core: SmallWorldHost, src: NodeHandle, m: NearReply) -> None:
    """A walk ended at ``src``, our neighbour on its side: link it, propose the nodes it names."""
    check_int(m.hop)
    nodes = exchange.check_nodes(m.nodes, core.config.max_reply_nodes)
    core.consider_near((src,))  # the sender itself is authenticated; the rest is hearsay
    exchange.propose(core, nodes)


def near_step(
    core: SmallWorldHost,
    origin: NodeHandle,
    side: int,
    hops: int,
    avoid: frozenset[NodeHandle] = frozenset(),
) -> None:
    """One hop of a near-repair walk for ``origin`` (which may be this node), not to ``avoid``."""
    o = origin.id
    me = core.id
    best: NodeHandle | None = None
    bm = RING if me == o else _side_metric(o, side, me)
    bad = core.prox.bad
    for h in core.table.all:
        if h.id == o:
            continue
        m = (h.id - o) % RING if side == RIGHT else (o - h.id) % RING
        if m < bm and not (bad and h in bad) and h not in avoid:
            best, bm = h, m
    if best is not None:
        core.runtime.send(best, NearQuery(origin, side, hops + 1))
        return
    if me == o:
        return  # we know nobody on that side at all
    # Nobody nearer to the origin on that side: we are its neighbour there.
    k = 2 * core.table.near + 2
    nodes = core.closest_known(o, k, o, with_self=False)
    core.runtime.send(origin, NearReply(hops, nodes))
    t = core.table
    if origin not in t and origin not in bad and t.fits_near(o, bad):
        core.link(origin, NEAR)


__all__ = [
    "LEFT",
    "RIGHT",
    "check_isolated",
    "check_shortcuts",
    "near_lost",
    "near_step",
    "on_near_query",
    "on_near_reply",
    "ping_idle",
    "repair_near",
    "tick",
    "walk_near",
]
