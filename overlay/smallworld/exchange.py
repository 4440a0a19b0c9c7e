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
  the nodes that just left it, who learn who displaced them — and every ``near_exchange_s``.
* **Receive.** The sender is linked if it belongs in the receiver's window (it is the
  authenticated sender); each listed node that would enter the window is sent a ``Link`` and
  becomes a connection only once its ``LinkAck`` comes back (:func:`propose`): hearsay never
  puts an unreachable or made-up handle in a table.
* **Answer.** With ``ask``, the receiver checks the sender's window against every node it knows
  (:func:`answer`): nodes that belong in it but are missing go back in a ``NearList`` without
  ``ask``, so an exchange ends there. On a converged ring nobody has news: the periodic round
  costs four messages per node and no answers.
* **Liveness.** The periodic lists are the keep-alive of near connections (any message counts
  as hearing its sender), so near links are pinged only when silent. Each list also echoes the
  last stamp its receiver sent, with how long it was held (TCP's timestamp echo, RFC 7323 §4),
  so every round gives each end an RTT sample: without them a near connection's only sample
  would be its first ping, RFC 6298 would keep its RTO at 3·RTT, and probing a silent
  neighbour (15 RTOs: one try, three back-off retries) would take up to half a minute.

Wherever one node knows both strands, its list tells its neighbours about the other strand;
they link the new nodes, their windows change, they push, and the strands zip together a few
message delays per step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from overlay.handle import NodeHandle
from overlay.ids import HALF_RING, RING
from overlay.smallworld.messages import NEAR, Link, NearList
from overlay.smallworld.state import SmallWorldHost

__all__ = [
    "answer",
    "expire_proposals",
    "list_to",
    "on_list",
    "probe_stale",
    "propose",
    "push_near",
    "take_proposal",
    "window_of",
]


def push_near(core: SmallWorldHost, extra: Iterable[NodeHandle] | None = None) -> None:
    """Send our near window to each of its members not suspected, and to ``extra`` (nodes that
    just left the window), asking for the nodes we are missing. The list is the window as it
    stands, suspected members included: leaving them out would make every receiver answer
    with them as news."""
    bad = core.prox.bad
    window = core.table.near_nodes()
    send = core.runtime.send
    for h in window:
        if h not in bad:
            send(h, list_to(core, h, window, True))
    if extra:
        for h in extra:
            if h not in window and h not in bad:
                send(h, list_to(core, h, window, True))


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


def answer(core: SmallWorldHost, src: NodeHandle, nodes: Sequence[NodeHandle]) -> None:
    """``src`` sent us its near window ``nodes`` and asked: if we know nodes (ourselves included)
    that belong in that window but are not in it, send them with our own window (``ask`` clear,
    so the exchange ends here)."""
    k = core.config.near_per_side
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
    propose(core, nodes)
    if ask:
        answer(core, src, nodes)


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
    budget = core.config.near_window
    for h in sorted(cands, key=lambda c: (min((c.id - me) % RING, (me - c.id) % RING), c.id)):
        if budget <= 0:
            break
        if h.id == me or h in bad or h in t or prox.is_dead(h) or not t.fits_near(h.id):
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
