"""The sans-io rule (docs/design.md): protocol cores never import I/O, clocks or global randomness.

Checked statically on the source (an import inside a function counts too) and dynamically: the
core packages import in a fresh interpreter without pulling in trio or socket.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Drivers that may do I/O (docs/design.md): the trio driver package, the in-memory test swarm
# and the plugins' trio wrappers. Everything else under ``overlay/`` and ``discovery/`` is a core.
DRIVER_DIRS = (ROOT / "overlay" / "live", ROOT / "discovery" / "live")
DRIVER_FILES = (ROOT / "overlay" / "testing.py",)
FORBIDDEN_MODULES = {"trio", "socket", "time", "asyncio", "selectors", "threading"}


def _core_files() -> list[Path]:
    files = []
    for pkg in ("overlay", "discovery"):
        for p in sorted((ROOT / pkg).rglob("*.py")):
            if p in DRIVER_FILES or any(d in p.parents for d in DRIVER_DIRS):
                continue
            files.append(p)
    return files


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top in FORBIDDEN_MODULES:
                    out.append(f"{path.name}:{node.lineno} import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            if top in FORBIDDEN_MODULES:
                out.append(f"{path.name}:{node.lineno} from {node.module}")
            if node.module == "os" and any(a.name == "urandom" for a in node.names):
                out.append(f"{path.name}:{node.lineno} from os import urandom")
            if node.module == "random" and any(a.name != "Random" for a in node.names):
                out.append(f"{path.name}:{node.lineno} global random function")
        elif isinstance(node, ast.Attribute) and node.attr == "urandom":
            out.append(f"{path.name}:{node.lineno} os.urandom")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "random"
            and node.attr != "Random"
        ):
            # `import random` for the type is fine; the module-level generator is not
            out.append(f"{path.name}:{node.lineno} random.{node.attr} (global generator)")
    return out


def test_core_modules_do_not_import_io_clock_or_global_random() -> None:
    files = _core_files()
    assert any(p.name == "kbr.py" for p in files)  # the check sees the cores
    assert any(p.parent.name == "multicast" for p in files)  # ... in subpackages too
    assert not any(p.parent.name == "live" for p in files)  # ... and not the trio driver
    bad = [v for p in files for v in _violations(p)]
    assert not bad, "sans-io rule broken:\n" + "\n".join(bad)


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    p = tmp_path / "core.py"
    p.write_text(
        "import random\nfrom time import monotonic\nimport os\nx = os.urandom(4)\n"
        "y = random.random()\nr: random.Random\n"
    )
    assert len(_violations(p)) == 3


def test_cores_import_without_trio_or_socket() -> None:
    code = (
        "import sys, overlay.kbr, overlay.proximity, overlay.ids, overlay.runtime\n"
        "bad = [m for m in ('trio', 'socket') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
