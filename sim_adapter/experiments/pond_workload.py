"""Jobs for the PonD job experiments: a parametric stand-in for DAS-2, or a GWA/SWF trace.

Theory of operation. PonD §4.3 drew each job's memory, number of independent concurrent tasks
and run time from the DAS-2 trace of the Grid Workloads Archive (Iosup et al. 2008; the trace
is the one Li, Groep and Wolters characterised in "Workload characteristics of a multi-cluster
supercomputer", JSSPP 2004, LNCS 3277). Neither the trace nor that characterisation could be
read here, so by default jobs come from :class:`Das2Model`, a parametric stand-in whose **form
and parameters are both our assumptions** (power-of-two task counts with some single-task
jobs, log-normal run times and memory per task; listed on the fields). Neither was fitted to,
or checked against, the trace or the published characterisation; ``docs/experiments.md`` sets
them beside the one third-party parametrisation of DAS-2 we could read.

``--trace FILE`` replaces the model with a real trace: :func:`read_trace` reads the Grid
Workloads Format (GWF: whitespace-separated columns, ``#`` comments; column 2 SubmitTime,
4 RunTime, 5 NProcs, 7 UsedMemory in KB, 8 ReqNProcs) and the Standard Workload Format of the
Parallel Workloads Archive, whose first columns are the same (``;`` comments). Jobs are drawn
from its rows uniformly (seeded), keeping each row's tasks, run time and memory together;
rows that could never run here (more tasks than machines, more memory than a machine has, no
run time) are skipped and counted. Arrivals stay exponential at the experiment's rates, as in
PonD §4.3 ("we differentiated average job inter-arrival time").
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, NamedTuple

import attrs

from overlay.errors import ConfigError

__all__ = ["Das2Model", "JobDraw", "TraceJobs", "read_trace"]


class JobDraw(NamedTuple):
    """One job's shape: concurrent tasks, run time of each (s), memory per task (MiB)."""

    tasks: int
    runtime_s: float
    memory_mb: float


@attrs.frozen(slots=True)
class Das2Model:
    """Parametric stand-in for DAS-2 jobs (module docstring); form and numbers are assumptions."""

    #: probability of a single-task job (assumption)
    serial_p: float = 0.3
    #: other jobs have 2^k tasks, k uniform on 1..max_log2 (power-of-two sizes; assumption: at
    #: most 32 tasks, a seventh of the 240 machines)
    max_log2: int = 5
    #: run time log-normal: median and sigma of ln (assumption: median 5 min, mean ~10 min),
    #: capped
    runtime_median_s: float = 300.0
    runtime_sigma: float = 1.2
    runtime_max_s: float = 7200.0
    #: memory per task log-normal: median and sigma of ln, MiB (assumption), capped at a
    #: machine's memory
    memory_median_mb: float = 64.0
    memory_sigma: float = 1.0
    memory_max_mb: float = 1024.0

    def draw(self, rng: random.Random) -> JobDraw:
        """One job."""
        tasks = 1 if rng.random() < self.serial_p else 2 ** rng.randint(1, self.max_log2)
        rt = min(
            self.runtime_max_s,
            rng.lognormvariate(math.log(self.runtime_median_s), self.runtime_sigma),
        )
        mem = min(
            self.memory_max_mb,
            rng.lognormvariate(math.log(self.memory_median_mb), self.memory_sigma),
        )
        return JobDraw(tasks, max(1.0, rt), round(mem))

    def mean_work_s(self) -> float:
        """Expected machine-seconds per job (ignoring the caps): E[tasks] · E[run time]."""
        e_tasks = (
            self.serial_p
            + (1 - self.serial_p) * sum(2**k for k in range(1, self.max_log2 + 1)) / self.max_log2
        )
        e_rt = self.runtime_median_s * math.exp(self.runtime_sigma**2 / 2)
        return float(e_tasks * e_rt)

    def describe(self) -> dict[str, Any]:
        """The parameters, JSON-friendly."""
        return {"model": "das2-shape (parameters assumed)", **attrs.asdict(self)}


def read_trace(path: str | Path) -> list[tuple[float, float, int, float]]:
    """Rows ``(submit_s, runtime_s, tasks, memory_mb)`` of a GWF or SWF trace (module
    docstring). Raises :class:`ConfigError` naming the file and line on a malformed row."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read trace {p}: {e.strerror or e}") from None
    rows = []
    for no, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        f = s.split()
        if len(f) < 8:
            raise ConfigError(f"{p}:{no}: expected at least 8 columns (GWF/SWF), got {len(f)}")
        try:
            submit, run, nproc, mem_kb, req = (float(f[1]), float(f[3]), int(float(f[4])),
                                               float(f[6]), int(float(f[7])))  # fmt: skip
        except ValueError:
            raise ConfigError(f"{p}:{no}: non-numeric field in {s[:60]!r}") from None
        tasks = nproc if nproc > 0 else req
        rows.append((submit, run, tasks, mem_kb / 1024.0 if mem_kb > 0 else 0.0))
    if not rows:
        raise ConfigError(f"{p}: no job rows")
    return rows


class TraceJobs:
    """Jobs drawn uniformly from a trace's usable rows (module docstring)."""

    def __init__(self, path: str | Path, *, max_tasks: int, memory_max_mb: float) -> None:
        rows = read_trace(path)
        self.path = str(path)
        self.rows = [
            JobDraw(t, r, round(m))
            for _, r, t, m in rows
            if 0 < t <= max_tasks and r > 0 and m <= memory_max_mb
        ]
        self.skipped = len(rows) - len(self.rows)
        if not self.rows:
            raise ConfigError(f"{path}: no row fits {max_tasks} machines of {memory_max_mb} MiB")

    def draw(self, rng: random.Random) -> JobDraw:
        """One job: a uniformly drawn usable row."""
        return self.rows[rng.randrange(len(self.rows))]

    def mean_work_s(self) -> float:
        """Mean machine-seconds per job over the usable rows."""
        return sum(j.tasks * j.runtime_s for j in self.rows) / len(self.rows)

    def describe(self) -> dict[str, Any]:
        """Source, usable and skipped rows."""
        return {
            "model": "trace",
            "path": self.path,
            "rows": len(self.rows),
            "skipped": self.skipped,
        }
