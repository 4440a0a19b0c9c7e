"""The near-list exchange: how the small-world ring converges and keeps its near links alive.

Theory of operation (Brunet's status exchange between structured neighbours; Chord's
stabilize/notify, with lists; docs/smallworld.md, "Stabilization"):

* **Why.** A JOIN reply names the nodes the responder knows closest to the joiner. Two nodes
  joining into one gap at the same time are in no such reply; each links the old neighbours,
  which take both, but the two never hear of each other. Later joiners land next to one or the
  other, and the ring grows interleaved strands: runs of nodes that know each other and skip
  the nodes of the other run. Each strand is consistent by itself, so a repair walk from either
  side stays in its own strand.
* **Push.** A node sends :class:`~overlay.smallworld.messages.NearList` (its near window, with
  ``ask``) to each member of its window ``near_push_delay_s`` after the window changed — and to
  the nodes that just left it, who learn who displaced them — and every ``near_exchange_s`` to
  its ``exchange_per_side`` (1) closest members on each side, as Chord's stabilize talks to the
  successor only.
* **Receive.** The sender is linked if it belongs in the receiver's window (it is the
  authenticated sender); each listed node that would enter the window is sent a ``Link`` and
  becomes a connection only once its ``LinkAck`` comes back (:func:`propose`): hearsay never
  puts an unreachable or made-up handle in a table.
* **Answer.** With ``ask``, the receiver checks the sender's window against every node it knows
  (:func:`answer`): nodes that belong in it but are missing go back in a ``NearList`` without
  ``ask``, so an exchange ends there. On a converged ring nobody has news: the periodic round
  costs two messages per node and no answers.
* **Liveness.** The periodic lists are the keep-alive of the closest neighbours (any message
  counts as hearing its sender), so those links are pinged only when silent. The outer near
  neighbours are watched through them: a list that leaves out a member of our window that
  belongs in the sender's own means the sender dropped it (:func:`check_omissions`). Each list
  also echoes the last stamp its receiver sent, with how long it was held (TCP's timestamp
  echo, RFC 7323 §4), so every round gives each end an RTT sample: without them a near
  connection's only sample would be its first ping, RFC 6298 would keep its RTO at 3·RTT, and
  probing a silent neighbour (7 RTOs: one try, two back-off retries) would take up to 20 s.

Wherever one node knows both strands, its list tells its neighbours about the other strand;
they link the new nodes, their windows change, they push, and the strands zip together a few
message delays per step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial

from overlay.handle import NodeHandle
from overlay.ids import HALF_RING, RING
from overlay.smallworld.messages import NEAR, Link, NearList
from overlay.smallworld.state import SmallWorldHost
from overlay.smallworld.validate import MalformedInput, check_handle, check_time

__all__ = [
    "answer",
    "ask_past_gap",
    "changed_for",
    "check_nodes",
    "check_omissions",
    "expire_proposals",
    "list_to",
    "listed_near",
    "on_list",
    "probe_stale",
    "propose",
    "push_near",
    "receive_list",
    "take_proposal",
    "window_of",
]


def push_near(
    core: SmallWorldHost,
    extra: Iterable[NodeHandle] | None = None,
    periodic: bool = False,
    before: tuple[NodeHandle, ...] | None = None,
) -> None:
    """Send our near window to each of its members not suspected, and to ``extra`` (nodes that
    just left the window), asking for the nodes we are missing. The list is the window as it
    stands, suspected members included: leaving them out would make every receiver answer
    with them as news.

    ``periodic``: the timed round, sent only to the ``exchange_per_side`` closest members on
    each side (the others hear of us through them, see :func:`check_omissions`) — counting
    only members heard from within ``idle_ping_s``: past a silent one (crashed, not yet
    declared dead) the next member gets the list too, so that it answers with the nodes we
    miss on that side while the silent one cannot.

    ``before``: the window before the changes this push reports. A member for which nothing
    changed — its own window, as far as ours shows it, is the same before and after
    (:func:`changed_for`) — is skipped: the list would repeat what it knows (a change at our
    right end means nothing to our outer left neighbour), and it hears from us in the periodic
    round or the next push that concerns it."""
    prox = core.prox
    bad = prox.bad
    t = core.table
    window = t.near_nodes()
    send = core.runtime.send
    if periodic:
        e = core.config.exchange_per_side
        fresh_s = core.config.idle_ping_s
        peers = prox.peers
        now = core.runtime.now()
        to: list[NodeHandle] = []
        for side in (t.right(), t.left()):
            fresh = 0
            for h in side:
                if fresh >= e:
                    break
                to.append(h)
                p = peers.get(h)
                if h not in bad and p is not None and now - p.last_heard < fresh_s:
                    fresh += 1
    elif before is not None:
        k = t.near
        to = [h for h in window if h not in before or changed_for(core.id, h, before, window, k)]
        core.stats["near_push_skipped"] += len(window) - len(to)
    else:
        to = list(window)
    for h in to:
        if h not in bad:
            send(h, list_to(core, h, window, True))
    if extra:
        for h in extra:
            if h not in window and h not in bad:
                send(h, list_to(core, h, window, True))


def ask_past_gap(core: SmallWorldHost, key: int) -> None:
    """A routed message for ``key`` is being retransmitted to a suspected next hop because no
    live connection of ours is closer to the key: every node we know between us and the key
    is suspected (crashed neighbours not declared dead yet), so the live nodes beyond them —
    the key's root among them — are unknown to us. Send our *live* window, asking, to the
    nearest live connection on that side: it answers with the nodes it knows that belong in
    that window (:func:`answer`), we link them, and the message goes through them at once
    (``SmallWorldCore._reroute_past_suspected``) rather than waiting for the suspected hop's
    verdict and then being delivered here. At most once per ``maintenance_interval_s`` per
    side.

    Not a repair walk: it heads for the nodes nearest us, the crashed ones, which the nodes on
    the way do not know have failed, and dies there (datagrams without acks). Traced under
    5-minute sessions (docs/smallworld.md, "Short sessions"), 17 of 18 ``root_unknown``
    deliveries were such a holder: its next hop had crashed, it knew no live node beyond it,
    and the message was delivered there once the probe's verdict came, up to 6 s later.
    Measured there too: about one query in eight saves a message — the nearest live
    connection is often a shortcut far beyond the gap, which knows nothing of it either."""
    t = core.table
    right = t.cw(key) <= HALF_RING
    now = core.runtime.now()
    asked = core.gap_asked
    if asked is None:
        asked = core.gap_asked = {}
    if now < asked.get(right, -1.0) + core.config.maintenance_interval_s:
        return
    bad = core.prox.bad
    conns = t.all if right else tuple(reversed(t.all))
    dst = next((h for h in conns if h not in bad), None)
    if dst is None:
        return
    asked[right] = now
    k = t.near
    live_right = [h for h in t.all if h not in bad][:k]
    live_left = [h for h in reversed(t.all) if h not in bad and h not in live_right][:k]
    core.stats["gap_queries"] += 1
    core.runtime.send(dst, list_to(core, dst, (*live_right, *reversed(live_left)), True))


def _presumed_window(z: int, ids: Iterable[int], k: int) -> frozenset[int]:
    """The ``k`` closest of ``ids`` on each side of id ``z``: its near window as far as these
    nodes show it."""
    right = sorted((x - z) % RING for x in ids if x != z and (x - z) % RING <= HALF_RING)
    left = sorted((z - x) % RING for x in ids if x != z and (x - z) % RING > HALF_RING)
    return frozenset([(z + d) % RING for d in right[:k]] + [(z - d) % RING for d in left[:k]])


def changed_for(
    me: int,
    z: NodeHandle,
    before: Sequence[NodeHandle],
    after: Sequence[NodeHandle],
    k: int,
) -> bool:
    """Whether a change of our near window from ``before`` to ``after`` touches the window of
    member ``z`` (both computed over our window and us): if not, our list tells ``z`` nothing
    it could link, and names every node it names before — no omission to probe either."""
    b = _presumed_window(z.id, [me, *(h.id for h in before)], k)
    a = _presumed_window(z.id, [me, *(h.id for h in after)], k)
    return a != b


def list_to(
    core: SmallWorldHost, dst: NodeHandle, nodes: tuple[NodeHandle, ...], ask: bool
) -> NearList:
    """A NearList for ``dst``, echoing the last stamp ``dst`` sent us."""
    now = core.runtime.now()
    got = core.list_stamps.get(dst) if core.list_stamps is not None else None
    if got is None:
        return NearList(nodes, ask, now, -1.0, 0.0)
    return NearList(nodes, ask, now, got[0], now - got[1])


def window_of(me: int, nodes: Sequence[NodeHandle], k: int, x: int) -> bool:
    """Would id ``x`` enter the near window of node ``me`` whose window is ``nodes``? (The
    ``ConnectionTable.fits_near`` rule applied to a list someone sent us.)"""
    if x == me:
        return False
    right = sorted((h.id - me) % RING for h in nodes if (h.id - me) % RING <= HALF_RING)
    left = sorted((me - h.id) % RING for h in nodes if (h.id - me) % RING > HALF_RING)
    if len(right) + len(left) < 2 * k:
        return True
    d = (x - me) % RING
    if d <= HALF_RING:
        return len(right) < k or d < right[k - 1]
    return len(left) < k or (me - x) % RING < left[k - 1]


def listed_near(core: SmallWorldHost, nodes: Sequence[NodeHandle], ask: bool) -> int:
    """How many near neighbours a side the sender of the list ``nodes`` keeps, for reading its
    list as its window: an asking list is its window (``near_per_side`` a side, or
    ``churn_near_per_side`` while it observes short sessions, ``churn.py``), so one longer than
    two sides of the narrow window comes from a widened one. An answer (``ask`` clear) lists
    news before the window; it is read at the narrow width, as before windows could widen."""
    cfg = core.config
    base, wide = cfg.near_per_side, cfg.churn_near_per_side
    return wide if ask and wide > base and len(nodes) > 2 * base else base


def answer(core: SmallWorldHost, src: NodeHandle, nodes: Sequence[NodeHandle]) -> None:
    """``src`` sent us its near window ``nodes`` and asked: if we know nodes (ourselves included)
    that belong in that window but are not in it, send them with our own window (``ask`` clear,
    so the exchange ends here)."""
    k = listed_near(core, nodes, True)
    listed = {h.id for h in nodes}
    listed.add(src.id)
    o = src.id
    news = [
        h
        for h in (core.handle, *core.table.all)
        if h.id not in listed and h not in core.prox.bad and window_of(o, nodes, k, h.id)
    ]
    if not news:
        return
    news.sort(key=lambda h: min((h.id - o) % RING, (o - h.id) % RING))
    cap = core.config.max_reply_nodes
    out = news[: 2 * k + 2]
    for h in core.table.near_nodes():
        if len(out) >= cap:
            break
        if h not in out and h.id != o and h not in core.prox.bad:
            out.append(h)
    core.stats["near_news"] += 1
    core.runtime.send(src, list_to(core, src, tuple(out), False))


def expire_proposals(core: SmallWorldHost, now: float) -> None:
    """Forget hearsay candidates that never acknowledged our Link, and the list stamps of
    nodes that are no longer connections."""
    pending = core.proposed
    if pending:
        for h in [h for h, (_tok, deadline) in pending.items() if now >= deadline]:
            del pending[h]
    if not pending:
        core.proposed = None
    stamps = core.list_stamps
    if stamps:
        t = core.table
        for h in [h for h in stamps if h not in t]:
            del stamps[h]
    if not stamps:
        core.list_stamps = None


def probe_stale(core: SmallWorldHost, members: Iterable[NodeHandle]) -> None:
    """Probe new near-window members not heard from for ``idle_ping_s``: a shortcut that slides
    into the window when a near neighbour fails may have failed too (correlated failures), and
    its shortcut idle period is long; a near connection must be live now."""
    prox = core.prox
    now = core.runtime.now()
    limit = core.config.idle_ping_s
    peers = prox.peers
    for h in members:
        p = peers.get(h)
        if p is None or now - p.last_heard >= limit:
            prox.probe(h)


def check_nodes(nodes: object, cap: int) -> tuple[NodeHandle, ...]:
    """``nodes`` if it is a tuple of at most ``cap`` well-formed handles; else MalformedInput."""
    if not isinstance(nodes, tuple) or len(nodes) > cap:
        raise MalformedInput("reply node list is not a short tuple")
    for h in nodes:
        check_handle(h)
    return nodes


def receive_list(core: SmallWorldHost, src: NodeHandle, m: NearList) -> None:
    """Check a received NearList and hand it to :func:`on_list` if this node is ready."""
    nodes = check_nodes(m.nodes, core.config.max_reply_nodes)
    if not isinstance(m.ask, bool):
        raise MalformedInput("NearList.ask is not a bool")
    if src.id == core.id:
        raise MalformedInput("near list from our own id")
    stamp, echo, held = check_time(m.stamp), check_time(m.echo), check_time(m.held)
    if not core.ready:
        # A join owns the table until it ends: only acknowledged links may make it succeed
        # (join.py). The node pushes its window asking for news the moment it is ready.
        return
    on_list(core, src, nodes, m.ask, stamp, echo, held)


def on_list(
    core: SmallWorldHost,
    src: NodeHandle,
    nodes: Sequence[NodeHandle],
    ask: bool,
    stamp: float,
    echo: float,
    held: float,
) -> None:
    """A ready node received ``src``'s near list ``nodes``: link the sender if it belongs in our
    window, propose the listed nodes that do, answer when asked and we have news, and take the
    round trip its echo measures."""
    core.consider_near((src,))
    now = core.runtime.now()
    if src in core.table:
        if core.list_stamps is None:
            core.list_stamps = {}
        core.list_stamps[src] = (stamp, now)
        # An echo of one of our own recent stamps: the round trip minus the time it was held.
        # Anything else (no echo yet, a stamp from the future or from long ago, a negative
        # hold) is not a sample.
        rtt = now - echo - held
        horizon = 3 * core.config.near_exchange_s
        if echo >= 0.0 and held >= 0.0 and rtt > 0.0 and now - echo <= horizon + held:
            core.prox.sample(src, rtt)
    check_omissions(core, src, nodes, ask)
    propose(core, nodes)
    if ask:
        answer(core, src, nodes)


def check_omissions(
    core: SmallWorldHost, src: NodeHandle, nodes: Sequence[NodeHandle], ask: bool = True
) -> None:
    """A near neighbour's list leaves out a member of our window that belongs in its own: it
    dropped that node (its own probes found it dead, or it never held it). Probe it, and
    declare it dead if the first two tries go unanswered — unless we heard from it just now.

    This is how the near neighbours that get no periodic list from us learn of a crash
    promptly: the neighbour between us hears from the failed node every exchange period and
    probes it after ``idle_ping_s`` of silence; when it drops it, its window changes and it
    pushes the new one to us at once (MSPastry's failure reports to the leaf set play this
    part in Pastry, Castro et al. 2003 §3.2). A node that merely did not know the other is
    answered with it as news (:func:`answer`); our probe finds it alive and changes nothing."""
    if src not in core.table or not core.table.is_near(src):
        return
    k = listed_near(core, nodes, ask)
    listed = {h.id for h in nodes}
    prox = core.prox
    bad = prox.bad
    peers = prox.peers
    now = core.runtime.now()
    recent = core.config.maintenance_interval_s
    for h in core.table.near_nodes():
        if h == src or h.id in listed or not window_of(src.id, nodes, k, h.id):
            continue
        if h in bad and prox.is_dead(h):
            continue
        p = peers.get(h)
        if p is not None and now - p.last_heard < recent:
            continue
        core.stats["near_omissions"] += 1
        answered: list[bool] = []
        prox.probe(h, partial(_note_answer, answered))
        # The neighbour between us declared it dead after its own probe; two unanswered pings
        # of ours (the probe's first two tries, 3 RTOs) confirm that verdict. Waiting for our
        # whole probe would take 7 RTOs of a peer we sample rarely (its RTO up to 3 RTT); one
        # try alone, lost at 5 % loss one time in ten, made live nodes dead. Until the first
        # timeout routing still uses it: a list can omit a live node (its sender's window is
        # incomplete after a join), and avoiding a live node on hearsay alone would deliver
        # its keys elsewhere.
        wait = 3 * prox.rto(h) + prox.config.min_rto_s
        core.runtime.call_later(wait, partial(_confirm_omission, core, h, now, answered))


def _note_answer(answered: list[bool], rtt: float | None) -> None:
    answered.append(rtt is not None)


def _confirm_omission(
    core: SmallWorldHost, h: NodeHandle, since: float, answered: list[bool]
) -> None:
    """Declare ``h`` dead if our probe's first two tries went unanswered (it is suspected now)
    and nothing came from it since its omission was seen."""
    if core.stopped or any(answered):
        return
    prox = core.prox
    p = prox.peers.get(h)
    if p is None or h not in prox.bad or p.last_heard >= since:
        return
    core.stats["near_omissions_confirmed"] += 1
    prox.declare_dead(h)


def propose(core: SmallWorldHost, cands: Sequence[NodeHandle]) -> None:
    """Send a Link to each hearsay candidate that would enter the near window; it joins the table
    only when its LinkAck comes back (:func:`take_proposal`), so a handle nobody answers for — a
    stale or made-up one — never becomes a connection. At most one window's worth of candidates
    is proposed per call, the closest first."""
    me = core.id
    prox = core.prox
    bad = prox.bad
    t = core.table
    now = core.runtime.now()
    budget = 2 * core.table.near
    for h in sorted(cands, key=lambda c: (min((c.id - me) % RING, (me - c.id) % RING), c.id)):
        if budget <= 0:
            break
        if h.id == me or h in t or not t.fits_near(h.id, bad):
            continue
        if h in bad:
            # Held DEAD (or suspected) yet named by a live neighbour's window: a node restarted
            # under its old id and address, which links only its own window and so never
            # contacts a wider node holding it dead. One ping once the verdict is old enough
            # that the list cannot merely be stale (``ProximityConfig.dead_recheck_s``); its
            # pong revives it and links it (``SmallWorldCore._on_peer_alive``).
            if prox.is_dead(h) and prox.recheck(h):
                core.stats["dead_rechecks"] += 1
            continue
        budget -= 1
        pending = core.proposed
        if pending is None:
            pending = core.proposed = {}
        if h in pending:
            continue
        token = core.next_token()
        pending[h] = (token, now + core.config.connect_timeout_s)
        core.stats["near_proposals"] += 1
        core.runtime.send(h, Link(NEAR, token))


def take_proposal(core: SmallWorldHost, src: NodeHandle, token: int) -> bool:
    """Whether a LinkAck from ``src`` answers one of our proposals (and forget the proposal)."""
    pending = core.proposed
    if pending is None:
        return False
    got = pending.get(src)
    if got is None or got[0] != token:
        return False
    del pending[src]
    if not pending:
        core.proposed = None
    return True
