"""The manager sits on both rings: faultD hands the flock role over with the manager role.

Theory of operation (Butt et al. 2006 §3.3, §4.1, §4.2). A pool's central manager is a member of
two rings: the pool ring, where faultD (:class:`discovery.failover.Failover`) keeps one manager
alive and replicates its state, and the flock ring, where the manager announces free machines,
keeps the willing list and makes the flocking decision (:class:`discovery.announce.Flock`). When
faultD moves the manager role, the flock role must move with it, or the pool vanishes from every
other pool's willing list and its schedds keep a stale ``FLOCK_TO``.

:class:`Site` wires the three plugins of one machine of a pool (Failover, Flock, and
:class:`discovery.submit.SubmitSync`) and follows faultD's change listener:

* **Becoming the manager** (bootstrap, takeover or preemption). The replicated committed state
  (:class:`SiteState`: the pool's collector and name and the last published decision, a few
  hundred bytes of msgpack) is restored into the Flock, which then announces at once under the
  pool's collector, and gets faultD's ballot term as its decision epoch (``Flock.set_epoch``):
  terms only grow, so every decision of the new manager orders after every decision of the
  old one. The last decision is re-published at once, re-stamped ``(term, 0)``, so the submit
  machines learn the new manager's epoch without losing their flock targets. The replacement's
  own willing list starts empty; its own decisions are held back for ``warmup_s`` (default one
  announcement period: every willing pool has announced to it once) and then published.
* **While managing.** Every decision the Flock publishes goes to the submit machines
  (``SubmitSync.publish``) and into faultD's replicated state (``Failover.commit``).
* **Losing the role** (the original preempted the replacement, or a higher epoch was heard).
  The Flock stops (no announcements, no decisions) and the push re-broadcasts stop.
* **Any change.** The SubmitSync re-tries a push it held back for an unknown manager and pulls
  the newest decision from the new manager.

On the flock ring the replacement speaks with its own node id (the overlay id is its key's
hash); other pools see the pool again under the same collector, which is how HTCondor names a
pool in ``FLOCK_TO``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs
import msgpack

from discovery.announce import Flock
from discovery.decision import FlockDecision
from discovery.failover import Failover, ManagerChange
from discovery.failover_config import FailoverError
from discovery.submit import SubmitSync, decode_decision, encode_decision
from overlay.errors import ConfigError
from overlay.runtime import Timer

__all__ = ["Site", "SiteState", "decode_site_state", "encode_site_state"]

_MAX_TEXT = 255


@attrs.frozen(slots=True)
class SiteState:
    """What faultD replicates for the flock role: small, so every commit is cheap."""

    collector: str
    pool_name: str
    decision: FlockDecision | None = None


def encode_site_state(s: SiteState) -> bytes:
    """msgpack bytes of ``s`` (the ``state`` given to ``Failover.commit``)."""
    d = encode_decision(s.decision) if s.decision is not None else None
    out: bytes = msgpack.packb([s.collector, s.pool_name, d])
    return out


def decode_site_state(raw: bytes | None) -> SiteState | None:
    """The state in ``raw``; None for no state or a malformed one (never raises)."""
    if not raw:
        return None
    try:
        collector, pool_name, d = msgpack.unpackb(raw, raw=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
    if not isinstance(collector, str) or not isinstance(pool_name, str):
        return None
    if len(collector) > _MAX_TEXT or len(pool_name) > _MAX_TEXT:
        return None
    dec = None
    if d is not None:
        dec = decode_decision(d) if isinstance(d, bytes) else None
        if dec is None:
            return None
    return SiteState(collector, pool_name, dec)


class Site:
    """Failover + Flock + SubmitSync on one machine of a pool: the flock role follows the
    manager role."""

    def __init__(
        self,
        failover: Failover,
        flock: Flock,
        sync: SubmitSync,
        *,
        collector: str,
        pool_name: str,
        warmup_s: float | None = None,
    ) -> None:
        """``collector``/``pool_name``: the pool's identity as configured on this machine
        (used when the replicated state has none yet). ``warmup_s``: how long a new manager
        holds back its own decisions (None: the Flock's announcement period)."""
        if failover.core is not flock.core or flock.core is not sync.core:
            raise ConfigError("Site needs the Failover, Flock and SubmitSync of one node")
        self.failover = failover
        self.flock = flock
        self.sync = sync
        self.collector = collector
        self.pool_name = pool_name
        self.warmup_s = warmup_s if warmup_s is not None else flock.config.announce_period_s
        if self.warmup_s < 0:
            raise ConfigError("warmup_s must be >= 0")
        self.stats: Counter[str] = Counter()
        self._serving = False
        self._warm_until = 0.0
        self._warm_timer: Timer | None = None
        if sync.pool_key is None:
            sync.pool_key = failover.pool
        flock.on_decision = self._on_decision
        if sync.authorize is None:
            sync.authorize = self._authorize
        if not failover.is_manager:
            flock.stop()
        failover.add_change_listener(self._on_change)
        if failover.is_manager:
            self._take_role(failover.state, failover.manager_epoch)

    def _authorize(self, manager_id: Any, epoch: int) -> bool:
        # a push is trusted from the manager faultD follows, for that manager's term only
        m = self.failover.manager
        e = self.failover.manager_epoch
        return m is not None and m.id == manager_id and (e is None or e.term == epoch)

    # ------------------------------------------------------------------ role changes
    @property
    def serving(self) -> bool:
        """This machine holds the flock role now."""
        return self._serving

    def _on_change(self, ch: ManagerChange) -> None:
        if self.sync.pool_key is None:  # a live listener learns the pool key from an alive
            self.sync.pool_key = self.failover.pool
        if ch.i_am_manager and not self._serving:
            self._take_role(ch.state, ch.epoch)
        elif not ch.i_am_manager and self._serving:
            self._drop_role()
        self.sync.manager_changed(None if ch.i_am_manager else ch.manager)

    def _take_role(self, raw: bytes | None, epoch: Any) -> None:
        term = int(epoch.term) if epoch is not None else 0
        st = decode_site_state(raw)
        if raw and st is None:
            self.stats["bad_state"] += 1
        if st is not None:
            self.collector, self.pool_name = st.collector, st.pool_name
        f = self.flock
        f.collector = self.collector
        f.pool_name = self.pool_name
        f.set_epoch(term)
        now = f.runtime.now()
        last = st.decision if st is not None else None
        self._serving = True
        self.stats["took_role"] += 1
        self._warm_until = now + self.warmup_s
        f.start()
        f.announce_now()  # the pool is visible again at once, under its collector
        if last is not None:
            f.decision = last  # hysteresis of the on/off rule continues from it
            restamped = attrs.evolve(last, at_s=now, epoch=term, seq=0)
            pub = self.sync.published
            if pub is None or restamped.newer_than(pub):
                self._publish(restamped)
        if self.warmup_s > 0:
            self._warm_timer = f.runtime.call_later(self.warmup_s, self._warm_done)
        else:
            self._warm_done()

    def _warm_done(self) -> None:
        self._warm_timer = None
        if not self._serving:
            return
        d = self.flock.decide_now()
        pub = self.sync.published
        if pub is None or d.newer_than(pub):
            self._publish(d)

    def _drop_role(self) -> None:
        self._serving = False
        self.stats["dropped_role"] += 1
        if self._warm_timer is not None:
            self._warm_timer.cancel()
            self._warm_timer = None
        self.flock.stop()
        self.sync.stop_publishing()

    # ------------------------------------------------------------------ decisions
    def _on_decision(self, d: FlockDecision) -> None:
        if not self._serving:
            self.stats["decision_not_serving"] += 1
            return
        if self.flock.runtime.now() < self._warm_until:
            self.stats["held_in_warmup"] += 1  # published by _warm_done if still newest
            return
        self._publish(d)

    def _publish(self, d: FlockDecision) -> None:
        pub = self.sync.published
        if pub is not None and not d.newer_than(pub):
            self.stats["not_newer"] += 1
            return
        self.sync.publish(d)
        self.stats["published"] += 1
        try:
            self.failover.commit(encode_site_state(SiteState(self.collector, self.pool_name, d)))
        except FailoverError:
            self.stats["commit_refused"] += 1  # stepped down meanwhile: the change follows

    def status(self) -> dict[str, Any]:
        """Role, the pool's identity, the published decision and counters."""
        return {
            "serving": self._serving,
            "collector": self.collector,
            "pool_name": self.pool_name,
            "sync": self.sync.status(),
            "stats": dict(self.stats),
        }
