"""The internal link application: connect requests routed through the KBR engine.

Theory of operation (Brunet's linking protocol, PonD §2.2; Symphony, Manku et al. 2003):
a :class:`~overlay.smallworld.messages.ConnectRequest` travels as the payload of routed messages
of the application :data:`~overlay.smallworld.messages.LINK_APP`, so it has the engine's per-hop
acks and reroutes. A JOIN request goes to the node closest to the joiner's id *other than the
joiner* (:meth:`LinkApp.forward` never hands it back), which answers with the nodes it knows
closest to that id. A SHORTCUT request goes to the node closest to its Kleinberg-drawn target;
with ``shortcut_accept_fraction`` > 0 (off by default) the first node on its path within that
fraction of the drawn distance answers instead (docs/smallworld.md, "Short sessions"). Its
origin then links the answering node directly.
"""

from __future__ import annotations

from typing import Any

from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.ids import ring_distance as _rd
from overlay.smallworld.messages import JOIN, KINDS, SHORTCUT, ConnectReply, ConnectRequest
from overlay.smallworld.state import SmallWorldHost
from overlay.smallworld.validate import MalformedInput, check_handle, check_int

__all__ = ["LinkApp", "on_connect_request"]


class LinkApp:
    """The internal KBR application that carries :class:`ConnectRequest` payloads. Its senders
    retry end to end (``BaseApplication.end_to_end``), so ``register`` exempts its messages
    from custody (``SmallWorldCore.ensure_link_app``)."""

    __slots__ = ("core",)
    end_to_end = True

    def __init__(self, core: SmallWorldHost) -> None:
        self.core = core

    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        """We are the node closest to ``key`` other than the requester (or near enough)."""
        on_connect_request(self.core, payload)

    def forward(self, key: NodeId, payload: Any, next_hop: NodeHandle) -> NodeHandle | None:
        """Route on, never back to the requester; answer a shortcut request here if this node
        is near enough to its target."""
        if not isinstance(payload, ConnectRequest):
            return None  # junk under our app name: stop it here (counted by the base)
        origin = payload.origin
        core = self.core
        if payload.kind == SHORTCUT and origin.id != core.id:
            # A shortcut needs a node at about the drawn distance, not the one closest to the
            # target: the first node on the path within a fraction of that distance answers.
            t = payload.target
            frac = core.config.shortcut_accept_fraction
            if frac > 0 and isinstance(t, int) and _rd(core.id, t) <= frac * _rd(origin.id, t):
                core.stats["shortcut_accepted_early"] += 1
                return core.handle
        if next_hop.id != origin.id:
            return next_hop
        # Never hand a connect request back to its requester: the node we want is the one
        # closest to the target *other than* the requester.
        alt = core.next_hop(key, {origin})
        return alt if alt is not None else core.handle

    def update(self, handle: NodeHandle, joined: bool) -> None:
        """Near-window changes mean nothing to the link application."""
        return None


def on_connect_request(core: SmallWorldHost, p: object) -> None:
    """We are the node closest to ``p.target`` other than its origin."""
    if not isinstance(p, ConnectRequest):
        raise MalformedInput("connect payload is not a ConnectRequest")
    origin = check_handle(p.origin)
    if p.kind not in KINDS:
        raise MalformedInput(f"unknown connect kind {p.kind!r}")
    check_int(p.target)
    token = check_int(p.token)
    if origin.id == core.id:
        # Routed straight back to us: no other node is closer to the target.
        if p.kind == SHORTCUT:
            core.stats["shortcut_attempt_wasted"] += 1
            core.shortcut_pending = max(0, core.shortcut_pending - 1)
        return
    shortcuts: tuple[NodeHandle, ...] = ()
    if p.kind == SHORTCUT:
        # The origin in a routed request is unauthenticated: it becomes an in-connection
        # only once it links to us directly (its Link, signed by its own key on live nodes).
        # Our neighbours closest to the target replace us there should we fail (offers.py).
        nodes = core.closest_known(p.target, 2, origin.id, with_self=False)
    else:
        k = 2 * core.table.near + 2
        nodes = core.closest_known(p.target, k, origin.id, with_self=False)
        alts = core.shortcut_alts
        if p.kind == JOIN and core.config.inherit_shortcuts and alts:
            # The joiner will sit next to us: our own shortcuts are at its distances too. We
            # name a neighbour of each (one its reply named), not the shortcut itself: two
            # adjacent nodes linked to one far node make it spend two of its links on one
            # region (measured: lookups took 5 % more hops).
            # Pairs (neighbour, shortcut): the shortcut replaces the neighbour should it fail.
            bad = core.prox.bad
            shortcuts = tuple(
                x
                for h in core.table.effective_out()
                if (a := alts.get(h)) and a[0] not in bad and a[0].id != origin.id
                for x in (a[0], h)
            )
    core.runtime.send(origin, ConnectReply(core.handle, p.kind, token, nodes, shortcuts))
