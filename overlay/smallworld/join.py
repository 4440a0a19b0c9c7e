"""Joining the small-world ring: a small state machine per joining node.

Theory of operation (PonD §2.2; Brunet's leaf → structured connection bootstrap):

::

    IDLE --join(seeds)--> ASKING --ConnectReply(JOIN)--> LINKING --all LinkAcks--> READY
                           |  ^                             |  --timeout, >= 1 link--^
                           |  +-- timeout: next seed, <-----+  timeout, no link   (on_done(True))
                           |      timeout doubles                                   ^
                           +--timeout, linked to by live nodes on both sides--------+
                           +--retries exhausted--> FAILED (on_done(False))

* The joiner knows seeds only by address, so it sends :class:`JoinRequest` to one of them with
  ``send_address``. The seed routes a :class:`ConnectRequest` of kind JOIN to the joiner's own
  id through the KBR engine (per-hop acks, reroutes). It is delivered at the node closest to
  the joiner's id other than the joiner, which replies with itself and the nodes it knows
  closest to that id: the joiner's future near neighbours on both sides.
* The joiner links to every candidate that fits its near window (``Link``; the far end adds
  the joiner and trims whoever the joiner pushed out of its own window) and becomes ready once
  they all acknowledged, or after ``join_link_timeout_s`` if at least one did (silent
  candidates are suspected and probed; maintenance replaces them) — on a node that scales its
  RTOs to the network, after three RTOs on the scale of the acks that came, never less than the
  initial RTO (``_scale_link_wait``). If *none* acknowledged —
  the candidates cannot reach us, as when we advertise an address that is not ours — the
  attempt failed: the silent candidates are dropped and the next seed is asked; when the
  retries are exhausted the join fails. A node with no link to show for it is not part of the
  ring and must not say "ready". A joiner still waiting for a seed's answer when its timeout
  fires, but which live nodes on both sides have linked meanwhile (their windows placed it),
  is in the ring and becomes ready instead of asking the next seed. Near lists that reach a
  joining node are ignored (only acknowledged links count); once ready, the node sends its
  window to its new neighbours, asking for the nodes it still misses — other nodes that joined
  into the same gap at the same time, which the JOIN reply could not know (exchange.py).
  Shortcuts are created right after, as in Brunet where the shortcut overlord starts once the
  node is connected.
* An empty seed list starts a new ring: ready at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from overlay.errors import OverlayError
from overlay.handle import Address, NodeHandle
from overlay.smallworld import exchange, maintenance, offers
from overlay.smallworld.estimate import desired_shortcuts
from overlay.smallworld.messages import NEAR, JoinRequest
from overlay.smallworld.state import JoinState, SmallWorldHost

log = logging.getLogger(__name__)


def begin(
    core: SmallWorldHost, seeds: Sequence[Address], on_done: Callable[[bool], None] | None
) -> None:
    """Start a join through ``seeds`` (none: a new ring, ready at once)."""
    if core.join_state is not None or core.ready:
        raise OverlayError("join() called on a node that is already joining or joined")
    if core.stopped:
        raise OverlayError("join() called on a stopped node")
    seeds_t = tuple(seeds)
    core.seeds = seeds_t
    if not seeds_t:
        core.ready = True
        core.stats["joined"] += 1
        if on_done is not None:
            on_done(True)
        return
    core.join_state = JoinState(seeds_t, on_done)
    _attempt(core)


def rejoin(core: SmallWorldHost) -> None:
    """An isolated node (every connection failed) asks its seeds again, without a callback."""
    if core.join_state is not None or not core.seeds or core.stopped:
        return
    core.stats["rejoins"] += 1
    seeds = core.seeds
    core.join_state = JoinState(seeds, None, core.runtime.rng.randrange(len(seeds)))
    _attempt(core)


def probe_partition(core: SmallWorldHost, address: Address) -> None:
    """Partition healing (FreePastry ``PartitionHandler``; Pastry's here is the same): a ready
    node asks a node it declared dead a while ago where it belongs, by a join request. If that
    node is alive — in a ring of its own since a partition cut the two apart — its ring routes
    the request to the nodes closest to our id there; we link to them and the near-list
    exchange merges the rings (exchange.py: what makes concurrent joins converge). If it is in
    our ring after all, the reply names neighbours we hold. One try; unanswered, it ends
    quietly."""
    if core.join_state is not None or core.stopped or not core.ready:
        return
    core.stats["partition_probes"] += 1
    st = core.join_state = JoinState((address,), None)
    st.probe = True
    _attempt(core)


def _attempt(core: SmallWorldHost) -> None:
    st = core.join_state
    assert st is not None
    st.token = core.next_token()
    seed = st.seeds[(st.offset + st.attempt) % len(st.seeds)]
    core.runtime.send_address(seed, JoinRequest(core.handle, st.token))
    token = st.token
    delay = core.config.join_timeout_s * (2**st.attempt)
    st.timer = core.runtime.call_later(delay, lambda: _timeout(core, token))


def _timeout(core: SmallWorldHost, token: int) -> None:
    st = core.join_state
    if st is None or st.token != token or st.linking or core.stopped:
        return
    if st.probe:
        # the node we asked is gone indeed (or cut off still): nothing to heal, no retry; an
        # isolation check the probe kept from rejoining runs now
        core.join_state = None
        core.stats["partition_probes_unanswered"] += 1
        maintenance.check_isolated(core)
        return
    if _found_by_ring(core):
        # No reply from the seed (under 5-minute sessions often a seed that has crashed since
        # we arrived), but the ring has found us meanwhile: live nodes on both sides linked to
        # us, as their own joins and exchanges placed us in their windows. Asking seed after
        # seed would keep us unready for minutes while those nodes route to us the keys we are
        # closest to and we send them back: traced with ``near_per_side`` = 3 (seed 5), three
        # such joiners in one stretch looped lookups between them and their neighbours until
        # the TTL or the lookup timeout (11 lookups lost, 7 joins failed). We are in the ring:
        # ready now; the push in ``_finish`` asks the new neighbours for the nodes we miss.
        core.stats["join_found_by_ring"] += 1
        _finish(core, True)
        return
    st.attempt += 1
    if st.attempt > core.config.join_retries:
        log.debug("join of %s failed after %d attempts", core.id.short(), st.attempt)
        _finish(core, False)
        return
    core.stats["join_retries"] += 1
    _attempt(core)


def on_reply(
    core: SmallWorldHost,
    responder: NodeHandle,
    nodes: tuple[NodeHandle, ...],
    token: int,
    shortcuts: tuple[NodeHandle, ...] = (),
) -> None:
    """The routed JOIN request reached the node closest to our id; ``shortcuts`` pairs a
    neighbour of each of its own shortcuts with that shortcut: the neighbours are offered a Link
    once we are ready (``offers.py``)."""
    st = core.join_state
    if st is None or st.linking or token != st.token:
        # Late, duplicate or forged: it answers no join of ours. Its node list is hearsay and
        # is ignored; the responder itself is the (authenticated) sender, a live node that may
        # still be one of our near neighbours.
        core.stats["connect_reply_unsolicited"] += 1
        core.consider_near((responder,))
        return
    if st.timer is not None:
        st.timer.cancel()
    if st.probe:
        core.stats["partition_probes_answered"] += 1
        g = core.gone
        if g:  # the node we asked answered for its ring: asking it again would tell us nothing
            for h in [h for h in g if h.address == st.seeds[0]]:
                del g[h]
    st.linking = True
    st.inherit = shortcuts
    base = core.config.near_per_side
    if len(nodes) > 2 * base + 2:
        # the responder names 2k + 2 nodes for its own width k: it keeps a widened window
        # (churn.py), so we link that many a side now rather than widen once we are ready
        core.adopt_near((len(nodes) - 2) // 2)
    added = core.consider_near((responder, *nodes), token)
    st.pending = set(added)
    if not st.pending:
        # nothing new to link: ready only if we already hold a live near connection
        if _linked(core, st):
            _finish(core, True)
        else:
            _attempt_failed(core, token)
        return
    st.linked_at = core.runtime.now()
    st.link_deadline = st.linked_at + core.config.join_link_timeout_s
    st.ack_rtt_max = 0.0
    st.timer = core.runtime.call_later(
        core.config.join_link_timeout_s, lambda: _link_timeout(core, token)
    )


def on_link_ack(core: SmallWorldHost, src: NodeHandle, token: int) -> None:
    """A near candidate acknowledged our link; the join ends when all have."""
    st = core.join_state
    if st is None or not st.linking or token != st.token or src not in st.pending:
        return
    st.pending.discard(src)
    if not st.pending:
        _finish(core, True)
        return
    _scale_link_wait(core, st)


def _scale_link_wait(core: SmallWorldHost, st: JoinState) -> None:
    """Shorten the wait for the candidates still silent to the network's scale, where the
    node scales its RTOs to the network (``ProximityConfig.network_rto_samples`` > 0: live
    nodes; off in the simulations' default).

    Traced live (``bench chaos``): the JOIN reply of a node restarted after a kill named
    nodes of the killed process, dead but not yet detected, and each such join waited the
    whole ``join_link_timeout_s`` (3 s) on loopback while the live neighbours, which had
    linked the joiner, sent it lookups it could only hold. The acks that came are round trips
    of this join: the wait, three initial RTOs by default, becomes three RTOs on their scale
    (:meth:`Proximity.wait_on_scale`, the rule of :meth:`Proximity.unmeasured_rto`) — but
    never less than the initial RTO from the Links. The silent candidates were never measured, and
    a far live one must not be passed over for a guess from the others
    (``Proximity.verdict_wait``'s rule); that floor, not the number of acks, is what guards
    them, so one ack sets the scale. Passed over, a silent candidate is only suspected and
    probed, as at the full timeout (:func:`_link_timeout`)."""
    now = core.runtime.now()
    st.ack_rtt_max = max(st.ack_rtt_max, now - st.linked_at)
    wait = core.prox.wait_on_scale(3.0, st.ack_rtt_max)
    if wait is None:
        return
    deadline = st.linked_at + min(core.config.join_link_timeout_s, wait)
    if deadline >= st.link_deadline:
        return
    st.link_deadline = deadline
    if st.timer is not None:
        st.timer.cancel()
    token = st.token
    core.stats["join_link_wait_scaled"] += 1
    st.timer = core.runtime.call_later(max(0.0, deadline - now), lambda: _link_timeout(core, token))


def _found_by_ring(core: SmallWorldHost) -> bool:
    """True if we hold live near connections on both sides while still asking a seed (a
    joiner's table holds only nodes that acknowledged a Link of ours or sent us one: each of
    them reached us)."""
    bad = core.prox.bad
    t = core.table
    return any(h not in bad for h in t.right()) and any(h not in bad for h in t.left())


def _linked(core: SmallWorldHost, st: JoinState) -> bool:
    """True if a near connection other than the still-silent candidates is in our table: one
    that acknowledged our Link, or that linked to us (either way it reached us)."""
    bad = core.prox.bad
    return any(h not in st.pending and h not in bad for h in core.table.near_nodes())


def _link_timeout(core: SmallWorldHost, token: int) -> None:
    st = core.join_state
    if st is None or st.token != token or core.stopped:
        return
    core.stats["join_link_timeouts"] += 1
    if not _linked(core, st):
        _attempt_failed(core, token)
        return
    for h in st.pending:
        core.prox.suspect(h)
    _finish(core, True)


def _release(core: SmallWorldHost, st: JoinState) -> None:
    """Route the messages held during LINKING: delivered here if we are ready now, else (still
    joining) sent back to their previous hops, which route them on avoiding us."""
    held = st.held
    st.held = None
    if held:
        core.release_held(held)


def _attempt_failed(core: SmallWorldHost, token: int) -> None:
    """No candidate acknowledged a link: forget them and ask the next seed (or fail)."""
    st = core.join_state
    assert st is not None
    core.stats["join_no_link"] += 1
    _release(core, st)
    for h in list(st.pending):
        core.drop(h, NEAR)
    st.pending = set()
    st.linking = False
    _timeout(core, token)


def _finish(core: SmallWorldHost, ok: bool) -> None:
    st = core.join_state
    if st is None:
        return
    if not ok:
        _release(core, st)  # still joining: they go back the way they came
    core.join_state = None
    if st.timer is not None:
        st.timer.cancel()
    if ok:
        was_ready = core.ready
        core.ready = True
        core.stats["joined"] += 1
        exchange.push_near(core)  # ask the new neighbours for the nodes we still miss
        if st.inherit and core.config.inherit_shortcuts:
            # (neighbour of a responder's shortcut, that shortcut) pairs, see linking.py
            want = desired_shortcuts(core.table.n_hat, core.config)
            left = want - len(core.table.effective_out())
            inh = st.inherit
            for cand in inh[::2]:
                # (no replacement kept: the responder's own shortcut would be a second link
                # of its node to our neighbourhood)
                left -= offers.offer(core, (cand,), left)
        maintenance.check_shortcuts(core)
        if was_ready:
            _release(core, st)
            return
    if st.on_done is not None:
        st.on_done(ok)
    if ok:
        _release(core, st)  # active now (the callback told the world): ours are delivered here


def cancel(core: SmallWorldHost) -> None:
    """Abandon the join under way (the node stops or rejoins)."""
    st = core.join_state
    core.join_state = None
    if st is not None and st.timer is not None:
        st.timer.cancel()
