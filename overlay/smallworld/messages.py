"""Messages of the small-world ring (wire tags 60–89, see ``overlay/messages.py``).

Theory of operation (Brunet's linking protocol, simplified to datagrams; PonD §2.2):

* ``JoinRequest`` is the only message sent to a bare address: the joiner asks a seed to route
  a :class:`ConnectRequest` of kind ``JOIN`` to the joiner's own id.
* ``ConnectRequest`` is not a top-level message: it is the payload of a KBR ``RouteMsg`` for
  the internal application :data:`LINK_APP`, so it inherits per-hop acks and reroutes. It is
  routed greedily to ``target`` and never delivered to (nor forwarded through) its ``origin``:
  the node that finally holds it is the one closest to ``target`` other than the requester.
  Kinds: ``JOIN`` (a newcomer looks for its place), ``NEAR`` (repair: a node looks for its own
  place again), ``SHORTCUT`` (a Kleinberg far link towards a drawn target).
* ``ConnectReply`` goes straight back to the origin with the responder and the nodes the
  responder knows closest to ``target``; ``Link``/``LinkAck`` create the connection on the far
  end (connections are bidirectional, as Brunet edges are), ``Unlink`` removes it.
* ``NearQuery`` is the near-connection repair walk: it starts at the requester and is forwarded
  node to node *in one direction* (``side``), each hop to the connection that lies nearest to
  the requester on that side, until it reaches a node that knows nobody nearer: the
  requester's true neighbour on that side (Brunet's left/right delivery modes). That node
  answers with ``NearReply`` (the nodes it knows closest to the requester) and links the
  requester. Its first hop is the requester's current nearest neighbour on that side, so
  the common case — refilling the second near connection — takes two hops; a wide gap left
  by several failures is crossed by shortcuts.
* ``NearList`` is the neighbour exchange (Brunet's status exchange between near neighbours):
  a node sends its near window to its near neighbours whenever the window changes, and every
  ``near_exchange_s`` to the closest one on each side. The receiver links the nodes that
  belong in its own window — the sender at once (it is the authenticated sender), the others
  only once they acknowledged a ``Link``
  (hearsay must not put unreachable handles in a table) — and, when ``ask`` is set and it
  knows nodes that belong in the sender's window but are missing from the list, answers with
  a ``NearList`` of its own (``ask`` clear, so exchanges end). Each list echoes the last
  stamp the sender got from the receiver, so the closest neighbours measure their RTT from the
  lists (TCP's timestamp echo, RFC 7323 §4) and need no pings while both are alive.
"""

from __future__ import annotations

import attrs

from overlay.handle import NodeHandle
from overlay.ids import NodeId
from overlay.messages import Message, register

#: name of the internal KBR application that carries ConnectRequest payloads.
LINK_APP = "smallworld.link"

# sides of the ring, for NearQuery
RIGHT = 0  # clockwise
LEFT = 1  # counter-clockwise
SIDES = (RIGHT, LEFT)

# ConnectRequest / Link kinds
JOIN = 0
NEAR = 1
SHORTCUT = 2
KINDS = (JOIN, NEAR, SHORTCUT)


@register(60)
@attrs.frozen(slots=True)
class JoinRequest(Message):
    """Joiner → seed (by address): please route my ConnectRequest(JOIN) to my id."""

    origin: NodeHandle
    token: int


@register(61)
@attrs.frozen(slots=True)
class ConnectRequest(Message):
    """Routed payload: link ``origin`` to the node closest to ``target`` (origin excluded)."""

    origin: NodeHandle
    target: NodeId
    kind: int
    token: int


@register(62)
@attrs.frozen(slots=True)
class ConnectReply(Message):
    """Responder → origin: here I am, and these are the nodes I know closest to the target."""

    responder: NodeHandle
    kind: int
    token: int
    nodes: tuple[NodeHandle, ...]
    #: JOIN replies: for each of the responder's own shortcuts whose neighbours it knows, a
    #: neighbour of it and the shortcut, in pairs — the joiner next to the responder may take
    #: them over (``offers.py``); empty otherwise.
    shortcuts: tuple[NodeHandle, ...] = ()


@register(63)
@attrs.frozen(slots=True)
class Link(Message):
    """Add the sender to your connections (``kind`` says why); answered by LinkAck."""

    kind: int
    token: int


@register(64)
@attrs.frozen(slots=True)
class LinkAck(Message):
    """Link receiver → sender: the near/join connection is in place (echoes the token)."""

    token: int


@register(65)
@attrs.frozen(slots=True)
class Unlink(Message):
    """The sender dropped its connection to you (trimmed near / shortcut, or declined)."""

    kind: int


@register(66)
@attrs.frozen(slots=True)
class NearQuery(Message):
    """Find ``origin``'s nearest neighbour on ``side``; ``hops`` counts the walk (TTL)."""

    origin: NodeHandle
    side: int
    hops: int


@register(67)
@attrs.frozen(slots=True)
class NearReply(Message):
    """The requester's true neighbour on a side → requester, ending a NearQuery walk: the nodes it
    knows closest to the requester."""

    hop: int
    nodes: tuple[NodeHandle, ...]


@register(68)
@attrs.frozen(slots=True)
class NearList(Message):
    """The sender's near window (and, in an answer, the nodes the receiver is missing in its own);
    ``ask``: answer if you know nodes that belong in my window but are not in ``nodes``.

    ``stamp`` is the sender's clock at sending; ``echo`` the last stamp the sender received
    from the receiver (-1: none yet) and ``held`` how long the sender had held it, so that
    the receiver measures the round trip (now − echo − held) without a ping of its own. Only
    durations cross the wire: the two clocks need not agree.
    """

    nodes: tuple[NodeHandle, ...]
    ask: bool
    stamp: float
    echo: float
    held: float
