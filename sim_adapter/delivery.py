"""Message delivery in a simulated :class:`~sim_adapter.network.Network`: what happens to a
message between two nodes. :class:`Delivery` is a mixin of the network.

A core's ``SimRuntime.send`` calls :meth:`Delivery._send`, which counts the message and turns it
into a delivery event ``latency.one_way_s(a, b)`` later, unless it is lost (``loss``,
independent per message), crosses a partition or goes to no node. A crashed receiver drops what
reaches it. In fidelity mode (:class:`~sim_adapter.simnode.Fidelity`) the event carries the
message's wire bytes and the receiver decodes them and sees the observed sender handle.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from overlay.errors import ConfigError
from overlay.handle import Address, NodeHandle
from overlay.ids import NodeId
from overlay.messages import Message
from sim_adapter.engine import Engine
from sim_adapter.simnode import Fidelity, SimNode

if TYPE_CHECKING:
    from sim_adapter.latency import LatencyModel

__all__ = ["Delivery"]


class Delivery:
    """The message-delivery side of a :class:`~sim_adapter.network.Network` (a mixin): sending,
    delivering, injecting, partitions and the traffic counters. The network state it uses is
    declared here for the type checker; ``Network.__init__`` sets it."""

    engine: Engine
    rng: random.Random
    nodes: list[SimNode]
    latency: LatencyModel
    loss: float
    fidelity: Fidelity | None
    message_count: int
    bytes_sent: int
    dropped_loss: int
    dropped_partition: int
    dropped_dead: int
    on_loss: Callable[[int, Address, Message], None] | None
    _send_to: NodeId | None
    _by_class: dict[type[Message], int]
    _encode: Callable[[Message], bytes] | None
    _partition: list[int] | None
    _ungrouped: int

    @property
    def msg_by_type(self) -> Counter[str]:
        """Messages sent so far, by message class name."""
        return Counter({t.__name__: n for t, n in self._by_class.items()})

    def _send(self, src: int, dst: Address, msg: Message) -> None:
        to = self._send_to
        self._send_to = None
        self.message_count += 1
        by = self._by_class
        t = type(msg)
        by[t] = by.get(t, 0) + 1
        fid = self.fidelity
        data = b""
        if fid is not None:
            got = fid.encode(msg)
            if got is None:
                return
            data = got
            self.bytes_sent += len(data)
        elif self._encode is not None:
            self.bytes_sent += len(self._encode(msg))
        if not isinstance(dst, int) or not 0 <= dst < len(self.nodes):
            self.dropped_dead += 1
            return
        if fid is not None and dst == src:  # live drops a frame signed by its own id
            fid.stats["self_dropped"] += 1
            return
        if self.loss and self.rng.random() < self.loss:
            self.dropped_loss += 1
            if self.on_loss is not None:
                self.on_loss(src, dst, msg)
            return
        part = self._partition
        if part is not None and part[src] != part[dst]:
            self.dropped_partition += 1
            return
        eng = self.engine
        when = eng.now + self.latency.one_way_s(src, dst)
        if fid is None:
            eng.push(when, self._deliver, (src, dst, msg))
        else:
            eng.push(when, self._deliver_wire, (self.nodes[src].id, src, dst, data, to))

    def _deliver(self, src: int, dst: int, msg: Message) -> None:
        node = self.nodes[dst]
        if not node.alive:
            self.dropped_dead += 1
            return
        node.core.receive(self.nodes[src].handle, msg)

    # fidelity mode: bytes on the wire, observed handles (sim_adapter/simnode.py)
    def _deliver_wire(
        self, sender: NodeId, src: int | str, dst: int, data: bytes, to: NodeId | None
    ) -> None:
        node = self.nodes[dst]
        if not node.alive:
            self.dropped_dead += 1
            return
        fid = self.fidelity
        assert fid is not None
        if to is not None and to != node.id:  # live: Verifier(own_id=...) drops it
            fid.stats["misdirected"] += 1
            return
        msg = fid.decode(data)
        if msg is not None:
            node.core.receive(fid.observed(sender, src), msg)

    def inject(self, src: NodeHandle, dst: SimNode, msg: Message, delay_s: float = 0.0) -> None:
        """Deliver ``msg`` to ``dst`` ``delay_s`` from now as if sent by ``src`` — any handle, a
        node of the network or not (tests of hostile input). In fidelity mode it crosses the wire
        and arrives from ``src.id`` at ``src.address``, as a signed datagram from there would."""
        if delay_s < 0:
            raise ConfigError("inject() needs delay_s >= 0")
        fid = self.fidelity
        eng = self.engine
        if fid is None:
            eng.push(eng.now + delay_s, self._deliver_as, (src, dst.index, msg))
            return
        data = fid.encode(msg)
        if data is not None:
            addr = src.address
            if not isinstance(addr, (int, str)):
                raise ConfigError(f"inject() needs an int or str address, got {addr!r}")
            eng.push(eng.now + delay_s, self._deliver_wire, (src.id, addr, dst.index, data, None))

    def _deliver_as(self, src: NodeHandle, dst: int, msg: Message) -> None:
        node = self.nodes[dst]
        if node.alive:
            node.core.receive(src, msg)
        else:
            self.dropped_dead += 1

    # ------------------------------------------------------------------ partitions
    def partition(self, groups: Sequence[Iterable[SimNode]]) -> None:
        """Cut the network: messages between different groups are dropped until ``heal()``.
        Nodes in no group form one more group of their own."""
        self._ungrouped = len(groups)
        label = [len(groups)] * len(self.nodes)
        for g, members in enumerate(groups):
            for m in members:
                label[m.index] = g
        self._partition = label

    def heal(self) -> None:
        """End the partition: every message is delivered again."""
        self._partition = None
