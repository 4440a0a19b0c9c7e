"""Re-integration of a node that was declared dead while it was alive (a false verdict).

Theory of operation. A DEAD verdict is remembered for ``ProximityConfig.dead_memory_s``
(300 s) so that stale gossip does not re-insert a crashed node: a node that declared X dead
re-admits X only when X itself speaks to it (any message is proof of life, and then X is
inserted again). A node that was cut off for a few seconds — a partition shorter than its own
lease, so it noticed nothing — is declared dead by the members that tried to reach it
meanwhile, and it does not know. With heartbeats to the left neighbour only (MSPastry, Castro
et al. 2004 §3) it speaks to one member a period; the others, and with them the nodes on its
right, would hear from it only when its traffic happened to reach them (up to
``dead_memory_s``). This module closes that gap in both directions (ours; MSPastry §3.2 does not
discuss false verdicts beyond "a report is a hint"):

* **Tell the accused.** The node that spreads a verdict also sends the :class:`LeafFailed` to
  the dead node itself (one datagram more per detection). A member that finds the accused alive
  — its own probe after a report answered, it heard from the node after the verdict (a stale
  report), a node it had declared dead speaks to it again, or its own probe ran out although
  the node spoke after the report (``Maintenance.on_dead``) — tells the accused too, at most
  once per ``reintegration_interval_s`` per node.
* **The accused announces itself both ways.** A node that learns it was declared dead (a
  failure report naming itself, directly or in a heartbeat's failed set) probes every member of
  its leaf set, on both sides, and the nodes it declared dead itself that belong there, at most
  once per ``reintegration_interval_s`` (in between it answers a reporter that did not have the
  announcement, or whose verdict is newer, with its leaf set): every member that had declared
  it dead hears from it directly — a ping is proof of life — and re-admits it at once, and the
  probe's retransmissions carry the announcement through loss. Before, one neighbour heard from
  it a heartbeat period, and news of it went round the leaf set one position a period.

Under churn the verdicts are true (crashed nodes do not answer), so all this costs one datagram
per detection; a false verdict costs about 2L datagrams (L pings and pongs) once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from overlay.handle import NodeHandle

from .host import PastryHost
from .messages import Heartbeat, LeafFailed


class Reintegration:
    """Announcing a falsely accused node to its leaf set, for one core (see module doc)."""

    def __init__(self, core: PastryHost) -> None:
        self.core = core
        self.cfg = core.config
        self._last_announce = -math.inf
        #: the members our last announcement went to (they need no second reply)
        self._announced_to: frozenset[NodeHandle] = frozenset()
        #: accused nodes we told they were declared dead, and when (rate limit, bounded)
        self._told: dict[NodeHandle, float] = {}

    def accused(self, src: NodeHandle, found_at: float, gone: Iterable[NodeHandle]) -> None:
        """``src`` reported us found dead at ``found_at`` (our clock): announce us to the whole
        leaf set (rate-limited), or at least answer ``src``. ``gone``: the nodes our own probes
        declared dead lately."""
        core = self.core
        now = core.runtime.now()
        leaf = core.leaf
        members = leaf.nodes()
        msg = Heartbeat(members, ())
        if now - self._last_announce < self.cfg.reintegration_interval_s:
            # answer unless it had our announcement and its verdict is older than that
            if src not in self._announced_to or found_at > self._last_announce:
                core.stats["leaf_pushes"] += 1
                core.runtime.send(src, msg)
            return
        # Only a member's report (or that of a node that belongs in our leaf set) is worth
        # L datagrams: anything else — a far node, a forged report — gets a single reply.
        if not core.ready or (src not in leaf.members and not leaf.fits(src.id)):
            core.stats["leaf_pushes"] += 1
            core.runtime.send(src, msg)
            return
        self._last_announce = now
        self._announced_to = frozenset(members) | {src}
        core.stats["reintegration_announces"] += 1
        # A probe to every member: the ping is a message from us (proof of life, which
        # undoes a DEAD verdict where gossip cannot), and its retransmissions carry it through
        # loss — a member that never hears us would hold the verdict for minutes. Nodes we
        # declared dead that belong in our leaf set are probed too: if we were cut off, so were
        # they from us, and only their answer undoes our verdict on them.
        for m in members:
            core.prox.probe(m)
        core.stats["reintegration_probes"] += len(members)
        if src not in leaf.members:
            core.stats["leaf_pushes"] += 1
            core.runtime.send(src, msg)
        for g in gone:
            if g not in leaf.members and leaf.fits(g.id):
                core.stats["reintegration_probes"] += 1
                core.prox.probe(g)

    def tell(self, h: NodeHandle, found_at: float) -> None:
        """``h`` was declared dead at ``found_at`` (our clock) yet is alive: tell it, so that
        it announces itself to the members that still hold the verdict."""
        core = self.core
        now = core.runtime.now()
        told = self._told
        last = told.get(h)
        interval = self.cfg.reintegration_interval_s
        if last is not None and now - last < interval:
            return
        if len(told) >= 4 * self.cfg.leaf_set_size:
            for k in [k for k, t in told.items() if now - t >= interval]:
                del told[k]
            if len(told) >= 4 * self.cfg.leaf_set_size:
                return  # bounded against floods of reports
        told[h] = now
        core.stats["reintegration_tells"] += 1
        core.runtime.send(h, LeafFailed(h, max(0.0, now - found_at)))
