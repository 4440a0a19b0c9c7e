"""The flock list reaches every submit machine: the manager pushes, each schedd applies the newest.

Theory of operation. HTCondor reads ``FLOCK_TO`` per schedd, so a flocking decision is useful only
once every submit machine of the pool has it: Butt et al. 2006 §4.1 has the Flocking Manager
"push the willing_list to the submission machines". :class:`SubmitSync` runs on every machine of
a pool ring (the ring faultD uses, Butt et al. 2006 §3.3), the central manager included.

* **Publish.** The manager calls :meth:`SubmitSync.publish` with every new
  :class:`~discovery.decision.FlockDecision`. The decision travels as a signed :class:`FlockPush`
  (origin signature over the encoded decision, :mod:`discovery.signing`) through the pool ring's
  recursive-partition multicast application, the same one faultD's alives ride: it reaches every
  live member in O(log N) levels over acknowledged, retransmitted edges and repairs around dead
  children, and the manager needs no membership list (it has none: its routing state holds
  O(log N) of the pool's machines).
* **Anti-entropy.** A multicast can still miss a node (a loss burst on a retransmitted edge, a
  node that joined late, a node that was down). The manager therefore re-broadcasts its newest
  decision every ``republish_period_s``, and a node that learns of a new manager (faultD's change
  hook) asks it directly with a :class:`FlockPull`, answered by a direct push. A node that missed
  any number of updates thus converges to the newest within one republish period (plus the
  multicast's delay), whatever it missed: only the newest decision matters.
* **Apply newest only.** A push is applied through the injected applier (on a site,
  :class:`discovery.condor.FlockConfigApplier`: atomic ``config.d`` fragment + reconfigure) only
  when its ``(epoch, seq)`` is greater than the applied one; duplicates, reordered and replayed
  pushes change nothing (counted), so a submit machine never goes back to an older list. Across
  a reboot too: ``SubmitSync(applied=...)`` starts from the decision a persisting applier kept
  beside its fragment (``FlockConfigApplier(persist=True).load()``).
* **Trust.** With signatures required, a push must carry the signature of the manager it names
  (its key hashes to the manager's id). An ``authorize(manager_id, epoch)`` check (on a site:
  "is this the manager faultD follows?") guards against any other pool member speaking as the
  manager; a push refused only by that check is kept (the newest one) and re-tried when the
  manager changes, because the push of a new manager can overtake its first alive.

Malformed input is dropped and counted in :attr:`SubmitSync.stats`, never raised.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs
import msgpack

from discovery.decision import FlockDecision, FlockTarget
from discovery.signing import KeyCache, Signer, sign_message, verify_message
from overlay.errors import ConfigError, OverlayError
from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.kbr import BaseApplication, KbrCore
from overlay.messages import Message, register
from overlay.multicast import MULTICAST_APP, Multicast
from overlay.runtime import Timer

__all__ = [
    "DOMAIN",
    "MAX_DECISION_BYTES",
    "SUBMIT_APP",
    "DecisionApplier",
    "FlockPull",
    "FlockPush",
    "SubmitConfig",
    "SubmitError",
    "SubmitSync",
    "decode_decision",
    "encode_decision",
]

#: the KBR application name
SUBMIT_APP = "submit"
#: domain separation of the push signature
DOMAIN = b"flockring/submit/v1\x00"
#: bound on an encoded decision (fits a datagram with envelope and signature)
MAX_DECISION_BYTES = 16 * 1024
_MAX_TARGETS = 256
_MAX_TEXT = 255

#: ``applier(decision)``: render and apply; the return value is ignored
DecisionApplier = Callable[[FlockDecision], object]
#: ``authorize(manager_id, epoch)``: may this node speak as the pool's manager for ``epoch``?
Authorize = Callable[[NodeId, int], bool]


class SubmitError(OverlayError):
    """Misuse of :class:`SubmitSync`."""


# ---------------------------------------------------------------------- decision encoding
def encode_decision(d: FlockDecision) -> bytes:
    """Compact msgpack bytes of ``d`` (also what the replicated site state carries)."""
    targets = [
        [t.node_id, t.collector, t.pool_name, t.rtt_s, t.free_machines, t.row] for t in d.targets
    ]
    out: bytes = msgpack.packb([d.enabled, float(d.at_s), d.epoch, d.seq, targets])
    return out


def _text(v: object) -> str:
    if not isinstance(v, str) or len(v) > _MAX_TEXT:
        raise ValueError("bad text")
    return v


def _int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError("bad int")
    return v


def decode_decision(raw: bytes) -> FlockDecision | None:
    """The decision in ``raw``, or None when it is malformed (never raises)."""
    if not isinstance(raw, bytes) or len(raw) > MAX_DECISION_BYTES:
        return None
    try:
        v = msgpack.unpackb(raw, raw=False, strict_map_key=True)
        enabled, at_s, epoch, seq, targets = v
        if not isinstance(enabled, bool) or not isinstance(at_s, float) or at_s != at_s:
            return None
        if not isinstance(targets, list) or len(targets) > _MAX_TARGETS:
            return None
        ts: list[FlockTarget] = []
        for t in targets:
            node_id, collector, pool_name, rtt, free, row = t
            if rtt is not None and (not isinstance(rtt, float) or not rtt >= 0.0):
                return None
            ts.append(
                FlockTarget(
                    _text(node_id), _text(collector), _text(pool_name), rtt, _int(free), _int(row)
                )
            )
        return FlockDecision(enabled, tuple(ts), at_s, _int(epoch), _int(seq))
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None


# ---------------------------------------------------------------------- messages
@register(170)
@attrs.frozen(slots=True)
class FlockPush(Message):
    """The manager's flocking decision for its pool's submit machines (Butt et al. 2006 §4.1)."""

    pool: NodeId  #: the pool key (the original manager's id)
    manager: NodeHandle  #: who decided (and signed)
    epoch: int  #: the decision's epoch (copied out of ``decision`` for cheap ordering)
    seq: int
    decision: bytes  #: :func:`encode_decision`
    key: bytes = b""
    sig: bytes = b""


@register(171)
@attrs.frozen(slots=True)
class FlockPull(Message):
    """A submit machine asks the manager for its newest decision (answered by a direct push)."""

    pool: NodeId
    requester: NodeHandle
    #: the version the requester has applied (the manager answers only if it has newer)
    epoch: int
    seq: int


# ---------------------------------------------------------------------- config
def _positive(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{attr.name} must be > 0, got {value!r}")


@attrs.frozen(slots=True)
class SubmitConfig:
    """Knobs of the decision push (every node of a pool ring should use the same values)."""

    #: the manager re-broadcasts its newest decision this often. The bound on how stale a
    #: submit machine can stay. Same as faultD's alive period (10 s, discovery/failover_config):
    #: a schedd then lags the manager by at most about one alive period, far below the 60 s
    #: Flocking Manager period of Butt et al. 2006 §5, at one small multicast per period.
    republish_period_s: float = attrs.field(default=10.0, validator=_positive)
    #: signatures on pushes are required (live sites: yes; unsigned simulations: no)
    require_signatures: bool = True
    #: a pull is not repeated to the same manager sooner than this (anti-flooding)
    pull_interval_s: float = attrs.field(default=2.0, validator=_positive)


# ---------------------------------------------------------------------- the application
class SubmitSync(BaseApplication):
    """Decision push (manager side) and newest-only apply (submit side) on one pool-ring node."""

    def __init__(
        self,
        core: KbrCore,
        pool_key: NodeId | None,
        applier: DecisionApplier,
        config: SubmitConfig | None = None,
        *,
        signer: Signer | None = None,
        authorize: Authorize | None = None,
        on_apply: Callable[[FlockDecision], object] | None = None,
        applied: FlockDecision | None = None,
        register: bool = True,
    ) -> None:
        """``pool_key`` may be None until faultD learns it from the first alive (set the
        attribute then; pushes received before are held and re-tried at the manager change).
        ``applier`` renders and applies a decision (e.g. a ``FlockConfigApplier``);
        ``on_apply`` observes every applied decision (tests, metrics); ``applied`` is the
        decision this machine applied before it restarted (``FlockConfigApplier.load``):
        nothing older or equal is applied again."""
        self.core = core
        self.pool_key = pool_key
        self.applier = applier
        self.config = config if config is not None else SubmitConfig()
        if signer is not None and NodeId.hash_of(signer.public_key) != core.id:
            raise ConfigError("the signer's public key does not hash to this node's id")
        self.signer = signer
        self.authorize = authorize
        self.on_apply = on_apply
        self.stats: Counter[str] = Counter()
        #: the newest decision applied on this node (None: none yet)
        self.applied: FlockDecision | None = applied
        #: the newest decision this node published as manager (None: not publishing)
        self.published: FlockDecision | None = None
        self._push_msg: FlockPush | None = None
        self._pending: FlockPush | None = None  # newest push refused only by ``authorize``
        self._timer: Timer | None = None
        self._last_pull: tuple[NodeId, float] | None = None
        self._keys = KeyCache(64)
        self._mc: Multicast | None = None
        if register:
            core.register(SUBMIT_APP, self)
            core.add_handler(FlockPush, lambda _src, m: self.receive(m))
            core.add_handler(FlockPull, lambda _src, m: self._on_pull(m))
            self._multicast()

    # ------------------------------------------------------------------ manager side
    def publish(self, decision: FlockDecision) -> None:
        """Push ``decision`` to every submit machine of the pool (and apply it here); then
        re-broadcast it every ``republish_period_s`` until :meth:`stop_publishing`."""
        if self.published is not None and not decision.newer_than(self.published):
            raise SubmitError(
                f"decision {decision.version} is not newer than published {self.published.version}"
            )
        raw = encode_decision(decision)
        if len(raw) > MAX_DECISION_BYTES:
            raise SubmitError(f"decision encodes to {len(raw)} bytes > {MAX_DECISION_BYTES}")
        if self.config.require_signatures and self.signer is None:
            raise ConfigError("require_signatures is on but this node has no signer")
        if self.pool_key is None:
            raise SubmitError("the pool key is not known yet")
        msg = FlockPush(self.pool_key, self.core.handle, decision.epoch, decision.seq, raw)
        if self.signer is not None:
            msg = sign_message(msg, self.signer, DOMAIN)
        self.published = decision
        self._push_msg = msg
        self._apply(decision)
        self._broadcast()

    def stop_publishing(self) -> None:
        """This node is no longer the manager: stop the re-broadcasts."""
        self.published = None
        self._push_msg = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _broadcast(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        msg = self._push_msg
        if msg is None:
            self._timer = None
            return
        mc = self._multicast()
        if mc is not None:
            mc.broadcast(msg)
            self.stats["pushes_broadcast"] += 1
        else:
            self.stats["no_multicast"] += 1
        self._timer = self.core.runtime.call_later(self.config.republish_period_s, self._broadcast)

    def _on_pull(self, m: FlockPull) -> None:
        msg = self._push_msg
        if (
            type(m.requester) is not NodeHandle
            or type(m.epoch) is not int
            or type(m.seq) is not int
            or m.pool != self.pool_key
        ):
            self.stats["pull_dropped"] += 1
            return
        if msg is None or (msg.epoch, msg.seq) <= (m.epoch, m.seq):
            self.stats["pull_nothing_newer"] += 1
            return
        self.stats["pull_answered"] += 1
        if m.requester != self.core.handle:
            self.core.runtime.send(m.requester, msg)

    # ------------------------------------------------------------------ submit side
    def pull(self, manager: NodeHandle) -> None:
        """Ask ``manager`` for its newest decision (e.g. after a manager change)."""
        now = self.core.runtime.now()
        last = self._last_pull
        if (
            last is not None
            and last[0] == manager.id
            and now - last[1] < self.config.pull_interval_s
        ):
            return
        self._last_pull = (manager.id, now)
        if manager == self.core.handle or self.pool_key is None:
            return
        a = self.applied
        e, s = a.version if a is not None else (0, 0)
        self.core.runtime.send(manager, FlockPull(self.pool_key, self.core.handle, e, s))
        self.stats["pulls_sent"] += 1

    def manager_changed(self, manager: NodeHandle | None) -> None:
        """faultD saw a manager change: re-try a held-back push, and pull from the new one."""
        held = self._pending
        if held is not None:
            self._pending = None
            self.receive(held)
        if manager is not None:
            self.pull(manager)

    def receive(self, m: object) -> None:
        """Process a push from any path (multicast, direct reply); never raises."""
        if type(m) is not FlockPush:
            self.stats["stray"] += 1
            return
        if (
            type(m.epoch) is not int
            or type(m.seq) is not int
            or type(m.decision) is not bytes
            or type(m.manager) is not NodeHandle
        ):
            self.stats["malformed"] += 1
            return
        a = self.applied
        if a is not None and (m.epoch, m.seq) <= a.version:
            self.stats["stale" if (m.epoch, m.seq) < a.version else "duplicate"] += 1
            return
        if self.pool_key is None:
            self._hold(m, "pool_unknown")  # re-tried once faultD names the pool's manager
            return
        if m.pool != self.pool_key:
            self.stats["wrong_pool"] += 1
            return
        if self.config.require_signatures and not verify_message(
            m, m.manager.id, DOMAIN, self._keys
        ):
            self.stats["bad_signature"] += 1
            return
        d = decode_decision(m.decision)
        if d is None or d.version != (m.epoch, m.seq):
            self.stats["malformed"] += 1
            return
        if self.authorize is not None and not self.authorize(m.manager.id, m.epoch):
            self._hold(m, "unauthorized")
            return
        self._apply(d)

    def _hold(self, m: FlockPush, why: str) -> None:
        self.stats[why] += 1
        p = self._pending
        if p is None or (m.epoch, m.seq) > (p.epoch, p.seq):
            self._pending = m

    def _apply(self, d: FlockDecision) -> None:
        if not d.newer_than(self.applied):
            self.stats["stale"] += 1
            return
        try:
            self.applier(d)
        except Exception:
            # not recorded as applied: the next push or re-broadcast tries again
            self.stats["apply_failed"] += 1
            return
        self.applied = d
        self.stats["applied"] += 1
        if self.on_apply is not None:
            self.on_apply(d)

    # ------------------------------------------------------------------ plumbing
    def _multicast(self) -> Multicast | None:
        if self._mc is None:
            app = self.core.apps.get(MULTICAST_APP)
            if isinstance(app, Multicast):
                self._mc = app
                app.add_listener(self._on_multicast)
        return self._mc

    def _on_multicast(self, payload: object) -> None:
        if type(payload) is FlockPush:
            self.receive(payload)

    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        """A push wrapped in a routed/direct payload is processed like any other."""
        self.receive(payload)

    def status(self) -> dict[str, Any]:
        """Applied and published versions and counters."""
        return {
            "applied": list(self.applied.version) if self.applied is not None else None,
            "published": list(self.published.version) if self.published is not None else None,
            "stats": dict(self.stats),
        }
