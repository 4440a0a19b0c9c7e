"""Admission of control requests: return-routability cookies and a per-source rate limit.

Control requests (``flockring status``, lookups, discovery queries from tools) arrive from
nodes that are not overlay members, and their answers can be much larger than the request. On
UDP the source address can be spoofed, so an answer sent to it could flood a third party. The
rule, as with DNS cookies (RFC 7873) and QUIC address validation (RFC 9000 §8): a source that
has not proven it receives at its address gets an answer no larger than its request — a
:class:`~overlay.live.control.CookieReply` carrying a cookie bound to that address — and only a
request that echoes a valid cookie gets the full answer. Cookies are an HMAC of the address
under a per-node random secret and a time bucket; they are valid for two buckets, so no state
is kept per source for them. Every request, proven or not, also passes a per-source token
bucket, so one source cannot make the node work without bound.

:class:`TokenBucket` is one bucket for all sources: it bounds the work a node does for session
handshakes from anyone (``transports.session``: answering a HELLO costs two X25519 operations
and a key generation, ~120 µs). A per-source table would cost every node ~150 bytes per peer
that ever handshook with it; refusing a handshake under a flood costs only efficiency (the
peers' traffic stays Ed25519-signed), so one bucket is enough.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from collections import OrderedDict

__all__ = ["ControlGate", "TokenBucket"]


class ControlGate:
    """Cookies and rate limits for control requests (one per node)."""

    def __init__(
        self,
        *,
        cookie_period_s: float = 60.0,
        rate_per_s: float = 20.0,
        burst: float = 40.0,
        max_sources: int = 4096,
    ) -> None:
        self._secret = secrets.token_bytes(32)
        self.cookie_period_s = cookie_period_s
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_sources = max_sources
        #: address -> (tokens, last refill time); least recently seen first
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def _mac(self, address: str, bucket: int) -> bytes:
        msg = f"{bucket}|{address}".encode()
        return hmac.new(self._secret, msg, hashlib.sha256).digest()[:16]

    def cookie(self, address: str, now: float) -> bytes:
        """The cookie for ``address`` at time ``now`` (16 bytes)."""
        return self._mac(address, int(now // self.cookie_period_s))

    def valid(self, cookie: bytes, address: str, now: float) -> bool:
        """True if ``cookie`` was issued to ``address`` in this time bucket or the previous."""
        if not isinstance(cookie, bytes) or len(cookie) != 16:
            return False
        b = int(now // self.cookie_period_s)
        return hmac.compare_digest(cookie, self._mac(address, b)) or hmac.compare_digest(
            cookie, self._mac(address, b - 1)
        )

    def admit(self, address: str, now: float) -> bool:
        """Take one token from ``address``'s bucket; False when it is empty (drop the request).

        The table of buckets is bounded (LRU); a source evicted from it starts with a full
        bucket again, which bounds what a flood of fresh sources gains to one burst each.
        """
        b = self._buckets.get(address)
        if b is None:
            tokens, last = self.burst, now
            if len(self._buckets) >= self.max_sources:
                self._buckets.popitem(last=False)
        else:
            tokens, last = b
            tokens = min(self.burst, tokens + (now - last) * self.rate_per_s)
            self._buckets.move_to_end(address)
        if tokens < 1.0:
            self._buckets[address] = (tokens, now)
            return False
        self._buckets[address] = (tokens - 1.0, now)
        return True


class TokenBucket:
    """One token bucket: ``rate_per_s`` tokens a second, at most ``burst`` saved up."""

    __slots__ = ("_last", "_tokens", "burst", "rate_per_s")

    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = burst
        self._last = -math.inf

    def admit(self, source: str, now: float) -> bool:
        """Take one token (whoever ``source`` is); False when the bucket is empty."""
        if now > self._last:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate_per_s)
            self._last = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
