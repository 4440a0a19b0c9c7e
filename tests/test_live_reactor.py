"""The process-wide timer heap and socket poller of live nodes (``overlay.live.reactor``).

Oracles: the timers that fire are exactly those set and not cancelled whose owner was still
open at their deadline, in (deadline, set order); every datagram sent to a registered socket
reaches that socket's reader and no other; a reader is removed only by whoever registered it.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from functools import partial

import trio
import trio.testing

from overlay.live.reactor import Reactor, reactor
from transports.udp import UdpTransport, open_udp


class Owner:
    def __init__(self) -> None:
        self.closed = False
        self.counters: Counter[str] = Counter()
        self.reactor = reactor()


def test_timers_fire_in_order_skip_cancelled_and_closed_owners() -> None:
    async def main() -> None:
        rng = random.Random(7)
        owners = [Owner() for _ in range(5)]
        fired: list[int] = []
        expected: list[tuple[float, int]] = []
        timers = []

        def fire(i: int) -> Callable[[], None]:
            return lambda: fired.append(i)

        t0 = trio.current_time()
        for i in range(400):
            o = rng.choice(owners)
            d = rng.choice([0.0, 0.5, 1.0, rng.random() * 3, -1.0, float("nan")])
            timers.append((i, o, d, o.reactor.call_later(d, fire(i), o)))
        closed = owners[0]
        cancelled = set(rng.sample(range(400), 250))  # a majority: the heap is rebuilt
        for i, _, _, t in timers:
            if i in cancelled:
                t.cancel()
        closed.closed = True
        for i, o, d, _ in timers:
            if i not in cancelled and o is not closed:
                expected.append((d if d >= 0 else 0.0, i))
        await trio.sleep(5)
        assert fired == [i for _, i in sorted(expected)]
        assert trio.current_time() - t0 >= 5
        for _, _, _, t in timers:
            t.cancel()  # after firing: a no-op
        assert reactor().pending() == 0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_timer_error_is_counted_and_later_timers_still_fire() -> None:
    async def main() -> None:
        o = Owner()
        out: list[str] = []

        def boom() -> None:
            raise RuntimeError("bug in a core")

        o.reactor.call_later(0.1, boom, o)
        o.reactor.call_later(0.2, lambda: out.append("later"), o)

        def nested() -> None:
            # a timer set from a callback, earlier than the sleeping deadline, wakes the task
            o.reactor.call_later(0.01, partial(out.append, "x"), o)

        o.reactor.call_later(0.05, nested, o)
        await trio.sleep(1)
        assert out == ["x", "later"] and o.counters["timer_errors"] == 1

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_one_reactor_per_run() -> None:
    seen: list[Reactor] = []

    async def main() -> None:
        seen.append(reactor())
        assert reactor() is seen[-1]

    trio.run(main)
    trio.run(main)
    assert seen[0] is not seen[1]


def test_poller_dispatches_each_socket_to_its_reader() -> None:
    async def main() -> None:
        r = reactor()
        async with (
            open_udp() as a,
            open_udp() as b,
            open_udp() as c,
        ):
            got: dict[str, list[bytes]] = {"a": [], "b": []}
            done = trio.Event()

            def reader(name: str, t: UdpTransport) -> Callable[[], None]:
                def on_readable() -> None:
                    while (item := t.receive_nowait()) is not None:
                        got[name].append(item[1])
                    if len(got["a"]) == 20 and len(got["b"]) == 30:
                        done.set()

                return on_readable

            ra, rb = reader("a", a), reader("b", b)
            assert r.add_reader(a.fileno(), ra)
            assert r.add_reader(b.fileno(), rb)
            for i in range(30):
                if i < 20:
                    c.send_nowait(a.address, b"a%d" % i)
                c.send_nowait(b.address, b"b%d" % i)
            with trio.fail_after(10):
                await done.wait()
            assert got["a"] == [b"a%d" % i for i in range(20)]
            assert got["b"] == [b"b%d" % i for i in range(30)]
            # only the registered reader removes a registration
            r.remove_reader(a.fileno(), rb)
            c.send_nowait(a.address, b"late")
            with trio.fail_after(10):
                while got["a"][-1] != b"late":
                    await trio.sleep(0.01)
            r.remove_reader(a.fileno(), ra)
            c.send_nowait(a.address, b"unread")
            await trio.sleep(0.2)
            assert got["a"][-1] == b"late"
            assert a.receive_nowait() == (c.address, b"unread")
            r.remove_reader(b.fileno(), rb)

    trio.run(main)
