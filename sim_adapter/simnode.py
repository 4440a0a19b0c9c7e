"""One simulated node (its runtime and lookup application), the narrow views of a network that
they and analytic walks need, and the simulator's fidelity mode.

Kept apart from :mod:`sim_adapter.network` so that modules the network uses (the analytic
query of :mod:`sim_adapter.fastquery`) can name these types without importing the network.

Fidelity mode (``Network(fidelity=True)``, :class:`Fidelity`): the simulator delivers what a
live node's receive loop would hand its core (``overlay.live.node``), not the sender's Python
object. Every message is encoded with ``overlay.wire`` when sent and decoded — with the wire's
type checks and the message classes' validators, the trust boundary — when delivered; one that
does not survive is dropped and counted. The receiver gets the handle a signed transport
observes: the sender's (key-proven) id with the address the message came from, interned as live
does, whatever the sender's core says about itself. Messages a node addresses to itself are
dropped (live drops frames signed by its own id), so are messages sent to a handle whose id is
not the id of the node at its address (live: the signed envelope names the receiver's id and the
node there drops it as ``misdirected``), and a node whose join failed does not count as live (a
live ``Node.join`` raises and the node goes away), so the oracle never expects it to own keys.
"""

from __future__ import annotations

import logging
import os
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from overlay.handle import Address, NodeHandle
from overlay.ids import NodeId
from overlay.kbr import BaseApplication, KbrCore
from overlay.messages import Message
from overlay.wire import Wire, WireError, encode_message, intern_handle
from sim_adapter.engine import Engine, EngineTimer

if TYPE_CHECKING:
    from sim_adapter.latency import LatencyModel

__all__ = [
    "FIDELITY_DEFAULT",
    "Fidelity",
    "Lookup",
    "LookupApp",
    "LookupState",
    "NetworkView",
    "SimHost",
    "SimNode",
    "SimRuntime",
]

log = logging.getLogger(__name__)

#: ``Network(fidelity=None)`` takes this: on when the environment sets FLOCKRING_SIM_FIDELITY=1
FIDELITY_DEFAULT = os.environ.get("FLOCKRING_SIM_FIDELITY", "") not in ("", "0")


class SimNode:
    """One simulated node: its core plus bookkeeping."""

    __slots__ = ("alive", "core", "handle", "id", "index")

    def __init__(self, index: int, handle: NodeHandle, core: KbrCore) -> None:
        self.index = index
        self.id = handle.id
        self.handle = handle
        self.core = core
        self.alive = True

    def __repr__(self) -> str:
        return f"SimNode({self.index}, {self.id.short()}, alive={self.alive})"


class SimHost(Protocol):
    """What a node's runtime and lookup application use of their :class:`Network`."""

    @property
    def rng(self) -> random.Random:
        """The network's one seeded generator."""

    @property
    def engine(self) -> Engine:
        """The event engine."""

    @property
    def _lookups(self) -> dict[int, LookupState]:
        """Lookups in flight, by id."""

    #: the id the next ``_send`` is meant for (set by ``SimRuntime.send``, read and cleared
    #: by ``_send``: a side channel, so tests can still wrap ``_send(src, dst, msg)``)
    _send_to: NodeId | None

    def _send(self, src: int, dst: Address, msg: Message) -> None:
        """Send ``msg`` from node ``src`` to address ``dst``."""

    def _lookup_delivered(self, lid: int, at: NodeId) -> None:
        """Lookup ``lid`` reached node ``at``."""


class Lookup(NamedTuple):
    """Outcome of one lookup: who answered, over how many hops, after how long."""

    result: NodeId | None
    hops: int
    latency_s: float


class SimRuntime:
    """The Runtime a simulated core sees (one small object per node)."""

    __slots__ = ("engine", "index", "net", "node")

    #: virtual time has no event loop to wait in: RTT samples are the latency model's alone
    timing_noise_s = 0.0

    def __init__(self, net: SimHost, index: int) -> None:
        self.net = net
        self.engine = net.engine
        self.index = index
        self.node: SimNode | None = None  # set once the SimNode exists

    @property
    def rng(self) -> random.Random:
        """The network's seeded generator (shared by every node)."""
        return self.net.rng

    def now(self) -> float:
        """Virtual time, seconds."""
        return self.engine.now

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> EngineTimer:
        """Schedule ``fn`` in the event loop (silent once this node crashed)."""
        return self.engine.call_later(delay_s, fn, self.node)

    def send(self, dst: NodeHandle, msg: Message) -> None:
        """Deliver ``msg`` to ``dst`` after the latency model's delay (or lose it)."""
        net = self.net
        net._send_to = dst.id  # the receiver id a signed envelope names (fidelity checks it)
        net._send(self.index, dst.address, msg)

    def send_address(self, address: Address, msg: Message) -> None:
        """Send to a bare address (bootstrap), as ``send``."""
        self.net._send(self.index, address, msg)


class LookupState:
    """Progress of one ``Network.lookup``."""

    __slots__ = ("done", "hops", "key", "result", "t0", "t1")

    def __init__(self, key: NodeId, t0: float) -> None:
        self.key = key
        self.t0 = t0
        self.t1 = -1.0
        self.hops = 0
        self.result: NodeId | None = None
        self.done = False


class LookupApp(BaseApplication):
    """Per-node measuring application for ``Network.lookup``."""

    __slots__ = ("net", "node_id")

    def __init__(self, net: SimHost, node_id: NodeId) -> None:
        self.net = net
        self.node_id = node_id

    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        """A lookup reached the responsible node: record where and when."""
        if type(payload) is int:  # anything else is not one of ours (fidelity: from the wire)
            self.net._lookup_delivered(payload, self.node_id)

    def forward(self, key: NodeId, payload: Any, next_hop: NodeHandle) -> NodeHandle | None:
        """Count the hop; the lookup goes on unchanged."""
        st = self.net._lookups.get(payload) if type(payload) is int else None
        if st is not None:
            st.hops += 1
        return next_hop


class NetworkView(Protocol):
    """What an analytic walk reads of a :class:`~sim_adapter.network.Network`."""

    @property
    def nodes(self) -> Sequence[SimNode]:
        """Every node ever spawned, by index (dead ones included, ``alive`` False)."""

    @property
    def latency(self) -> LatencyModel:
        """The network's latency model."""

    @property
    def loss(self) -> float:
        """Per-message loss probability."""

    @property
    def seed(self) -> int:
        """The network's seed."""


class Fidelity:
    """What fidelity mode does to one message: encode, decode, observed sender handle.

    Counters (``stats``): ``encode_errors`` (an unencodable message: a bug, logged), ``decoded``
    and the wire's rejections (``bad_message``, ``unknown_tag``, ``malformed``, ``too_deep``),
    ``self_dropped`` (messages a node addressed to itself), ``misdirected`` (sent to a handle
    whose id is not the receiver's), ``failed_joins``.
    """

    __slots__ = ("stats", "wire")

    def __init__(self) -> None:
        self.wire = Wire()
        #: the wire's own counters, plus the fidelity mode's
        self.stats: Counter[str] = self.wire.counters

    def encode(self, msg: Message) -> bytes | None:
        """The wire bytes of ``msg``, or None (counted and logged: the live node cannot send it)."""
        try:
            return encode_message(msg)
        except WireError:
            self.stats["encode_errors"] += 1
            log.exception("fidelity: cannot encode %s", type(msg).__name__)
            return None

    def decode(self, data: bytes) -> Message | None:
        """The message a live receiver would get from ``data``, or None (counted)."""
        return self.wire.decode(data)

    @staticmethod
    def observed(sender: NodeId, address: str | int) -> NodeHandle:
        """The handle a live receiver builds: proven id, observed address, interned."""
        return intern_handle(sender.to_bytes_be(), address)
