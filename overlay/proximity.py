"""Proximity and liveness: RTT estimation, probes and the ALIVE/SUSPECTED/DEAD state machine.

Theory of operation (RFC 6298; FreePastry's minimum-RTT PNS; MSPastry §3.2 failure detection):

* Every peer we have exchanged messages with gets a :class:`PeerState`. RTT samples (from
  ping/pong and from per-hop route acks, Karn's rule: first transmissions only) feed an RFC 6298
  estimator: SRTT/RTTVAR with alpha = 1/8, beta = 1/4, RTO = SRTT + 4·RTTVAR clamped to
  [0.05, 10] s; the initial RTO is 1 s (RFC 6298 §2.1). The minimum RTT seen is kept as well:
  FreePastry's proximity neighbour selection compares minimum RTTs, which are robust to queueing.
* Liveness is a small state machine, per peer::

      UNKNOWN --(any message / pong)--> ALIVE
      ALIVE --(probe or route ack timed out)--> SUSPECTED --(retries exhausted)--> DEAD
      SUSPECTED/DEAD --(any message from it)--> ALIVE

  A probe is retransmitted with exponential back-off (RTO, 2·RTO, …) ``probe_retries`` times
  before the peer is declared DEAD and the owner's ``on_dead`` callback runs (MSPastry,
  Castro et al. 2003 §3.2: probe before declaring failure, so that message loss alone rarely
  evicts a live node). A probe of a mere hint (a candidate, or a peer another node accuses)
  retransmits only ``hint_probe_retries`` times: most of those point at nodes long gone. A
  message from the peer after a probe began ends the probe as answered at its next timeout
  (its pong was lost; no retransmission, and never a verdict that message contradicts).
* ``bad`` is the set of SUSPECTED ∪ DEAD handles; routing consults it on every hop, so it is kept
  as a set rather than derived.
* The table is bounded by what the owner's routing state references, not by everyone it ever
  measured: the overlay's maintenance calls :meth:`Proximity.forget_unreferenced` with the
  handles its tables hold, and a live peer that has stayed out of them for
  ``forget_unreferenced_s`` (10 min) is forgotten (DEAD verdicts expire on their own after
  ``dead_memory_s``). Without this, churn leaves every departed neighbour's replacement's
  predecessor in the table for ever: 23 → 73 entries per node over 95 min while 30 were known.
* Layout: a node holds state for tens of peers (63 per node in a 300-node live swarm, most of
  them PNS candidates measured during the join), so the table is columnar — a dict from handle
  to row, the five numbers of every row in one flat ``array('d')`` and the liveness in a
  ``bytearray`` (:class:`PeerTable`) — ~85 bytes a peer where an object per peer with boxed
  floats cost ~220. :class:`PeerState` is a read-only view of one row, made on access.
"""

from __future__ import annotations

import enum
import logging
from array import array
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet

import attrs

from overlay.handle import NodeHandle
from overlay.messages import Message, register
from overlay.runtime import Runtime, Timer
from overlay.validators import positive

log = logging.getLogger(__name__)


_NO_BAD: frozenset[NodeHandle] = frozenset()


class Liveness(enum.Enum):
    """A peer's liveness as our own probes last established it."""

    UNKNOWN = "unknown"
    ALIVE = "alive"
    SUSPECTED = "suspected"
    DEAD = "dead"


@attrs.frozen
class ProximityConfig:
    """RTT estimation and failure-detection knobs."""

    initial_rto_s: float = attrs.field(default=1.0, validator=positive)  # RFC 6298 §2.1
    # RTO clamp, ours: RFC 6298 §2.4 rounds the RTO up to 1 s (and §2.5 allows a cap >= 60 s),
    # but overlay probes are cheap datagrams and LAN RTTs are far below 1 s.
    min_rto_s: float = attrs.field(default=0.05, validator=positive)
    max_rto_s: float = attrs.field(default=10.0, validator=positive)
    alpha: float = 1 / 8  # RFC 6298 §2.3
    beta: float = 1 / 4  # RFC 6298 §2.3
    #: retransmissions of an unanswered probe before DEAD (MSPastry probes a few times).
    probe_retries: int = 3
    #: each retransmission of a probe waits this many times longer than the one before
    #: (RFC 6298 §5.5 doubles the RTO; 1.0 would probe at a fixed interval, as SWIM's
    #: failure detector does)
    probe_backoff: float = attrs.field(default=2.0, validator=attrs.validators.ge(1.0))
    #: retransmissions for a probe that checks a *hint* rather than a peer we rely on: a
    #: routing-table or leaf-set candidate, a nearby-node candidate, another node's failure
    #: report. Ours: a wrong verdict there costs one candidate (or, for a report, agrees with the
    #: reporter's own exhausted probes), while a quarter of a churning Pastry ring's pings were
    #: retransmissions to dead candidates; a probe shared with a full-strength caller keeps
    #: the full count. Never more than ``probe_retries``.
    hint_probe_retries: int = 1
    #: retransmissions for a probe of a routing-table *candidate* outside the leaf set's range
    #: (proximity neighbour selection: is it nearer than what we hold?). Ours: 0. Such a probe
    #: only decides whether a node we can do without enters a slot; an unanswered one costs that
    #: candidate (its DEAD verdict is not spread: it is in none of our tables) and the slot
    #: keeps its occupant or waits for the next candidate. Leaf-set candidates and accusations
    #: keep ``hint_probe_retries``, as a false verdict there would hold a live node out of a
    #: leaf set. Never more than ``hint_probe_retries``.
    candidate_probe_retries: int = 0
    #: a probe's ping is sent again after this many smoothed RTTs (+ ``min_rto_s``) when that
    #: is below its RTO, save the last one, which waits the full RTO: the verdict still comes
    #: only after every ping had at least an RTO to be answered (a pong to an earlier ping
    #: counts). Ours, as KbrConfig.hop_timeout_srtt_factor for hops: RFC 6298 starts RTTVAR
    #: at half the first sample, so a peer sampled once has an RTO of three RTTs, and a
    #: message waiting on a crashed root waited three such RTOs for the verdict. 0 = the RTO.
    retransmit_srtt_factor: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    #: once this node has taken this many RTT samples, a peer it has not measured yet gets,
    #: in place of ``initial_rto_s``, the RTO that the largest sample would give as a first
    #: sample (three times it, RFC 6298 §2.2), if that is lower; and a DEAD verdict on such a
    #: peer still waits ``initial_rto_s`` from its first ping (``Proximity.unmeasured_rto``).
    #: Ours: RFC 6298's 1 s suits a WAN (on the transit-stub model, RTTs 0.3-1 s, a node's
    #: largest sample is above 0.33 s once it has joined), but live on a LAN or loopback every
    #: hop to a never-measured leaf member waited a second, and a lookup whose root had
    #: crashed ~4-5 s (traced, ``bench chaos``). 0 = always ``initial_rto_s``: the default,
    #: so that the simulations keep RFC 6298's initial RTO (a 5-minute transit-stub churn run
    #: changed course with it on, by a cause not traced); live nodes use 3
    #: (``overlay.live.node.LIVE_NETWORK_RTO_SAMPLES``).
    network_rto_samples: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    #: how long a DEAD verdict is remembered, so stale gossip does not re-insert the node.
    dead_memory_s: float = attrs.field(default=300.0, validator=positive)
    #: a DEAD verdict at least this old is checked again — one ping, no retransmission — when
    #: a live peer names the node as a neighbour of its own (:meth:`Proximity.recheck`). Ours:
    #: longer than a neighbour takes to find a crash (a small-world neighbour pings after 22 s
    #: of silence and probes for a few RTOs), so a list that still names the node past it comes
    #: from someone who heard from it since — a node restarted under its old id and address.
    #: Without it such a node is held out for ``dead_memory_s`` by every node that saw it die
    #: but is not contacted by it, as the lists naming it are not proposed.
    dead_recheck_s: float = attrs.field(default=30.0, validator=positive)
    #: a live peer no table references is forgotten after this long unreferenced (ours: long
    #: enough that RTTs measured for a join's or a row refresh's PNS choice are reused, short
    #: against a node's lifetime; FreePastry keeps proximity only for its table entries)
    forget_unreferenced_s: float = attrs.field(default=600.0, validator=positive)


@register(20)
@attrs.frozen(slots=True)
class Ping(Message):
    """RTT probe: the receiver answers with a :class:`Pong` echoing nonce and send time."""

    nonce: int
    sent_at: float


@register(21)
@attrs.frozen(slots=True)
class Pong(Message):
    """Answer to a :class:`Ping` (must come from the probed id to count)."""

    nonce: int
    sent_at: float


#: the doubles of one peer's row, in this order; NaN stands for "no sample yet" (None)
_SRTT, _RTTVAR, _MIN_RTT, _LAST_HEARD, _DEAD_SINCE = range(5)
_WIDTH = 5
#: liveness codes in the ``bytearray`` column (index into ``_STATES``)
_UNKNOWN, _ALIVE, _SUSPECTED, _DEAD = range(4)
_STATES = (Liveness.UNKNOWN, Liveness.ALIVE, Liveness.SUSPECTED, Liveness.DEAD)
_NAN = float("nan")


def _opt(v: float) -> float | None:
    return None if v != v else v  # NaN: never sampled


class PeerState:
    """What we know about one peer's latency and liveness: a read-only view of its row in a
    :class:`PeerTable`, valid until that table next forgets a peer (read it, do not keep it)."""

    __slots__ = ("_o", "_r", "_t")

    def __init__(self, table: PeerTable, row: int) -> None:
        self._t = table
        self._r = row
        self._o = row * _WIDTH

    @property
    def srtt(self) -> float | None:
        """Smoothed RTT in seconds (RFC 6298 SRTT), None before any sample."""
        return _opt(self._t.cols[self._o + _SRTT])

    @property
    def rttvar(self) -> float:
        """RTT variation in seconds (RFC 6298 RTTVAR)."""
        return self._t.cols[self._o + _RTTVAR]

    @property
    def rto(self) -> float:
        """Retransmission timeout in seconds."""
        return self._t.rto_of(self._r)

    @property
    def min_rtt(self) -> float | None:
        """Minimum RTT seen in seconds (the PNS metric), None before any sample."""
        return _opt(self._t.cols[self._o + _MIN_RTT])

    @property
    def last_heard(self) -> float:
        """When we last heard from the peer (runtime seconds), -1.0 never."""
        return self._t.cols[self._o + _LAST_HEARD]

    @property
    def dead_since(self) -> float:
        """When the peer was declared DEAD (runtime seconds), -1.0 never."""
        return self._t.cols[self._o + _DEAD_SINCE]

    @property
    def state(self) -> Liveness:
        """Its liveness."""
        return _STATES[self._t.states[self._r]]


class PeerTable:
    """Every peer a :class:`Proximity` holds state for: ``handle -> row``, and the rows in two
    columns (``cols``: five doubles a row; ``states``: one liveness code a row). Read like a
    mapping from handle to :class:`PeerState` (``get``, ``items``, ``in``, ``len``, iteration in
    insertion order); only its :class:`Proximity` changes it. The RTO is not stored: it is a
    function of SRTT and RTTVAR (RFC 6298 §2.3, clamped), 8 bytes a peer less."""

    __slots__ = ("_free", "_init", "_rto", "cols", "rows", "states")

    def __init__(
        self, initial_rto_s: float, min_rto_s: float = 0.0, max_rto_s: float = 1e9
    ) -> None:
        #: handle -> row number, in insertion order
        self.rows: dict[NodeHandle, int] = {}
        self.cols = array("d")
        self.states = bytearray()
        self._free: list[int] = []
        self._init = array("d", (_NAN, 0.0, _NAN, -1.0, -1.0))
        #: (initial, min, max) RTO in seconds
        self._rto = (initial_rto_s, min_rto_s, max_rto_s)

    def sampled(self, row: int) -> bool:
        """Whether the peer in ``row`` has an RTT sample (its SRTT is not NaN)."""
        v = self.cols[row * _WIDTH + _SRTT]
        return v == v

    def rto_of(self, row: int) -> float:
        """The RTO of the peer in ``row``: the initial RTO before any sample, else
        SRTT + 4 RTTVAR clamped to [min, max] (RFC 6298 §2.2-2.3)."""
        o = row * _WIDTH
        cols = self.cols
        srtt = cols[o + _SRTT]
        initial, lo, hi = self._rto
        if srtt != srtt:
            return initial
        v = srtt + 4 * cols[o + _RTTVAR]
        return hi if v > hi else (lo if v < lo else v)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[NodeHandle]:
        return iter(self.rows)

    def __contains__(self, h: object) -> bool:
        return h in self.rows

    def __getitem__(self, h: NodeHandle) -> PeerState:
        return PeerState(self, self.rows[h])

    def get(self, h: NodeHandle) -> PeerState | None:
        """The state of ``h``, or None if we hold none."""
        r = self.rows.get(h)
        return None if r is None else PeerState(self, r)

    def items(self) -> Iterator[tuple[NodeHandle, PeerState]]:
        """``(handle, state)`` for every peer, in insertion order."""
        for h, r in self.rows.items():
            yield h, PeerState(self, r)

    def keys(self) -> Iterator[NodeHandle]:
        """Every handle, in insertion order."""
        return iter(self.rows)

    def add(self, h: NodeHandle) -> int:
        """A fresh row for ``h`` (UNKNOWN, no samples, the initial RTO); returns it."""
        if self._free:
            r = self._free.pop()
            o = r * _WIDTH
            self.cols[o : o + _WIDTH] = self._init
            self.states[r] = _UNKNOWN
        else:
            r = len(self.states)
            self.cols.extend(self._init)
            self.states.append(_UNKNOWN)
        self.rows[h] = r
        return r

    def remove(self, h: NodeHandle) -> None:
        """Forget ``h`` (its row is reused by the next :meth:`add`)."""
        self._free.append(self.rows.pop(h))

    def compact(self) -> None:
        """Give back the memory of forgotten rows once they are most of the table (views made
        before this call are invalid after it)."""
        free = self._free
        if len(free) <= 8 or len(free) <= len(self.rows):
            return
        cols, states = array("d"), bytearray()
        rows = self.rows
        for h, r in rows.items():
            rows[h] = len(states)
            cols.extend(self.cols[r * _WIDTH : (r + 1) * _WIDTH])
            states.append(self.states[r])
        self.rows = dict(rows)  # a dict never shrinks in place; a copy is sized to fit
        self.cols, self.states, self._free = cols, states, []


class _Probe:
    __slots__ = (
        "attempt",
        "callbacks",
        "earlier",
        "handle",
        "nonce",
        "retries",
        "sent_at",
        "started",
        "timer",
    )

    def __init__(
        self, handle: NodeHandle, nonce: int, sent_at: float, timer: Timer, retries: int
    ) -> None:
        self.handle = handle
        self.nonce = nonce
        self.sent_at = sent_at
        #: when the first ping went (a message from the peer since then answers the probe)
        self.started = sent_at
        self.attempt = 0
        #: retransmissions before DEAD: the largest any sharer of this probe asked for
        self.retries = retries
        self.timer = timer
        self.callbacks: list[Callable[[float | None], None]] = []
        #: (nonce, sent_at) of the attempts before this one: a pong to any of them answers
        #: the probe (the peer is alive, only slower than our RTO) with an exact RTT sample,
        #: since each attempt has its own nonce (no retransmission ambiguity, unlike Karn's)
        self.earlier: tuple[tuple[int, float], ...] = ()


ProbeCallback = Callable[[float | None], None]


class Proximity:
    """Per-node table of peer RTTs and liveness; sends and answers probes through the Runtime."""

    #: the largest RTT sample taken, and how many were taken (counted up to
    #: ``network_rto_samples``): :meth:`unmeasured_rto`. Class-level until the first sample
    #: (no attribute on a node that never measured anything: 10^6 simulated nodes)
    _rtt_max = 0.0
    _samples = 0

    def __init__(
        self,
        runtime: Runtime,
        owner: NodeHandle,
        config: ProximityConfig,
        on_dead: Callable[[NodeHandle], None],
        on_alive: Callable[[NodeHandle], None] | None = None,
    ) -> None:
        self.runtime = runtime
        self.owner = owner
        self.config = config
        self._on_dead = on_dead
        self._on_alive = on_alive
        #: every peer we hold state for (a mapping handle -> :class:`PeerState` view)
        self.peers = PeerTable(config.initial_rto_s, config.min_rto_s, config.max_rto_s)
        # ``bad`` is read on every routing hop; an empty frozenset shared by all nodes stands in
        # until the first suspicion (saves ~200 bytes a node at 10^6 simulated nodes).
        self.bad: AbstractSet[NodeHandle] = _NO_BAD
        self._probes: dict[NodeHandle, _Probe] = {}
        self._by_nonce: dict[int, _Probe] = {}
        self.probes_sent = 0
        #: probes ended by other traffic from the peer after a lost pong (no sample taken)
        self.answered_by_traffic = 0
        #: pongs whose nonce was outstanding but came from another id (dropped)
        self.foreign_pongs = 0
        #: pings of probes that ended DEAD, for ``max_rto_s``: nonce -> (handle, sent_at,
        #: expiry); created on use. A pong to one still corrects the RTT estimate.
        self._failed: dict[int, tuple[NodeHandle, float, float]] | None = None
        #: pongs that came after their probe had ended DEAD (each one an RTT sample)
        self.pongs_after_verdict = 0
        #: peers found unreferenced by forget_unreferenced, and since when (created on use)
        self._unreferenced: dict[NodeHandle, float] | None = None
        #: peers forgotten because no table referenced them
        self.forgotten = 0

    def _bad_add(self, h: NodeHandle) -> None:
        bad = self.bad
        if not isinstance(bad, set):
            bad = self.bad = set()
        bad.add(h)

    def _bad_discard(self, h: NodeHandle) -> None:
        bad = self.bad
        if isinstance(bad, set):
            bad.discard(h)

    # ------------------------------------------------------------------ queries
    def state(self, h: NodeHandle) -> Liveness:
        """The liveness of ``h`` (ALIVE for a peer we hold no state for)."""
        r = self.peers.rows.get(h)
        return _STATES[self.peers.states[r]] if r is not None else Liveness.UNKNOWN

    def is_dead(self, h: NodeHandle) -> bool:
        """True if our probes declared ``h`` dead (and the verdict has not expired)."""
        t = self.peers
        r = t.rows.get(h)
        if r is None or t.states[r] != _DEAD:
            return False
        return self.runtime.now() - t.cols[r * _WIDTH + _DEAD_SINCE] <= self.config.dead_memory_s

    def rtt(self, h: NodeHandle) -> float | None:
        """Minimum RTT observed (seconds), or None if never measured (PNS metric)."""
        r = self.peers.rows.get(h)
        return _opt(self.peers.cols[r * _WIDTH + _MIN_RTT]) if r is not None else None

    def srtt(self, h: NodeHandle) -> float | None:
        """Smoothed RTT of ``h`` in seconds (RFC 6298 SRTT), None before any sample."""
        r = self.peers.rows.get(h)
        return _opt(self.peers.cols[r * _WIDTH + _SRTT]) if r is not None else None

    def last_heard(self, h: NodeHandle) -> float | None:
        """When ``h`` was last heard from (runtime seconds), None if never or no state."""
        r = self.peers.rows.get(h)
        if r is None:
            return None
        t = self.peers.cols[r * _WIDTH + _LAST_HEARD]
        return t if t >= 0.0 else None

    def heard_since(self, h: NodeHandle, t: float) -> bool:
        """Whether ``h`` was heard from at or after runtime time ``t`` (False if never)."""
        r = self.peers.rows.get(h)
        if r is None:
            return False
        last = self.peers.cols[r * _WIDTH + _LAST_HEARD]
        return last >= 0.0 and last >= t

    def rto(self, h: NodeHandle) -> float:
        """Retransmission timeout for ``h`` in seconds (RFC 6298, clamped); for a peer never
        sampled, :meth:`unmeasured_rto`."""
        r = self.peers.rows.get(h)
        if r is None or not self.peers.sampled(r):
            return self.unmeasured_rto()
        return self.peers.rto_of(r)

    def verdict_wait(self, h: NodeHandle, since: float) -> float:
        """Seconds still to wait before declaring ``h`` dead when the first of the pings (or
        requests) it has not answered went at ``since``: none once ``h`` has been sampled
        (its timeouts came from its own RTO); else until the initial RTO has passed since
        then, as those timeouts came from :meth:`unmeasured_rto`, a guess from other peers,
        not a bound. The probes here and a Pastry joiner's requests to its members use it."""
        r = self.peers.rows.get(h)
        if r is not None and self.peers.sampled(r):
            return 0.0
        return max(0.0, since + self.config.initial_rto_s - self.runtime.now())

    def unmeasured_rto(self) -> float:
        """The RTO of a peer never sampled: ``initial_rto_s`` (RFC 6298 §2.1), or, once this
        node has taken ``network_rto_samples`` samples, three times the largest of them (the
        RTO it would give as a first sample, §2.2) when that is lower, never below
        ``min_rto_s``. The peers of one node share its network: its largest RTT is the scale
        of their RTTs, not a bound on them, so a DEAD verdict on a never-sampled peer still
        waits the initial RTO from the first ping (:meth:`_probe_timeout`)."""
        c = self.config
        if not c.network_rto_samples or self._samples < c.network_rto_samples:
            return c.initial_rto_s
        return self.rto_on_scale(self._rtt_max)

    def rto_on_scale(self, rtt_max_s: float) -> float:
        """The RTO for a peer never sampled on a network whose largest RTT seen is
        ``rtt_max_s``: what that RTT would give as a first sample (3x, RFC 6298 §2.2), within
        ``[min_rto_s, initial_rto_s]`` (:meth:`unmeasured_rto`)."""
        c = self.config
        return min(c.initial_rto_s, max(c.min_rto_s, 3.0 * rtt_max_s))

    def wait_on_scale(self, rtos: float, rtt_max_s: float | None = None) -> float | None:
        """``rtos`` RTOs of a never-measured peer on the network's scale — that of
        ``rtt_max_s`` if given (round trips the caller timed itself), else of this node's
        samples (:meth:`unmeasured_rto`) — never below ``initial_rto_s``: a wait for peers
        never measured, whose verdict never comes sooner (:meth:`verdict_wait`). None where
        this node does not scale its RTOs to the network (``network_rto_samples`` 0): the
        caller keeps its own fixed wait."""
        c = self.config
        if not c.network_rto_samples:
            return None
        rto = self.unmeasured_rto() if rtt_max_s is None else self.rto_on_scale(rtt_max_s)
        return max(c.initial_rto_s, rtos * rto)

    def liveness_table(self) -> dict[NodeHandle, Liveness]:
        """The liveness of every peer we hold state for."""
        st = self.peers.states
        return {h: _STATES[st[r]] for h, r in self.peers.rows.items()}

    # ------------------------------------------------------------------ updates
    def _peer(self, h: NodeHandle) -> int:
        """The row of ``h``, made on first use."""
        r = self.peers.rows.get(h)
        if r is None:
            r = self.peers.add(h)
        return r

    def sample(self, h: NodeHandle, rtt_s: float) -> None:
        """Feed one RTT measurement (RFC 6298 §2.2–2.3) and mark the peer ALIVE."""
        if not rtt_s >= 0:  # negative, or NaN (which the table reserves for "no sample")
            return
        r = self._peer(h)
        f = self.peers.cols
        o = r * _WIDTH
        c = self.config
        srtt = f[o + _SRTT]
        if srtt != srtt:  # first sample
            srtt = rtt_s
            rttvar = rtt_s / 2
        else:
            rttvar = (1 - c.beta) * f[o + _RTTVAR] + c.beta * abs(srtt - rtt_s)
            srtt = (1 - c.alpha) * srtt + c.alpha * rtt_s
        f[o + _SRTT] = srtt
        f[o + _RTTVAR] = rttvar
        m = f[o + _MIN_RTT]
        if m != m or rtt_s < m:
            f[o + _MIN_RTT] = rtt_s
        if rtt_s > self._rtt_max:
            self._rtt_max = rtt_s
        if self._samples < c.network_rto_samples:
            self._samples += 1
        self._mark_alive(h, r)

    def heard(self, h: NodeHandle, start: bool = False) -> None:
        """Any message from ``h`` is proof of life. ``start``: begin a record for ``h`` if we
        hold none (a peer just made a connection of ours), rather than ignore it."""
        r = self.peers.rows.get(h)
        if r is None:
            # do not allocate state for every passer-by (sample() or probe() will), but a peer
            # we are probing is no passer-by: without a record its message would go unseen
            # and the probe, its pong lost, would end in a false DEAD verdict (a node cut off
            # and back was so declared dead by a member that had just heard it, and held out
            # of its leaf set for 92 s: tests/test_pastry_reintegration.py, seed 7 at 5 %)
            if not start and h not in self._probes:
                return
            r = self._peer(h)
        self._mark_alive(h, r)

    def _mark_alive(self, h: NodeHandle, r: int) -> None:
        t = self.peers
        t.cols[r * _WIDTH + _LAST_HEARD] = self.runtime.now()
        s = t.states[r]
        if s != _ALIVE:
            was_bad = s in (_SUSPECTED, _DEAD)
            t.states[r] = _ALIVE
            self._bad_discard(h)
            if was_bad and self._on_alive is not None:
                self._on_alive(h)

    def suspect(self, h: NodeHandle) -> None:
        """Something (a missing route ack) hints that ``h`` failed: suspect it and probe."""
        if h == self.owner:
            return
        r = self._peer(h)
        st = self.peers.states
        if st[r] == _DEAD:
            return
        if st[r] != _SUSPECTED:
            st[r] = _SUSPECTED
            self._bad_add(h)
        self.probe(h)

    def forget(self, h: NodeHandle) -> None:
        """Drop all state about ``h`` (it left our tables and is not DEAD-remembered)."""
        pr = self._probes.pop(h, None)
        if pr is not None:
            pr.timer.cancel()
            self._drop_nonces(pr)
        t = self.peers
        r = t.rows.get(h)
        if r is not None and t.states[r] != _DEAD:
            t.remove(h)
            self._bad_discard(h)

    def declare_dead(self, h: NodeHandle) -> None:
        """Record a DEAD verdict (from our own probes) and tell the owner once."""
        r = self._peer(h)
        t = self.peers
        if t.states[r] == _DEAD:
            return
        t.states[r] = _DEAD
        t.cols[r * _WIDTH + _DEAD_SINCE] = self.runtime.now()
        self._bad_add(h)
        self._on_dead(h)

    def probing(self, h: NodeHandle) -> bool:
        """Whether a probe of ``h`` is in flight."""
        return h in self._probes

    def recheck(self, h: NodeHandle) -> bool:
        """``h``, held DEAD, was named as live by a peer: if the verdict is at least
        ``dead_recheck_s`` old, ping it once (a pong revives it, through ``on_alive``) and
        restart the verdict's clock, so the next recheck waits as long again. Returns whether a
        ping was sent."""
        t = self.peers
        r = t.rows.get(h)
        if r is None or t.states[r] != _DEAD or h in self._probes:
            return False
        now = self.runtime.now()
        at = r * _WIDTH + _DEAD_SINCE
        if now - t.cols[at] < self.config.dead_recheck_s:
            return False
        t.cols[at] = now
        self.probe(h, candidate=True)
        return True

    def expire_dead(self) -> None:
        """Forget DEAD verdicts older than ``dead_memory_s`` (called from maintenance)."""
        now = self.runtime.now()
        limit = self.config.dead_memory_s
        t = self.peers
        st, f = t.states, t.cols
        gone = [
            h
            for h, r in t.rows.items()
            if st[r] == _DEAD and now - f[r * _WIDTH + _DEAD_SINCE] > limit
        ]
        for h in gone:
            t.remove(h)
            self._bad_discard(h)
        t.compact()
        # the pings of failed probes expire here too, not only at the next failure: a node
        # whose probes stop failing would otherwise keep them for good
        self._expire_failed(now)
        if not self._failed:
            self._failed = None

    def forget_unreferenced(self, referenced: AbstractSet[NodeHandle]) -> int:
        """Forget live peers outside ``referenced`` (the handles the owner's tables hold) that
        have stayed outside it for ``forget_unreferenced_s``; returns how many went.

        Called periodically by the overlay's maintenance, every P seconds: a peer is forgotten
        at the first call at least ``forget_unreferenced_s`` after the first call that found it
        unreferenced — at most ``forget_unreferenced_s + 2 P`` after its last reference. Peers
        with a probe in flight and DEAD verdicts (see :meth:`expire_dead`) are left alone.
        """
        now = self.runtime.now()
        limit = self.config.forget_unreferenced_s
        since = self._unreferenced
        if since is None:
            since = self._unreferenced = {}
        probes = self._probes
        gone: list[NodeHandle] = []
        t = self.peers
        st = t.states
        for h, r in t.rows.items():
            if h in referenced or h in probes or st[r] == _DEAD:
                since.pop(h, None)
                continue
            t0 = since.setdefault(h, now)
            if now - t0 >= limit - 1e-6:  # a sweep period that divides the limit: no extra round
                gone.append(h)
        for h in gone:
            del since[h]
            self.forget(h)
        rows = t.rows
        for h in [h for h in since if h not in rows]:
            del since[h]
        self.forgotten += len(gone)
        t.compact()
        return len(gone)

    def stop(self) -> None:
        """Cancel every in-flight probe (the owner is shutting down); callbacks are not run."""
        for pr in self._probes.values():
            pr.timer.cancel()
        self._probes.clear()
        self._by_nonce.clear()
        self._failed = None

    # ------------------------------------------------------------------ probing
    def probe(
        self,
        h: NodeHandle,
        callback: ProbeCallback | None = None,
        hint: bool = False,
        candidate: bool = False,
    ) -> None:
        """Ping ``h``; ``callback(rtt_s)`` on the pong, ``callback(None)`` once it is DEAD.
        A probe whose ping or pong is lost ends as answered, without retransmission, if any
        message from ``h`` arrived since it began; ``rtt_s`` is then ``h``'s smoothed RTT (or,
        never sampled, the time since the probe began).

        At most one probe per peer is in flight; further callers share its outcome. ``hint``:
        ``h`` is a candidate or accused peer, not one we rely on — retransmit only
        ``hint_probe_retries`` times (unless a full-strength caller shares the probe);
        ``candidate``: a routing-table candidate we can do without, ``candidate_probe_retries``.
        """
        if h == self.owner:
            if callback is not None:
                callback(0.0)
            return
        c = self.config
        if candidate:
            retries = min(c.candidate_probe_retries, c.hint_probe_retries, c.probe_retries)
        elif hint:
            retries = min(c.hint_probe_retries, c.probe_retries)
        else:
            retries = c.probe_retries
        pr = self._probes.get(h)
        if pr is None:
            pr = self._send_probe(h, attempt=0, retries=retries)
        elif retries > pr.retries:
            pr.retries = retries
        if callback is not None:
            pr.callbacks.append(callback)

    def _send_probe(
        self, h: NodeHandle, attempt: int, old: _Probe | None = None, retries: int = 0
    ) -> _Probe:
        rt = self.runtime
        nonce = rt.rng.getrandbits(32)
        now = rt.now()
        c = self.config
        timeout = min(c.max_rto_s, self.rto(h) * c.probe_backoff**attempt)
        if attempt < (retries if old is None else old.retries):  # the last waits its RTO
            timeout = self.srtt_capped(h, timeout, c.retransmit_srtt_factor)
        timer = rt.call_later(timeout, lambda: self._probe_timeout(h, nonce))
        if old is None:
            pr = _Probe(h, nonce, now, timer, retries)
        else:
            pr = old
            pr.earlier += ((pr.nonce, pr.sent_at),)
            pr.nonce, pr.sent_at, pr.timer = nonce, now, timer
        pr.attempt = attempt
        self._probes[h] = pr
        self._by_nonce[nonce] = pr
        self.probes_sent += 1
        rt.send(h, Ping(nonce, now))
        return pr

    def srtt_capped(self, h: NodeHandle, timeout_s: float, factor: float) -> float:
        """``timeout_s``, or ``factor`` smoothed RTTs of ``h`` plus ``min_rto_s`` when that is
        shorter (``factor`` 0, or ``h`` never sampled: ``timeout_s``). The early timer of a
        hop's first transmission (KbrConfig.hop_timeout_srtt_factor) and of a probe's pings
        but the last (``retransmit_srtt_factor``): a premature one costs a datagram, while
        RFC 6298's RTO of a peer sampled once is three RTTs."""
        if factor > 0:
            srtt = self.srtt(h)
            if srtt is not None:
                return min(timeout_s, factor * srtt + self.config.min_rto_s)
        return timeout_s

    def _probe_timeout(self, h: NodeHandle, nonce: int) -> None:
        pr = self._by_nonce.get(nonce)
        if pr is None or pr.nonce != nonce:
            return
        r = self._peer(h)
        t = self.peers
        st = t.states
        if st[r] == _ALIVE and t.cols[r * _WIDTH + _LAST_HEARD] > pr.started:
            # It spoke to us after the probe began (its pong was lost, or crossed a ping of its
            # own): alive, so no retransmission and no verdict. A verdict given here would be
            # one a message already contradicts — a cut-off node that came back and announced
            # itself was declared dead by a probe started during the cut whose last pong was
            # lost, and held out of a leaf set for minutes.
            self._close(pr)
            self.answered_by_traffic += 1
            srtt = t.cols[r * _WIDTH + _SRTT]
            rtt = srtt if srtt == srtt else self.runtime.now() - pr.started
            for cb in pr.callbacks:
                cb(rtt)
            return
        if st[r] != _DEAD and st[r] != _SUSPECTED:
            st[r] = _SUSPECTED
            self._bad_add(h)
        if pr.attempt < pr.retries:
            self._send_probe(h, pr.attempt + 1, pr)
            return
        wait = self.verdict_wait(h, pr.started)
        if wait > 1e-9:
            # never sampled: its pings went on the network's scale, a guess; the verdict
            # waits the initial RTO, within which any peer answers
            pr.timer = self.runtime.call_later(wait, lambda: self._probe_timeout(h, nonce))
            return
        self._close(pr)
        self._remember_failed(pr)
        self.declare_dead(h)
        for cb in pr.callbacks:
            cb(None)

    def _remember_failed(self, pr: _Probe) -> None:
        """Keep the pings of a probe that ended DEAD for ``max_rto_s``: a pong that comes after
        the verdict is the only sample that can correct an RTO below the peer's true RTT.
        Without it such an RTO never recovers (every exchange with the peer is retransmitted,
        so Karn's rule samples none) and each probe ends in the same false verdict, as one
        leaf-set neighbour did four times in 100 s under churn (docs/reliability.md)."""
        now = self.runtime.now()
        self._expire_failed(now)
        failed = self._failed
        if failed is None:
            failed = self._failed = {}
        exp = now + self.config.max_rto_s
        for n, sent_at in (*pr.earlier, (pr.nonce, pr.sent_at)):
            failed[n] = (pr.handle, sent_at, exp)

    def _expire_failed(self, now: float) -> None:
        """Forget the pings of failed probes kept past their expiry."""
        failed = self._failed
        if failed:
            for n in [n for n, (_, _, exp) in failed.items() if exp < now]:
                del failed[n]

    def _close(self, pr: _Probe) -> None:
        """Forget ``pr``, which has its outcome (the caller runs its callbacks)."""
        self._drop_nonces(pr)
        del self._probes[pr.handle]

    def _drop_nonces(self, pr: _Probe) -> None:
        # a 32-bit nonce drawn again by a later probe may map to that one now: leave it there
        by_nonce = self._by_nonce
        if by_nonce.get(pr.nonce) is pr:
            del by_nonce[pr.nonce]
        for n, _ in pr.earlier:
            if by_nonce.get(n) is pr:
                del by_nonce[n]

    def on_ping(self, src: NodeHandle, msg: Ping) -> None:
        """Answer a probe with a pong."""
        self.runtime.send(src, Pong(msg.nonce, msg.sent_at))

    def on_pong(self, src: NodeHandle, msg: Pong) -> None:
        """A pong answers our probe only if its nonce is outstanding *and* it comes from the id
        we probed (live: the id proven by the sender's key). Anything else is counted in
        ``foreign_pongs`` and leaves the probe pending, so its timeout still runs."""
        pr = self._by_nonce.get(msg.nonce)
        if pr is None and self._failed:
            late = self._failed.get(msg.nonce)
            if late is not None and late[0].id == src.id and self.runtime.now() <= late[2]:
                del self._failed[msg.nonce]
                self.pongs_after_verdict += 1
                self.sample(late[0], self.runtime.now() - late[1])  # revives it, as any message
            return
        if pr is None or pr.handle.id != src.id:
            if pr is not None:
                self.foreign_pongs += 1
            return  # late, or not from whom we asked
        pr.timer.cancel()
        self._close(pr)
        sent_at = pr.sent_at
        if msg.nonce != pr.nonce:  # an earlier attempt's pong: late, yet proof of life
            sent_at = next(t for n, t in pr.earlier if n == msg.nonce)
        rtt = self.runtime.now() - sent_at
        self.sample(pr.handle, rtt)
        for cb in pr.callbacks:
            cb(rtt)
