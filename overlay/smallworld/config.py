"""Configuration of the small-world ring (docs/smallworld.md).

Every knob of :class:`~overlay.smallworld.core.SmallWorldCore` lives here, with its unit in
the name and the source of its default next to it. The routing-reliability knobs shared with
Pastry (:class:`~overlay.kbr.KbrConfig`) and the failure detector
(:class:`~overlay.proximity.ProximityConfig`) are nested so that one object configures a node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from overlay.errors import ConfigError
from overlay.kbr import KbrConfig
from overlay.proximity import ProximityConfig

_Validator = Callable[[object, "attrs.Attribute[Any]", Any], None]


def _at_least(lo: float) -> _Validator:
    def check(_inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= lo:
            raise ConfigError(f"SmallWorldConfig.{attr.name} must be >= {lo}, got {value!r}")

    return check


def _positive(_inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"SmallWorldConfig.{attr.name} must be > 0, got {value!r}")


def _default_kbr() -> KbrConfig:
    # A message's first hop heard from within 20 s where one is at most 8 times as far from
    # the key (KbrConfig.fresh_first_hop_s), while the node observes short sessions (its
    # near window widened: SmallWorldCore._origin_hedges): a shortcut is pinged only after 120 s
    # of silence, so at 5-minute sessions a stale best hop has often crashed unnoticed, and
    # a lookup whose origin crashes before its first hop acks is lost with it
    # (docs/smallworld.md, "Fresh first hops"). Pastry, whose table entries are probed more
    # often, gained nothing measurable and keeps it off. Under the same gate an application's
    # message also leaves its origin by a spare first hop (KbrConfig.spare_first_hop;
    # docs/smallworld.md, "A spare first hop").
    return KbrConfig(fresh_first_hop_s=20.0, spare_first_hop=True)


def _default_proximity() -> ProximityConfig:
    return ProximityConfig(probe_retries=2)


@attrs.frozen
class SmallWorldConfig:
    """Knobs of the Brunet/Symphony-style ring. Defaults cite where they come from."""

    #: near connections kept on each side of the ring. Brunet
    #: ``StructuredNearConnectionOverlord.DESIRED_NEIGHBORS = 2``. Under 5-minute sessions 3
    #: removed every wrong delivery in six seeds, for ~0.25 more msg/s/node (and 0.54 at
    #: 30-minute sessions with 5 % loss, over the 0.5 budget): docs/smallworld.md, "Three near
    #: neighbours a side under 5-minute sessions". So a node widens to
    #: ``churn_near_per_side`` only while it observes short sessions.
    near_per_side: int = attrs.field(default=2, validator=_at_least(1))
    #: near connections a side while the node observes short sessions (``churn.py``; not more
    #: than ``near_per_side``: never widen). 3 gave six 5-minute runs at N = 2,000 without a
    #: wrong delivery (20 with two) and control at 30-minute sessions as with two
    #: (docs/smallworld.md, "A near window that follows the churn"). 2 turns it off.
    churn_near_per_side: int = attrs.field(default=3, validator=_at_least(1))
    #: widen the near window while the mean session of the node's connections, as it estimates
    #: it, is below this. Ours: between the 5- and 30-minute sessions of MSPastry's churn
    #: experiments (Castro et al. 2003), which need three and two near neighbours a side.
    churn_session_s: float = attrs.field(default=600.0, validator=_positive)
    #: narrow it again only when the estimate is above this many times ``churn_session_s``
    #: (hysteresis: the estimate of a few deaths is noisy).
    churn_narrow_factor: float = attrs.field(default=1.5, validator=_at_least(1.0))
    #: the estimate forgets with this time constant (deaths and connection-seconds are
    #: discounted by exp(-age / horizon)). Ours: long enough that a node with ~12 connections
    #: at 30-minute sessions counts ~6 deaths, short enough to follow a change within minutes.
    churn_horizon_s: float = attrs.field(default=900.0, validator=_positive)
    #: (discounted) deaths needed before the estimate may widen the window.
    churn_min_deaths: float = attrs.field(default=3.0, validator=_at_least(1.0))
    #: shortcuts wanted = ceil(shortcut_factor · log2 N̂). Brunet
    #: ``StructuredShortcutConnectionOverlord.DesiredShortcuts`` (0.5·log N).
    shortcut_factor: float = attrs.field(default=0.5, validator=_at_least(0.0))
    #: no shortcuts while N̂ is at most this ("no shortcuts for networks smaller than 10 nodes",
    #: Brunet DesiredShortcuts).
    shortcut_min_network: float = attrs.field(default=10.0, validator=_at_least(0.0))
    #: surplus own shortcuts tolerated before trimming (hysteresis: N̂ from 2·near gaps is
    #: noisy, so the wanted count wobbles by one; Brunet likewise trims only clear surpluses).
    shortcut_slack: int = attrs.field(default=1, validator=_at_least(0))
    #: a shortcut request may be answered by the first node on its path within this fraction
    #: of the drawn distance d from the target (0: only by the node closest to the target, as
    #: in Symphony). Off by default: at 0.25 it cut the routed control traffic at 5-minute
    #: sessions by 0.13 msg/s/node, but the shortcuts came out shorter than drawn, lookups took
    #: 4-8 % more hops and more of them failed under churn (docs/smallworld.md, "Short
    #: sessions").
    shortcut_accept_fraction: float = attrs.field(default=0.0, validator=_at_least(0.0))
    #: replace a dead own shortcut by a neighbour of it that the reply which made it named (the
    #: node now closest to the same target, most likely), with a Link instead of a routed
    #: request (``offers.py``). Off by default: under 5-minute sessions it and
    #: ``inherit_shortcuts`` saved ~0.2 msg/s/node of routed requests, but those requests
    #: detected crashes on the side, and without them a crashed near neighbour stayed in the
    #: windows 1.2-1.4 s longer (measured, docs/smallworld.md "Short sessions").
    reuse_shortcuts: bool = False
    #: a joiner offers a Link to a neighbour of each own shortcut of the node that answered its
    #: JOIN (its neighbour, so they lie at the joiner's log-uniform distances too) instead of
    #: routing its own requests (``offers.py``). A neighbour, not the shortcut itself: one far
    #: node linked from two adjacent ones spends two links on one region (more hops). Off by
    #: default, as ``reuse_shortcuts``.
    inherit_shortcuts: bool = False
    #: an offered shortcut that does not acknowledge its Link within this long is forgotten (a
    #: routed request replaces it on the next tick). Ours: a few RTTs on any latency model.
    shortcut_offer_timeout_s: float = attrs.field(default=3.0, validator=_positive)
    #: the greedy TTL is max(ttl_min_hops, ceil((ln N̂) ** ttl_exponent)). Brunet uses
    #: (ln N)^3. The floor keeps tiny rings (N̂ < 10) routable.
    ttl_exponent: float = attrs.field(default=3.0, validator=_at_least(1.0))
    ttl_min_hops: int = attrs.field(default=16, validator=_at_least(1))
    #: period of the maintenance tick (trim, repair, shortcut top-up, idle pings). Brunet's
    #: overlords run on the node heartbeat and retry every 10 s; half that keeps repair fast.
    maintenance_interval_s: float = attrs.field(default=5.0, validator=_positive)
    #: every node sends its near window to its closest near neighbours this often (Brunet's
    #: neighbour status exchange; Chord's stabilize/notify, which likewise talks to the
    #: successor only). It keeps the ring converging and doubles as the keep-alive of those
    #: connections. Ours: 2 lists per node per period (0.1 msg/s/node at 20 s).
    near_exchange_s: float = attrs.field(default=20.0, validator=_positive)
    #: the periodic list goes to this many closest near neighbours on each side (a change of
    #: the window is still pushed to all of it). Ours: 1, as Chord's stabilize: the farther
    #: near neighbours are watched through the lists of the closest one, which names them
    #: (one that stops naming a node it should hold has dropped it: we probe it at once), and
    #: pinged after ``outer_idle_ping_s`` of silence. Halves the periodic lists (measured under
    #: churn at N = 2,000: docs/smallworld.md, "Maintenance"). ``near_per_side``: every member.
    exchange_per_side: int = attrs.field(default=1, validator=_at_least(1))
    #: a change of the near window is pushed to the near neighbours this long after it (a
    #: join changes the window several times within one round trip: one push covers them).
    near_push_delay_s: float = attrs.field(default=0.2, validator=_positive)
    #: a near connection silent for this long is pinged. Ours: one exchange period plus 2 s
    #: (the periodic lists leave on the sender's tick, exactly one period apart, and arrive
    #: within one one-way delay, < 1 s on the transit-stub model), so a live neighbour's list
    #: always comes first and only a silent (failed, or one-sided) neighbour costs a ping.
    #: With the probe retries this bounds failure detection of a near neighbour
    #: (docs/smallworld.md, "Maintenance").
    idle_ping_s: float = attrs.field(default=22.0, validator=_positive)
    #: a near connection that gets no periodic list from us (beyond ``exchange_per_side``) is
    #: pinged after this long of silence. Ours: a safety net only — its failure is normally
    #: seen first in the lists of the near neighbour between us, which drops it from its
    #: window within ``idle_ping_s`` plus a probe of the crash, and when a closer neighbour on
    #: its side is suspected it is probed at once (correlated failures).
    outer_idle_ping_s: float = attrs.field(default=60.0, validator=_positive)
    #: a shortcut silent for this long is pinged (Brunet edge keep-alive, 15 s there). Ours,
    #: eight times that: a dead shortcut costs one rerouted hop (per-hop acks), never a wrong
    #: delivery, and the pings of ~0.5·log2 N shortcuts per node are the larger part of the
    #: maintenance budget (0.19 msg/s/node at N = 10^4 with 75 s). Ping + Pong under churn at
    #: N = 2,000 fell from 0.18 to 0.14 msg/s/node with this and the outer near neighbours'
    #: longer idle period (docs/smallworld.md). A dead shortcut is gone within ~2-2.5 min.
    shortcut_idle_ping_s: float = attrs.field(default=120.0, validator=_positive)
    #: a node that would deliver a routed message while its nearest connection on the key's
    #: side is suspected, dead or excluded (it cannot tell whether live nodes lie between it
    #: and the key) holds the message this long, asking past the gap and walking that side,
    #: and routes it again when a near connection is linked or the time is up. Ours: traced
    #: under 5-minute sessions, 6 of 7 ``root_unknown`` deliveries were such a holder, right
    #: after its next hop's DEAD verdict (docs/smallworld.md, "Short sessions"); 2 s covers a
    #: walk's few hops on the transit-stub model. 0 = deliver at once.
    unsure_root_hold_s: float = attrs.field(default=2.0, validator=_at_least(0.0))
    #: run a near-repair walk on each side this often even when nothing looks wrong (a safety
    #: net under the near-list exchange; repairs after a failure walk at once).
    stabilize_interval_s: float = attrs.field(default=300.0, validator=_positive)
    #: partition healing (FreePastry ``PartitionHandler``, as Pastry's here): every
    #: ``stabilize_interval_s`` (300 s, FreePastry's period) a node that lost connections asks
    #: one of them, chosen at random, where it belongs. It remembers up to this many
    #: (FreePastry ``partition_handler_max_history_size = 20``; 0 turns healing off) ...
    gone_history_size: int = attrs.field(default=20, validator=_at_least(0))
    #: ... for this long (FreePastry ``partition_handler_max_history_age``: 90 min).
    gone_history_age_s: float = attrs.field(default=5400.0, validator=_positive)
    #: an unanswered connect request (shortcut or near repair) is forgotten after this.
    connect_timeout_s: float = attrs.field(default=10.0, validator=_positive)
    #: join: wait this long for the routed reply before trying the next seed (doubles per try).
    join_timeout_s: float = attrs.field(default=5.0, validator=_positive)
    join_retries: int = attrs.field(default=4, validator=_at_least(0))
    #: after the join reply, wait at most this long for the near neighbours' LinkAcks.
    join_link_timeout_s: float = attrs.field(default=3.0, validator=_positive)
    #: routed messages a joining node keeps while its links are being acknowledged (about one
    #: round trip), to handle once it is ready; more are handled at once (sent back). Ours: a
    #: joiner is known only to its near neighbours then, so few messages reach it.
    max_held_while_joining: int = attrs.field(default=64, validator=_at_least(0))
    #: largest node list accepted in a reply (ours: bigger ones are malformed input).
    max_reply_nodes: int = attrs.field(default=32, validator=_at_least(1))
    #: run the periodic maintenance tick at all (huge oracle-built benchmarks may turn it off:
    #: with it on, every connection is pinged once per idle period).
    maintenance_enabled: bool = True
    #: routing reliability (per-hop acks, retransmits, reroutes) shared with Pastry.
    kbr: KbrConfig = attrs.Factory(_default_kbr)
    #: RTT estimation and the ALIVE/SUSPECTED/DEAD failure detector. Ours: two probe retries
    #: (7 RTOs to DEAD instead of 15). A near neighbour is probed only after its periodic list
    #: failed to come, so the silence is evidence already; declaring a crash sooner shortens
    #: both the time its keys are misrouted and the time a lookup's holder waits on it
    #: (docs/smallworld.md, "Maintenance"). Three unanswered tries at 5 % loss: ~1e-3.
    proximity: ProximityConfig = attrs.Factory(_default_proximity)

    @property
    def near_window(self) -> int:
        """Near connections on both sides together (at ``near_per_side``: a node widens it
        while it observes short sessions, ``churn_near_per_side``)."""
        return 2 * self.near_per_side
