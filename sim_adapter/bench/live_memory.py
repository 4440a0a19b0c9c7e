"""Where a live node's memory goes: the ``--trace-memory`` report of ``flockring bench live``.

Theory of operation (docs/transports.md, "Memory"): the worker starts ``tracemalloc`` (one frame
per allocation) right after its baseline and takes a census of objects by type; after the
bring-up, :func:`memory_report` groups what is still allocated by source line and by file and
diffs the census, everything divided by the number of nodes. Allocations are charged to the line
that made them (a dict's growth to the line that inserted the key that made it grow).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

__all__ = ["census", "memory_report"]


def census() -> dict[str, tuple[int, int]]:
    """``type name -> (objects, bytes)`` over every object the garbage collector tracks, plus
    the containers' referents of untracked types (floats, ints, bytes, str held in them)."""
    import gc

    out: dict[str, list[int]] = {}
    seen: set[int] = set()
    for o in gc.get_objects():
        for x in (o, *gc.get_referents(o)):
            i = id(x)
            if i in seen:
                continue
            seen.add(i)
            e = out.setdefault(type(x).__qualname__, [0, 0])
            e[0] += 1
            e[1] += sys.getsizeof(x)
    return {k: (v[0], v[1]) for k, v in out.items()}


def memory_report(n: int, census0: dict[str, tuple[int, int]] | None, top: int) -> dict[str, Any]:
    """Where the memory allocated since the baseline went, per node: tracemalloc by source
    line and by file, and the object census by type (``--trace-memory``; slows the run)."""
    import tracemalloc

    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    out: dict[str, Any] = {
        "traced_KiB": round(sum(s.size for s in snap.statistics("filename")) / n / 1024, 2)
    }
    for key in ("lineno", "filename"):
        out[f"by_{key}"] = [
            (
                str(st.traceback[0]).replace(str(Path(__file__).resolve().parents[2]) + "/", ""),
                round(st.size / n, 1),
                round(st.count / n, 2),
            )
            for st in snap.statistics(key)[:top]
        ]
    del snap  # its traces are objects too: out of the census
    if census0 is not None:
        import gc

        gc.collect()
        c1 = census()
        diff = {
            k: (v[0] - census0.get(k, (0, 0))[0], v[1] - census0.get(k, (0, 0))[1])
            for k, v in c1.items()
        }
        out["by_type"] = [
            (k, round(b / n, 1), round(c / n, 2))
            for k, (c, b) in sorted(diff.items(), key=lambda kv: -kv[1][1])[:top]
        ]
    return out
