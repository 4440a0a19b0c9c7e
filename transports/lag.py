"""How long this process leaves datagrams waiting: the receive lag of its sockets.

Theory of operation: an RTT measured through an event loop is the network's round trip plus the
time the ping waited in the peer's socket and the pong in ours until each loop got to them. On a
LAN or on loopback the network's part is tens of microseconds and the waiting is milliseconds —
hundreds of nodes in one process (``flockring bench live``, the test rings) or one busy node —
so two RTTs differing by less than that waiting tell nothing about which peer is nearer.

The UDP transports ask the kernel to stamp each datagram on arrival (Linux ``SO_TIMESTAMPNS``,
socket(7)) and read every :data:`SAMPLE_EVERY`-th datagram of the process with its stamp (counted
over datagrams, not reads: an empty read ends most bursts, and sampling reads would pick the
datagrams that arrived during a burst, which waited least): the delay from the stamp to the read
is one sample of this process's receive lag. :class:`ReceiveLag` smooths the samples as RFC 6298
§2.3 smooths RTTs (gains 1/8 and 1/4) and reports ``mean + 4 · deviation`` as the bound of one
side's waiting; the live runtime doubles it (the peer's side waits as ours does: the same loop
on one host, a loop like it across a LAN) and offers it to the cores as the noise of their RTT
samples (``TrioRuntime.timing_noise_s``). One per process: every node of a process shares its
loop, and so its lag.
"""

from __future__ import annotations

__all__ = ["MAX_NOISE_S", "RECEIVE_LAG", "SAMPLE_EVERY", "ReceiveLag"]

#: one datagram in this many is read with its kernel timestamp (a ``recvmsg_into`` with
#: ancillary data costs more than the plain read)
SAMPLE_EVERY = 8
#: the bound :meth:`ReceiveLag.noise_s` reports is never above this (a collector pause or a
#: suspended process must not make every peer "near" for long)
MAX_NOISE_S = 0.025


class ReceiveLag:
    """Smoothed receive lag of one process (RFC 6298 §2.3's estimator on lag samples)."""

    __slots__ = ("dev_s", "mean_s", "samples")

    def __init__(self) -> None:
        self.mean_s = 0.0
        self.dev_s = 0.0
        self.samples = 0

    def sample(self, lag_s: float) -> None:
        """One datagram waited ``lag_s`` between its arrival and its read (negative or NaN: a
        clock step, ignored)."""
        if not lag_s >= 0.0:
            return
        if self.samples == 0:
            self.mean_s, self.dev_s = lag_s, lag_s / 2
        else:
            self.dev_s += (abs(self.mean_s - lag_s) - self.dev_s) / 4
            self.mean_s += (lag_s - self.mean_s) / 8
        self.samples += 1

    def noise_s(self) -> float:
        """How long one side of an exchange may wait in this process: ``mean + 4 · dev``
        (0 before any sample), at most :data:`MAX_NOISE_S`."""
        return min(self.mean_s + 4.0 * self.dev_s, MAX_NOISE_S)


#: the process's estimate, fed by every UDP transport that gets kernel timestamps
RECEIVE_LAG = ReceiveLag()
