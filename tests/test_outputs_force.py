"""Outputs never replace a user's files without --force (issue 26)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from aifabric.cli import main


def _refused(result, kept: Path, text: str) -> None:
    assert result.exit_code == 1, result.output
    assert "--force" in result.output and "Traceback" not in result.output, result.output
    assert kept.read_text() == text


def test_report_refuses_to_replace_a_file_without_force(pristine, tmp_path, monkeypatch):
    mine = tmp_path / "mine.html"
    mine.write_text("my notes")
    _refused(CliRunner().invoke(main, ["report", str(pristine), "-o", str(mine)]), mine, "my notes")
    monkeypatch.chdir(tmp_path)
    default = tmp_path / "report.html"
    default.write_text("mine too")
    _refused(CliRunner().invoke(main, ["report", str(pristine)]), default, "mine too")
    result = CliRunner().invoke(main, ["report", str(pristine), "-o", str(mine), "--force"])
    assert result.exit_code == 0, result.output
    assert mine.read_text().startswith("<!DOCTYPE html>") or "<html" in mine.read_text()
    result = CliRunner().invoke(main, ["report", str(pristine), "-o", ""])
    assert result.exit_code == 1 and "empty" in result.output, result.output


def test_sweep_commands_refuse_to_replace_a_users_files_without_force(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    table = folder / "results.csv"
    table.write_text("my,table\n")
    result = CliRunner().invoke(main, ["sweep", "run", "demo", "-o", str(folder)])
    _refused(result, table, "my,table\n")
    page = folder / "report.html"
    page.write_text("my page")
    result = CliRunner().invoke(main, ["experiment", "run", "ecmp-entropy", "-o", str(folder)])
    _refused(result, page, "my page")
    result = CliRunner().invoke(main, ["sweep", "report", str(folder), "-o", str(page)])
    _refused(result, page, "my page")
