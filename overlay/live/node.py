"""``overlay.Node``: the trio driver that runs a sans-io overlay core on a real transport.

Theory of operation (docs/live.md; the h11/aioquic "sans-io core + thin driver" pattern):

* The node implements :class:`overlay.runtime.Runtime` for its core: ``now()`` is
  ``trio.current_time()`` (so ``trio.testing.MockClock`` drives a whole swarm in virtual time),
  ``call_later`` pushes onto the process's one timer heap (:mod:`overlay.live.reactor`),
  ``send`` (:mod:`overlay.live.send`) encodes the message
  (``overlay/wire.py``), seals it — as an AEAD record of the session held with that peer
  (``transports/session.py``: Noise XX handshake bound to both Ed25519 identities), or, with
  none, as an Ed25519-signed envelope (``transports/auth.py``) — and hands the bytes to the
  transport's non-blocking ``send_nowait``. Peers that exchange sustained traffic handshake in
  the background; control traffic and bootstrap messages stay signed.
* The receive path (:mod:`overlay.live.receive`; a UDP socket is read by the process's one
  poller, other transports by a receive task of the node's) opens each frame (session record:
  index, replay window,
  AEAD tag; envelope: limits, signature, replay window), decodes the message (type-checked: the
  trust boundary) and calls ``core.receive(src, msg)`` with ``src = NodeHandle(SHA-1(verified
  key), address)``. Anything malformed, forged, replayed, unsigned or over a per-source rate
  limit (:mod:`overlay.live.ratelimit`) is dropped and counted in :attr:`Node.stats`.
* A node on UDP has no task of its own: its timers and its socket are served by the two system
  tasks of the process's :class:`~overlay.live.reactor.Reactor` (one per trio run), which drop
  a closed node's timers and stop reading its socket. A node on another transport runs its
  receive task in the nursery its ``async with`` opens. Leaving the block stops the core (a clean
  leave where the overlay offers one); no task is ever spawned fire-and-forget.
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
timers, sends), :mod:`overlay.live.reactor` (the process's timer heap and socket poller),
:mod:`overlay.live.receive` and :mod:`overlay.live.send` (the two halves of the I/O path),
:mod:`overlay.live.apps` (application endpoints and the lookup application),
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

import attrs
import trio

from overlay.config_overrides import with_overrides
from overlay.errors import (
    ConfigError,
    JoinError,
    NotReadyError,
    OverlayError,
)
from overlay.handle import NodeHandle
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
from overlay.live.ratelimit import RateLimits, SourceLimiter
from overlay.live.runtime import TrioRuntime, exit_nursery
from overlay.live.send import Sender
from overlay.live.serving import ControlHandler
from overlay.messages import Message
from overlay.multicast import Multicast
from overlay.multicast import attach as attach_multicast
from overlay.wire import Wire
from transports.address import MAX_ADDRESS_LEN, AddressError, advertised_address, parse_address
from transports.auth import Signer, Verifier
from transports.base import Transport
from transports.codec import DEFAULT_LIMITS, Limits
from transports.pair import PairKeys
from transports.session import DROP_COUNTERS, SessionConfig, Sessions

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
    "live_config",
]

log = logging.getLogger(__name__)

CoreFactory = Callable[..., KbrCore]

_OVERLAYS: dict[str, tuple[str, str]] = {
    "pastry": ("overlay.pastry.core", "PastryCore"),
    "smallworld": ("overlay.smallworld.core", "SmallWorldCore"),
}
#: each built-in overlay's config class, for a live node's default config
_CONFIGS: dict[str, tuple[str, str]] = {
    "pastry": ("overlay.pastry.config", "PastryConfig"),
    "smallworld": ("overlay.smallworld.config", "SmallWorldConfig"),
}
#: ``ProximityConfig.network_rto_samples`` of a live node's default config (the config's own
#: default, 0, keeps the simulations on RFC 6298's initial RTO): a node that has measured three
#: RTTs gives a peer it never measured the RTO of their scale, never above 1 s. Live on
#: loopback (``bench chaos``) a hop to a never-measured leaf member waited 1 s, a lookup whose
#: root had crashed 4-5 s, and a join asking a crashed member 15 s (docs/reliability.md)
LIVE_NETWORK_RTO_SAMPLES = 3

_SESSIONS = SessionConfig()
#: the live default config of each built-in overlay (``_live_default_config``), made once and
#: handed to every core given none: a core making its own (Pastry's, with its KBR and
#: proximity configs, is ~0.6 KiB) would leave every node of a process an equal copy of the
#: same frozen object
_DEFAULT_CONFIGS: dict[str, Any] = {}
#: the default limits of a live node: a source is forgotten once its buckets have refilled
_RATE_LIMITS = RateLimits(forget_idle=True)


def _live_default_config(overlay: str) -> Any:
    """The config a live node of a built-in overlay gets when given none: the overlay's
    default with ``LIVE_NETWORK_RTO_SAMPLES``, made once per process and shared (frozen)."""
    cfg = _DEFAULT_CONFIGS.get(overlay)
    if cfg is None:
        mod_name, cls_name = _CONFIGS[overlay]
        base = getattr(importlib.import_module(mod_name), cls_name)()
        prox = attrs.evolve(base.proximity, network_rto_samples=LIVE_NETWORK_RTO_SAMPLES)
        cfg = _DEFAULT_CONFIGS[overlay] = attrs.evolve(base, proximity=prox)
    return cfg


def _check_overlay(overlay: str) -> None:
    """Raise ConfigError unless ``overlay`` names a built-in overlay."""
    if overlay not in _OVERLAYS:
        raise ConfigError(
            f"unknown overlay {overlay!r}; choose one of {', '.join(sorted(_OVERLAYS))}"
        )


def live_config(overlay: str, overrides: Sequence[str] = ()) -> Any:
    """A built-in overlay's live default config with ``FIELD=VALUE`` overrides
    (:func:`overlay.config_overrides.with_overrides`; what ``flockring node --set`` passes)."""
    _check_overlay(overlay)
    return with_overrides(_live_default_config(overlay), overrides)


class ProbeError(OverlayError):
    """A probed peer did not answer (declared dead) or the probe timed out."""


class Node(Sender):
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

    # slots: a node has ~35 attributes, and an instance dict that size costs ~1.5 KiB
    __slots__ = (
        "_address",
        "_closed",
        "_closed_event",
        "_control_handlers",
        "_core",
        "_core_kwargs",
        "_counters",
        "_ctl_waiters",
        "_entered",
        "_factory",
        "_limiter",
        "_nursery_cm",
        "_own_id_bytes",
        "_pair_on",
        "_relays",
        "_rng",
        "_runtime",
        "_scheme",
        "_session_config",
        "_signer",
        "_started_at",
        "_use_reply_to",
        "_verifier",
        "_wire",
        "config",
        "identity",
        "join_timeout_s",
        "multicast",
        "overlay",
        "signing",
        "transport",
    )

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
        if isinstance(overlay, str):
            _check_overlay(overlay)
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
        # the process's one default (frozen) instead of an equal copy per node: the decoder's
        # cached keyword set is then found by identity on every datagram
        lim = limits if limits is not None else DEFAULT_LIMITS
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
        self._reading = None
        self._entered = False
        self._use_reply_to = self._address.startswith("tcp://")
        self._scheme = self._address.partition("://")[0]
        self._started_at = 0.0
        self._closed = False
        self._closed_event: trio.Event | None = None  # made when someone waits for it
        self._ctl_waiters: dict[int, Callable[[Message], None]] = {}
        self._control_handlers: dict[type[Message], ControlHandler] = {}
        self._gate_ = None
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
            # from a list: a generator's resized tuple parks on a freelist (overlay/wire.py)
            rows.append(tuple([h for h in row if h is not None]))
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
        for prefix, c in parts:
            for k, v in c.items():
                out[prefix + k] = v
        if self._pair is not None:
            # derivations of the pair keys dropped when idle are in the counter already
            out["node.pair_derivations"] = self._counters["pair_derivations"] + (
                self._pair.derivations
            )
            out["node.pair_keys_held"] = self._pair.held()
        return MappingProxyType(out)

    @property
    def sessions(self) -> Sessions | None:
        """This node's authenticated sessions (None when unsigned, turned off, or before the
        first handshake)."""
        return self._sessions

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
        # a built-in overlay's frozen default config, shared (see _DEFAULT_CONFIGS)
        key = (
            factory
            if isinstance(factory, str)
            and self.config is None
            and "config" not in self._core_kwargs
            else None
        )
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
        elif key is not None:
            args.append(_live_default_config(key))
        core = factory(*args, **self._core_kwargs)
        if not isinstance(core, KbrCore):
            raise ConfigError(f"overlay factory returned {type(core).__name__}, not a KbrCore")
        return core

    async def __aenter__(self) -> Node:
        if self._entered:
            raise OverlayError("a Node can be entered only once")
        self._entered = True
        runtime = TrioRuntime(self, self._rng)
        self._runtime = runtime
        core = self._make_core(runtime)
        core.register(LOOKUP_APP, LookupApp(self))
        # every live node takes part in multicast trees (aggregation for discovery queries)
        self.multicast = attach_multicast(core)
        self._core = core
        self._started_at = trio.current_time()
        # Timers run on the process's one timer heap, a UDP socket is read by the process's
        # one poller (overlay.live.reactor): such a node has no task and no nursery of its own.
        # Other transports get a receive task in a nursery of the node's; it owns the one
        # cancel scope that _halt() cancels.
        nursery = None
        try:
            if not self._start_receiving(runtime.reactor, None):
                self._nursery_cm = trio.open_nursery()
                nursery = await self._nursery_cm.__aenter__()
                self._start_receiving(runtime.reactor, nursery)
            core.start()
        except BaseException:
            self._halt()
            if self._nursery_cm is not None:
                await self._nursery_cm.__aexit__(None, None, None)
            raise
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self.leave()
        if self._nursery_cm is None:
            await trio.lowlevel.checkpoint()
            return None
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
        self._stop_receiving()
        if self._closed_event is not None:
            self._closed_event.set()

    @property
    def closed_event(self) -> trio.Event:
        """Set once the node has left, crashed or been closed."""
        ev = self._closed_event
        if ev is None:
            ev = self._closed_event = trio.Event()
            if self._closed:
                ev.set()
        return ev

    @property
    def closed(self) -> bool:
        """True once the node has left, crashed or been closed."""
        return self._closed

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
