"""The churn benchmark's accounting at a tiny size: every measured lookup is delivered (correctly
or not) or lost with a cause, the population really churns, the same seed repeats, and a bad
trace file is named by file and line. Its figures are a benchmark's, never asserted here."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from overlay.errors import ConfigError
from sim_adapter.bench import churn


def args(**kw: Any) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    churn.register(p.add_subparsers())
    base = ["churn", "--nodes", "60", "--session-min", "4", "--hours", "0.1", "--warmup-min", "2"]
    ns = p.parse_args([*base, "--sample-s", "120", "--lookup-rate", "0.05"])
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


@pytest.mark.parametrize("overlay", ["pastry", "smallworld"])
def test_every_lookup_is_accounted_for(overlay: str) -> None:
    r = churn.run(args(overlay=overlay))
    assert r["launched"] > 50
    assert r["arrivals"] > 10 and r["departures"] > 10
    lost = r["source_crashed"] + r["holder_crashed"] + r["dropped"]
    assert r["lost"] == lost
    assert r["delivered"] + lost == r["launched"] and r["unaccounted"] == 0
    assert r["correct"] + r["incorrect"] == r["delivered"]
    assert sum(w["launched"] for w in r["windows"]) == r["launched"]
    assert len(r["windows"]) == 3


def test_same_seed_same_figures() -> None:
    a = churn.run(args(loss=0.01))
    b = churn.run(args(loss=0.01))
    for x in (a, b):
        for k in ("wall_s", "peak_rss_mib"):
            x.pop(k)
    assert a == b
    assert a["dropped_loss"] > 0


def test_trace_mode_follows_the_file(tmp_path: Path) -> None:
    f = tmp_path / "sessions.txt"
    lines = ["# arrive_s depart_s"] + [f"0 {400 + 10 * i}" for i in range(30)]
    lines += [f"{130 + 5 * i} {900 + i}" for i in range(20)]
    f.write_text("\n".join(lines) + "\n")
    r = churn.run(args(trace=str(f), warmup_min=1.0, hours=0.2))
    # 20 arrivals from the file, all after the warm-up; departures of the 30 first sessions
    # fall inside the measured window (400..690 s), the later ones at 900+ s after it ends
    assert r["arrivals"] == 20
    assert r["departures"] == 30


def test_bad_trace_line_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("0 100\n5 oops\n")
    with pytest.raises(ConfigError, match=r"t\.txt:2: expected"):
        churn.run(args(trace=str(f)))
