"""Signed announcements between live nodes on loopback UDP (real sockets, real keys, the wall
clock): a forged origin, a tampered field, a replay and an expired offer are each dropped and
counted by reason, and the node keeps serving (the honest pool then enters its willing list,
and the node still answers status requests). A blacklist share crosses the same sockets to the
pool that trusts its sender, and is refused by one that does not."""

from __future__ import annotations

import time

import attrs
import trio
from flock_support import announce

from discovery.live import Discovery
from discovery.policy import Policy
from discovery.pool import SimulatedPool
from overlay.identity import Identity
from overlay.live.control import ControlClient
from overlay.live.node import Node
from transports import open_udp


async def test_bad_announcements_are_dropped_and_counted_live() -> None:
    async with (
        open_udp("udp://127.0.0.1:0") as ta,
        open_udp("udp://127.0.0.1:0") as tm,
        Node(ta, "pastry", Identity.generate()) as victim,
        Node(tm, "pastry", Identity.generate()) as peer,
    ):
        await victim.join([])
        await peer.join([victim.address])
        d = Discovery(victim)
        pool = SimulatedPool("v", 4, collector="v.example.org:9618", runtime=victim.core.runtime)
        flock = d.attach_flock(pool, collector="v.example.org:9618", pool_name="v")
        assert flock.config.require_signatures  # live nodes sign and check by default
        me = peer.identity
        now = time.time()

        def good(seq: int, free: int = 7, issued: float | None = None) -> object:
            return announce(
                me,
                address=peer.address,
                free=free,
                seq=seq,
                issued=now if issued is None else issued,
                collector="p.example.org:9618",
            )

        third = Identity.generate()  # a pool whose key the peer does not hold
        forged = attrs.evolve(
            announce(me, address=peer.address, issued=now, seq=1),
            origin=announce(third, issued=now).origin,
        )
        tampered = attrs.evolve(good(2), free_machines=999)
        expired = good(3, issued=now - 600.0)
        send = lambda m: peer.send_message(victim.address, m, victim.id)  # noqa: E731
        for m in (forged, tampered, expired):
            send(m)
        send(good(10))  # the honest announcement, then a replay of an older round
        await trio.sleep(0.3)
        send(good(9))
        with trio.fail_after(5):
            while sum(flock.stats[k] for k in ("forged", "tampered", "expired", "replayed")) < 4:
                await trio.sleep(0.02)
        for reason in ("forged", "tampered", "expired", "replayed"):
            assert flock.stats[reason] == 1, (reason, dict(flock.stats))
        listed = [e for row in flock.willing_list() for e in row]
        assert [(e.origin.id, e.free_machines) for e in listed] == [(peer.id, 7)]
        async with open_udp("udp://127.0.0.1:0") as tc, ControlClient(tc) as c:
            assert (await c.status(victim.address)).handle == victim.handle
        d.stop()


async def test_a_blacklist_share_crosses_real_sockets_to_the_trusted_pool_only() -> None:
    async with (
        open_udp("udp://127.0.0.1:0") as ta,
        open_udp("udp://127.0.0.1:0") as tb,
        open_udp("udp://127.0.0.1:0") as tc,
        Node(ta, "pastry", Identity.generate()) as a,
        Node(tb, "pastry", Identity.generate()) as b,
        Node(tc, "pastry", Identity.generate()) as c,
    ):
        await a.join([])
        await b.join([a.address])
        await c.join([a.address])
        with trio.fail_after(10):
            while len({h.id for h in a.core.known_nodes()}) < 2:
                await trio.sleep(0.02)
        hx = {n: f"{int(n.id):040x}" for n in (a, b, c)}
        flocks = {}
        ds = []
        for n, pol in (
            (a, f'[blacklist-to]\nallow = ["id:{hx[b]}", "id:{hx[c]}"]\n'),
            (b, f'[blacklist-from]\nallow = ["id:{hx[a]}"]\n'),
            (c, ""),  # trusts nobody
        ):
            pool = SimulatedPool(hx[n][:4], 4, runtime=n.core.runtime)
            ds.append(Discovery(n))
            flocks[n] = ds[-1].attach_flock(
                pool, collector=f"{hx[n][:8]}.example.org:9618", policy=Policy.loads(pol)
            )
        flocks[a].report_failure("bad.example.org:9618", "evicted 2 jobs")
        with trio.fail_after(10):
            while not flocks[b].learned_blacklist() or not flocks[c].stats["blacklist_untrusted"]:
                await trio.sleep(0.02)
        left, by = flocks[b].learned_blacklist()["bad.example.org:9618"]
        assert by == (hx[a],) and 1700 < left <= 1800
        assert flocks[c].learned_blacklist() == {}
        assert flocks[a].stats["blacklist_shares_sent"] == 2
        for d in ds:
            d.stop()
