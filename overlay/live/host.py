"""The narrow interface the trio driver's parts see of an ``overlay.Node``.

The timer runtime (:mod:`overlay.live.runtime`) and the application endpoints
(:mod:`overlay.live.apps`) need a handful of the node's services: its handle, its counters,
whether it is closed, the running core and a way to send a message or hand over a control
reply. They type against this protocol instead of the ``Node`` class, so the node module can
import them without an import cycle, and so they can be tested against a small fake.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Protocol

from overlay.handle import Address, NodeHandle
from overlay.ids import NodeId
from overlay.messages import Message

if TYPE_CHECKING:
    from overlay.kbr import KbrCore

__all__ = ["NodeHost"]


class NodeHost(Protocol):
    """What the driver's runtime and endpoints use of the node that owns them."""

    @property
    def id(self) -> NodeId:
        """This node's id."""

    @property
    def handle(self) -> NodeHandle:
        """This node's handle (id and transport address)."""

    @property
    def closed(self) -> bool:
        """True once the node has been closed or crashed."""

    @property
    def counters(self) -> Counter[str]:
        """The driver's event counters (mutable)."""

    @property
    def running_core(self) -> KbrCore | None:
        """The core while the node runs, else None."""

    def send_message(self, address: Address, msg: Message, peer: NodeId | None) -> None:
        """Encode, sign and send ``msg``."""

    def send_to_member(self, address: Address, msg: Message, peer: NodeId) -> None:
        """Encode, authenticate and send ``msg`` to another member of the overlay."""

    def send_unbound(self, address: Address, msg: Message, peer: NodeId | None) -> None:
        """Encode, sign and send ``msg`` bound to no receiver id (a relayed lookup answer)."""

    def deliver_reply(self, msg: Message) -> None:
        """Hand a control reply to the request waiting for it."""

    def relay_reply(self, msg: Message) -> None:
        """Answer a control client whose lookup this node routed (it is responsible for the
        key; ``msg`` is the ``LookupReply``)."""

    def require_core(self) -> KbrCore:
        """The running core, or raise ``NotReadyError``."""

    def require_ready(self) -> KbrCore:
        """The running core once joined, or raise ``NotReadyError``."""
