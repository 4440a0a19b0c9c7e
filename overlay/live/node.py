"""``overlay.Node``: the trio driver that runs a sans-io overlay core on a real transport.

Theory of operation (docs/live.md; the h11/aioquic "sans-io core + thin driver" pattern):

* The node implements :class:`overlay.runtime.Runtime` for its core: ``now()`` is
  ``trio.current_time()`` (so ``trio.testing.MockClock`` drives a whole swarm in virtual time),
  ``call_later`` pushes onto *one* heap served by *one* timer task, ``send`` encodes the message
  (``overlay/wire.py``), seals it — as an AEAD record of the session held with that peer
  (``transports/session.py``: Noise XX handshake bound to both Ed25519 identities), or, with
  none, as an Ed25519-signed envelope (``transports/auth.py``) — and hands the bytes to the
  transport's non-blocking ``send_nowait``. Peers that exchange sustained traffic handshake in
  the background; control traffic and bootstrap messages stay signed.
* One receive task reads the transport, opens each frame (session record: index, replay window,
  AEAD tag; envelope: limits, signature, replay window), decodes the message (type-checked: the
  trust boundary) and calls ``core.receive(src, msg)`` with ``src = NodeHandle(SHA-1(verified
  key), address)``. Anything malformed, forged, replayed, unsigned or over a per-source rate
  limit (:mod:`overlay.live.ratelimit`) is dropped and counted in :attr:`Node.stats`.
* All tasks live in one supervisor task inside the nursery the ``async with`` opens; leaving the
  block stops the core (a clean leave where the overlay offers one) and cancels them; no task is
  ever spawned fire-and-forget.
* The trio world meets the callback world in small adapters: :meth:`Node.join` waits on the
  core's ``on_done``; :class:`Endpoint` turns ``deliver`` upcalls into an async iterator;
  :meth:`Node.probe` waits on a proximity callback. Timeouts map to our own exceptions.
* A small read-only control protocol (status and lookup requests, tags 16–19) lets the CLI and
  operators ask a running node about itself and who is responsible for a key; answers go where
  the request was *observed* from (:mod:`overlay.live.serving`).
* Addresses: the node tells peers ``advertise`` if given, else its transport's address; a
  wildcard (``0.0.0.0``, ``::``) is refused with :class:`~transports.address.WildcardAddressError`
  before anything is sent, since no peer could reach it.

Split by concern (each module re-exported here): :mod:`overlay.live.runtime` (the Runtime: clock,
timer heap, sends), :mod:`overlay.live.apps` (application endpoints and the lookup application),
:mod:`overlay.live.control` (the control messages and :class:`ControlClient`),
:mod:`overlay.live.serving` (how this node admits and answers control requests).
"""

from __future__ import annotations

import importlib
import logging
import math
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any

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
from overlay.live.apps import LOOKUP_APP, Delivery, Endpoint, LookupApp
from overlay.live.control import (
    ControlClient,
    LookupReply,
    LookupRequest,
    StatusReply,
    StatusRequest,
    await_reply,
)
from overlay.live.gate import ControlGate, TokenBucket
from overlay.live.ratelimit import RateLimits, SourceLimiter
from overlay.live.runtime import TrioRuntime, exit_nursery
from overlay.live.serving import ControlHandler, ControlServer
from overlay.messages import Message
from overlay.multicast import Multicast
from overlay.multicast import attach as attach_multicast
from overlay.wire import Wire, WireError, encode_message, intern_handle
from transports.address import MAX_ADDRESS_LEN, AddressError, advertised_address, parse_address
from transports.auth import Signer, Verifier
from transports.base import Transport
from transports.codec import Limits
from transports.pair import PAIR, PairKeys, known_key
from transports.session import DROP_COUNTERS, SessionConfig, Sessions, is_session_frame

__all__ = [
    "LOOKUP_APP",
    "ControlClient",
    "ControlHandler",
    "CoreFactory",
    "Delivery",
    "Endpoint",
    "LookupReply",
    "LookupRequest",
    "Node",
    "ProbeError",
    "StatusReply",
    "StatusRequest",
    "iter_handles",
]

log = logging.getLogger(__name__)

CoreFactory = Callable[..., KbrCore]

_OVERLAYS: dict[str, tuple[str, str]] = {
    "pastry": ("overlay.pastry.core", "PastryCore"),
    "smallworld": ("overlay.smallworld.core", "SmallWorldCore"),
}

#: datagrams handled per wake-up of the receive task before it yields to the scheduler
_BURST = 64

#: HELLOs answered (and unknown-session hints sent): 100/s, 200 at once — more than a joining
#: node meets; a flood costs < 2 % of a core (~120 µs each) and refused peers stay signed
_HANDSHAKE_RATE_PER_S, _HANDSHAKE_BURST, _SESSIONS = 100.0, 200.0, SessionConfig()
_PAIR_BYTE = bytes((PAIR,))
#: the default limits of a live node: a source is forgotten once its buckets have refilled
_RATE_LIMITS = RateLimits(forget_idle=True)


class ProbeError(OverlayError):
    """A probed peer did not answer (declared dead) or the probe timed out."""


class Node(ControlServer):
    """A live overlay node: ``async with Node(transport, overlay="pastry") as node``.

    ``identity`` defaults to a fresh key; ``config`` is the overlay's config
    (``PastryConfig`` / ``SmallWorldConfig``); ``overlay`` is ``"pastry"``, ``"smallworld"`` or a
    factory ``(runtime, handle[, config]) -> KbrCore``. ``signing=False`` sends unsigned
    envelopes and accepts unsigned ones (an explicit opt-out, for comparisons only).
    ``sessions`` (signed mode only; a :class:`~transports.session.SessionConfig` or a bool):
    authenticated sessions with peers that exchange sustained traffic, instead of an Ed25519
    signature per datagram (``False``: every datagram signed).
    ``advertise`` is the address peers are told (``udp://IP:PORT``, or a bare IP taking the
    bound port); it is required when the transport is bound to a wildcard such as ``0.0.0.0``
    (:class:`~transports.address.WildcardAddressError` otherwise). ``rate_limits``: per-source
    budgets on what peers send (:class:`~overlay.live.ratelimit.RateLimits`; None: defaults).
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
        advertise: str | None = None,
        sessions: bool | SessionConfig = True,
        rate_limits: RateLimits | None = None,
    ) -> None:
        if isinstance(overlay, str) and overlay not in _OVERLAYS:
            raise ConfigError(
                f"unknown overlay {overlay!r}; choose one of {', '.join(sorted(_OVERLAYS))}"
            )
        if not join_timeout_s > 0:
            raise ConfigError(f"join_timeout_s must be > 0, got {join_timeout_s!r}")
        self.transport = transport
        #: the address peers are told (never a wildcard)
        self._address: str = advertised_address(transport.address, advertise)
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
        #: made at the first handshake (most nodes of a swarm never need one; ~1.5 KiB each)
        self._sessions: Sessions | None = None
        self._session_config: SessionConfig | None = None
        if signing and sessions is not False:
            if len(self._address.encode()) > MAX_ADDRESS_LEN:
                raise ConfigError(f"sessions need an address of at most {MAX_ADDRESS_LEN} bytes")
            self._session_config = sessions if isinstance(sessions, SessionConfig) else _SESSIONS
        #: pair frames (``transports/pair.py``): made at first use, None when off
        self._pair: PairKeys | None = None
        self._pair_on = self._session_config is not None and self._session_config.pair_frames
        self._counters: Counter[str] = Counter()
        self._core: KbrCore | None = None
        #: the multicast/aggregation application on this node's core (set on entry)
        self.multicast: Multicast | None = None
        self._runtime: TrioRuntime | None = None
        self._nursery_cm: Any = None
        self._scope: trio.CancelScope | None = None
        self._use_reply_to = self._address.startswith("tcp://")
        self._scheme = self._address.partition("://")[0]
        self._started_at = 0.0
        self._closed = False
        self.closed_event = trio.Event()
        self._ctl_waiters: dict[int, Callable[[Message], None]] = {}
        self._control_handlers: dict[type[Message], ControlHandler] = {}
        self._gate = ControlGate()
        self._limiter = SourceLimiter(rate_limits if rate_limits is not None else _RATE_LIMITS)
        self._own_id_bytes = self.identity.id.to_bytes_be()
        #: control lookups routed for an asker: nonce -> (where the asker was observed, until)
        self._relays: dict[int, tuple[str, float]] = {}

    # ------------------------------------------------------------------ properties
    @property
    def id(self) -> NodeId:
        """This node's id (SHA-1 of its public key)."""
        return self.identity.id

    @property
    def address(self) -> str:
        """The address peers are told (``advertise``, else the transport's; never a wildcard)."""
        return self._address

    @property
    def handle(self) -> NodeHandle:
        """This node's handle: its id and the address it advertises."""
        return NodeHandle(self.identity.id, self._address)

    @property
    def core(self) -> KbrCore:
        """The sans-io overlay core (for plugins registering on it; do not call from threads)."""
        return self.require_core()

    @property
    def counters(self) -> Counter[str]:
        """The driver's own event counters (mutable; :attr:`stats` is the read-only view)."""
        return self._counters

    @property
    def running_core(self) -> KbrCore | None:
        """The core while the node runs, else None (never raises)."""
        return self._core

    @property
    def ready(self) -> bool:
        """True once the node has joined the overlay."""
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
        parts = [
            ("node.", self._counters),
            ("auth.", self._verifier.counters),
            ("wire.", self._wire.counters),
            ("transport.", self.transport.stats),
            ("rate.", self._limiter.counters),
        ]
        if self._sessions is not None:
            parts.append(("session.", self._sessions.counters))
            out["session.held"] = len(self._sessions)
        out["rate.sources"] = len(self._limiter)
        if self._pair is not None:
            out["node.pair_derivations"] = self._pair.derivations
            out["node.pair_keys_held"] = self._pair.held()
        for prefix, c in parts:
            for k, v in c.items():
                out[prefix + k] = v
        return MappingProxyType(out)

    @property
    def sessions(self) -> Sessions | None:
        """This node's authenticated sessions (None when unsigned, turned off, or before the
        first handshake)."""
        return self._sessions

    def _open_sessions(self, config: SessionConfig) -> Sessions:
        s = self._sessions
        if s is None:
            s = self._sessions = Sessions(
                self.identity.private_key,
                self._address,
                self.transport.send_nowait,
                config=config,
                admit=TokenBucket(_HANDSHAKE_RATE_PER_S, _HANDSHAKE_BURST).admit,
            )
        return s

    def dropped(self) -> int:
        """Total inputs dropped at the trust boundary (codec, auth, session and wire)."""
        a = sum(v for k, v in self._verifier.counters.items() if k != "accepted")
        w = sum(v for k, v in self._wire.counters.items() if k != "decoded")
        s = 0
        if self._sessions is not None:
            s = sum(v for k, v in self._sessions.counters.items() if k in DROP_COUNTERS)
        return a + w + s + self._limiter.dropped()

    # ------------------------------------------------------------------ lifecycle
    def _make_core(self, runtime: TrioRuntime) -> KbrCore:
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
        runtime = TrioRuntime(self, self._rng)
        self._runtime = runtime
        core = self._make_core(runtime)
        core.register(LOOKUP_APP, LookupApp(self))
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
        return await exit_nursery(self._nursery_cm, exc_type, exc, tb)

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
        """True once the node has left, crashed or been closed."""
        return self._closed

    # ------------------------------------------------------------------ I/O
    def send_message(self, address: Address, msg: Message, peer: NodeId | None) -> None:
        """Encode, sign and send ``msg`` to ``address`` (``peer``: the receiver's id, if known)."""
        self._send(address, msg, peer, True)

    def send_to_member(self, address: Address, msg: Message, peer: NodeId) -> None:
        """Like :meth:`send_message` for the core's traffic to another member: a pair frame
        (``transports/pair.py``) when this process verified ``peer``'s key. Control replies and
        lookup answers, which may go to a tool that opens signed envelopes only, stay signed."""
        self._send(address, msg, peer, True, self._pair_on)

    def send_unbound(self, address: Address, msg: Message, peer: NodeId | None) -> None:
        """Like :meth:`send_message`, but the envelope is bound to no receiver id: a lookup
        answer that the node at ``address`` forwards as it is to its asker. ``peer`` still lets
        TLS check whom it reached."""
        self._send(address, msg, peer, False)

    def _send(
        self, address: Address, msg: Message, peer: NodeId | None, bind: bool, pair: bool = False
    ) -> None:
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
        frame = None
        if bind and to is not None and self._sessions is not None:
            frame = self._sessions.seal(to, address, body, trio.current_time())
        if frame is None and pair and to is not None:
            frame = self._seal_pair(to, body)
        if frame is None:
            frame = self._signer.seal(self._address, body, to if bind else None)
        self.transport.send_nowait(address, frame, to)

    def _pair_keys(self) -> PairKeys:
        p = self._pair
        if p is None:
            cfg = self._session_config
            p = self._pair = PairKeys(
                self.identity.private_key,
                self._signer.sender,
                cache=cfg.pair_cache if cfg is not None else 128,
            )
        return p

    def _seal_pair(self, to: bytes, body: bytes) -> bytes | None:
        """A pair frame to ``to`` if this process verified its key, else None (sign)."""
        peer = known_key(to)
        if peer is None:
            return None
        frame = self._pair_keys().seal(peer, to, self._signer.next_seq(), self._address, body)
        if frame is not None:
            self._counters["pair_sent"] += 1
        return frame

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
        now = trio.current_time()
        if not self._limiter.admit_frame(src_addr, now):  # before the costly opening
            return
        cfg = self._session_config
        pair = False
        if cfg is not None and is_session_frame(data):
            self._counters["session_frames"] += 1
            opened = self._open_sessions(cfg).receive(src_addr, data, now)
        elif data[:1] == _PAIR_BYTE and self._pair_on:
            opened = self._verifier.open_pair(data, self._pair_keys())
            pair = True
        else:
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
        if not self._limiter.admit_message(src_addr, msg, now):
            return
        if self._control_message(msg, opened, src_addr, address, data):
            return
        src = intern_handle(opened.sender_hash, address)
        core = self._core
        if core is not None:
            if cfg is not None and opened.sender_key is not None:
                # a signed or pair frame from a member: sustained traffic earns a session
                recent = self._verifier.last_recent
                want = cfg.handshake_after_frames
                if pair:
                    want = cfg.handshake_after_pair_frames or 4 * want
                if self._sessions is not None or recent >= want:
                    self._open_sessions(cfg).consider(
                        opened.sender_hash, address, recent, now, want
                    )
            core.receive(src, msg)

    # ------------------------------------------------------------------ API
    def require_core(self) -> KbrCore:
        """The running core; :class:`NotReadyError` before entry or after close."""
        if self._core is None:
            raise NotReadyError("the node is not running: use `async with Node(...) as node`")
        if self._closed:
            raise NotReadyError("the node has been closed")
        return self._core

    def require_ready(self) -> KbrCore:
        """The running core once joined; :class:`NotReadyError` otherwise."""
        core = self.require_core()
        if not core.ready:
            raise NotReadyError("the node has not joined the overlay yet: await node.join(seeds)")
        return core

    async def join(self, seeds: Sequence[str] = (), timeout_s: float | None = None) -> None:
        """Join the overlay through any of ``seeds`` (addresses); ``[]`` starts a new ring.

        Raises :class:`JoinError` (with ``.tried``) if the join does not finish in time.
        """
        core = self.require_core()
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
        core = self.require_core()
        ep = Endpoint(self, name, buffer, forward, update)
        core.register(name, ep)
        return ep

    async def probe(self, handle: NodeHandle, timeout_s: float | None = None) -> float:
        """Measure the RTT to ``handle`` (seconds); :class:`ProbeError` if it does not answer."""
        core = self.require_core()
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
        core = self.require_ready()
        nonce = self._rng.getrandbits(62)

        def send() -> None:
            core.route(key, LOOKUP_APP, (nonce, self.handle, self.handle))

        r = await await_reply(self._ctl_waiters, nonce, send, timeout_s)
        if r is None:
            raise OverlayError(f"lookup of {key.short()} got no answer within {timeout_s:g}s")
        assert isinstance(r, LookupReply)
        return r.responsible

    def __repr__(self) -> str:
        return f"<Node {self.id.short()}@{self.address} {self.overlay}>"


def iter_handles(rows: Sequence[Sequence[NodeHandle]]) -> Iterator[NodeHandle]:
    """Every handle of a routing table view, row by row."""
    for row in rows:
        yield from row
