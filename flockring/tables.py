"""Terminal tables of the CLI: one column definition, drawn by ``rich`` on a terminal and as
plain aligned text elsewhere (pipes, logs, the demo's scripted runs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

    from overlay import Node

#: (header, width, right-aligned, value of a node)
Column = tuple[str, int, bool, Callable[["Node"], Any]]


def _known(n: Node) -> int:
    return len(n.core.known_nodes()) if not n.closed else 0


STATUS_COLUMNS: tuple[Column, ...] = (
    ("id", 10, False, lambda n: n.id.short()),
    ("address", 24, False, lambda n: n.address),
    ("ready", 5, False, lambda n: "yes" if n.ready else "no"),
    ("leaf", 4, True, lambda n: len(n.leaf_set)),
    ("rt", 4, True, lambda n: sum(len(r) for r in n.routing_table)),
    ("known", 5, True, _known),
    ("sent", 7, True, lambda n: n.stats.get("transport.sent", 0)),
    ("recv", 7, True, lambda n: n.stats.get("transport.received", 0)),
    ("routed", 6, True, lambda n: n.stats.get("delivered", 0)),
    ("drop", 5, True, lambda n: n.dropped()),
)


def _cell(text: str, width: int, right: bool) -> str:
    return f"{text:>{width}}" if right else f"{text:<{width}}"


def status_rows(nodes: Sequence[Node]) -> list[str]:
    """The status table as plain text lines (header first)."""
    out = [" ".join(_cell(h, w, r) for h, w, r, _ in STATUS_COLUMNS)]
    for n in nodes:
        out.append(" ".join(_cell(str(f(n)), w, r) for _, w, r, f in STATUS_COLUMNS))
    return out


def status_table(nodes: Sequence[Node], title: str = "") -> Table:
    """The status table as a ``rich`` table (for ``rich.live.Live``)."""
    from rich.table import Table

    t = Table(title=title or None, header_style="bold")
    for h, _, r, _ in STATUS_COLUMNS:
        t.add_column(h, justify="right" if r else "left")
    for n in nodes:
        t.add_row(*(str(f(n)) for _, _, _, f in STATUS_COLUMNS))
    return t
