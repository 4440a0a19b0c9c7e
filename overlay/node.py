"""``overlay.Node``: the trio driver that runs a sans-io overlay core on a real transport.

Theory of operation (DESIGN §1.1, §3; the h11/aioquic "sans-io core + thin driver" pattern):

* The node implements :class:`overlay.runtime.Runtime` for its core: ``now()`` is
  ``trio.current_time()`` (so ``trio.testing.MockClock`` drives a whole swarm in virtual time),
  ``call_later`` pushes onto *one* heap served by *one* timer task, ``send`` encodes the message
  (``overlay/wire.py``), seals it (``transports/auth.py``: Ed25519 signature, sequence number,
  reply address) and hands the bytes to the transport's non-blocking ``send_nowait``.
* One receive task reads the transport, opens each envelope (limits, signature, replay window),
  decodes the message (type-checked: the trust boundary) and calls ``core.receive(src, msg)``
  with ``src = NodeHandle(SHA-1(verified key), reply address)``. Anything malformed, forged,
  replayed or unsigned is dropped and counted in :attr:`Node.stats`; nothing raises into the loop.
* All tasks live in one supervisor task inside the nursery the ``async with`` opens; leaving the
  block stops the core (a clean leave where the overlay offers one) and cancels them; no task is
  ever spawned fire-and-forget.
* The trio world meets the callback world in small adapters: :meth:`Node.join` waits on the
  core's ``on_done``; :class:`Endpoint` turns ``deliver`` upcalls into an async iterator;
  :meth:`Node.probe` waits on a proximity callback. Timeouts map to our own exceptions.
* A small read-only control protocol (status and lookup requests, tags 16–19) lets the CLI and
  operators ask a running node about itself and about who is responsible for a key.
"""

from __future__ import annotations

import heapq
import importlib
import logging
import math
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any

import attrs
import trio

from overlay.errors import (
    ConfigError,
    JoinError,
    NotReadyError,
    OverlayError,
)
from overlay.handle import Address, NodeHandle
from overlay.identity import Identity
from overlay.ids import NodeId
from overlay.kbr import KbrCore
from overlay.messages import Message, register
from overlay.multicast import Multicast
from overlay.multicast import attach as attach_multicast
from overlay.wire import Wire, WireError, encode_message, intern_handle
from transports.address import AddressError, parse_address
from transports.auth import Signer, Verifier
from transports.base import Transport
from transports.codec import Limits

__all__ = [
    "ControlClient",
    "Delivery",
    "Endpoint",
    "LookupReply",
    "LookupRequest",
    "Node",
    "ProbeError",
    "StatusReply",
    "StatusRequest",
]

log = logging.getLogger(__name__)

CoreFactory = Callable[..., KbrCore]

_OVERLAYS: dict[str, tuple[str, str]] = {
    "pastry": ("overlay.pastry.core", "PastryCore"),
    "smallworld": ("overlay.smallworld.core", "SmallWorldCore"),
}

LOOKUP_APP = "flockring.lookup"
#: datagrams handled per wake-up of the receive task before it yields to the scheduler
_BURST = 64


class ProbeError(OverlayError):
    """A probed peer did not answer (declared dead) or the probe timed out."""


# ------------------------------------------------------------------------ control messages
@register(16)
@attrs.frozen(slots=True)
class StatusRequest(Message):
    """Ask a node to describe itself (answered with :class:`StatusReply`)."""

    nonce: int


@register(17)
@attrs.frozen(slots=True)
class StatusReply(Message):
    """A node's self-description: what ``flockring status`` prints."""

    nonce: int
    handle: NodeHandle
    overlay: str
    ready: bool
    uptime_s: float
    leaf_set: tuple[NodeHandle, ...]
    routing_rows: tuple[int, ...]  # filled entries per routing-table row (Pastry)
    known: int
    stats: tuple[tuple[str, int], ...]


@register(18)
@attrs.frozen(slots=True)
class LookupRequest(Message):
    """Ask a node to route a lookup for ``key``; the responsible node answers the asker."""

    nonce: int
    key: NodeId


@register(19)
@attrs.frozen(slots=True)
class LookupReply(Message):
    """Sent by the node responsible for ``key`` straight to whoever asked."""

    nonce: int
    key: NodeId
    responsible: NodeHandle
    entry: NodeHandle


@attrs.frozen(slots=True)
class Delivery:
    """One payload delivered to an application endpoint."""

    key: NodeId
    payload: Any
    src: NodeHandle


async def _exit_nursery(
    cm: Any,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> bool | None:
    """Close a nursery owned by an async context manager without wrapping the body's exception.

    trio wraps whatever leaves a nursery in an ExceptionGroup; the caller of ``async with node``
    should see its own ``JoinError`` (or assertion) unwrapped, as if no nursery were involved.
    """
    try:
        result: bool | None = await cm.__aexit__(exc_type, exc, tb)
    except BaseExceptionGroup as eg:
        if exc is not None and _only(eg, exc):
            return False
        raise
    return result


def _only(eg: BaseExceptionGroup[BaseException], exc: BaseException) -> bool:
    """True if ``eg`` holds ``exc`` and otherwise only cancellations (outer scope cancelled)."""
    found = False
    stack: list[BaseException] = [eg]
    while stack:
        e = stack.pop()
        if e is exc:
            found = True
        elif isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
        elif not isinstance(e, trio.Cancelled):
            return False
    return found


# ------------------------------------------------------------------------ trio runtime
class _TrioRuntime:
    """The Runtime a core sees: trio clock, one timer heap, signed sends.

    A timer is a plain mutable heap entry ``[when, seq, fn]``; ``cancel()`` clears ``fn``
    (:class:`_Timer` is that list, so no extra object per timer). The timer task sleeps until
    the earliest deadline; a new earlier timer wakes it.
    """

    __slots__ = ("_heap", "_n_cancelled", "_node", "_rng", "_seq", "_sleeping", "_wakeup")

    def __init__(self, node: Node, rng: random.Random) -> None:
        self._node = node
        self._rng = rng
        self._heap: list[_Timer] = []
        self._seq = 0
        self._wakeup: trio.Event | None = None
        self._sleeping = math.inf  # the deadline the timer task sleeps until
        self._n_cancelled = 0

    @property
    def rng(self) -> random.Random:
        return self._rng

    def now(self) -> float:
        return trio.current_time()

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> _Timer:
        if not delay_s >= 0:  # negative or NaN
            delay_s = 0.0
        when = trio.current_time() + delay_s
        self._seq += 1
        t = _Timer((when, self._seq, fn, self))
        heap = self._heap
        heapq.heappush(heap, t)
        if when < self._sleeping and self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None
        # cancelled entries wait for their deadline in the heap; once they are the majority
        # the heap is rebuilt (amortised O(1); keeps ~1 KiB of dead timers off each node)
        if self._n_cancelled > 8 and self._n_cancelled > len(heap) // 2:
            self._heap = [e for e in heap if e[2] is not None]
            heapq.heapify(self._heap)
            self._n_cancelled = 0
        return t

    def send(self, dst: NodeHandle, msg: Message) -> None:
        self._node._send(dst.address, msg, dst.id)

    def send_address(self, address: Address, msg: Message) -> None:
        self._node._send(address, msg, None)

    async def run(self) -> None:
        node = self._node
        while not node._closed:
            now = trio.current_time()
            heap = self._heap
            while heap and heap[0][0] <= now:
                t = heapq.heappop(heap)
                fn = t[2]
                if fn is None:
                    self._n_cancelled -= 1
                    continue
                t[2] = None  # fired: a later cancel() is a no-op
                try:
                    fn()
                except Exception:
                    node._counters["timer_errors"] += 1
                    log.exception("timer callback failed on %r", node.handle)
            deadline = heap[0][0] if heap else math.inf
            if deadline <= trio.current_time():
                await trio.lowlevel.checkpoint()  # timers fell due while firing: yield, go on
                continue
            wakeup = self._wakeup = trio.Event()
            self._sleeping = deadline
            with trio.move_on_at(deadline):
                await wakeup.wait()
            self._sleeping = -math.inf  # awake: call_later need not wake us
            self._wakeup = None


class _Timer(list[Any]):
    """A heap entry ``[when, seq, fn | None, runtime]`` that is also the Timer handle.

    A list subclass without ``__lt__``: heapq compares entries in C (``when``, then the unique
    ``seq``), and the entry needs no separate handle object.
    """

    __slots__ = ()

    def cancel(self) -> None:
        if self[2] is not None:
            self[2] = None
            self[3]._n_cancelled += 1


# ------------------------------------------------------------------------ applications
class Endpoint:
    """A named application on a node: ``await route(key, payload)``; ``async for d in endpoint``.

    Deliveries queue up to ``buffer`` items; beyond that they are dropped and counted
    (``stats["app_queue_full"]``) — the core's callbacks never block.
    """

    def __init__(
        self,
        node: Node,
        name: str,
        buffer: int,
        forward: Callable[[NodeId, Any, NodeHandle], NodeHandle | None] | None,
        update: Callable[[NodeHandle, bool], None] | None,
    ) -> None:
        self.node = node
        self.name = name
        self._forward = forward
        self._update = update
        self._send, self._recv = trio.open_memory_channel[Delivery](buffer)

    # upcalls from the core (Application protocol)
    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        try:
            self._send.send_nowait(Delivery(key, payload, src))
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            self.node._counters["app_queue_full"] += 1

    def forward(self, key: NodeId, payload: Any, next_hop: NodeHandle) -> NodeHandle | None:
        if self._forward is None:
            return next_hop
        return self._forward(key, payload, next_hop)

    def update(self, handle: NodeHandle, joined: bool) -> None:
        if self._update is not None:
            self._update(handle, joined)

    # the async side
    async def route(self, key: NodeId, payload: Any, hint: NodeHandle | None = None) -> None:
        """Route ``payload`` to the node responsible for ``key`` (datagram semantics)."""
        core = self.node._require_ready()
        core.route(key, self.name, payload, hint)
        await trio.lowlevel.checkpoint()

    async def send(self, handle: NodeHandle, payload: Any) -> None:
        """Send ``payload`` straight to one node's endpoint of the same name (no routing)."""
        core = self.node._require_core()
        core.send_direct(handle, self.name, payload)
        await trio.lowlevel.checkpoint()

    async def receive(self) -> Delivery:
        """The next delivery (waits)."""
        return await self._recv.receive()

    def __aiter__(self) -> Endpoint:
        return self

    async def __anext__(self) -> Delivery:
        try:
            return await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Unregister; a pending ``async for`` ends."""
        core = self.node._core
        if core is not None and core.apps.get(self.name) is self:
            core.unregister(self.name)
        self._send.close()


class _LookupApp:
    """Built-in application answering ``LookupRequest``s on the responsible node."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def deliver(self, key: NodeId, payload: Any, src: NodeHandle) -> None:
        if (
            not isinstance(payload, tuple)
            or len(payload) != 3
            or type(payload[0]) is not int
            or not isinstance(payload[1], NodeHandle)
            or not isinstance(payload[2], NodeHandle)
        ):
            self.node._counters["bad_lookup"] += 1
            return
        nonce, asker, entry = payload
        reply = LookupReply(nonce, key, self.node.handle, entry)
        if asker.id == self.node.id:
            self.node._on_reply(reply)
        else:
            self.node._send(asker.address, reply, asker.id)

    def forward(self, key: NodeId, payload: Any, next_hop: NodeHandle) -> NodeHandle | None:
        return next_hop

    def update(self, handle: NodeHandle, joined: bool) -> None:
        return None


# ------------------------------------------------------------------------ the node
class Node:
    """A live overlay node: ``async with Node(transport, overlay="pastry") as node``.

    ``identity`` defaults to a fresh key; ``config`` is the overlay's config
    (``PastryConfig`` / ``SmallWorldConfig``); ``overlay`` is ``"pastry"``, ``"smallworld"`` or a
    factory ``(runtime, handle[, config]) -> KbrCore``. ``signing=False`` sends unsigned
    envelopes and accepts unsigned ones (an explicit opt-out, for comparisons only).
    """

    def __init__(
        self,
        transport: Transport,
        overlay: str | CoreFactory = "pastry",
        identity: Identity | None = None,
        config: Any = None,
        *,
        seed: int | None = None,
        rng: random.Random | None = None,
        signing: bool = True,
        join_timeout_s: float = 30.0,
        limits: Limits | None = None,
        core_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(overlay, str) and overlay not in _OVERLAYS:
            raise ConfigError(
                f"unknown overlay {overlay!r}; choose one of {', '.join(sorted(_OVERLAYS))}"
            )
        if not join_timeout_s > 0:
            raise ConfigError(f"join_timeout_s must be > 0, got {join_timeout_s!r}")
        self.transport = transport
        self.overlay = overlay if isinstance(overlay, str) else getattr(overlay, "__name__", "?")
        self._factory = overlay
        self.identity = identity if identity is not None else Identity.generate()
        self.config = config
        self.signing = signing
        self.join_timeout_s = join_timeout_s
        self._core_kwargs = dict(core_kwargs or {})
        if rng is not None and seed is not None:
            raise ConfigError("give Node either seed= or rng=, not both")
        #: several nodes of one process may share one generator (``rng=``): a random.Random
        #: holds 2.5 KiB of Mersenne-Twister state, a tenth of a small node's footprint.
        self._rng = rng if rng is not None else random.Random(seed)
        self._signer = (
            Signer(self.identity.private_key)
            if signing
            else Signer(None, claimed_id=self.identity.id.to_bytes_be())
        )
        lim = limits if limits is not None else Limits()
        self._verifier = Verifier(
            require_signatures=signing, limits=lim, own_id=self.identity.id.to_bytes_be()
        )
        self._wire = Wire(lim)
        self._counters: Counter[str] = Counter()
        self._core: KbrCore | None = None
        #: the multicast/aggregation application on this node's core (set on entry)
        self.multicast: Multicast | None = None
        self._runtime: _TrioRuntime | None = None
        self._nursery_cm: Any = None
        self._scope: trio.CancelScope | None = None
        self._use_reply_to = transport.address.startswith("tcp://")
        self._scheme = transport.address.partition("://")[0]
        self._started_at = 0.0
        self._closed = False
        self.closed_event = trio.Event()
        self._ctl_waiters: dict[int, Callable[[Message], None]] = {}
        self._own_id_bytes = self.identity.id.to_bytes_be()

    # ------------------------------------------------------------------ properties
    @property
    def id(self) -> NodeId:
        return self.identity.id

    @property
    def address(self) -> str:
        return self.transport.address

    @property
    def handle(self) -> NodeHandle:
        return NodeHandle(self.identity.id, self.transport.address)

    @property
    def core(self) -> KbrCore:
        """The sans-io overlay core (for plugins registering on it; do not call from threads)."""
        return self._require_core()

    @property
    def ready(self) -> bool:
        return self._core is not None and self._core.ready

    @property
    def leaf_set(self) -> tuple[NodeHandle, ...]:
        """Ring neighbours (Pastry leaf set / small-world near connections), closest first."""
        core = self._core
        if core is None:
            return ()
        return tuple(core.neighbor_set(1 << 16))

    @property
    def routing_table(self) -> tuple[tuple[NodeHandle, ...], ...]:
        """Pastry: the filled entries of each routing-table row (trailing empty rows trimmed).

        Small-world: one row holding every connection.
        """
        core = self._core
        if core is None:
            return ()
        row_fn = getattr(core, "routing_row", None)
        if row_fn is None:
            return (tuple(core.known_nodes()),)
        rows: list[tuple[NodeHandle, ...]] = []
        for i in range(40):
            try:
                row = row_fn(i)
            except Exception:
                break
            rows.append(tuple(h for h in row if h is not None))
        while rows and not rows[-1]:
            rows.pop()
        return tuple(rows)

    @property
    def stats(self) -> Mapping[str, int]:
        """Snapshot of all counters: core, ``node.*``, ``auth.*``, ``wire.*``, ``transport.*``."""
        out: dict[str, int] = {}
        if self._core is not None:
            out.update(self._core.stats)
        for prefix, c in (
            ("node.", self._counters),
            ("auth.", self._verifier.counters),
            ("wire.", self._wire.counters),
            ("transport.", self.transport.stats),
        ):
            for k, v in c.items():
                out[prefix + k] = v
        return MappingProxyType(out)

    def dropped(self) -> int:
        """Total inputs dropped at the trust boundary (codec, auth and wire rejections)."""
        a = sum(v for k, v in self._verifier.counters.items() if k != "accepted")
        w = sum(v for k, v in self._wire.counters.items() if k != "decoded")
        return a + w

    # ------------------------------------------------------------------ lifecycle
    def _make_core(self, runtime: _TrioRuntime) -> KbrCore:
        factory = self._factory
        if isinstance(factory, str):
            mod_name, cls_name = _OVERLAYS[factory]
            try:
                mod = importlib.import_module(mod_name)
            except ImportError as exc:
                raise ConfigError(f"overlay {factory!r} is not available: {exc}") from None
            factory = getattr(mod, cls_name)
        assert callable(factory)
        args: list[Any] = [runtime, self.handle]
        if self.config is not None:
            args.append(self.config)
        core = factory(*args, **self._core_kwargs)
        if not isinstance(core, KbrCore):
            raise ConfigError(f"overlay factory returned {type(core).__name__}, not a KbrCore")
        return core

    async def __aenter__(self) -> Node:
        if self._nursery_cm is not None:
            raise OverlayError("a Node can be entered only once")
        runtime = _TrioRuntime(self, self._rng)
        self._runtime = runtime
        core = self._make_core(runtime)
        core.register(LOOKUP_APP, _LookupApp(self))
        # every live node takes part in multicast trees (aggregation for discovery queries)
        self.multicast = attach_multicast(core)
        self._core = core
        self._started_at = trio.current_time()
        self._nursery_cm = trio.open_nursery()
        nursery = await self._nursery_cm.__aenter__()
        try:
            # Two tasks, straight in the node's nursery (no supervisor task, no inner nursery:
            # ~3 KiB a node). The timer task ends when the node closes; the receive task owns
            # the one cancel scope that _halt() cancels.
            nursery.start_soon(runtime.run)
            nursery.start_soon(self._receive_loop)
            core.start()
        except BaseException:
            self._halt()
            await self._nursery_cm.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self.leave()
        return await _exit_nursery(self._nursery_cm, exc_type, exc, tb)

    def leave(self) -> None:
        """Leave the overlay cleanly (tell neighbours where the overlay supports it) and stop."""
        if self._closed:
            return
        core = self._core
        if core is not None and not core.stopped:
            leave = getattr(core, "leave", None)
            if callable(leave):
                try:
                    leave()
                except Exception:
                    log.exception("leave() failed on %r", self.handle)
        self._halt()

    def crash(self) -> None:
        """Stop at once without telling anyone (failure tests): tasks cancelled, core silenced."""
        self._halt()

    def _halt(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._core is not None:
            self._core.stop()
        if self._scope is not None:
            self._scope.cancel()
        rt = self._runtime
        if rt is not None and rt._wakeup is not None:
            rt._wakeup.set()
        self.closed_event.set()

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ I/O
    def _send(self, address: Address, msg: Message, peer: NodeId | None) -> None:
        if self._closed:
            return
        if not isinstance(address, str):
            self._counters["send_bad_address"] += 1
            return
        try:
            body = encode_message(msg)
        except WireError:
            self._counters["encode_errors"] += 1
            log.exception("cannot encode %s", type(msg).__name__)
            return
        to = peer.to_bytes_be() if peer is not None else None
        frame = self._signer.seal(self.transport.address, body, to)
        self.transport.send_nowait(address, frame, to)

    async def _receive_loop(self) -> None:
        transport = self.transport
        # A transport may offer ``receive_nowait() -> (src, data) | None``: after each wake-up
        # the datagrams already queued are handled without a trip through the scheduler.
        nowait: Callable[[], tuple[str, bytes] | None] | None = getattr(
            transport, "receive_nowait", None
        )
        with trio.CancelScope() as scope:
            self._scope = scope
            while not self._closed:
                try:
                    item: tuple[str, bytes] | None = await transport.receive()
                except trio.ClosedResourceError:
                    return
                burst = 0
                while item is not None:
                    try:
                        self._on_datagram(item[0], item[1])
                    except Exception:  # a bug in a core must not kill the node: count and log
                        self._counters["receive_errors"] += 1
                        log.exception("error handling a datagram on %r", self.handle)
                    burst += 1
                    if nowait is None or burst >= _BURST or self._closed:
                        break
                    item = nowait()

    def _on_datagram(self, src_addr: str, data: bytes) -> None:
        opened = self._verifier.open(data)
        if opened is None:
            return
        msg = self._wire.decode(opened.body)
        if msg is None:
            return
        if opened.sender_hash == self._own_id_bytes:
            self._counters["own_id_dropped"] += 1
            return
        address = src_addr
        if self._use_reply_to:
            try:
                parse_address(opened.reply_to, self._scheme)
                address = opened.reply_to
            except AddressError:
                self._counters["bad_reply_address"] += 1
                return
        src = intern_handle(opened.sender_hash, address)
        t = type(msg)
        if t is StatusRequest or t is LookupRequest:
            self._on_control(src, msg)
            return
        if t is StatusReply or t is LookupReply:
            self._on_reply(msg)
            return
        core = self._core
        if core is not None:
            core.receive(src, msg)

    def _on_reply(self, msg: Message) -> None:
        waiter = self._ctl_waiters.pop(getattr(msg, "nonce", -1), None)
        if waiter is not None:
            waiter(msg)
        else:
            self._counters["unexpected_reply"] += 1

    def _on_control(self, src: NodeHandle, msg: Message) -> None:
        core = self._core
        if core is None:
            return
        if isinstance(msg, StatusRequest):
            self._send(src.address, self.status_reply(msg.nonce), src.id)
        elif isinstance(msg, LookupRequest):
            if not core.ready:
                self._counters["lookup_not_ready"] += 1
                return
            core.route(msg.key, LOOKUP_APP, (msg.nonce, src, self.handle))

    def status_reply(self, nonce: int = 0) -> StatusReply:
        """This node's :class:`StatusReply` (what ``flockring status`` shows)."""
        stats = tuple(sorted((k, int(v)) for k, v in self.stats.items()))
        rows = tuple(len(r) for r in self.routing_table) if self._core is not None else ()
        core = self._core
        return StatusReply(
            nonce,
            self.handle,
            self.overlay,
            self.ready,
            max(0.0, trio.current_time() - self._started_at),
            self.leaf_set,
            rows,
            len(core.known_nodes()) if core is not None else 0,
            stats[:200],
        )

    # ------------------------------------------------------------------ API
    def _require_core(self) -> KbrCore:
        if self._core is None:
            raise NotReadyError("the node is not running: use `async with Node(...) as node`")
        if self._closed:
            raise NotReadyError("the node has been closed")
        return self._core

    def _require_ready(self) -> KbrCore:
        core = self._require_core()
        if not core.ready:
            raise NotReadyError("the node has not joined the overlay yet: await node.join(seeds)")
        return core

    async def join(self, seeds: Sequence[str] = (), timeout_s: float | None = None) -> None:
        """Join the overlay through any of ``seeds`` (addresses); ``[]`` starts a new ring.

        Raises :class:`JoinError` (with ``.tried``) if the join does not finish in time.
        """
        core = self._require_core()
        if isinstance(seeds, str):
            seeds = [seeds]
        seeds = [s for s in seeds if s != self.address]
        for s in seeds:
            try:
                parse_address(s, self._scheme)
            except AddressError as exc:
                raise ConfigError(f"bad seed address: {exc}") from None
        timeout = self.join_timeout_s if timeout_s is None else timeout_s
        done = trio.Event()
        result: list[bool] = []

        def on_done(ok: bool) -> None:
            result.append(ok)
            done.set()

        core.join(list(seeds), on_done)
        with trio.move_on_after(timeout):
            await done.wait()
        if result and result[0]:
            return
        why = "timed out" if not result else "failed"
        tried = ", ".join(seeds) if seeds else "(none)"
        raise JoinError(f"join {why} after {timeout:g}s; seeds tried: {tried}", tuple(seeds))

    def application(
        self,
        name: str,
        *,
        buffer: int = 1024,
        forward: Callable[[NodeId, Any, NodeHandle], NodeHandle | None] | None = None,
        update: Callable[[NodeHandle, bool], None] | None = None,
    ) -> Endpoint:
        """Register application ``name`` and return its endpoint (names are unique per node)."""
        core = self._require_core()
        ep = Endpoint(self, name, buffer, forward, update)
        core.register(name, ep)
        return ep

    async def probe(self, handle: NodeHandle, timeout_s: float | None = None) -> float:
        """Measure the RTT to ``handle`` (seconds); :class:`ProbeError` if it does not answer."""
        core = self._require_core()
        done = trio.Event()
        out: list[float | None] = []

        def cb(rtt: float | None) -> None:
            out.append(rtt)
            done.set()

        core.prox.probe(handle, cb)
        with trio.move_on_after(math.inf if timeout_s is None else timeout_s):
            await done.wait()
        if not out:
            raise ProbeError(f"probe of {handle!r} timed out after {timeout_s}s")
        rtt = out[0]
        if rtt is None:
            raise ProbeError(f"{handle!r} did not answer probes (declared dead)")
        return rtt

    async def lookup(self, key: NodeId, timeout_s: float = 5.0) -> NodeHandle:
        """Route a lookup for ``key`` from this node and return the responsible node's handle.

        Retried up to three times within ``timeout_s``; :class:`OverlayError` if none answers.
        """
        core = self._require_ready()
        nonce = self._rng.getrandbits(62)
        done = trio.Event()
        out: list[Message] = []

        def waiter(reply: Message) -> None:
            out.append(reply)
            done.set()

        self._ctl_waiters[nonce] = waiter
        try:
            for _ in range(3):
                core.route(key, LOOKUP_APP, (nonce, self.handle, self.handle))
                with trio.move_on_after(timeout_s / 3):
                    await done.wait()
                if out:
                    r = out[0]
                    assert isinstance(r, LookupReply)
                    return r.responsible
        finally:
            self._ctl_waiters.pop(nonce, None)
        raise OverlayError(f"lookup of {key.short()} got no answer within {timeout_s:g}s")

    def __repr__(self) -> str:
        return f"<Node {self.id.short()}@{self.address} {self.overlay}>"


class ControlClient:
    """Talks the read-only control protocol to running nodes without joining (the CLI uses it).

    ``async with ControlClient(transport) as c: await c.status(addr); await c.lookup(addr, key)``
    """

    def __init__(
        self, transport: Transport, identity: Identity | None = None, *, signing: bool = True
    ) -> None:
        self.transport = transport
        self.identity = identity if identity is not None else Identity.generate()
        self._signer = (
            Signer(self.identity.private_key)
            if signing
            else Signer(None, claimed_id=self.identity.id.to_bytes_be())
        )
        self._verifier = Verifier(require_signatures=signing, own_id=self.identity.id.to_bytes_be())
        self._wire = Wire()
        self._waiters: dict[int, Callable[[Message], None]] = {}
        self._rng = random.Random()
        self._nursery_cm: Any = None
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> ControlClient:
        self._nursery_cm = trio.open_nursery()
        nursery = await self._nursery_cm.__aenter__()
        self._nursery = nursery
        nursery.start_soon(self._receive_loop)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        return await _exit_nursery(self._nursery_cm, exc_type, exc, tb)

    async def _receive_loop(self) -> None:
        while True:
            try:
                _, data = await self.transport.receive()
            except trio.ClosedResourceError:
                return
            opened = self._verifier.open(data)
            if opened is None:
                continue
            msg = self._wire.decode(opened.body)
            if isinstance(msg, (StatusReply, LookupReply)):
                w = self._waiters.pop(msg.nonce, None)
                if w is not None:
                    w(msg)

    async def _ask(self, address: str, msg: Message, nonce: int, timeout_s: float) -> Message:
        done = trio.Event()
        out: list[Message] = []

        def waiter(reply: Message) -> None:
            out.append(reply)
            done.set()

        self._waiters[nonce] = waiter
        body = encode_message(msg)
        try:
            for _ in range(3):  # datagrams may be lost: retry within the timeout
                self.transport.send_nowait(address, self._signer.seal(self.transport.address, body))
                with trio.move_on_after(timeout_s / 3):
                    await done.wait()
                if out:
                    return out[0]
        finally:
            self._waiters.pop(nonce, None)
        raise OverlayError(f"no answer from {address} within {timeout_s:g}s")

    async def status(self, address: str, timeout_s: float = 3.0) -> StatusReply:
        """The :class:`StatusReply` of the node at ``address``."""
        nonce = self._rng.getrandbits(62)
        r = await self._ask(address, StatusRequest(nonce), nonce, timeout_s)
        assert isinstance(r, StatusReply)
        return r

    async def lookup(self, address: str, key: NodeId, timeout_s: float = 5.0) -> LookupReply:
        """Ask the node at ``address`` to route a lookup for ``key``; who answered, and via whom."""
        nonce = self._rng.getrandbits(62)
        r = await self._ask(address, LookupRequest(nonce, key), nonce, timeout_s)
        assert isinstance(r, LookupReply)
        return r


def iter_handles(rows: Sequence[Sequence[NodeHandle]]) -> Iterator[NodeHandle]:
    """Every handle of a routing table view, row by row."""
    for row in rows:
        yield from row
