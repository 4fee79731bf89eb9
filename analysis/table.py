"""Plain-text tables for the terminal: left-aligned words, right-aligned numbers."""

from __future__ import annotations

from collections.abc import Sequence


def _is_number(text: str) -> bool:
    t = text.replace(",", "").replace(".", "").replace(":", "").replace("%", "").replace("x", "")
    t = t.rstrip("KMGTBiptsun/")
    return t.lstrip("-").isdigit()


def render(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str = "") -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [
        all(_is_number(r[i]) or r[i] in ("-", "") for r in cells[1:]) for i in range(len(headers))
    ]

    def line(row):
        parts = [
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(row, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [title] if title else []
    out.append(line(cells[0]))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells[1:])
    return "\n".join(out)
