"""The live target of ``flockring bench fuzz``: hostile datagrams at a node on loopback UDP.

Theory of operation: see :mod:`sim_adapter.bench.fuzz` (the campaign, the decoder target and the
mutator live there; this module builds the live target's inputs — captured traffic replayed and
mutated, forged and unsigned envelopes, spoofed ids, re-signed mutants, oversized and deeply
nested payloads — sends them in batches the node has read before the next, and checks that the
node's counters account for every datagram).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from sim_adapter import bench
from sim_adapter.bench.fuzz_decoder import deep_body, hypothesis_seeds, mutate

__all__ = ["run_live"]


# ------------------------------------------------------------------------- live target
_LIVE_KINDS = (
    "random", "mutated_capture", "replay", "forged_signature", "forged_body", "unsigned",
    "spoofed_id", "resigned_mutant", "wellformed", "oversized", "deep",
)  # fmt: skip


class _Forger:
    """Makes the live campaign's datagrams (one generator per kind)."""

    def __init__(self, rng: random.Random, target: Any, captured: list[bytes], seeds: list[Any]):
        from overlay.identity import Identity
        from overlay.wire import WireError, encode_message
        from transports.auth import Signer

        self.rng = rng
        self.target = target
        self.to = target.id.to_bytes_be()
        self.captured = captured
        self.keys = [Identity.from_rng(rng) for _ in range(4)]
        self.signers = [Signer(k.private_key) for k in self.keys]
        self.reply_to = "udp://127.0.0.1:9"
        self.bodies: list[bytes] = []
        for m in seeds:
            try:
                self.bodies.append(encode_message(m))
            except WireError:
                continue
        self.envelopes = [c for c in captured if c[:1] == b"\x98"] or [self.signed(self.bodies[0])]

    def signed(self, body: bytes) -> bytes:
        """``body`` sealed by one of the fuzzer's valid keys, bound to the target."""
        return self.rng.choice(self.signers).seal(self.reply_to, body, self.to)

    def make(self, kind: str) -> bytes:
        """One datagram of ``kind`` (see :data:`_LIVE_KINDS`)."""
        from overlay.handle import NodeHandle
        from overlay.ids import NodeId
        from overlay.kbr import DirectMsg, RouteMsg
        from overlay.live.control import StatusReply
        from overlay.pastry.messages import JoinPayload
        from overlay.wire import encode_message
        from transports.codec import pack_envelope, safe_unpackb

        r = self.rng
        if kind == "random":
            d = r.randbytes(r.randint(0, 1400))
            if d and r.random() < 0.3:  # a session frame's type byte, or an envelope's header
                d = bytes((r.choice((0xF1, 0xF2, 0xF3, 0xF4, 0xF5, 0x98)),)) + d[1:]
            return d
        if kind == "mutated_capture":
            return mutate(r.choice(self.captured), r, self.captured)
        if kind == "replay":
            return r.choice(self.captured)
        if kind in ("forged_signature", "forged_body", "unsigned"):
            f = safe_unpackb(r.choice(self.envelopes))
            _, _flags, sender, seq, reply_to, to, body, sig = f
            if kind == "forged_signature" and sig:
                sig = bytes([sig[0] ^ 1]) + sig[1:]
            elif kind == "forged_body":
                body = mutate(body, r, self.bodies)
            else:  # unsigned, claiming a member's id
                sender, sig = NodeId.hash_of(sender).to_bytes_be(), None
            return pack_envelope(sender, seq + r.randint(1, 1000), reply_to, to, body, sig)
        if kind == "spoofed_id":
            # a valid key, a message claiming another id (SHA-1 of the key does not match)
            other = NodeHandle(r.choice((self.target.id, NodeId.random(r))), self.reply_to)
            m = r.choice(
                (
                    DirectMsg("flockring.lookup", (1, other, other), other),
                    RouteMsg(NodeId.random(r), "x", 1, other, r.getrandbits(62), 0),
                    RouteMsg(NodeId.random(r), "pastry.join", JoinPayload(other, 1), other, 1, 0),
                    StatusReply(r.getrandbits(62), other, "pastry", True, 0.0, (), (), 0, ()),
                )
            )
            return self.signed(encode_message(m))
        if kind == "resigned_mutant":
            return self.signed(mutate(r.choice(self.bodies), r, self.bodies))
        if kind == "wellformed":
            return self.signed(r.choice(self.bodies))
        if kind == "oversized":
            if r.random() < 0.5:
                return r.randbytes(r.choice((9_000, 60_000, 65_000)))
            me = NodeHandle(self.keys[0].id, self.reply_to)
            big = RouteMsg(NodeId.random(r), "x", bytes(60_000), me, 1, 0)
            return self.signed(encode_message(big))
        if kind == "deep":
            return self.signed(deep_body(r.choice((25, 200, 1000))))
        raise ValueError(kind)


async def _live_campaign(inputs: int, seed: int, nseeds: int) -> dict[str, Any]:
    import socket

    import trio

    from overlay.identity import Identity
    from overlay.ids import NodeId
    from overlay.live.control import ControlClient
    from overlay.live.node import Node
    from overlay.live.ratelimit import RateLimits, account
    from transports import open_udp

    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    captured: list[bytes] = []
    async with (
        open_udp(rcvbuf_bytes=1 << 20) as t0,
        open_udp() as t1,
        open_udp() as t2,
        open_udp() as tc,
    ):
        rx = _RxTap(t0)
        target = Node(rx, "pastry", Identity.from_rng(rng), seed=1,
                      rate_limits=RateLimits(enabled=False))  # fmt: skip
        peers = [Node(t, "pastry", Identity.from_rng(rng), seed=i) for i, t in enumerate((t1, t2))]
        async with target, peers[0], peers[1]:
            for p in peers:  # capture what the peers send the target
                p.transport = _Tap(p.transport, target.address, captured)
            await target.join([])
            for p in peers:
                await p.join([target.address])
            for i in range(60):
                await peers[i % 2].lookup(NodeId.random(rng), timeout_s=5)
            for p in peers:
                await p.probe(target.handle, timeout_s=5)
            forger = _Forger(rng, target, captured, hypothesis_seeds(nseeds, seed))
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", 0))
            host, _, port = target.address.removeprefix("udp://").rpartition(":")
            dest = (host, int(port))
            base = dict(target.stats)
            rx.by_source.clear()
            me = "udp://{}:{}".format(*sock.getsockname())
            sent = 0
            tstats = target.transport.stats

            def seen() -> int:  # the fuzzer's datagrams the node has read (or refused as too big)
                return int(rx.by_source[me] + tstats["recv_oversized"] - big0)

            big0 = tstats["recv_oversized"]
            with bench.stopwatch() as t:
                while sent < inputs:
                    batch = 0
                    while sent < inputs and batch < 64_000:  # under the socket's buffer
                        kind = _LIVE_KINDS[rng.randrange(len(_LIVE_KINDS))]
                        d = forger.make(kind)
                        try:
                            sock.sendto(d, dest)
                        except OSError:
                            counts["send_refused_by_kernel"] += 1  # > 65,507 bytes
                            continue
                        counts[kind] += 1
                        sent += 1
                        batch += len(d) + 512
                    await _caught_up(seen, sent, 30.0)  # pace: the node has read the batch
            await _caught_up(seen, sent, 30.0)
            counts["lost"] = sent - seen()  # dropped by the kernel (socket buffer), if any
            sock.close()
            await trio.sleep(1.0)  # let timers the inputs armed run
            after = dict(target.stats)
            delta = {k: v - base.get(k, 0) for k, v in after.items() if v - base.get(k, 0)}
            acc = account(delta)
            honest = sum(v for k, v in rx.by_source.items() if k != me)
            fuzz_seen = seen()
            ok_lookup = (await peers[0].lookup(target.id, timeout_s=5)).id == target.id
            async with ControlClient(tc) as c:
                st = await c.status(target.address, timeout_s=5)
            core_refused = {
                k: v for k, v in sorted(delta.items())
                if not k.startswith(("auth.", "wire.", "rate.", "transport.", "session."))
                and ("forged" in k or "bad" in k or "unknown" in k or "invalid" in k)
            }  # fmt: skip
    crashes = bench.internal_errors(after)
    return {
        "inputs": sent,
        "by_kind": {k: counts[k] for k in _LIVE_KINDS},
        "lost_in_kernel": counts["lost"],
        "received": acc["received"],
        "delivered": acc["delivered"],
        "session_consumed": acc["session_consumed"],
        "dropped": acc["dropped"],
        "honest_datagrams_meanwhile": honest,
        "balanced": acc["balanced"]
        and acc["received"] == fuzz_seen + honest
        and fuzz_seen + counts["lost"] == sent,
        "checks": acc["checks"],
        "refused_by_core_after_delivery": core_refused,
        "crashes": crashes,
        "still_serves": ok_lookup and st.ready,
        "captured_frames": len(captured),
        "fuzz_s": bench.r(t(), 1),
        "inputs_per_s": bench.r(sent / t(), 0) if t() else None,
    }


async def _caught_up(seen: Any, want: int, timeout_s: float) -> None:
    """Wait until ``seen() >= want`` (or ``timeout_s`` without progress)."""
    import trio

    last, idle = seen(), 0.0
    while seen() < want and idle < timeout_s:
        await trio.sleep(0.001 if idle else 0)
        now = seen()
        idle = 0.0 if now > last else idle + 0.001
        last = now


class _RxTap:
    """A transport that counts the datagrams it hands the node, by source address."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.by_source: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def receive_nowait(self) -> tuple[str, bytes] | None:
        """The next queued datagram (counted), or None."""
        got: tuple[str, bytes] | None = self._inner.receive_nowait()
        if got is not None:
            self.by_source[got[0]] += 1
        return got

    async def receive(self) -> tuple[str, bytes]:
        """The next datagram (counted)."""
        got: tuple[str, bytes] = await self._inner.receive()
        self.by_source[got[0]] += 1
        return got


class _Tap:
    """A transport that records the datagrams it sends to one address (up to 5,000)."""

    def __init__(self, inner: Any, watch: str, into: list[bytes]) -> None:
        self._inner, self._watch, self._into = inner, watch, into

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def send_nowait(self, address: str, data: bytes, *rest: Any) -> None:
        """Record ``data`` if it goes to the watched address, then send it."""
        if address == self._watch and len(self._into) < 5000:
            self._into.append(data)
        self._inner.send_nowait(address, data, *rest)


def run_live(inputs: int, seed: int = 1, seeds: int = 500) -> dict[str, Any]:
    """The live target: ``inputs`` datagrams at a node on loopback UDP."""
    import trio

    return trio.run(_live_campaign, inputs, seed, seeds)
