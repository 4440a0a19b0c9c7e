"""Custody of routed messages by the previous hop, until the next hop has handed them on.

Theory of operation (per-hop acks as in MSPastry, Castro et al. 2003 §3.2; the custody transfer
of Fall's delay-tolerant network architecture, SIGCOMM 2003, reduced to one hop). A per-hop ack
moves the only copy of a one-way message from hop A to hop B: if B crashes before its own next
hop acks (or before it delivers), the message dies with it — ``holder_crashed``, the largest
cause of lost one-way lookups in ``flockring bench churn``. So A keeps a *custody copy* after
B's ack (:meth:`CustodyEngine._take_custody`), and B tells A once the message is safe: a small
:class:`~overlay.kbr.HandedOff` notice when its own next hop acked it, or when it delivered it
(:meth:`CustodyEngine._handed_on`). The notice releases the copy.

* **When A looks.** B legitimately keeps a message for a while: a silent next hop that is the
  only way on is retransmitted to until its probe's verdict (three pings for Pastry), a
  suspected closer node is waited for, a returned message is offered again with doubling
  waits. A does not know B's round-trip times to its next hops, so it uses its own RTO to B
  as their scale: with no notice ``custody_check_rtos`` RTOs after the ack (at least the
  initial RTO, about the largest RTT of the transit-stub model), A probes B, and again at
  doubling intervals. A probe of a live B costs one ping and pong, and only for the few
  copies whose notice is late or lost; each check that waited longer would leave B's crash
  undetected longer, and A may crash meanwhile too.
* **B dead** (a DEAD verdict, from this probe or from anything else): the copy is routed again
  from A avoiding B, as the reroute of a hop that timed out is (:meth:`custody_dead`).
  Delivery stays at most once per node (``KbrCore._seen``): a node that already handled the
  message drops the copy as a duplicate, since it comes from farther back with fewer hops. It
  counts against the message's reroutes (``max_reroutes``) and keeps its hop count, so the
  usual bounds hold.
* **B alive**: A keeps the copy until ``custody_max_s`` after the ack; then it is dropped
  (``custody_expired``) — B still has the message or dropped it itself (hop limit, reroutes
  spent), and routing a second copy round a live B would only make a duplicate. A probes again
  at doubling intervals only while B stays silent: once B is heard after a probe began (its
  pong, or any message), the notice was most likely lost, and A waits for a DEAD verdict that
  comes some other way (``custody_quiet``). At 5 % loss lost notices drew about half of all
  custody probes, each copy probed ~3 times before it expired.
* **Bounded memory**: at most ``custody_max`` copies per node (the oldest goes first, counted
  in ``custody_overflow``) and none older than ``custody_max_s``. The table is allocated on
  first use: a node that forwards nothing holds none (10^6 simulated nodes).

A notice is lookup traffic (one per hop, like the ack), not maintenance.

Only one-way messages need custody. An application whose sender retries end to end (a lookup
answered to its asker, a join) says so (``BaseApplication.end_to_end``), and its messages get
neither copies nor notices: the retry recovers a message lost with a hop, and custody would
only add a notice per hop (live lookups: ~7 datagrams instead of ~5).
"""

from __future__ import annotations

from typing import Any

import attrs

from overlay.handle import NodeHandle
from overlay.kbr_pending import DELIVERED, Hop, HopEngine
from overlay.proximity import Liveness

__all__ = ["CustodyEngine"]


class CustodyEngine(HopEngine):
    """Mixin of :class:`overlay.kbr.KbrCore`: the custody copies a node keeps of what it passed
    on, and the notices that release them. A custody copy is a :class:`Hop` that was acked:
    ``sent_at`` is when custody began and ``attempt`` counts the checks made."""

    #: custody copies by msg_id; a class-level None until a node first keeps one (no
    #: attribute at all on a node that never forwarded: 10^6 simulated nodes)
    _custody: dict[int, Hop] | None = None
    #: names of the registered applications that retry end to end (``end_to_end``): their
    #: messages get no custody (a class-level empty set until one registers)
    _end_to_end: frozenset[str] = frozenset()

    def _notice(self, mid: int) -> Any:
        """The :class:`~overlay.kbr.HandedOff` notice for ``mid`` (KbrCore builds it)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the holder (B)
    def _handed_on(self, prev: NodeHandle | None, msg: Any) -> None:
        """This node's next hop acked RouteMsg ``msg``, or it delivered it: tell ``prev``, the
        node it had it from (which keeps a custody copy until it hears so)."""
        if prev is None or prev == self.handle or not self.kbr_config.custody:
            return
        if msg.app in self._end_to_end:
            return  # its sender retries end to end: no copy was kept
        self.stats["custody_notices_sent"] += 1
        self.runtime.send(prev, self._notice(msg.msg_id))

    def _handed_on_before(self, src: NodeHandle, msg: Any) -> None:
        """A duplicate of ``msg`` came from ``src`` (acked again): if this node is done with it
        — delivered it, or a next hop took it and none is pending — tell ``src`` again. Its
        retransmission's ack starts a custody copy that the first notice, sent before, cannot
        release; without this it would be probed until it expired, and a false DEAD verdict
        of this node on the way would route a second copy of a delivered message."""
        mark = self._mark(msg)
        if mark is None:
            return
        if mark[0] != DELIVERED and (len(mark) < 2 or msg.msg_id in self._pending):
            return
        held = self._unready_held
        if held and (msg.origin.id, msg.msg_id) in held:
            return
        self._handed_on(src, msg)

    # ------------------------------------------------------------------ the previous hop (A)
    def _take_custody(self, mid: int, hop: Hop) -> None:
        """``hop.nh`` acked ``hop.msg``: keep a copy until it tells us it handed it on."""
        cfg = self.kbr_config
        if not cfg.custody or cfg.custody_max <= 0 or hop.notified:
            return
        if hop.msg.app in self._end_to_end:
            return  # its sender retries end to end (``BaseApplication.end_to_end``)
        held = self._custody
        if held is None:
            held = self._custody = {}
        old = held.pop(mid, None)
        if old is not None:
            # the same message passed on again (it came back round a loop): the latest copy
            # is the one in flight
            self._cancel(old)
        elif len(held) >= cfg.custody_max:
            first = next(iter(held))
            self._cancel(held.pop(first))
            self.stats["custody_overflow"] += 1
        hop.sent_at = self.runtime.now()
        hop.attempt = 0
        hop.held = None
        held[mid] = hop
        self.stats["custody_held"] += 1
        self._arm_check(mid, hop, self._first_check_s(hop.nh))

    def _first_check_s(self, nh: NodeHandle) -> float:
        prox = self.prox
        rtos: float = self.kbr_config.custody_check_rtos
        return max(prox.config.initial_rto_s, rtos * prox.rto(nh))

    def _arm_check(self, mid: int, hop: Hop, delay: float) -> None:
        hop.timer = self.runtime.call_later(delay, lambda: self._custody_check(mid, hop))

    @staticmethod
    def _cancel(hop: Hop) -> None:
        if hop.timer is not None:
            hop.timer.cancel()
            hop.timer = None

    def _custody_check(self, mid: int, hop: Hop) -> None:
        """No notice yet: reroute if ``hop.nh`` is dead, drop the copy past the time limit,
        else probe it (a DEAD verdict reroutes the copy, :meth:`custody_dead`) and look again
        after twice as long — unless it was heard since the last probe began: then only
        the time limit is armed."""
        held = self._custody
        if held is None or held.get(mid) is not hop or self.stopped:
            return
        hop.timer = None
        prox = self.prox
        if prox.state(hop.nh) is Liveness.DEAD:
            self._custody_reroute(mid, hop)
            return
        cfg = self.kbr_config
        now = self.runtime.now()
        left = hop.sent_at + cfg.custody_max_s - now
        if left <= 1e-9:
            del held[mid]
            self.stats["custody_expired"] += 1
            return
        if hop.attempt and prox.heard_since(hop.nh, hop.checked_at):
            # It answered our probe (or spoke to us) after its notice was due: alive, so the
            # notice was most likely lost. Probing it again and again until the copy
            # expired cost ~3 pings and pongs per lost notice (at 5 % loss half of all
            # custody probes). The copy stays until then, so a DEAD verdict reached any
            # other way still routes it again.
            self.stats["custody_quiet"] += 1
            self._arm_check(mid, hop, left)
            return
        self.stats["custody_probes"] += 1
        hop.attempt += 1
        hop.checked_at = now
        self._arm_check(mid, hop, min(left, self._first_check_s(hop.nh) * 2**hop.attempt))
        prox.probe(hop.nh)

    def on_handed_off(self, src: NodeHandle, mid: int) -> None:
        """``src`` says it handed message ``mid`` on (or delivered it): release our copy.

        A notice for a hop still *pending* on ``src`` (its ack was lost or is late) does not end
        that hop: the timeout, retransmission and reroute rules stay exactly as they were (a
        reroute's copy is then met as a duplicate). It only spares the custody copy when a
        retransmission's ack comes later, as no second notice will."""
        hop = self._pending.get(mid)
        if hop is not None and hop.nh == src:
            hop.notified = True
            self.stats["custody_early_notices"] += 1
            return
        held = self._custody
        hop = held.get(mid) if held else None
        if hop is None or hop.nh != src:
            return
        assert held is not None
        del held[mid]
        self._cancel(hop)
        self.stats["custody_released"] += 1

    def custody_dead(self, h: NodeHandle) -> None:
        """``h`` was declared DEAD: route again each copy it had not handed on."""
        held = self._custody
        if not held:
            return
        for mid, hop in [(m, x) for m, x in held.items() if x.nh == h]:
            self._custody_reroute(mid, hop)

    def _custody_reroute(self, mid: int, hop: Hop) -> None:
        held = self._custody
        if held is not None and held.get(mid) is hop:
            del held[mid]
        self._cancel(hop)
        msg = hop.msg
        mark = self._mark(msg)
        if (mark is not None and mark[0] == DELIVERED) or mid in self._pending:
            # delivered here meanwhile, or another copy of ours is on its way already
            self.stats["custody_superseded"] += 1
            return
        if hop.reroutes >= self.kbr_config.max_reroutes:
            self.stats["route_dropped"] += 1
            return
        self.stats["custody_rerouted"] += 1
        exclude = set(hop.exclude) if hop.exclude else set()
        exclude.add(hop.nh)
        back = attrs.evolve(msg, hops=msg.hops - 1)
        self._step(back, exclude, None, hop.reroutes + 1, hop.prev)

    def _stop_custody(self) -> None:
        held = self._custody
        if held:
            for hop in held.values():
                self._cancel(hop)
        self._custody = None
