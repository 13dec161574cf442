"""The one table renderer: every table the report and the study print (markdown, a rich text table, or plain
aligned columns), given a header and rows of cells."""

from __future__ import annotations

import io
from typing import Optional, Sequence

Rows = Sequence[Sequence[str]]


def markdown_table(header: Sequence[str], body: Rows) -> list[str]:
    """`| a | b |` lines under a `|---|---|` rule."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in body]


def aligned_table(header: Sequence[str], body: Rows) -> list[str]:
    """Plain text: the first column left-aligned, the others right-aligned, a dashed rule under the header."""
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
        for r in [header, *body]
    ]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def rich_table(header: Sequence[str], body: Rows, max_width: Optional[int] = None, fold_first: bool = False) -> str:
    """A rich text table as wide as its cells (at most `max_width`). `fold_first`: only the first column wraps
    (folded), never a published row's label; the number columns stay on one line."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table()
    unwrapped = max((len(row[0]) for row in body if row[0].endswith("[published]")), default=None)
    for i, name in enumerate(header):
        if fold_first:
            table.add_column(
                name,
                overflow="fold",
                no_wrap=i > 0,
                ratio=1 if i == 0 else None,
                min_width=unwrapped if i == 0 else None,
            )
        else:
            table.add_column(name)
    for row in body:
        table.add_row(*(escape(cell) for cell in row))  # "[baseline]", "[published]" are text, not rich markup
    widths = [max(len(cell) for cell in column) for column in zip(header, *body)]
    width = sum(w + 3 for w in widths) + 1
    console = Console(
        file=io.StringIO(), width=width if max_width is None else min(max_width, width), force_terminal=False
    )
    console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined]
