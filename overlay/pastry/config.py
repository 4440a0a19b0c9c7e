"""Pastry configuration: one attrs class, units in names, every default cites its source.

Theory of operation: :class:`PastryConfig` gathers the knobs of docs/pastry.md — table geometry
(b, leaf-set size), the leaf-set liveness protocol (FreePastry's ``PeriodicLeafSetProtocol``:
neighbour heartbeats every 20 s with a 30 s lease), routing-table maintenance (lazy repair plus
a periodic row exchange every 900 s, FreePastry ``pastry_routeSetMaintFreq``), partition healing
(FreePastry ``PartitionHandler``: every 300 s re-join through a recently gone or bootstrap node),
the consistent join (MSPastry, Castro et al. 2003 §3.1) and the oracle build. It also carries the
:class:`~overlay.kbr.KbrConfig` and :class:`~overlay.proximity.ProximityConfig` the core's base
uses, so one object configures a whole Pastry node.
"""

from __future__ import annotations

import attrs

from overlay.errors import ConfigError
from overlay.kbr import KbrConfig
from overlay.proximity import ProximityConfig


def _positive(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{attr.name} must be > 0, got {value!r}")


def _sub_second(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ConfigError(f"{attr.name} must be a number of seconds in [0, 1), got {value!r}")


def _non_negative_int(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{attr.name} must be an int >= 0, got {value!r}")


def _positive_int(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{attr.name} must be an int >= 1, got {value!r}")


def _b_bits(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if value not in (1, 2, 4, 5, 8):
        raise ConfigError(f"{attr.name} must divide 160 and be 1, 2, 4, 5 or 8; got {value!r}")


def _leaf_size(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 2 or value % 2:
        raise ConfigError(f"{attr.name} must be an even int >= 2, got {value!r}")


def _pastry_kbr() -> KbrConfig:
    # A copy of a lookup that comes back while our next hop is unacknowledged waits for that
    # hop (overlay/kbr.py): under loss it is a reroute's duplicate, and routing it on avoiding
    # the lossy hop delivered lookups in the closest node's place (bench churn, 1-5 % loss).
    # 16 reroutes (the engine's default is 6): traced in a one-hour churn run (N = 2 000,
    # 30-min sessions), sources whose seven nearest entries towards a key had all crashed
    # unseen tried them in 0.4 s and dropped 5 of 70,889 lookups with the root alive. Pastry's
    # partition handler and re-integration undo the verdicts more tries leave across a cut.
    return KbrConfig(hold_returning_copies=True, max_reroutes=16)


def _pastry_proximity() -> ProximityConfig:
    # Two probe retransmissions (three pings in all) before DEAD: FreePastry's test harnesses run
    # with ``pastry_socket_scm_num_ping_tries = 2``..5; MSPastry (§3.2) retries a probe a small
    # number of times. Three pings keep a neighbour's failure detected inside one lease period.
    # At a fixed interval, not doubling (ours, measured): a message whose next hop crashed waits
    # at its holder for the DEAD verdict when that hop was the key's root, and RTO + 2·RTO +
    # 4·RTO made those lookups the latency tail (p99 7–8 s under 30-min churn, N = 2,000).
    # With a right RTO, three RTOs give the same verdicts under independent loss and halve the
    # p99, at the same control traffic; an RTO below the true RTT now ends in a false verdict
    # where doubling would have waited (docs/reliability.md, "Probe timing", "What still falls
    # short").
    # Pings but the last go again after 1.5 smoothed RTTs (+ 50 ms) when that is below the RTO
    # (``retransmit_srtt_factor``, the hops' factor): a peer sampled once has an RTO of three
    # RTTs, and a lookup whose root had crashed waited three of them for the verdict.
    return ProximityConfig(probe_retries=2, probe_backoff=1.0, retransmit_srtt_factor=1.5)


@attrs.frozen
class PastryConfig:
    """Every Pastry knob (docs/pastry.md). All times are seconds of the runtime's clock."""

    #: bits per digit; 16 columns per row (Rowstron & Druschel 2001 §2.1; FreePastry
    #: ``pastry_rtBaseBitLength = 4``).
    b_bits: int = attrs.field(default=4, validator=_b_bits)
    #: leaf-set size L, L/2 each side (ours: 16; FreePastry ``pastry_lSetSize = 24``).
    leaf_set_size: int = attrs.field(default=16, validator=_leaf_size)

    # ---- leaf-set liveness (FreePastry PeriodicLeafSetProtocol; MSPastry §3.2)
    #: heartbeat (carrying our leaf set) to each immediate neighbour
    #: (FreePastry ``pastry_protocol_periodicLeafSet_ping_neighbor_period = 20000`` ms).
    heartbeat_interval_s: float = attrs.field(default=20.0, validator=_positive)
    #: heartbeats to the left (counter-clockwise) neighbour only, which holds the lease on its
    #: right neighbour (MSPastry, Castro et al. 2004 §3: one heartbeat per node per period;
    #: ~0.05 msg/s/node less than both sides under churn). False: to both neighbours, each
    #: holding a lease on both (FreePastry ``PeriodicLeafSetProtocol``). A node declared dead
    #: while it was merely cut off is re-integrated by announcing itself to its whole leaf set
    #: (``reintegration.py``), not by heartbeats, so the one-way heartbeat does not slow it.
    heartbeat_left_only: bool = True
    #: an immediate neighbour silent this long is probed
    #: (FreePastry ``pastry_protocol_periodicLeafSet_lease_period = 30000`` ms).
    neighbor_lease_s: float = attrs.field(default=30.0, validator=_positive)
    #: how often leases are checked (a local timer only; no messages). Half the heartbeat
    #: period keeps detection within lease + 10 s (our choice, so that a crash is repaired
    #: in < 60 s, the bound tests/test_pastry_network.py checks after a crash).
    lease_check_interval_s: float = attrs.field(default=10.0, validator=_positive)
    #: when a failure is detected, other leaf-set members not heard from for this long are
    #: probed as well (correlated failures; MSPastry §3.2 probes on suspicion).
    leaf_verify_after_s: float = attrs.field(default=20.0, validator=_positive)

    #: failures we learnt of in this window ride on our heartbeats and leaf-set pushes, so
    #: members that a detector could not reach directly still hear of them (FreePastry
    #: ConsistentJoinProtocol sends its "failed set", ``maxFailedToSend = 20``).
    failed_spread_s: float = attrs.field(default=60.0, validator=_positive)
    #: at most one probe per reported node per this interval: a failure report from another
    #: node is a hint that makes us probe, never a verdict (MSPastry §3.2)
    failure_report_probe_interval_s: float = attrs.field(default=10.0, validator=_positive)
    #: a node told it was declared dead (while alive) announces itself to its whole leaf set at
    #: most this often, and a member tells a given accused node at most this often (ours: the
    #: report-probe interval above, so a stream of reports costs a bounded trickle)
    reintegration_interval_s: float = attrs.field(default=10.0, validator=_positive)

    # ---- routing-table maintenance
    #: periodic routing-table row exchange (MSPastry §3.3 "periodic routing table
    #: maintenance"; FreePastry ``pastry_routeSetMaintFreq`` is 900 s). Ours: 300 s — at 900 s a
    #: ring of 5 000 built by joins held the best row-1 entry in 94 % of slots after an hour
    #: (mean RDP 1.50), at 300 s 98 % (RDP 1.44) for 0.16 instead of 0.13 msg/s/node.
    row_exchange_interval_s: float = attrs.field(default=300.0, validator=_positive)
    #: at most this many unmeasured candidates are probed per row received in steady state
    #: (keeps maintenance under 0.5 msg/s/node, MSPastry's budget). RTT hints choose which.
    row_probe_limit: int = attrs.field(default=4, validator=_non_negative_int)
    #: the row exchange asks one of the k nearest measured entries of each row (FreePastry
    #: ``maintainRouteSet`` swaps rows with "the closest node" of a random column): a near
    #: peer's row holds nodes near us too, so gossip converges on the nearest candidates.
    row_exchange_nearest: int = attrs.field(default=3, validator=_non_negative_int)
    #: a row request's reply is accepted this long after it was sent (replies bind to requests)
    row_reply_timeout_s: float = attrs.field(default=30.0, validator=_positive)
    #: probes a node spends on the row a new node announces to it (FreePastry
    #: ``broadcastRows``: the joiner sends row i to its row-i entries). 0 (ours): the row is
    #: not sent at all — it cost ~20-30 datagrams per join for no measurable route stretch
    #: (transit-stub, N = 2 000: RDP 1.43 with 0, 1.44 with 1; 1 000: 1.47 with 0, 1.48 with 2)
    announce_probe_limit: int = attrs.field(default=0, validator=_non_negative_int)
    #: a new node announces itself to this many of its row-0 entries, nearest first (deeper
    #: rows: to all entries). A receiver takes the newcomer into its row 0 only if it is the
    #: nearest of ~N/16 candidates, i.e. near the receiver (Castro et al. 2002 §4). 16 = every
    #: entry (FreePastry ``broadcastRows``). Ours: 4 — transit-stub, N = 1 000 built by joins:
    #: 10 announces and 5 receiver probes per join instead of 20 and 9, the same share of
    #: best row-0 entries (0.963 both, 20 tables examined); 0 fell to 0.80.
    announce_row0_nearest: int = attrs.field(default=4, validator=_non_negative_int)
    #: a new node also announces itself to this many of the nearest nodes its discovery walk
    #: measured (ours: near nodes need each other most, see ``Maintenance.on_ready``)
    announce_nearest: int = attrs.field(default=8, validator=_non_negative_int)

    # ---- row walks (join.py: the join route's rows, re-collected from another near node)
    #: walks a node starts from its nearest entries when its join completes (the oracle
    #: build's refinement starts from 4 nearest entries; the join route itself is the first).
    #: Ours: 1 (was 2) — transit-stub, N = 1 000 built by joins: the same route stretch
    #: (p50 1.25) for ~10 datagrams less per join; 0 raised p50 to 1.27.
    join_walks: int = attrs.field(default=1, validator=_non_negative_int)
    #: one walk from one of the ``row_exchange_nearest`` nearest entries this often, so that
    #: nodes that joined near us since enter our table (ours; ~10 messages a walk)
    walk_interval_s: float = attrs.field(default=600.0, validator=_positive)
    #: PNS probes one walk may spend (anchor probes of unmeasured hops included)
    walk_probe_budget: int = attrs.field(default=12, validator=_non_negative_int)
    #: a walk's rows and reply are accepted this long after it started (replies bind to it)
    walk_timeout_s: float = attrs.field(default=30.0, validator=_positive)
    #: walks outstanding at once (more are not started: a bound on state and on traffic)
    walk_max_pending: int = attrs.field(default=4, validator=_non_negative_int)

    # ---- partition healing (FreePastry PartitionHandler)
    #: re-join through a recently gone or bootstrap node
    #: (FreePastry ``partition_handler_check_interval = 300000`` ms).
    partition_check_interval_s: float = attrs.field(default=300.0, validator=_positive)
    #: nodes remembered as gone (FreePastry ``partition_handler_max_history_size = 20``).
    gone_history_size: int = attrs.field(default=20, validator=_non_negative_int)
    #: how long they are remembered (FreePastry ``partition_handler_max_history_age``: 90 min).
    gone_history_age_s: float = attrs.field(default=5400.0, validator=_positive)
    #: fraction of healing rounds that use a bootstrap address instead of a gone node
    #: (FreePastry ``partition_handler_bootstrap_check_rate = 0.05``).
    bootstrap_check_rate: float = 0.05

    # ---- join (Rowstron & Druschel §2.4; MSPastry §3.1 consistent join)
    #: first wait for the join reply; doubles on each retry (our choice: > a few RTTs x hops).
    join_timeout_s: float = attrs.field(default=5.0, validator=_positive)
    #: join attempts before ``on_done(False)`` (backoff 5, 10, 20, 40, 80 s).
    join_attempts: int = attrs.field(default=5, validator=_non_negative_int)
    #: the routed join's request goes again (same nonce) if no reply came within this time,
    #: doubled per resend, up to ``join_probe_retries`` times within the attempt: a lost
    #: request or reply (one datagram each) otherwise costs the joiner the whole attempt's
    #: ``join_timeout_s``. Ours: 3 s, the 99th percentile of request-to-reply time at 0 %
    #: loss (N = 2 000, transit-stub, 30-min sessions: p50 0.72 s, p90 1.58 s, p99 2.91 s),
    #: so that a reply merely slow is rarely asked for twice.
    join_route_wait_s: float = attrs.field(default=3.0, validator=_positive)
    #: retransmissions of the leaf-set probe of the consistent join before the member is
    #: taken as dead (FreePastry ``pastry_socket_scm_num_ping_tries``-style retries).
    join_probe_retries: int = attrs.field(default=3, validator=_non_negative_int)
    #: nearby-node discovery before joining (Castro et al. 2002 §4; FreePastry
    #: ``PNSApplication.getNearest``): requests after the seed's leaf set, each for the
    #: routing rows 0-2 of the nearest node not asked yet. 0 = join through the seed directly.
    join_locate_rounds: int = attrs.field(default=6, validator=_non_negative_int)
    #: the walk stops after this many rounds in a row that found no nearer node (2: the
    #: nearest node's table, then the runner-up's — a beam of two against local minima)
    join_locate_patience: int = attrs.field(default=2, validator=_non_negative_int)
    #: unmeasured nodes probed per discovery round, those the RTT hints say may be nearer
    #: first (a leaf set is 16, three rows up to 45). Ours: 8 (was 16) — the seed's leaf set
    #: (round 0, random nodes) need not be probed whole: the rounds after it zoom in. Transit-
    #: stub, 300 nodes built by joins: 22 probes per join instead of 26, joins through the
    #: nearest ready node 88 % (87 % with 16), row-0 best entries 92 % (90 %).
    join_locate_probes: int = attrs.field(default=8, validator=_non_negative_int)
    #: unmeasured nodes probed in the whole discovery, all rounds together (a hard bound on
    #: what locating costs: Castro et al. 2002 §4 find the nearest node, or one close to it, in
    #: a few rounds; see ``locate.py``). Ours: 40, rarely reached. Lower bounds cut the walk
    #: short and lose locality: at N = 1 000, 24 gave 22 probes per join instead of 31 but
    #: row-0 best entries fell 0.97 -> 0.91-0.93 (60 tables examined); 16 ended most walks
    #: after the seed's leaf set (0.84).
    join_locate_max_probes: int = attrs.field(default=40, validator=_non_negative_int)
    #: unmeasured nodes probed at once within a round; the next few are taken (and pruned
    #: again by the triangle inequality against the nearest RTT found) when these answered.
    #: Ours: 4 (16 = the whole round at once, the earlier behaviour).
    join_locate_batch: int = attrs.field(default=4, validator=_positive_int)
    #: a discovery round waits this long for its pongs, then goes on with what it has.
    join_locate_wait_s: float = attrs.field(default=2.0, validator=_positive)
    #: a node within this RTT is near enough: nothing nearer is worth a probe (ours: 1 ms, a
    #: LAN; two hosts of the transit-stub model are >= 2 ms apart, their access links alone).
    #: The discovery walk ends once it measured such a node (on loopback or a LAN: the seed),
    #: an entry this near is not contested, and a candidate whose hints put it this near
    #: fills an empty slot without a probe. On a flat network PNS otherwise measures noise:
    #: 26 of the 41 probes of a join at N = 300 on loopback were the discovery walk's. 0 = off.
    pns_near_enough_s: float = attrs.field(default=0.001, validator=_sub_second)
    #: PNS probes per join attempt for routing-table candidates that compete with an entry
    #: (empty slots are filled at once; leaf-set members are measured by the join itself).
    join_probe_budget: int = attrs.field(default=16, validator=_non_negative_int)

    # ---- oracle build (steady state computed directly, ``build="oracle"``; docs/pastry.md)
    #: random candidates sampled per routing-table slot in the first pass; the lowest RTT
    #: wins (PNS). 8 + two refinement rounds ≈ exhaustive PNS on transit-stub at ~1.2x the
    #: CPU of a 16-sample alone (N = 10^4: RDP 1.47 vs 3.1).
    oracle_pns_sample: int = attrs.field(default=8, validator=_non_negative_int)
    #: refinement rounds after the sampled pass: each node is offered the rows met on the
    #: routes towards it from its nearest entries (what a join through a nearby node plus the
    #: row exchange converge to; Castro et al. 2002 §4). 0 = sampled PNS only.
    oracle_refine_rounds: int = attrs.field(default=2, validator=_non_negative_int)
    #: nearest routing-table entries each refinement round starts a route from.
    oracle_refine_seeds: int = attrs.field(default=4, validator=_non_negative_int)
    #: each node starts with one RTT sample (the latency model's round trip, what one probe
    #: measures) of every leaf member and table entry, as a ring built by joins has measured
    #: every node it holds. Off by default (ours): under churn at N = 10^4 with a 2-min warm-up
    #: it cuts control traffic 0.72 -> 0.55 msg/s/node (no unmeasured occupants to probe, RTT
    #: hints known), but at N = 2 000 (10-min warm-up) lookups took 3-5 % more hops and 10 of
    #: 17 940 failed against 3 without it, not yet explained (docs/pastry.md, "Oracle build").
    oracle_measured_rtts: bool = False

    kbr: KbrConfig = attrs.field(factory=_pastry_kbr)
    proximity: ProximityConfig = attrs.field(factory=_pastry_proximity)

    @property
    def half_leaf(self) -> int:
        """Leaf-set members kept on each side of the node."""
        return self.leaf_set_size // 2

    @property
    def rows(self) -> int:
        """Routing-table rows: digits of a 160-bit id in base ``2**b_bits``."""
        return 160 // self.b_bits

    @property
    def cols(self) -> int:
        """Routing-table columns: one per digit value."""
        return 1 << self.b_bits
