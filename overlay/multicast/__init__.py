"""Recursive-partition multicast and map-reduce aggregation on the KBR API (both overlays).

PonD (Lee et al. 2012) §2.3, §3.1; see :mod:`overlay.multicast.app` for the theory of
operation and ``docs/multicast.md``. Modules by concern:

* :mod:`~overlay.multicast.app` — the per-node application (:class:`Multicast`), the root side
  and :func:`attach`;
* :mod:`~overlay.multicast.protocol` — the per-node tree protocol (dispatch, answers, deadlines,
  repair, reliable replies); :mod:`~overlay.multicast.session` its bookkeeping records;
* :mod:`~overlay.multicast.api` — config, aggregator plug-ins, results, errors;
* :mod:`~overlay.multicast.tree` and :mod:`~overlay.multicast.ranges` — the pure partition and
  ring-range functions (shared with the simulator's analytic mode);
* :mod:`~overlay.multicast.messages` — the wire messages.
"""

from overlay.multicast.api import (
    BUILTIN_AGGREGATORS,
    Aggregator,
    CollectIds,
    Count,
    MulticastConfig,
    MulticastHost,
    MulticastResult,
    ResultCallback,
    UnknownAggregatorError,
)
from overlay.multicast.app import MULTICAST_APP, Multicast, attach
from overlay.multicast.messages import McAck, McQuery, McReply, McReplyAck, Range
from overlay.multicast.ranges import CCW, CW

__all__ = [
    "BUILTIN_AGGREGATORS",
    "CCW",
    "CW",
    "MULTICAST_APP",
    "Aggregator",
    "CollectIds",
    "Count",
    "McAck",
    "McQuery",
    "McReply",
    "McReplyAck",
    "Multicast",
    "MulticastConfig",
    "MulticastHost",
    "MulticastResult",
    "Range",
    "ResultCallback",
    "UnknownAggregatorError",
    "attach",
]
