"""Per-source rate limits on live nodes: a flood from one address is dropped and counted, honest
lookups stay correct, and the table of sources stays bounded.

The limiter is checked against a brute-force reference token bucket (one bucket per source and
kind, refilled lazily); the swarm tests run in virtual time (memory network, autojump clock), so
what the victim admits is bounded exactly by ``burst + rate × elapsed``; one test floods a real
loopback UDP node from a plain socket.
"""

from __future__ import annotations

import random
import socket

import pytest
import trio
import trio.testing

from overlay.errors import ConfigError
from overlay.identity import Identity
from overlay.ids import NodeId, closer
from overlay.live.node import Node
from overlay.live.ratelimit import _KIND_OF, KINDS, RateLimits, SourceLimiter, account, classify
from overlay.messages import REGISTRY
from overlay.testing import open_swarm
from sim_adapter.bench import internal_errors
from sim_adapter.bench.flood import flood_frames
from transports import open_udp

LIMITS = RateLimits(
    frames_per_s=16.0, frames_burst=12.0, routed_per_s=8.0, routed_burst=6.0,
    probe_per_s=4.0, probe_burst=4.0, join_per_s=1.0, join_burst=3.0,
)  # fmt: skip
_BUCKET = {"frame": 0, "routed": 1, "probe": 2, "join": 3}


class Reference:
    """One independent token bucket per (source, bucket), refilled only when used."""

    def __init__(self, lim: RateLimits) -> None:
        self.rate = [lim.frames_per_s, lim.routed_per_s, lim.probe_per_s, lim.join_per_s]
        self.burst = [lim.frames_burst, lim.routed_burst, lim.probe_burst, lim.join_burst]
        self.state: dict[tuple[str, int], tuple[float, float]] = {}

    def admit(self, src: str, bucket: str, now: float) -> bool:
        i = _BUCKET[bucket]
        tokens, last = self.state.get((src, i), (self.burst[i], now))
        tokens = min(self.burst[i], tokens + (now - last) * self.rate[i])
        ok = tokens >= 1.0
        self.state[(src, i)] = (tokens - 1.0 if ok else tokens, now)
        return ok


class Fake:
    """A stand-in message of a given kind (classify() looks at module and class name)."""


def _msg_of(kind: str) -> object:
    """A bare instance of a message class of ``kind`` (classify() looks only at its class)."""
    if kind == "other":
        return Fake()
    import overlay.kbr
    import overlay.pastry.messages
    import overlay.proximity  # noqa: F401

    mod, name = next(k for k, v in _KIND_OF.items() if v == kind)
    cls = next(c for c in REGISTRY.values() if c.__module__ == mod and c.__name__ == name)
    return cls.__new__(cls)


def test_the_limiter_agrees_with_a_reference_token_bucket() -> None:
    rng = random.Random(5)
    lim, ref = SourceLimiter(LIMITS), Reference(LIMITS)
    classes = {k: _msg_of(k) for k in (*KINDS, "other")}
    now = 0.0
    drops = 0
    for _ in range(20_000):
        if rng.random() < 0.15:  # bursts at one instant, then binary-fraction steps (exact sums)
            now += rng.choice((1 / 512, 1 / 64, 0.25, 2.0))
        src = f"udp://10.0.0.{rng.randrange(4)}:1"
        want = ref.admit(src, "frame", now)
        assert lim.admit_frame(src, now) == want
        drops += not want
        kind = rng.choice((*KINDS, "other"))
        msg = classes[kind]
        if kind == "other":
            assert lim.admit_message(src, msg, now)
            continue
        want = ref.admit(src, kind, now)
        assert lim.admit_message(src, msg, now) == want
        drops += not want
    # the sequence did exercise every bucket
    assert all(lim.counters[f"dropped_{b}"] > 20 for b in ("frame", *KINDS)), lim.counters
    assert lim.dropped() == drops
    assert lim.counters["frames"] == 20_000


def test_every_named_kind_is_a_registered_message() -> None:
    import overlay.kbr
    import overlay.pastry.messages
    import overlay.proximity
    import overlay.smallworld.messages  # noqa: F401

    registered = {(c.__module__, c.__name__): c for c in REGISTRY.values()}
    for key, kind in _KIND_OF.items():
        assert key in registered, f"{key} was renamed: the rate limits would miss it"
        assert kind in KINDS
        assert classify(registered[key].__new__(registered[key])) == kind
    assert classify(object()) == "other"


def test_the_source_table_is_bounded_and_evictions_are_counted() -> None:
    lim = SourceLimiter(RateLimits(max_sources=64))
    for i in range(10_000):
        assert lim.admit_frame(f"udp://10.1.{i // 256}.{i % 256}:7", float(i))
    assert len(lim) == 64
    assert lim.counters["evicted"] == 10_000 - 64
    # an evicted source comes back with a full bucket (one burst per fresh address)
    assert lim.admit_frame("udp://10.1.0.0:7", 1e6)


def test_disabled_limits_count_but_never_drop() -> None:
    lim = SourceLimiter(RateLimits(frames_per_s=1.0, frames_burst=1.0, enabled=False))
    assert all(lim.admit_frame("a", 0.0) for _ in range(100))
    assert lim.dropped() == 0 and lim.counters["frames"] == 100


@pytest.mark.parametrize(
    "kw", [{"routed_per_s": 0.0}, {"probe_burst": -1.0}, {"join_per_s": float("nan")},
           {"max_sources": 0}],
)  # fmt: skip
def test_bad_limits_raise_config_errors(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        RateLimits(**kw)  # type: ignore[arg-type]


async def test_a_flood_from_one_address_is_dropped_and_honest_lookups_stay_correct(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_swarm(16, overlay="pastry", seed=11, latency=(0.005, 0.03)) as sw:
        victim = sw.nodes[7]
        flooder = sw.network.endpoint()
        per_kind = 600
        frames = flood_frames(KINDS, 3 * per_kind, flooder.address, victim.id.to_bytes_be(), 3)
        before = dict(victim.stats)
        others_before = {n.id: n.dropped() for n in sw.nodes}
        t0 = trio.current_time()
        results: list[bool] = []

        async def honest() -> None:
            rng = random.Random(4)
            for j in range(60):
                src = sw.nodes[(j * 5) % len(sw.nodes)]
                key = NodeId.random(rng)
                got = await src.lookup(key, timeout_s=10)
                results.append(got.id == sw.closest_live(key).id)

        async def flood() -> None:
            for i in range(0, len(frames), 30):  # 30 frames a millisecond: 30,000/s
                for f in frames[i : i + 30]:
                    flooder.send_nowait(victim.address, f)
                await trio.sleep(0.001)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(honest)
            nursery.start_soon(flood)
        span = trio.current_time() - t0 + 0.1  # + the last frames' latency
        st = victim.stats
        d = {k: st.get(k, 0) - before.get(k, 0) for k in st}
        lim = RateLimits()
        assert all(results) and len(results) == 60, "an honest lookup failed during the flood"
        assert d["rate.dropped_frame"] > 0
        # what passed each bucket is at most its burst plus its rate over the flood's span
        # (the honest peers' own routed messages and probes to the victim pass too: + slack)
        slack = 200
        for kind, rate, burst in (
            ("routed", lim.routed_per_s, lim.routed_burst),
            ("probe", lim.probe_per_s, lim.probe_burst),
            ("join", lim.join_per_s, lim.join_burst),
        ):
            assert d[f"rate.admitted_{kind}"] <= burst + rate * span + slack, kind
        assert d["rate.frames"] - d["rate.dropped_frame"] <= lim.frames_burst + (
            lim.frames_per_s * span + slack
        )
        # nobody else dropped anything at the rate limits: honest traffic never meets them
        for n in sw.nodes:
            if n is not victim:
                assert n.dropped() == others_before[n.id], n
        # the drops are visible where `flockring status` reads them
        shown = dict(victim.status_reply().stats)
        assert shown["rate.dropped_frame"] == st["rate.dropped_frame"]
        assert account(st)["balanced"]


async def test_without_limits_the_same_flood_is_all_admitted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_swarm(
        6, overlay="pastry", seed=12, latency=0.01, rate_limits=RateLimits(enabled=False)
    ) as sw:
        victim = sw.nodes[2]
        flooder = sw.network.endpoint()
        frames = flood_frames(("probe",), 500, flooder.address, victim.id.to_bytes_be(), 5)
        before = victim.stats.get("rate.admitted_probe", 0)
        for f in frames:
            flooder.send_nowait(victim.address, f)
        await trio.sleep(1.0)
        assert victim.stats["rate.admitted_probe"] - before == 500
        assert victim.dropped() == 0


async def test_a_flood_from_many_addresses_keeps_the_table_bounded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lim = RateLimits(max_sources=32)
    async with open_swarm(4, overlay="pastry", seed=13, latency=0.01, rate_limits=lim) as sw:
        victim = sw.nodes[1]
        for i in range(300):
            ep = sw.network.endpoint()
            for f in flood_frames(("probe",), 2, ep.address, victim.id.to_bytes_be(), 100 + i):
                ep.send_nowait(victim.address, f)
        await trio.sleep(1.0)
        assert victim.stats["rate.sources"] == 32
        assert victim.stats["rate.evicted"] >= 300 - 32
        key = sw.random_key()
        assert (await sw.nodes[0].lookup(key)).id == sw.closest_live(key).id


async def test_a_udp_flood_at_a_live_node_is_counted_and_lookups_still_arrive() -> None:
    rng = random.Random(21)
    async with open_udp() as t0, open_udp() as t1, open_udp() as t2, open_udp() as t3:
        nodes = [Node(t, "pastry", Identity.from_rng(rng), seed=i) for i, t in enumerate(
            (t0, t1, t2, t3))]  # fmt: skip
        async with nodes[0], nodes[1], nodes[2], nodes[3]:
            await nodes[0].join([])
            for n in nodes[1:]:
                await n.join([nodes[0].address], timeout_s=20)
            victim = nodes[1]
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", 0))
            me = "udp://{}:{}".format(*sock.getsockname())
            host, _, port = victim.address.removeprefix("udp://").rpartition(":")
            frames = flood_frames(KINDS, 3000, me, victim.id.to_bytes_be(), 9)
            sent = 0
            for i in range(0, len(frames), 100):
                for f in frames[i : i + 100]:
                    sock.sendto(f, (host, int(port)))
                    sent += 1
                await trio.sleep(0.01)  # let the victim read (kernel buffers are small)
            await trio.sleep(0.5)
            sock.close()
            st = victim.stats
            assert st.get("rate.dropped_frame", 0) + st.get("rate.dropped_join", 0) > 0
            assert internal_errors(st) == 0  # nothing raised in the loop, a timer or a handler
            for j in range(20):
                key = NodeId.random(rng)
                best = nodes[0]
                for n in nodes:
                    if closer(key, n.id, best.id):
                        best = n
                assert (await nodes[j % 4].lookup(key, timeout_s=10)).id == best.id
            assert account(victim.stats)["balanced"]
