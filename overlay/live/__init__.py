"""The trio driver of the sans-io overlay cores: ``overlay.Node`` and its parts.

* :mod:`overlay.live.node` — :class:`Node`, an async context manager owning one transport and
  one core (a nursery with a receive task only on transports other than UDP);
* :mod:`overlay.live.runtime` — the :class:`~overlay.runtime.Runtime` the core sees (trio clock,
  timers, signed sends);
* :mod:`overlay.live.reactor` — one timer heap and one socket poller per trio run, shared by
  every node of the process;
* :mod:`overlay.live.receive`, :mod:`overlay.live.send` — the node's I/O path;
* :mod:`overlay.live.apps` — application endpoints (``node.application(name)``);
* :mod:`overlay.live.control` — status/lookup control messages and the control client;
* :mod:`overlay.live.host` — the narrow node interface the runtime and endpoints use;
* :mod:`overlay.live.ratelimit` — per-source token buckets on what arrives (:class:`RateLimits`).

This is the only part of :mod:`overlay` (besides :mod:`overlay.testing`) that imports trio.
"""

from overlay.live.node import ControlHandler, CoreFactory, Node, ProbeError
from overlay.live.ratelimit import RateLimits

__all__ = ["ControlHandler", "CoreFactory", "Node", "ProbeError", "RateLimits"]
