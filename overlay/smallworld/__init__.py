"""Brunet/Symphony-style small-world ring behind the common KBR API (Kleinberg 2000).

``SmallWorldCore(runtime, handle, config)`` is the sans-io node; ``SmallWorldConfig`` its one
configuration object; ``build_oracle(cores, rtt_s)`` installs the steady state directly for
large simulations. See ``docs/smallworld.md``.
"""

from overlay.smallworld.config import SmallWorldConfig
from overlay.smallworld.connections import ConnectionTable
from overlay.smallworld.core import SmallWorldCore
from overlay.smallworld.estimate import (
    desired_shortcuts,
    draw_shortcut_target,
    estimate_size,
    ttl_hops,
)
from overlay.smallworld.oracle import build_oracle

__all__ = [
    "ConnectionTable",
    "SmallWorldConfig",
    "SmallWorldCore",
    "build_oracle",
    "desired_shortcuts",
    "draw_shortcut_target",
    "estimate_size",
    "ttl_hops",
]
