"""The shared routing engine's state per message: hops waiting for an ack, copies, joiners.

Theory of operation (MSPastry, Castro et al. 2003 §3.1-3.2; a mixin of
:class:`overlay.kbr.KbrCore`, which holds the messages and the routing step). Every routed
message a node forwards stays *pending* until the next hop acks it, and each node remembers,
per (origin, msg_id), the hop count at which it handled a message and the next hops it chose
(``_visit``/``_record``: duplicates, loops, at-most-once delivery). Each rule below marked
"traced" closes a course of events found with ``flockring bench churn --trace-lookups``:

* **Timeout.** The first transmission to a measured hop times out after
  ``hop_timeout_srtt_factor`` smoothed RTTs (an unmeasured one after the initial RTO). Then the
  hop is suspected (a liveness probe starts) and the message goes at once by the overlay's
  next-best choice; only a silent hop that is the only way on (the closest node known:
  delivering here instead would be wrong if it is merely lossy) is retransmitted with RTO
  back-off, until it acks or its probe declares it DEAD. Reroutes are bounded
  (``max_reroutes``); a message that exhausts them is dropped and counted.
* **Liveness verdicts act at once** (traced in ``flockring bench churn --trace-lookups``):
  a hop whose probe declares it DEAD does not keep its message until its back-off next fires
  (up to 8 RTOs later; a holder that crashes meanwhile loses it) — the message goes on now
  (:meth:`HopEngine.reroute_waiting_on`). And a hop avoided only because its ack was lost, whose
  probe then answers, takes back every message still waiting on a next hop farther from the
  key (:meth:`HopEngine.retry_through`): without it the holder retransmitted to a farther,
  crashed node, and once that one was declared dead delivered in place of the live root it
  still held excluded. A message waiting on a *closer* hop stops avoiding it instead, so that
  if that hop fails too the reroute can take it.
* **A suspected closer node is waited for, not replaced**: a node that would deliver because
  its closer candidate is only *suspected* (its probe is in flight) sends the message there and
  retransmits until it acks or is declared DEAD (:meth:`HopEngine._suspected_closer`), as for a
  silent hop that is the only way on. Traced: a node whose probe of the (lossy but live) root
  was in flight delivered in its place ("root_suspected").
* **Copies that return with more hops** (:meth:`HopEngine._returning_copy`). One that returns
  while its hop here is unacked may wait for that hop's outcome (``held``;
  ``KbrConfig.hold_returning_copies``): the ack hands it on, the timeout drops it (the reroute
  carries the message). Then a copy that does not come back from one of the next hops this node
  chose, all of them closer to the key than this node, is a *parallel copy* — the previous hop
  rerouted after a lost ack — and is routed as usual (traced: the loop rule sent it round those
  hops, often the root, and delivered it here in the root's place); any other copy came round a
  loop and leaves by a next hop not tried yet, ``max_hops`` bounding the walk.

* **A joining node may hold what it would deliver** for ``hold_unready_s`` (off by default;
  traced: a joiner sent a lookup back to the previous hop and became active 0.2 s later, and
  the previous hop delivered it in its place); when the join ends it handles it as a ready
  node, else it sends it back as before (:meth:`HopEngine._hold_unready`). A join that fails
  while it holds one loses it, which is why it is off.
* **A lookup sent back by a closer node is offered to it again** (traced: the root, still
  joining, sent it back and became active 0.05-1.8 s later, and the previous hop delivered it
  in its place, "root_excluded"). The node that would deliver because a next hop closer to the
  key returned the message sends it there again after ``retry_bounced_s``, doubling the wait,
  up to ``retry_bounced_times`` (:meth:`HopEngine._retry_bounced`). Unlike a hold at the joiner
  it keeps the message at a node that is already active, so a join that fails loses nothing:
  the last return is delivered here as before. And a reroute that would deliver here while
  it excludes a live node closer to the key sends the message to that node once more, from the
  same retries (traced: the joining root sent it back while this node still had another way
  on, the crashed old root; that one's verdict came once the root was active, and this node
  delivered in its place, "root_excluded"; :meth:`HopEngine._closer_excluded`).

What happens after the ack — the custody copy the previous hop keeps until the next hop hands
the message on — is in ``overlay/kbr_custody.py``; this module only calls its two hooks.

This module holds no message classes (they live in ``overlay.kbr``): the mixin copies a routed
message with one hop less by ``attrs.evolve``.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from typing import Any

import attrs

from overlay.handle import NodeHandle
from overlay.ids import NodeId, closer
from overlay.proximity import Liveness, Proximity
from overlay.runtime import Runtime, Timer

log = logging.getLogger("overlay.kbr")

__all__ = ["DELIVERED", "Hop", "HopEngine", "closer"]

#: messages a joining node holds at most (beyond, they are sent back at once)
_MAX_HELD_UNREADY = 64

#: what a node remembers of a routed message (``KbrCore._seen``): the hop count at which it
#: last handled it, then the next hops it forwarded it to (oldest first); ``(DELIVERED,)``
#: once delivered here.
DELIVERED = -1
#: the entries without next hops, made once and shared (tuples are immutable): an entry per
#: routed message a node handled, so a fresh 1-tuple each would cost every node ~50 bytes a
#: message for as long as it stays in the window
_ONLY_HOPS = tuple((h,) for h in range(DELIVERED, 64))
#: next hops remembered per message (a loop that outlasts this many exits reuses the last ones)
_MAX_TRIED = 8


class Hop:
    """A routed message sent to ``nh`` and not acknowledged yet."""

    __slots__ = (
        "attempt",
        "checked_at",
        "exclude",
        "held",
        "msg",
        "nh",
        "notified",
        "prev",
        "reroutes",
        "resent",
        "sent_at",
        "timer",
    )

    def __init__(
        self,
        msg: Any,
        nh: NodeHandle,
        exclude: set[NodeHandle] | None,
        prev: NodeHandle | None = None,
    ) -> None:
        self.msg = msg
        self.nh = nh
        self.exclude = exclude
        #: the node this one got the message from (None: it started here). A reroute keeps it,
        #: so a node still joining sends the message back there rather than delivering it
        self.prev = prev
        self.attempt = 0
        self.reroutes = 0
        self.sent_at = 0.0
        #: when the last custody probe of ``nh`` began (``overlay/kbr_custody.py``)
        self.checked_at = 0.0
        #: this node sent the message to ``nh`` before (a reroute or a retry came back to it):
        #: an ack may answer that earlier transmission, so it is no RTT sample (Karn's rule
        #: across transmissions; acks name only the message)
        self.resent = False
        self.timer: Timer | None = None
        #: a copy that came back with more hops before this hop was acked: (from, message)
        self.held: tuple[NodeHandle, Any] | None = None
        #: ``nh`` already said it handed the message on (its notice overtook its ack): no
        #: custody copy to keep once the ack comes (``overlay/kbr_custody.py``)
        self.notified = False


class HopEngine:
    """Mixin of :class:`overlay.kbr.KbrCore`: the pending hops and what ends them."""

    # provided by KbrCore
    runtime: Runtime
    handle: NodeHandle
    prox: Proximity
    stats: Counter[str]
    stopped: bool
    kbr_config: Any
    _pending: dict[int, Hop]
    _unready_held: dict[tuple[int, int], tuple[Any, ...]] | None
    _bounce_retried: OrderedDict[tuple[int, int], int] | None
    ready: bool
    _seen: OrderedDict[tuple[int, int], tuple[Any, ...]] | None
    id: NodeId

    def next_hop(self, key: NodeId, exclude: set[NodeHandle] | None = None) -> NodeHandle | None:
        """The overlay's next hop towards ``key`` (KbrCore's abstract method)."""
        raise NotImplementedError

    def _step(
        self,
        msg: Any,
        exclude: set[NodeHandle] | None,
        hint: NodeHandle | None = None,
        reroutes: int = 0,
        prev: NodeHandle | None = None,
    ) -> None:
        raise NotImplementedError  # KbrCore's

    # ------------------------------------------------------------------ sending
    def _send_hop(self, hop: Hop) -> None:
        rt = self.runtime
        hop.sent_at = rt.now()
        prox = self.prox
        timeout = min(prox.config.max_rto_s, prox.rto(hop.nh) * (2**hop.attempt))
        if hop.attempt == 0:
            timeout = prox.srtt_capped(hop.nh, timeout, self.kbr_config.hop_timeout_srtt_factor)
        mid = hop.msg.msg_id
        hop.timer = rt.call_later(timeout, lambda: self._hop_timeout(mid, hop))
        rt.send(hop.nh, hop.msg)

    def _hop_timeout(self, mid: int, hop: Hop) -> None:
        """No ack from the next hop within its RTO (MSPastry §3.2): suspect it, and go by the
        next-best hop now — or, when it is the only way on, retransmit with back-off until it
        acks or its probe declares it DEAD (``hop_retries`` at most)."""
        if self._pending.get(mid) is not hop or self.stopped:
            return
        cfg = self.kbr_config
        prox = self.prox
        prox.suspect(hop.nh)
        exclude = set(hop.exclude) if hop.exclude else set()
        exclude.add(hop.nh)
        if (
            hop.attempt < cfg.hop_retries
            and prox.state(hop.nh) is not Liveness.DEAD
            and (hop.reroutes >= cfg.max_reroutes or self.next_hop(hop.msg.key, exclude) is None)
        ):
            hop.attempt += 1
            self.stats["hop_retransmits"] += 1
            self._send_hop(hop)
            return
        self._unpend(mid, hop)
        if hop.held is not None:
            self.stats["route_copies_dropped"] += 1  # the reroute below carries the message
        if hop.reroutes >= cfg.max_reroutes:
            self.stats["route_dropped"] += 1
            log.debug("route %x dropped after %d reroutes", mid, hop.reroutes)
            return
        self.stats["reroutes"] += 1
        back = attrs.evolve(hop.msg, hops=hop.msg.hops - 1)
        again = self._closer_excluded(back, exclude)
        if again is not None:
            # We would deliver here, yet we avoid a live node closer to the key: most often a
            # root that sent the message back while it was joining, when we still had another
            # way on that has failed since (traced: "root_excluded", the root active by then).
            # It gets the message once more; a root still joining sends it back again, and the
            # loop rule's retries take over (:meth:`_retry_bounced`).
            exclude.discard(again)
            self.stats["reroutes_to_excluded"] += 1
            self._step(back, exclude, again, hop.reroutes + 1, hop.prev)
            return
        self._step(back, exclude, None, hop.reroutes + 1, hop.prev)

    def _closer_excluded(self, msg: Any, exclude: set[NodeHandle]) -> NodeHandle | None:
        """The live node of ``exclude`` closest to ``msg``'s key, if routing would deliver
        ``msg`` here without it and it is closer to the key than we are (None otherwise, or
        once this message's ``retry_bounced_times`` retries are spent)."""
        if self.kbr_config.retry_bounced_s <= 0:
            return None
        key = msg.key
        bad = self.prox.bad
        best: NodeHandle | None = None
        for h in exclude:
            if h in bad or not closer(key, h.id, self.id):
                continue
            if best is None or closer(key, h.id, best.id):
                best = h
        # the routing lookup only when there is a node to retry (the caller's reroute makes
        # the same lookup again otherwise)
        if best is None or self.next_hop(key, exclude) is not None:
            return None
        if self._take_retry(msg) is None:
            return None
        return best

    def _take_retry(self, msg: Any) -> int | None:
        """Spend one of ``msg``'s ``retry_bounced_times`` retries of a node that sent it back:
        how many it had spent before, or None if none is left."""
        k = (msg.origin.id, msg.msg_id)
        done = self._bounce_retried
        if done is None:
            done = self._bounce_retried = OrderedDict()
        n = done.get(k, 0)
        if n >= self.kbr_config.retry_bounced_times:
            return None
        done[k] = n + 1
        done.move_to_end(k)
        if len(done) > self.kbr_config.dedupe_window:
            done.popitem(last=False)
        return n

    def _unpend(self, mid: int, hop: Hop) -> None:
        del self._pending[mid]
        if hop.timer is not None:
            hop.timer.cancel()

    def _on_hop_acked(self, src: NodeHandle, mid: int) -> None:
        """``src`` acknowledged message ``mid``: it is no longer ours to carry (but, with
        custody, ours to keep a copy of until ``src`` hands it on)."""
        hop = self._pending.get(mid)
        if hop is None or hop.nh != src:
            return
        self._unpend(mid, hop)
        if hop.attempt == 0 and not hop.resent:  # Karn's rule: only unambiguous samples
            # Traced (bench churn, 5 % loss): every RTT sample below the true RTT came from
            # an ack to an earlier transmission of the same message to the same hop, after
            # a reroute had come back to it; RTOs a quarter of the RTT then gave false DEAD
            # verdicts that no later exchange could correct.
            self.prox.sample(src, self.runtime.now() - hop.sent_at)
        held = hop.held
        self._handed_on(hop.prev, hop.msg)
        self._take_custody(mid, hop)
        if held is not None:  # the next hop took it on: the copy that came back looped
            self._route_loop(held[1], held[0])

    # custody hooks (``overlay/kbr_custody.py`` overrides them)
    def _handed_on(self, prev: NodeHandle | None, msg: Any) -> None:
        """RouteMsg ``msg`` left this node safely (acked onwards, or delivered here)."""
        return None

    def _take_custody(self, mid: int, hop: Hop) -> None:
        """``hop`` was acked: keep a copy of its message (or not)."""
        return None

    # ------------------------------------------------------------------ what a node remembers
    def _visit(self, msg: Any) -> tuple[NodeHandle, ...] | None:
        """Record that ``msg`` is being handled here at its hop count.

        Returns None for a duplicate (already delivered here, or handled at as many hops or
        more: a retransmission), else the next hops already tried for it (empty on a first
        visit; not empty when it came back round a loop).
        """
        k = (msg.origin.id, msg.msg_id)
        seen = self._seen
        if seen is None:
            seen = self._seen = OrderedDict()
        prev = seen.get(k)
        if prev is None:
            hops = msg.hops
            seen[k] = _ONLY_HOPS[hops + 1] if DELIVERED <= hops < 64 else (hops,)
            if len(seen) > self.kbr_config.dedupe_window:
                seen.popitem(last=False)
            return ()
        if prev[0] == DELIVERED or msg.hops <= prev[0]:
            return None
        seen[k] = (msg.hops, *prev[1:])
        seen.move_to_end(k)
        return prev[1:]

    def _mark(self, msg: Any) -> tuple[Any, ...] | None:
        """What this node remembers of ``msg`` (``_seen``), None if nothing."""
        seen = self._seen
        return seen.get((msg.origin.id, msg.msg_id)) if seen is not None else None

    def _tried(self, msg: Any, nh: NodeHandle) -> bool:
        """True if this node already sent ``msg`` to ``nh`` (as far as its record goes)."""
        prev = self._mark(msg)
        return prev is not None and nh in prev[1:]

    def _record(self, msg: Any, nh: NodeHandle | None) -> None:
        """Remember the next hop ``msg`` left by (None: it was delivered here)."""
        seen = self._seen
        if seen is None:
            return
        k = (msg.origin.id, msg.msg_id)
        prev = seen.get(k)
        if prev is None:
            return  # aged out of the window meanwhile: nothing to add to
        if nh is None:
            seen[k] = _ONLY_HOPS[0]  # (DELIVERED,)
        elif nh not in prev[1:]:
            tried = prev[1:] if len(prev) <= _MAX_TRIED else prev[2:]
            seen[k] = (prev[0], *tried, nh)

    # ------------------------------------------------------------------ returning copies
    def _returning_copy(self, src: NodeHandle, msg: Any) -> None:
        """``msg`` came back with more hops than this node handled it at (``KbrCore._on_route``):
        hold it for the pending hop, or route it as a parallel copy or a loop."""
        hop = self._pending.get(msg.msg_id) if self.kbr_config.hold_returning_copies else None
        if hop is not None and hop.msg.origin.id == msg.origin.id:
            # A copy came back while our own next hop has not acknowledged yet. Under loss that
            # is mostly the previous hop's reroute (our ack to it was lost), not a loop: routing
            # it on *avoiding* the unacknowledged hop delivered it here in place of a closest
            # node that was merely lossy (the ``root_excluded`` incorrect deliveries of
            # ``bench churn`` at 1-5 % loss). So it waits: the hop's ack shows the next hop
            # took the message on, and the copy is then routed (below); a timeout hands the
            # message to the retransmission or reroute, and the copy is dropped.
            self.stats["route_copies_held"] += 1
            hop.held = (src, msg)
            return
        self._route_loop(msg, src)

    def _route_loop(self, msg: Any, src: NodeHandle) -> None:
        """``msg`` came back with more hops and no hop of ours is pending for it."""
        prev = self._mark(msg)
        if prev is None or prev[0] == DELIVERED:
            return
        tried = prev[1:]
        if self.kbr_config.parallel_copies and tried and src not in tried:
            key = msg.key
            if all(closer(key, h.id, self.id) for h in tried):
                # Every next hop we chose was closer to the key than us and the copy does not
                # come back from one of them: the other copy of a hop whose ack was lost (the
                # hop before rerouted), not a loop. Avoiding our next hops would deliver it
                # here in place of the root they lead to; sent on as usual it meets the first
                # copy (a duplicate there). Had it really come round a loop, the node that
                # sent it away from the key has a farther next hop and its loop rule fires.
                self.stats["parallel_copies"] += 1
                self._step(msg, None, prev=src)
                return
        if self._retry_bounced(msg, src, tried):
            return
        # Back round a loop: leave by a next hop not tried yet. When every closer node this node
        # knows has been tried and led back here, this node is the closest one reachable and
        # delivers (as when every closer node is suspected); max_hops bounds the whole walk.
        self.stats["route_loops"] += 1
        self._step(msg, set(tried), prev=src)

    def _retry_bounced(self, msg: Any, src: NodeHandle, tried: tuple[NodeHandle, ...]) -> bool:
        """``src``, a next hop closer to the key than us, sent ``msg`` back and we would deliver
        it in its place: send it to ``src`` again later instead (True), at most
        ``retry_bounced_times`` per message with doubling waits. A joining root sends back what
        it is not yet responsible for; once active it delivers the next copy (its own loop rule
        excludes us). A real loop only costs the retries before we deliver as before."""
        wait = self.kbr_config.retry_bounced_s
        if wait <= 0 or src not in tried or src in self.prox.bad:
            return False
        key = msg.key
        if not closer(key, src.id, self.id) or self.next_hop(key, set(tried)) is not None:
            return False
        n = self._take_retry(msg)
        if n is None:
            return False
        self.stats["bounced_retried"] += 1
        self.runtime.call_later(wait * 2**n, lambda: self._retry_send(msg, src))
        return True

    def _retry_send(self, msg: Any, to: NodeHandle) -> None:
        # ``to`` as the previous hop too: were we to be sent the message back once more and
        # still be joining ourselves, it goes back there, not to the original sender
        if not self.stopped:
            self._step(msg, None, hint=to, prev=to)

    def _suspected_closer(self, key: NodeId, exclude: set[NodeHandle] | None) -> NodeHandle | None:
        """The next hop towards ``key`` that routing skips only because it is *suspected* (a
        probe still in flight), or None. A node about to deliver sends the message there
        instead (``KbrConfig.wait_for_suspected``): a suspected node is often one whose
        datagrams were lost, and delivering in its place is wrong if it is alive; if it is
        dead, its probe's verdict releases the message at once (:meth:`reroute_waiting_on`)."""
        prox = self.prox
        bad = prox.bad
        if not bad:
            return None
        dead = {h for h in bad if prox.state(h) is Liveness.DEAD}
        if len(dead) == len(bad):
            return None
        prox.bad = dead  # routing's view with only the DEAD verdicts standing
        try:
            return self.next_hop(key, exclude)
        finally:
            prox.bad = bad

    # ------------------------------------------------------------------ joining
    def _hold_unready(
        self, msg: Any, exclude: set[NodeHandle] | None, reroutes: int, prev: NodeHandle
    ) -> bool:
        """Hold ``msg``, which this joining node would deliver, until it is ready or
        ``hold_unready_s`` has passed; False when it is not held (off, or too many held)."""
        wait = self.kbr_config.hold_unready_s
        if wait <= 0:
            return False
        held = self._unready_held
        if held is None:
            held = self._unready_held = {}
        k = (msg.origin.id, msg.msg_id)
        if k in held:
            self.stats["held_unready_copies"] += 1  # the first copy waits here already
            return True
        if len(held) >= _MAX_HELD_UNREADY:
            return False
        held[k] = (msg, exclude, reroutes, prev)
        self.stats["held_unready"] += 1
        self.runtime.call_later(wait, lambda: self._unready_timeout(k))
        return True

    def _unready_timeout(self, k: tuple[int, int]) -> None:
        held = self._unready_held
        item = held.pop(k, None) if held else None
        if item is None or self.stopped:
            return
        msg, exclude, reroutes, prev = item
        if self.ready:  # (the release below normally came first)
            self._step(msg, exclude, None, reroutes, prev)
            return
        self.stats["bounced_unready"] += 1  # still joining: back to the previous hop
        self._step(msg, exclude, prev, reroutes, prev)

    def _release_unready(self) -> None:
        """The join ended: handle every held message as a ready node."""
        held = self._unready_held
        if not self.ready or self.stopped or not held:
            return
        self._unready_held = None
        for msg, exclude, reroutes, prev in held.values():
            if not self.stopped:
                self._step(msg, exclude, None, reroutes, prev)

    # ------------------------------------------------------------------ liveness verdicts
    def reroute_waiting_on(self, h: NodeHandle) -> None:
        """``h`` was declared DEAD: each message waiting on it goes on now — by another next
        hop, or delivered here — instead of when its back-off next fires."""
        for mid, hop in [(m, x) for m, x in self._pending.items() if x.nh == h]:
            if hop.timer is not None:
                hop.timer.cancel()
            self.stats["reroutes_on_dead"] += 1
            self._hop_timeout(mid, hop)

    def retry_through(self, h: NodeHandle) -> None:
        """``h`` answered its probe: each message whose hop to ``h`` timed out (a lost datagram)
        and that still waits on a next hop farther from its key goes to ``h`` now; one that
        waits on a closer hop no longer avoids ``h`` should that hop fail too."""
        for mid, hop in list(self._pending.items()):
            ex = hop.exclude
            if not ex or h not in ex:
                continue
            if not closer(hop.msg.key, h.id, hop.nh.id):
                # Traced (small-world ring, 1 % loss): the message waited on a closer node that
                # had crashed; its verdict rerouted it still avoiding ``h``, which had answered
                # long before, and the holder delivered it in place of the root beyond ``h``.
                ex.discard(h)
                self.stats["unexcluded_on_alive"] += 1
                continue
            self._unpend(mid, hop)
            left = set(ex)
            left.discard(h)
            self.stats["reroutes_on_alive"] += 1
            back = attrs.evolve(hop.msg, hops=hop.msg.hops - 1)
            self._step(back, left, None, hop.reroutes + 1, hop.prev)
