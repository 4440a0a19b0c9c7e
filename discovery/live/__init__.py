"""The discovery plugins on a live ``overlay.Node``: trio wrappers and control endpoints.

The plugins are sans-io objects registered on the node's core; their timers run on the node's
trio runtime and their completion callbacks fire inside the node's tasks. This package turns
those callbacks into awaitables (:func:`wait_for`), attaches the plugins to a running node with
the node's own Ed25519 identity as their signer (:class:`Discovery`), and answers the control
requests of :mod:`discovery.control` so that ``flockring flock|query|pond|manager`` can talk to
a running node. The same plugin objects run unchanged in the simulator
(``sim_adapter.plugins``): nothing here changes protocol behaviour.

Two compositions are wired here: a *site* node (:meth:`Discovery.attach_site`: faultD, the
flock, the decision push, the pool agent and the :class:`~discovery.site.Site` coordinator on
one pool ring, Butt et al. 2006 §3.3, §4.1, §4.2) and *queue-driven ponds*
(:meth:`Discovery.attach_pond_queue`: a :class:`~discovery.pond_scheduler.PondScheduler` over
the node's job queue, started and stopped by ``flockring pond ADDR --from-queue``, PonD §3.2).

The package is in four parts: :mod:`discovery.live.wait` turns a completion callback into an
awaitable, :mod:`discovery.live.plugins` attaches the plugins (:class:`Discovery`),
:mod:`discovery.live.endpoints` answers the control requests, and :mod:`discovery.live.load`
gives a simulated pool a local workload. This is the only part of :mod:`discovery` that imports
trio.
"""

from __future__ import annotations

from discovery.live.load import simulated_load
from discovery.live.plugins import Discovery
from discovery.live.wait import DiscoveryTimeout, wait_for

__all__ = ["Discovery", "DiscoveryTimeout", "simulated_load", "wait_for"]
