"""Per-source rate limits on what reaches a live node, and the accounting of every datagram.

Theory of operation. A live node spends CPU on every datagram it opens (an Ed25519 verification
costs ~120 µs, a session record ~2 µs) and sends on behalf of many of the messages it accepts:
a routed message is forwarded, acknowledged and may be retried (MSPastry §3.2, per-hop acks), a
probe is answered, a join makes every hop on the join route send the joiner its rows (Rowstron
and Druschel 2001 §2.4). One address that sends them fast would make the node work for it alone
and, through the forwards, make the whole ring work for it. :class:`SourceLimiter` gives every
source *address* (as observed on the socket, ``udp://IP:PORT``; never a claimed id, which costs a
flooder one key generation to change) token buckets, checked in the node's receive path before
anything reaches the sans-io core:

* a **frame** bucket, checked *before* the frame is opened, so a flood costs the node a dict
  look-up per datagram instead of a signature verification;
* one bucket per **kind** of decoded message, checked before the core sees it: ``routed``
  (``RouteMsg``, ``DirectMsg``), ``probe`` (requests that make the node answer: ``Ping``, leaf-set,
  row, nearby and near-list requests), ``join`` (a joiner's first message to its seed, and the
  small-world connection requests). Other kinds (acks, replies, heartbeats) pass with the frame
  bucket only; control requests have their own gate (:mod:`overlay.live.gate`).

The table of sources is an LRU bounded by ``max_sources`` (evictions counted): a flood from many
addresses costs at most ``max_sources`` entries (~90 bytes each), and each fresh address buys one
burst, the same trade as :class:`~overlay.live.gate.ControlGate`. A dropped datagram is counted by
reason (``rate.dropped_frame``, ``rate.dropped_routed`` …) in the node's stats, which
``flockring status`` prints. Honest peers never come near the defaults (see
:class:`RateLimits`); a dropped routed message is retried by its sender's per-hop ack timer on
another route, so a limited source slows down instead of failing.

:func:`account` turns a node's stats into the fate of every datagram it received — dropped (by
reason), consumed by the session layer, or delivered to the core or the control server — and
checks that they add up; the fuzz campaign (``flockring bench fuzz``) reports it.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Mapping
from typing import Any

import attrs

from overlay.errors import ConfigError

__all__ = ["KINDS", "RateLimits", "SourceLimiter", "account", "classify"]

#: the kinds of message with their own bucket; anything else passes with the frame bucket only
KINDS = ("routed", "probe", "join")

#: message classes by (module, name) -> kind; by name so that this module imports no overlay
#: (live nodes load Pastry / small-world lazily, see ``overlay.live.node``)
_KIND_OF: dict[tuple[str, str], str] = {
    ("overlay.kbr", "RouteMsg"): "routed",
    ("overlay.kbr", "DirectMsg"): "routed",
    ("overlay.proximity", "Ping"): "probe",
    ("overlay.pastry.messages", "LeafSetRequest"): "probe",
    ("overlay.pastry.messages", "RowRequest"): "probe",
    ("overlay.pastry.messages", "NearbyRequest"): "probe",
    ("overlay.smallworld.messages", "NearQuery"): "probe",
    ("overlay.pastry.messages", "JoinRequest"): "join",
    ("overlay.smallworld.messages", "JoinRequest"): "join",
    ("overlay.smallworld.messages", "ConnectRequest"): "join",
}
_OTHER = "other"
_CACHE: dict[type, str] = {}
#: counter keys, made once: a key built per message (``"admitted_" + kind``) is a new string
#: that every node's counters then hold a copy of (~60 bytes a key a node)
_ADMITTED = {k: "admitted_" + k for k in (*KINDS, _OTHER)}
_DROPPED = {k: "dropped_" + k for k in KINDS}


def classify(msg: object) -> str:
    """The rate-limit kind of ``msg``: one of :data:`KINDS`, or ``"other"``."""
    cls = type(msg)
    kind = _CACHE.get(cls)
    if kind is None:
        kind = _CACHE[cls] = _KIND_OF.get((cls.__module__, cls.__name__), _OTHER)
    return kind


def _positive(_: Any, a: attrs.Attribute[float], v: float) -> None:
    if not v > 0:  # also refuses NaN
        raise ConfigError(f"RateLimits.{a.name} must be > 0, got {v!r}")


@attrs.frozen(slots=True)
class RateLimits:
    """Per-source token buckets of a live node (``rate`` tokens a second, ``burst`` saved up).

    Defaults: the busiest honest source a node has is a neighbour forwarding lookups and
    acknowledging ours. In ``flockring bench flood`` (30 nodes, 1,000 honest lookups) and in the
    suite's live rings no honest source ever met a limit (``rate.dropped_*`` = 0); a lookup
    crosses each link once and costs it one ack, so 200 routed messages a second from one
    neighbour is ~100× what a node of a 10^4-node ring sees at 1,000 lookups/s ring-wide
    (log16(10^4) = 3.3 hops each). Frames allow twice that (a routed message and an ack, each
    way) plus the maintenance rate (Pastry ~0.1 msg/s/node). Probes: MSPastry probes a peer at
    most every few seconds; 20/s is room for a node's whole leaf set re-probing and its row
    exchanges at once. Joins: a joiner sends one to its seed and retries after seconds; 5/s with
    a burst of 20 lets a seed take a batch of joiners behind one NAT. 4,096 sources (~1 MiB) is
    more peers than a node of a 10^4-node ring ever talks to in a table lifetime; an evicted
    honest source only gets a full bucket back.
    """

    frames_per_s: float = attrs.field(default=500.0, validator=_positive)
    frames_burst: float = attrs.field(default=1000.0, validator=_positive)
    routed_per_s: float = attrs.field(default=200.0, validator=_positive)
    routed_burst: float = attrs.field(default=400.0, validator=_positive)
    probe_per_s: float = attrs.field(default=20.0, validator=_positive)
    probe_burst: float = attrs.field(default=40.0, validator=_positive)
    join_per_s: float = attrs.field(default=5.0, validator=_positive)
    join_burst: float = attrs.field(default=20.0, validator=_positive)
    max_sources: int = attrs.field(default=4096)
    #: False: count only (every bucket admits); for comparisons (``bench flood --no-limits``)
    enabled: bool = True
    #: forget a source once all its buckets have refilled (it is then exactly a new entry), so
    #: that the table holds only the sources still owed tokens (an honest peer's one datagram
    #: is repaid in milliseconds) instead of the last ``max_sources``. Live nodes turn it on
    #: (``overlay.live.node``); off, the table is a plain LRU.
    forget_idle: bool = False

    @max_sources.validator
    def _check_sources(self, a: attrs.Attribute[int], v: int) -> None:
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"RateLimits.max_sources must be an int >= 1, got {v!r}")


# slot layout of one source's entry: [last refill time, frame, routed, probe, join tokens]
_SLOT = {"routed": 2, "probe": 3, "join": 4}
#: the smallest table that a new source sweeps (below it a sweep would free next to nothing)
_SWEEP_MIN = 8


#: ``RateLimits -> (rates, bursts, sweep period)``: the tuples the buckets read, made once per
#: set of limits and shared by the limiters using it (every live node of a process, usually)
_DERIVED: dict[RateLimits, tuple[tuple[float, ...], tuple[float, ...], float]] = {}


def _derived(lim: RateLimits) -> tuple[tuple[float, ...], tuple[float, ...], float]:
    d = _DERIVED.get(lim)
    if d is None:
        rate = (0.0, lim.frames_per_s, lim.routed_per_s, lim.probe_per_s, lim.join_per_s)
        burst = (0.0, lim.frames_burst, lim.routed_burst, lim.probe_burst, lim.join_burst)
        # the slowest bucket's refill time, a quarter of it (see SourceLimiter._drop_idle)
        sweep_s = max(b / r for b, r in zip(burst[1:], rate[1:], strict=True)) / 4
        if len(_DERIVED) >= 64:  # limits made per test or per call: keep the table bounded
            _DERIVED.clear()
        d = _DERIVED[lim] = (rate, burst, sweep_s)
    return d


class SourceLimiter:
    """The buckets of every source a node hears from (one per node; not thread-safe)."""

    __slots__ = (
        "_burst", "_data", "_free", "_max", "_rate", "_sweep_at", "_sweep_len", "_sweep_s",
        "_table", "counters", "limits",
    )  # fmt: skip

    def __init__(self, limits: RateLimits | None = None) -> None:
        lim = limits if limits is not None else RateLimits()
        self.limits = lim
        self._rate, self._burst, self._sweep_s = _derived(lim)
        self._max = lim.max_sources
        #: address -> row of ``_data``; least recently heard first (a plain dict keeps
        #: insertion order: a look-up moves the source to the end by re-inserting it)
        self._table: dict[str, int] = {}
        #: row i is ``_data[5i:5i+5]`` = [last refill time, frame, routed, probe, join tokens].
        #: One flat array of doubles per node instead of a list of float objects per source in
        #: an ``OrderedDict``: ~90 bytes a source instead of ~230, on every node, for every peer
        #: it hears from.
        self._data = array("d")
        self._free: list[int] = []  # rows of evicted sources, reused first
        #: a source whose buckets have all refilled is exactly what a new entry gets: its row
        #: carries no information and is dropped. How long that takes depends on what it sent
        #: (one frame: 2 ms at the defaults; a burst of joins: up to ``burst / rate``), so each
        #: row is tested on its own; a sweep visits every row, and runs when the table has
        #: doubled since the last one (O(1) amortised per new source) or ``_sweep_s`` after it
        #: (so that a node that stopped meeting new peers still forgets the old ones): this is
        #: when the table is next swept even if no new source came
        self._sweep_at = 0.0
        #: the table size at which a new source triggers a sweep
        self._sweep_len = _SWEEP_MIN
        #: ``frames`` (every datagram seen), ``dropped_<bucket>``, ``admitted_<kind>``,
        #: ``evicted`` (sources pushed out of the table)
        self.counters: Counter[str] = Counter()

    def __len__(self) -> int:
        """Sources currently in the table (at most ``max_sources``)."""
        return len(self._table)

    def _entry(self, src: str, now: float) -> int:
        """The offset in ``_data`` of ``src``'s row, its buckets refilled up to ``now``."""
        forget = self.limits.forget_idle
        if forget and now >= self._sweep_at:
            self._drop_idle(now)
        table, d = self._table, self._data
        row = table.pop(src, None)
        if row is None:
            if forget and len(table) >= self._sweep_len:
                self._drop_idle(now)
                table, d = self._table, self._data
            if len(table) >= self._max:
                old = next(iter(table))  # least recently heard
                self._free.append(table.pop(old))
                self.counters["evicted"] += 1
            if self._free:
                row = self._free.pop()
                o = row * 5
                d[o] = now
                d[o + 1 : o + 5] = array("d", self._burst[1:])
            else:
                row = len(d) // 5
                d.append(now)
                d.extend(self._burst[1:])
            table[src] = row
            return row * 5
        table[src] = row  # re-inserted last: most recently heard
        o = row * 5
        dt = now - d[o]
        if dt > 0:
            d[o] = now
            rate, burst = self._rate, self._burst
            for i in (1, 2, 3, 4):
                t = d[o + i] + dt * rate[i]
                d[o + i] = t if t < burst[i] else burst[i]
        return o

    def _drop_idle(self, now: float) -> None:
        """Forget every source whose buckets would all be full at ``now`` (the very test and
        arithmetic of the refill in :meth:`_entry`, so a forgotten source is indistinguishable
        from one kept), and shrink the array when most of its rows are free: a node keeps rows
        only for the peers that sent to it lately, not for every peer of its join."""
        self._sweep_at = now + self._sweep_s
        table, d = self._table, self._data
        rate, burst = self._rate, self._burst
        stale = []
        for s, row in table.items():
            o = row * 5
            dt = now - d[o]
            if dt <= 0:
                continue
            for i in (1, 2, 3, 4):
                if d[o + i] + dt * rate[i] < burst[i]:
                    break
            else:
                stale.append(s)
        if stale:
            free = self._free
            for s in stale:
                free.append(table.pop(s))
            if len(free) * 2 > len(d) // 5:
                nd = array("d")
                for s, row in table.items():
                    table[s] = len(nd) // 5
                    nd.extend(d[row * 5 : row * 5 + 5])
                self._data = nd
                self._free = []
                self._table = dict(table)  # a dict never shrinks in place; a copy is sized to fit
        self._sweep_len = max(_SWEEP_MIN, 2 * len(self._table))

    def admit_frame(self, src: str, now: float) -> bool:
        """Take a frame token from ``src`` (before the frame is opened); False: drop it."""
        c = self.counters
        c["frames"] += 1
        o = self._entry(src, now) + 1
        d = self._data
        if d[o] < 1.0 and self.limits.enabled:
            c["dropped_frame"] += 1
            return False
        d[o] -= 1.0
        return True

    def admit_message(self, src: str, msg: object, now: float) -> bool:
        """Take a token of ``msg``'s kind from ``src`` (before the core sees it); False: drop."""
        kind = classify(msg)
        slot = _SLOT.get(kind)
        c = self.counters
        if slot is not None:
            o = self._entry(src, now) + slot
            d = self._data
            if d[o] < 1.0 and self.limits.enabled:
                c[_DROPPED[kind]] += 1
                return False
            d[o] -= 1.0
        c[_ADMITTED[kind]] += 1
        return True

    def dropped(self) -> int:
        """Datagrams and messages dropped by a rate limit so far."""
        return sum(v for k, v in self.counters.items() if k.startswith("dropped_"))


#: wire counters that are not drops
_WIRE_OK = "decoded"


def account(stats: Mapping[str, int]) -> dict[str, Any]:
    """The fate of every datagram a node received, from its :attr:`~overlay.Node.stats`.

    Returns ``received`` (datagrams the receive path saw), ``delivered`` (messages handed to the
    core or the control server), ``session_consumed`` (session frames that opened no message:
    handshake messages, and session-layer drops, detailed in ``session.*``), ``dropped`` (by
    reason: ``rate.*``, ``auth.*``, ``wire.*``, ``node.*``) and ``balanced``: whether
    ``received == delivered + session_consumed + sum(dropped)`` and each layer's input equals
    the previous layer's output.
    """

    def g(k: str) -> int:
        return int(stats.get(k, 0))

    dropped: dict[str, int] = {}
    # datagrams the transport refused (larger than its buffer) never reach the node
    dropped["transport.recv_oversized"] = g("transport.recv_oversized")
    received = g("rate.frames") + dropped["transport.recv_oversized"]
    dropped["rate.frame"] = g("rate.dropped_frame")
    auth_total = 0
    for k, v in stats.items():
        if k.startswith("auth.") and k != "auth.accepted":
            dropped[k] = int(v)
        if k.startswith("auth."):
            auth_total += int(v)
    session_frames = g("node.session_frames")
    session_opened = g("session.accepted")
    wire_total = 0
    for k, v in stats.items():
        if k.startswith("wire.") and k != "wire." + _WIRE_OK:
            dropped[k] = int(v)
        if k.startswith("wire."):
            wire_total += int(v)
    for k in ("node.own_id_dropped", "node.bad_reply_address"):
        dropped[k] = g(k)
    for kind in KINDS:
        dropped["rate." + kind] = g("rate.dropped_" + kind)
    delivered = sum(int(v) for k, v in stats.items() if k.startswith("rate.admitted_"))
    consumed = session_frames - session_opened
    checks = {
        "frames": g("rate.frames") == dropped["rate.frame"] + auth_total + session_frames,
        "opened": g("auth.accepted") + session_opened == wire_total,
        "decoded": g("wire.decoded")
        == delivered
        + dropped["node.own_id_dropped"]
        + dropped["node.bad_reply_address"]
        + sum(dropped["rate." + kind] for kind in KINDS),
    }
    total = delivered + consumed + sum(dropped.values())
    return {
        "received": received,
        "delivered": delivered,
        "session_consumed": consumed,
        "dropped": {k: v for k, v in sorted(dropped.items()) if v},
        "balanced": received == total and all(checks.values()),
        "checks": checks,
    }
