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


@attrs.frozen
class SmallWorldConfig:
    """Knobs of the Brunet/Symphony-style ring. Defaults cite where they come from."""

    #: near connections kept on each side of the ring. Brunet
    #: ``StructuredNearConnectionOverlord.DESIRED_NEIGHBORS = 2``.
    near_per_side: int = attrs.field(default=2, validator=_at_least(1))
    #: shortcuts wanted = ceil(shortcut_factor · log2 N̂). Brunet
    #: ``StructuredShortcutConnectionOverlord.DesiredShortcuts`` (0.5·log N).
    shortcut_factor: float = attrs.field(default=0.5, validator=_at_least(0.0))
    #: no shortcuts while N̂ is at most this ("no shortcuts for networks smaller than 10 nodes",
    #: Brunet DesiredShortcuts).
    shortcut_min_network: float = attrs.field(default=10.0, validator=_at_least(0.0))
    #: surplus own shortcuts tolerated before trimming (hysteresis: N̂ from 2·near gaps is
    #: noisy, so the wanted count wobbles by one; Brunet likewise trims only clear surpluses).
    shortcut_slack: int = attrs.field(default=1, validator=_at_least(0))
    #: the greedy TTL is max(ttl_min_hops, ceil((ln N̂) ** ttl_exponent)). Brunet uses
    #: (ln N)^3. The floor keeps tiny rings (N̂ < 10) routable.
    ttl_exponent: float = attrs.field(default=3.0, validator=_at_least(1.0))
    ttl_min_hops: int = attrs.field(default=16, validator=_at_least(1))
    #: period of the maintenance tick (trim, repair, shortcut top-up, idle pings). Brunet's
    #: overlords run on the node heartbeat and retry every 10 s; half that keeps repair fast.
    maintenance_interval_s: float = attrs.field(default=5.0, validator=_positive)
    #: every node sends its near window to its near neighbours this often (Brunet's neighbour
    #: status exchange; Chord's stabilize/notify). It keeps the ring converging and doubles as
    #: the keep-alive of near connections. Ours: 4 lists per node per period (0.2 msg/s/node
    #: at 20 s) keep maintenance within 0.5 msg/s/node with the shortcut pings.
    near_exchange_s: float = attrs.field(default=20.0, validator=_positive)
    #: a change of the near window is pushed to the near neighbours this long after it (a
    #: join changes the window several times within one round trip: one push covers them).
    near_push_delay_s: float = attrs.field(default=0.2, validator=_positive)
    #: a near connection silent for this long is pinged. Ours: one exchange period plus one
    #: tick, so a live neighbour's periodic list always comes first and only a silent (failed,
    #: or one-sided) neighbour costs a ping. With the probe retries this bounds failure
    #: detection of a near neighbour (docs/smallworld.md, "Maintenance").
    idle_ping_s: float = attrs.field(default=25.0, validator=_positive)
    #: a shortcut silent for this long is pinged (Brunet edge keep-alive). Ours, five times the
    #: old 15 s: a dead shortcut costs one rerouted hop (per-hop acks), never a wrong delivery,
    #: and the pings of ~0.5·log2 N shortcuts per node are the larger part of the maintenance
    #: budget (0.19 msg/s/node at N = 10^4). A dead shortcut is still gone within ~1.5 min.
    shortcut_idle_ping_s: float = attrs.field(default=75.0, validator=_positive)
    #: run a near-repair walk on each side this often even when nothing looks wrong (a safety
    #: net under the near-list exchange; repairs after a failure walk at once).
    stabilize_interval_s: float = attrs.field(default=300.0, validator=_positive)
    #: an unanswered connect request (shortcut or near repair) is forgotten after this.
    connect_timeout_s: float = attrs.field(default=10.0, validator=_positive)
    #: join: wait this long for the routed reply before trying the next seed (doubles per try).
    join_timeout_s: float = attrs.field(default=5.0, validator=_positive)
    join_retries: int = attrs.field(default=4, validator=_at_least(0))
    #: after the join reply, wait at most this long for the near neighbours' LinkAcks.
    join_link_timeout_s: float = attrs.field(default=3.0, validator=_positive)
    #: largest node list accepted in a reply (ours: bigger ones are malformed input).
    max_reply_nodes: int = attrs.field(default=32, validator=_at_least(1))
    #: run the periodic maintenance tick at all (huge oracle-built benchmarks may turn it off:
    #: with it on, every connection is pinged once per idle period).
    maintenance_enabled: bool = True
    #: routing reliability (per-hop acks, retransmits, reroutes) shared with Pastry.
    kbr: KbrConfig = attrs.Factory(KbrConfig)
    #: RTT estimation and the ALIVE/SUSPECTED/DEAD failure detector.
    proximity: ProximityConfig = attrs.Factory(ProximityConfig)

    @property
    def near_window(self) -> int:
        """Near connections on both sides together."""
        return 2 * self.near_per_side
