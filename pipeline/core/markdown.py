"""One Markdown-table renderer for every report (benchmark, evaluate, quantize, the sweep comparison)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def md_cell(s: Any) -> str:
    """A Markdown table cell: ``|`` escaped, newlines joined (for cells that hold the user's data)."""
    return str(s).replace("|", "\\|").replace("\n", " ")


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]] = ()) -> list[str]:
    """The lines of a Markdown table: ``| a | b |``, ``|---|---|``, then one line per row (cells as ``str``)."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(map(str, r)) + " |" for r in rows)]
