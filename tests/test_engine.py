"""The discrete-event engine: ordering, cancellation, stop, determinism."""

from __future__ import annotations

from sim_adapter.engine import Engine


def test_events_run_in_time_then_fifo_order() -> None:
    e = Engine()
    seen: list[str] = []
    e.push(2.0, seen.append, ("c",))
    e.push(1.0, seen.append, ("a",))
    e.push(1.0, seen.append, ("b",))
    e.call_later(1.5, lambda: seen.append("t"))
    assert e.run_until(10.0)
    assert seen == ["a", "b", "t", "c"]
    assert e.now == 10.0
    assert e.events == 4


def test_cancel_owner_and_stop() -> None:
    e = Engine()
    seen: list[int] = []
    t = e.call_later(1.0, lambda: seen.append(1))
    t.cancel()

    class Dead:
        alive = False

    e.call_later(2.0, lambda: seen.append(2), owner=Dead())

    def stopper() -> None:
        seen.append(3)
        e.stop()

    e.call_later(3.0, stopper)
    e.call_later(4.0, lambda: seen.append(4))
    assert not e.run_until(10.0)
    assert seen == [3]
    assert e.now == 3.0
    assert e.run_until(10.0)
    assert seen == [3, 4]
