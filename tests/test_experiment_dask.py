"""Replicates on a Dask cluster give the same document as inline runs; a bad address is one line.

A ``distributed.LocalCluster`` with one worker process stands in for a researcher's cluster: the
replicate function is pickled, shipped, run in another process and its result returned, which is
exactly what a remote scheduler does.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from overlay.errors import ConfigError
from sim_adapter.experiments import common
from sim_adapter.experiments.butt import replicate
from sim_adapter.experiments.butt_condor import Machinery
from sim_adapter.experiments.butt_model import ButtConfig

pytestmark = pytest.mark.slow

SMALL = ButtConfig(jobs_per_sequence=8)


def _strip(reps: list[dict[str, Any]]) -> str:
    for r in reps:
        for conf in r.values():
            if isinstance(conf, dict):
                conf.pop("wall_s", None)
    return json.dumps(reps, sort_keys=True)


def test_dask_local_cluster_matches_inline() -> None:
    distributed = pytest.importorskip("distributed")
    # the Condor machinery model (the default of butt-table2) on the 2006 PlanetLab sites
    fn = functools.partial(replicate, SMALL, Machinery(), "condor", "planetlab-2006", ("I", "II"))
    inline = common.run_replicates(fn, [5, 6], progress=False)
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        remote = common.run_replicates(fn, [5, 6], progress=False, dask=cluster.scheduler_address)
    assert _strip(remote) == _strip(inline)
    assert [r["seed"] for r in remote] == [5, 6]
    assert any(r["II"]["flocked_out"] > 0 for r in inline)  # flocking really ran remotely too


def test_unreachable_scheduler_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("distributed")
    monkeypatch.setattr(common, "DASK_CONNECT_TIMEOUT_S", 1.0)
    with pytest.raises(ConfigError, match="cannot reach the Dask scheduler"):
        common.run_replicates(abs, [1], progress=False, dask="tcp://127.0.0.1:9")
