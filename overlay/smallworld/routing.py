"""Routing refinements of the small-world ring on top of the shared KBR engine.

Theory of operation (MSPastry, Castro et al. 2003 §3.1–3.2, applied to greedy ring routing;
docs/smallworld.md, "Routing under churn"). The engine (``overlay/kbr.py``) acks each hop,
suspects a silent next hop and reroutes, and takes a copy that returns with more hops for one
that came round a loop. Measured under churn (``flockring bench churn --overlay smallworld``),
the last incorrect or lost lookups of the ring came from four races that these functions close:

* **A joiner's neighbours route to it one round trip before it is ready** (they add it on its
  ``Link``; it becomes ready when their ``LinkAck``\\ s are back). The engine bounces such a
  message to the previous hop, which delivers it in the joiner's place a moment before the
  joiner becomes responsible. A joining node now *holds* what reaches it while its links are
  acknowledged (:func:`hold_while_joining`) and handles it when the join ends.
* **A lost ack makes two copies.** The hop before reroutes by its next-best node; the second
  copy reaches a node the first already passed, with more hops, and the loop rule sends it on
  avoiding that node's choice — often the root — so it is delivered next to the root. Greedy
  routing only moves closer to the key, so a copy cannot come back through a next hop that was
  closer than us: such a copy is routed greedily again (:func:`parallel_copy`).
* **A root whose ack was lost is avoided for good**, and **a holder waits on a dead next hop**
  until its back-off next fires: both are closed in the engine now, for both overlays
  (``overlay/kbr_pending.py``: a liveness verdict acts on the messages in flight at once).
"""

from __future__ import annotations

from overlay.handle import NodeHandle
from overlay.ids import closer
from overlay.kbr import KbrCore, RouteMsg
from overlay.smallworld.state import JoinState

__all__ = ["hold_while_joining", "parallel_copy"]


def hold_while_joining(
    core: KbrCore, st: JoinState | None, limit: int, src: NodeHandle, msg: RouteMsg
) -> bool:
    """Keep ``msg`` (acked now, so the previous hop does not reroute round us) if this node is
    joining (``st``) and waits for its near neighbours' LinkAcks, up to ``limit`` messages;
    the end of the join releases them (``join._release``)."""
    if st is None or not st.linking or core.ready or src == core.handle:
        return False
    held = st.held
    if held is None:
        held = st.held = []
    if len(held) >= limit:
        return False
    core._ack_hop(src, msg)
    held.append((src, msg))
    core.stats["held_while_joining"] += 1
    return True


def parallel_copy(core: KbrCore, src: NodeHandle, msg: RouteMsg) -> bool:
    """If ``msg`` is a second copy, by another path, of a message this node already sent on
    greedily, route it greedily again (through the next hops chosen before) and return True.

    Every next hop chosen for it was strictly closer to the key than this node and the copy
    does not come back from one of them (as a joining node returns one): no honest greedy route
    leads back here, so it is the other copy of a hop whose ack was lost. Sent greedily again it
    meets the first copy at the node that delivered it (a duplicate there). Should it really
    have come round a loop — a node farther on sent it away from the key (an application's
    ``forward``, a corrupt entry) — it reaches that node again, whose own choice was farther
    than itself, and the engine's loop rule takes it out there."""
    seen = core._seen
    if seen is None:
        return False
    prev = seen.get((msg.origin.id, msg.msg_id))
    if prev is None or prev[0] < 0 or msg.hops <= prev[0] or len(prev) < 2:
        return False  # first visit, delivered here, or a plain retransmission: the engine's
    tried = prev[1:]
    if src in tried:
        return False
    if not all(closer(msg.key, h.id, core.id) for h in tried):
        return False
    core._ack_hop(src, msg)
    core.stats["parallel_copies"] += 1
    core._visit(msg)  # the new hop count
    if msg.hops > core.kbr_config.max_hops:
        core.stats["ttl_expired"] += 1
        return True
    core._step(msg, None, prev=src)
    return True
