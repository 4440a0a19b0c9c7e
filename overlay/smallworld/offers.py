"""Shortcuts without a routed request: inherited at a join, replaced from a dead one's neighbours.

Theory of operation (docs/smallworld.md, "Short sessions"; Symphony, Manku et al. 2003 §3;
Brunet's shortcut overlord). Both are off by default (``SmallWorldConfig.reuse_shortcuts``,
``inherit_shortcuts``): the routed requests they save also detected crashes on their way, and
without them a crashed near neighbour stayed in the windows longer (measured there).

A shortcut is normally made by routing a ``ConnectRequest`` to a drawn target (about log N
acked hops, ~11 datagrams in all at N = 2,000). Under 5-minute sessions those requests were
the largest part of the control traffic, and most of them carry little information:

* **A joiner** sits next to the node that answered its JOIN (the node closest to its id), so
  that node's own shortcuts lie at the same log-uniform distances from the joiner, give or
  take one node spacing: a draw from the joiner's own distribution. The JOIN reply names, for
  each of them whose neighbours the responder knows, one such neighbour and the shortcut
  (``ConnectReply.shortcuts``, in pairs), and the joiner offers the neighbour a ``Link`` — not
  the shortcut itself: two adjacent nodes linked to one far node would make it spend two of
  its links on one region (measured: lookups took 5 % more hops). Drawing and routing its own
  requests is left for the ones that do not answer.
* **A dead shortcut's** target is still a valid draw, and the node now closest to it is one of
  the dead node's neighbours. The reply that made the shortcut named them (its ``nodes``), so
  its loss costs one ``Link`` to the first of them instead of a routed request.

Either way the candidate is hearsay: it becomes an own shortcut only when its ``LinkAck``
(echoing a fresh token) comes back, as for near candidates (``exchange.propose``); one that
stays silent for ``shortcut_offer_timeout_s`` is forgotten, and the next maintenance tick
routes a request for the missing shortcut as before. A replacement keeps the dead shortcut's
other neighbour as its own replacement. A candidate that is a connection of ours already is
skipped: taking it as an own shortcut too would leave us one distinct link short (measured:
lookups took more hops).
"""

from __future__ import annotations

from collections.abc import Iterable

from overlay.handle import NodeHandle
from overlay.smallworld.messages import SHORTCUT, Link
from overlay.smallworld.state import SmallWorldHost

__all__ = ["live_offers", "offer", "remember_alternates", "replace_from_alternates", "take"]


def live_offers(core: SmallWorldHost, now: float) -> int:
    """Expire offers past their deadline; return how many are still awaiting their LinkAck."""
    offers = core.shortcut_offers
    if not offers:
        return 0
    for h in [h for h, (_tok, deadline, _alts) in offers.items() if now >= deadline]:
        del offers[h]
    if not offers:
        core.shortcut_offers = None
        return 0
    return len(offers)


def offer(
    core: SmallWorldHost,
    cands: Iterable[NodeHandle],
    limit: int,
    alts: tuple[NodeHandle, ...] = (),
) -> int:
    """Send ``Link(SHORTCUT, token)`` to up to ``limit`` candidates that could be own shortcuts
    (not us, not connected, not suspected or dead, outside our near window); return how many.
    ``alts``: nodes next to the candidates, to replace the one taken should it fail too."""
    if limit <= 0:
        return 0
    t = core.table
    prox = core.prox
    bad = prox.bad
    now = core.runtime.now()
    deadline = now + core.config.shortcut_offer_timeout_s
    live_offers(core, now)
    sent = 0
    for h in cands:
        if sent >= limit:
            break
        if h.id == core.id or h in bad or prox.is_dead(h):
            continue
        if h in t:
            # A connection already (its own shortcut to us, say): taking it as ours too would
            # leave us one distinct link short (measured: more hops); route a request instead.
            continue
        if t.fits_near(h.id, bad):
            continue
        offers = core.shortcut_offers
        if offers is None:
            offers = core.shortcut_offers = {}
        if h in offers:
            continue
        token = core.next_token()
        offers[h] = (token, deadline, tuple(a for a in alts if a != h))
        core.stats["shortcut_offers"] += 1
        core.runtime.send(h, Link(SHORTCUT, token))
        sent += 1
    return sent


def take(core: SmallWorldHost, src: NodeHandle, token: int) -> tuple[NodeHandle, ...] | None:
    """If a LinkAck from ``src`` answers one of our shortcut offers, forget the offer and return
    the nodes next to ``src`` it came with (maybe none); else None."""
    offers = core.shortcut_offers
    if offers is None:
        return None
    got = offers.get(src)
    if got is None or got[0] != token:
        return None
    del offers[src]
    if not offers:
        core.shortcut_offers = None
    return got[2]


def remember_alternates(
    core: SmallWorldHost, shortcut: NodeHandle, nodes: Iterable[NodeHandle]
) -> None:
    """Keep the neighbours a shortcut's reply named (closest to its target first), to replace it
    by one of them should it fail."""
    alts = tuple(h for h in nodes if h.id != core.id and h != shortcut)[:2]
    if not alts:
        return
    if core.shortcut_alts is None:
        core.shortcut_alts = {}
    core.shortcut_alts[shortcut] = alts


def replace_from_alternates(core: SmallWorldHost, dead: NodeHandle) -> None:
    """Own shortcut ``dead`` failed: offer a Link to the first usable neighbour its reply named
    (the node now closest to its target, unless it failed too). Also forgets the alternates of
    shortcuts we no longer hold."""
    alts = core.shortcut_alts
    if alts is None:
        return
    mine = alts.pop(dead, None)
    out = core.table.out
    for h in [h for h in alts if h not in out]:
        del alts[h]
    if not alts:
        core.shortcut_alts = None
    if mine:
        offer(core, mine, 1, mine)
