"""Nearby-node discovery: the LOCATING phase of a Pastry join.

Theory of operation (Castro, Druschel, Hu & Rowstron 2002, "Exploiting network proximity in
peer-to-peer overlay networks" §4; FreePastry ``PNSApplication.getNearest``). Proximity neighbour
selection only pays if the join starts *near the joiner in the network*: row i of the joiner X
is taken from hop i of the join route, and hop 0's row 0 is near hop 0. So before joining, X
asks the seed *address* for its leaf set (:class:`NearbyRequest` row -1; leaf sets are spread
over the whole network) and probes the members, then asks the nearest node found for its rows
0-2 with its RTTs to them (hints) and probes those the triangle inequality says may be nearer,
and so on from the nearest node not asked yet (:meth:`NearbyLocator._step`).

Each request and its reply are a round trip of X's own, so the replier's RTT is a sample
without a probe, and it turns the replier's hints into bounds: a candidate at hint h from a
replier at RTT a lies in ``[|a - h|, a + h]``; one whose lower bound is no better than the
nearest node found cannot be nearer and is not probed. Candidates are probed in small batches
(``join_locate_batch``), most promising first, so each batch's pongs tighten the bound that
prunes the next.

What a discovery costs is bounded three ways (Castro et al. 2002 §4 report that a few rounds
find the nearest node or one close to it; the probes, a ping and a pong each, are most of a
join's datagrams): at most ``join_locate_probes`` probes per round, at most
``join_locate_max_probes`` in the whole discovery, and the walk stops when
``join_locate_patience`` rounds in a row found no nearer node or ``join_locate_rounds`` requests
were spent, or as soon as it measured a node within ``pns_near_enough_s`` (1 ms: a LAN; on a
flat network, loopback or a LAN, the seed itself). Every RTT measured here seeds X's routing
table, and the nearest nodes found hear of X once it is ready (``tables.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from overlay.handle import Address, NodeHandle
from overlay.runtime import Timer

from .host import PastryHost
from .messages import NearbyReply, NearbyRequest, check_handles, check_hints

__all__ = ["NearbyLocator"]

#: called when the discovery ends: the node to join through (None: nothing answered but the
#: seed address itself) and the nearest nodes measured, nearest first
FoundCallback = Callable[[NodeHandle | None, list[NodeHandle]], None]


class NearbyLocator:
    """One joiner's nearby-node discovery walk (see the module doc) and the existing nodes'
    answer to it."""

    def __init__(self, core: PastryHost, on_found: FoundCallback) -> None:
        self.core = core
        self._on_found = on_found
        #: a discovery is under way (replies and pongs are taken only then)
        self.active = False
        #: the seed has answered this discovery (from then on its own timers bound it)
        self.answered = False
        self.nonce = 0
        self._round = 0
        self._asked: NodeHandle | None = None  # None: the seed address
        self._replied = False  # the node asked this round has answered
        self._sent_at = 0.0  # when this round's request left (its reply is an RTT sample)
        self._done: set[NodeHandle] = set()  # nodes asked so far
        self._best: NodeHandle | None = None  # nearest after the previous round
        self._stale = 0  # rounds in a row that found no nearer node
        self._pending: set[NodeHandle] = set()
        self._rtt: dict[NodeHandle, float] = {}
        self._seed_resent = False  # the seed's request went more than once (Karn's rule)
        self._timer: Timer | None = None
        #: this round's candidates not yet taken (least promising first) with their hints,
        #: our RTT to the replier, and the probes the round / the whole walk may still start
        self._cands: list[tuple[NodeHandle, float]] = []
        self._a: float | None = None
        self._left = 0
        self._total_left = 0

    # ------------------------------------------------------------------ joiner side
    def start(self, nonce: int, addr: Address) -> None:
        """Begin a discovery bound to ``nonce``: ask the seed address for its leaf set."""
        core = self.core
        self.reset()
        self.active = True
        self.nonce = nonce
        self._total_left = core.config.join_locate_max_probes
        self._sent_at = core.runtime.now()
        self._ask_seed(addr, 0)

    def _ask_seed(self, addr: Address, attempt: int) -> None:
        """Send the seed its request, and again after ``join_locate_wait_s``, doubled each time
        (RFC 6298 §5.5), up to ``join_probe_retries`` times: one lost datagram of this
        exchange used to stall the join for the whole attempt's timeout (5 s); over an hour at
        N = 2 000 and 5 % loss, 475 discovery attempts timed out with their seed alive. Not
        the 1-s initial RTO of RFC 6298 §2.1: the address's RTT is unknown, some paths of the
        transit-stub model take 1.2 s, and a spurious resend costs the round its RTT sample
        (Karn's rule; 11 of 300 joins resent at 1 s, and the row-0 PNS test fell below its
        bound). ``join_locate_wait_s`` is what a silent node of the walk gets too."""
        core = self.core
        core.stats["join_locate_requests"] += 1
        if attempt:
            core.stats["join_locate_seed_resends"] += 1
        self._seed_resent = attempt > 0
        core.runtime.send_address(addr, NearbyRequest(self.nonce, -1))
        if attempt < core.config.join_probe_retries:
            nonce = self.nonce

            def again() -> None:
                if self.active and self.nonce == nonce and not self.answered:
                    self._ask_seed(addr, attempt + 1)

            delay = core.config.join_locate_wait_s * 2**attempt
            self._timer = core.runtime.call_later(delay, again)

    def reset(self) -> None:
        """Forget the discovery under way (if any) and cancel its timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.active = False
        self.answered = False
        self._round = 0
        self._asked = None
        self._replied = False
        self._done.clear()
        self._best = None
        self._stale = 0
        self._pending.clear()
        self._rtt.clear()
        self._cands.clear()

    def max_duration_s(self) -> float:
        """An upper bound of how long a discovery lasts once the seed answered: every round
        waits at most ``join_locate_wait_s`` per batch of probes, and each request at most
        ``join_locate_wait_s`` plus the largest retransmission timeout for its reply."""
        cfg = self.core.config
        batches = math.ceil(cfg.join_locate_probes / cfg.join_locate_batch)
        per_round = cfg.join_locate_wait_s * (batches + 1) + self.core.prox.config.max_rto_s
        return (cfg.join_locate_rounds + 1) * per_round

    def on_nearby_reply(self, src: NodeHandle, msg: NearbyReply) -> None:
        """Measure the RTT to the sender and to the nodes it listed that may be nearer than the
        nearest found so far, then take the next step of the walk."""
        entries = check_handles(msg.entries)
        rtts = check_hints(msg.rtts, len(entries))
        if type(msg.depth) is not int:
            raise ValueError("NearbyReply.depth must be an int")
        if not self.active or msg.nonce != self.nonce:
            return
        if self._asked is not None and src != self._asked:
            return  # replies bind to the node asked (the seed address: whoever answers it)
        if self._replied or src.id == self.core.id:  # a duplicate, a late reply, or us
            return
        core = self.core
        karn = self._asked is None and self._seed_resent  # the seed's request went twice
        self.answered = True
        self._replied = True
        self._asked = src
        self._done.add(src)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # The request and its reply are a round trip of our own: an RTT sample of the replier
        # (an upper bound of the true RTT — no answer leaves before its request arrives), so
        # the seed needs no probe, and its RTT turns the hints of round 0 into bounds too.
        # Unless the seed's request was sent again: which copy this answers is unknown, so
        # there is no sample (Karn's rule), and without one no bounds this round.
        a: float | None = None
        if not karn:
            core.prox.sample(src, core.runtime.now() - self._sent_at)
            a = core.prox.rtt(src) or 0.0
        elif (known := core.prox.rtt(src)) is not None:
            a = known
        hints = rtts if rtts else (-1.0,) * len(entries)
        if a is None:
            # unmeasured: probed as one more candidate, and the hints bound nothing
            hints = (-1.0,) * (len(entries) + 1)
            entries = (*entries, src)
        else:
            self._rtt[src] = a

        def promise(t: tuple[NodeHandle, float]) -> tuple[float, float, int]:
            # Triangle inequality: |a - h| <= rtt(us, it) <= a + h. Most promising first: the
            # smallest lower bound — nodes about as far from the replier as we are, i.e. in
            # the *other* branches at our level of a hierarchical network (the replier's own
            # neighbourhood, h ~ 0, is no nearer to us than the replier itself).
            h, hint = t
            if hint < 0.0 or a is None:
                return (math.inf, math.inf, int(h.id))
            return (abs(a - hint), a + hint, int(h.id))

        self._cands = sorted(zip(entries, hints, strict=True), key=promise)
        self._cands.reverse()  # popped from the end: most promising first
        self._a = a
        self._left = core.config.join_locate_probes
        self._batch(self._round)

    def _batch(self, rnd: int) -> None:
        """Probe the next few candidates of this round's reply, most promising first, pruning
        again with the nearest RTT found so far; with none left to probe, end the round.

        Probing in small batches (``join_locate_batch``) rather than all at once lets each
        batch's pongs tighten the bound that prunes the next: a candidate whose lower bound
        |a - h| is no better than the nearest node found cannot be nearer (the triangle
        inequality), and the candidates come sorted by that bound, so once one is pruned the
        rest of the hinted ones are too."""
        core = self.core
        prox = core.prox
        a = self._a
        near = core.near_enough_s()
        best = min(self._rtt.values(), default=math.inf)
        cands = self._cands
        batch = core.config.join_locate_batch
        started = 0
        while cands and started < batch and self._left > 0 and self._total_left > 0:
            h, hint = cands.pop()
            if h.id == core.id or h in self._rtt or h in self._pending or prox.is_dead(h):
                continue
            rtt = prox.rtt(h)
            if rtt is not None:  # measured already (an earlier round or join): no probe
                self._rtt[h] = rtt
                best = min(best, rtt)
                continue
            if best <= near or (a is not None and hint >= 0.0 and abs(a - hint) >= best):
                core.stats["join_locate_pruned"] += 1
                continue  # near enough found already, or it cannot be nearer than that
            self._left -= 1
            self._total_left -= 1
            started += 1
            self._pending.add(h)
            core.stats["join_locate_probes"] += 1
            # one ping (ProximityConfig.candidate_probe_retries): a candidate of rows 0-2, not
            # a node we rely on; a lost ping costs this round one candidate, not the walk
            prox.probe(h, self._pong_cb(h, rnd), hint=True, candidate=True)
        if not self._pending:
            cands.clear()
            self._step(rnd)
            return
        if self._timer is not None:
            self._timer.cancel()
        wait = core.config.join_locate_wait_s
        self._timer = core.runtime.call_later(wait, lambda: self._batch_timeout(rnd))

    def _batch_timeout(self, rnd: int) -> None:
        """A batch's pongs did not all come in time: go on without the silent ones."""
        if self._round != rnd or not self.active or self.core.stopped:
            return
        self._timer = None
        self._pending.clear()
        self._batch(rnd)

    def _pong_cb(self, h: NodeHandle, rnd: int) -> Callable[[float | None], None]:
        def done(rtt: float | None) -> None:
            if self._round != rnd or not self.active:
                return
            if rtt is not None:  # a straggler of an earlier batch still counts
                self._rtt[h] = self.core.prox.rtt(h) or rtt
            if h not in self._pending:
                return
            self._pending.discard(h)
            if not self._pending:
                self._batch(rnd)

        return done

    def _step(self, rnd: int) -> None:
        """A discovery round ended: ask the nearest node not asked yet for its routing rows,
        or end the discovery with the nearest node found.

        The walk (Castro et al. 2002 §4; FreePastry ``PNSApplication.getNearest``): the seed's
        leaf set (spread over the network), then rows 0-2 of the nearest node so far — deep
        rows hold few candidates per slot, so their entries are spread out and move the walk
        to the right region; row 0 holds the nearest of many, so it zooms in (FreePastry asks
        one row per request, deepest first; all rows in one request, with the hints pruning
        what is probed, take fewer round trips). It stops when ``join_locate_patience`` rounds
        in a row found no nearer node, after ``join_locate_rounds`` requests, when the probe
        budget of the whole discovery is spent, or once the nearest node found is within
        ``pns_near_enough_s``; a round that finds nothing nearer asks the next nearest node
        not asked yet (a small beam against local minima).
        """
        if self._round != rnd or not self.active or self.core.stopped:
            return
        core = self.core
        cfg = core.config
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending.clear()
        self._round += 1
        order = sorted(self._rtt, key=lambda h: (self._rtt[h], int(h.id)))
        best = order[0] if order else None
        asked = self._asked
        if rnd > 0:  # the seed's leaf set (round 0) is no step of the walk
            self._stale = 0 if best != self._best else self._stale + 1
        self._best = best
        nxt = next((h for h in order if h not in self._done), None)
        if (
            nxt is not None
            # a node near enough was found: no walk can do meaningfully better
            and (best is None or self._rtt[best] > self.core.near_enough_s())
            and self._round <= cfg.join_locate_rounds
            and self._stale < cfg.join_locate_patience
            and self._total_left > 0
        ):
            self._ask(nxt)
            return
        # every RTT measured while searching is a PNS sample for our own table
        for h in sorted(self._rtt, key=lambda h: int(h.id)):
            core.consider(h, probe=False)
        near = order[: cfg.announce_nearest]
        target = best if best is not None else asked
        self.reset()
        self._on_found(target, near)

    def _ask(self, nxt: NodeHandle) -> None:
        """Ask ``nxt`` for its routing rows 0-2; a silent node is skipped after a wait."""
        core = self.core
        cfg = core.config
        self._asked = nxt
        self._replied = False
        core.stats["join_locate_requests"] += 1
        self._sent_at = core.runtime.now()
        core.runtime.send(nxt, NearbyRequest(self.nonce, 0))
        nonce = self.nonce
        rnd = self._round

        def no_answer() -> None:
            if self.active and self.nonce == nonce and self._round == rnd and not self._replied:
                # it did not answer: forget it and go on from the next nearest node
                core.stats["join_locate_silent"] += 1
                self._rtt.pop(nxt, None)
                self._done.add(nxt)
                self._step(rnd)

        self._timer = core.runtime.call_later(
            cfg.join_locate_wait_s + core.prox.rto(nxt), no_answer
        )

    # ------------------------------------------------------------------ existing-node side
    def on_nearby_request(self, src: NodeHandle, msg: NearbyRequest) -> None:
        """Answer a joiner's discovery request (ready nodes only) with our leaf set (row -1) or
        our routing rows ``row`` .. ``row + 2``, with our RTTs as hints.

        Three rows — the whole table of rings up to ~10^5 nodes: row 0's near entries to zoom
        in, the deeper rows' spread-out ones to move on (two rows found the nearest node less
        often: 97 % of row-0 slots best at N = 2 000 against 99 %). Capped all the same: a
        discovery request comes from a node that is no member yet, so its answer amplifies."""
        core = self.core
        row = msg.row
        if type(row) is not int or not -1 <= row < core.table.nrows:
            raise ValueError(f"NearbyRequest row out of range: {row!r}")
        if not core.ready or src.id == core.id:
            return
        table = core.table
        entries = core.leaf.nodes() if row < 0 else table.rows_between(row, row + 2)
        rows = table.populated_rows()
        depth = rows[-1] + 1 if rows else 0
        core.runtime.send(src, NearbyReply(msg.nonce, row, entries, core.hints(entries), depth))
