"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from toy_overlay import ToyConfig, ToyCore, toy_oracle

from sim_adapter import network as netmod


@pytest.fixture
def toy_overlay() -> Iterator[str]:
    """Register the toy overlay with the simulator under the name ``"toy"``."""
    netmod.OVERLAYS["toy"] = (ToyCore, ToyConfig, toy_oracle)
    yield "toy"
    del netmod.OVERLAYS["toy"]
