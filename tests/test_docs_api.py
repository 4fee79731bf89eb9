"""Every ```python block of docs/api.md, and of the README's "## Python API" section when it
has one, runs: in order, in one namespace (as a notebook's cells), in a temporary working
directory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def section(text: str, heading: str) -> str:
    """The text under `heading` (a `## ` line) up to the next `## `; empty without it."""
    match = re.search(rf"^{re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.DOTALL | re.MULTILINE)
    return match.group(1) if match else ""


def _run(cells: list[str], where: Path, monkeypatch) -> None:
    monkeypatch.chdir(where)
    namespace: dict = {"__name__": "__main__"}
    for i, cell in enumerate(cells):
        exec(compile(cell, f"<block {i + 1}>", "exec"), namespace)


def test_the_section_finder_reads_only_its_section():
    text = "# t\n## A\n```python\na = 1\n```\n## Python API\n```python\nb = 2\n```\n## C\n"
    assert blocks(section(text, "## Python API")) == ["b = 2\n"]
    assert section(text, "## Missing") == ""


def test_docs_api_blocks_run(tmp_path, monkeypatch):
    cells = blocks((ROOT / "docs" / "api.md").read_text())
    assert len(cells) >= 5
    _run(cells, tmp_path, monkeypatch)


def test_readme_python_api_blocks_run(tmp_path, monkeypatch):
    cells = blocks(section((ROOT / "README.md").read_text(), "## Python API"))
    if not cells:
        pytest.skip("the README has no ## Python API section with python blocks")
    _run(cells, tmp_path, monkeypatch)
