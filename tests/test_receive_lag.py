"""The receive lag a process measures with kernel arrival stamps (transports/lag.py)."""

from __future__ import annotations

import pytest
import trio

from transports import udp
from transports.lag import MAX_NOISE_S, SAMPLE_EVERY, ReceiveLag
from transports.udp import open_udp


def test_the_estimator_smooths_as_rfc6298_and_is_bounded() -> None:
    lag = ReceiveLag()
    assert lag.noise_s() == 0.0  # no sample: no noise claimed
    lag.sample(0.004)
    assert (lag.mean_s, lag.dev_s) == (0.004, 0.002)  # RFC 6298 §2.2's first sample
    lag.sample(0.012)
    assert lag.dev_s == pytest.approx(0.002 + (0.008 - 0.002) / 4)
    assert lag.mean_s == pytest.approx(0.004 + 0.008 / 8)
    assert lag.noise_s() == pytest.approx(lag.mean_s + 4 * lag.dev_s)
    lag.sample(-1.0)  # a clock step back: ignored
    lag.sample(float("nan"))
    assert lag.samples == 2
    for _ in range(50):
        lag.sample(5.0)  # a suspended process: the bound stays bounded
    assert lag.noise_s() == MAX_NOISE_S


async def test_datagrams_left_waiting_are_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each datagram waits 5 ms in the socket before it is read (each read followed by an
    empty one, as a burst ends): one datagram in ``SAMPLE_EVERY`` is sampled, at about 5 ms."""
    fresh = ReceiveLag()
    monkeypatch.setattr(udp, "RECEIVE_LAG", fresh)
    async with open_udp("udp://127.0.0.1:0") as a, open_udp("udp://127.0.0.1:0") as b:
        if not b._stamped:
            pytest.skip("no kernel receive timestamps on this platform (Linux SO_TIMESTAMPNS)")
        n = 4 * SAMPLE_EVERY
        for _ in range(n):
            a.send_nowait(b.address, b"x")
            await trio.sleep(0.005)
            assert b.receive_nowait() is not None
            assert b.receive_nowait() is None
        assert n // SAMPLE_EVERY - 1 <= fresh.samples <= n // SAMPLE_EVERY + 1
        assert fresh.samples >= 1 and 0.004 <= fresh.mean_s < 0.5
