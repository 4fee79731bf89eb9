"""Plain-text tables for the terminal, laid out by rich: left-aligned words, right-aligned
numbers, a rule under the header, two spaces between columns, no colour or box drawing (the
text goes to pipes, logs and tests as often as to a terminal)."""

from __future__ import annotations

import io
from collections.abc import Sequence

# rich's Box is eight rows of four characters (left, horizontal, divider, right): only the
# row under the header draws, with '-', and columns are divided by a space
_PLAIN = "    \n    \n -  \n    \n    \n    \n    \n    \n"


def _is_number(text: str) -> bool:
    t = text.replace(",", "").replace(".", "").replace(":", "").replace("%", "").replace("x", "")
    t = t.rstrip("KMGTBiptsun/")
    return t.lstrip("-").isdigit()


def render(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str = "") -> str:
    from rich.box import Box
    from rich.console import Console
    from rich.table import Table

    cells = [[str(c) for c in row] for row in rows]
    table = Table(
        box=Box(_PLAIN, ascii=True),
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        header_style=None,
        highlight=False,
    )
    for i, header in enumerate(headers):
        numeric = all(_is_number(r[i]) or r[i] in ("-", "") for r in cells)
        table.add_column(str(header), justify="right" if numeric else "left", no_wrap=True)
    for row in cells:
        table.add_row(*row)
    out = io.StringIO()
    console = Console(
        file=out, width=1 << 16, color_system=None, markup=False, emoji=False, highlight=False
    )
    console.print(table)
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    return "\n".join([title, *lines] if title else lines)
