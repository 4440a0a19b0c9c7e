"""How much churn one small-world node sees, and the near window it keeps for it.

Theory of operation (docs/smallworld.md, "A near window that follows the churn"):

* **Why.** Under 5-minute sessions two near neighbours a side (Brunet's default) leave wrong
  deliveries: both neighbours on one side crash within one detection time and the node takes
  the keys of the live node beyond them. Three a side removed all but one in six measured
  runs, but cost ~0.07 msg/s/node more at 30-minute sessions (over the 0.5 budget at 5 %
  loss), where two are enough. MSPastry tunes its maintenance to the failure rate each node
  observes instead of fixing it for the worst case (Castro et al. 2003, self-tuning of the
  probing period); here a node widens its near window to ``churn_near_per_side`` while the
  sessions it observes are short, and narrows it back when they are long again.
* **Estimate.** The mean session of the nodes this node is connected to, as time at risk over
  failures — the maximum-likelihood mean of exponential lifetimes observed with censoring:
  connection-seconds (the table's size integrated over time) over connection deaths (DEAD
  verdicts), both discounted by ``exp(-age / churn_horizon_s)`` so that the estimate follows a
  change of regime. Started at the first death, counting connection-seconds from the node's
  start; one three-float list per node, none for a node that never lost a connection (a
  static 10^6-node simulation pays nothing).
* **Decision**, with hysteresis so that one unlucky minute does not flap the window: wide
  when at least ``churn_min_deaths`` (discounted) deaths give a mean below
  ``churn_session_s``; narrow again once the mean exceeds ``churn_narrow_factor`` times that,
  counting at least ``churn_min_deaths`` deaths (so a quiet first minute is no evidence of
  long sessions). At 30-minute sessions a node with ~12 connections sees ~6 deaths per 900-s
  horizon, and a mean below 600 s would take three times that many.
* **A joiner** has no evidence either way: it would keep the narrow window through its first
  minutes, the very time a short session is spent in. So it takes the width of the node that
  answers its JOIN (whose reply names 2k + 2 nodes for its width k), which has watched that
  stretch of ring longer, and links that many a side from the start. Only a joiner: when
  ready nodes whose estimate was still thin took a neighbour's wider width from its lists,
  a freshly started 10^4-node ring (every node young) widened from a few early deaths
  outwards, ring-wide, for minutes (measured: docs/smallworld.md).

On by default; ``churn_near_per_side`` = ``near_per_side`` turns it off. A wide node takes back a
neighbour restarted under its old id, which links only its own narrower window, by rechecking
its old DEAD verdict when a list names it (``Proximity.recheck``; docs/smallworld.md, "A
same-id restart").

Sans-io: the time comes from the node's runtime; the module only computes.
"""

from __future__ import annotations

import math

from overlay.smallworld.config import SmallWorldConfig

__all__ = ["fold", "unsure", "wanted_near"]


def fold(
    state: list[float] | None, now: float, started: float, conns: int, deaths: int, tau: float
) -> list[float]:
    """The estimate ``[connection-seconds, deaths, as of]`` brought up to ``now``: the time
    since it was last updated counted at ``conns`` connections (the table's size over that
    time, which changes rarely), then ``deaths`` more deaths. ``state`` None: start one,
    counting connection-seconds from ``started``."""
    if state is None:
        state = [0.0, 0.0, started]
    dt = now - state[2]
    if dt > 0.0:
        f = math.exp(-dt / tau)
        # the integral of conns · exp(-(now - t) / tau) over the interval just ended
        state[0] = state[0] * f + conns * tau * (1.0 - f)
        state[1] *= f
        state[2] = now
    state[1] += deaths
    return state


def wanted_near(state: list[float], current: int, cfg: SmallWorldConfig) -> int:
    """The near connections a side this estimate asks for, given the ``current`` ones."""
    base, wide = cfg.near_per_side, cfg.churn_near_per_side
    if wide <= base:
        return base
    secs, deaths = state[0], state[1]
    if current < wide:
        short = deaths >= cfg.churn_min_deaths and secs < cfg.churn_session_s * deaths
        return wide if short else base
    # long sessions need evidence too: as many connection-seconds as ``churn_min_deaths``
    # deaths would take at the narrowing mean, not just a quiet spell of a young node
    return base if secs > _long_bar(cfg, max(deaths, cfg.churn_min_deaths)) else wide


def _long_bar(cfg: SmallWorldConfig, deaths: float) -> float:
    """Connection-seconds above which ``deaths`` deaths mean long sessions (the narrowing
    mean, ``churn_narrow_factor`` times ``churn_session_s``)."""
    return cfg.churn_session_s * cfg.churn_narrow_factor * deaths


def unsure(state: list[float] | None, cfg: SmallWorldConfig) -> bool:
    """Whether this estimate is too thin to say the sessions are short or long (too few deaths
    for the one, too few connection-seconds for the other): a joiner that young takes the
    width of the node that answered its JOIN."""
    if state is None:
        return True
    return state[1] < cfg.churn_min_deaths and state[0] <= _long_bar(cfg, cfg.churn_min_deaths)
