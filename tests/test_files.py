import os
import stat

import pytest

from aifabric.fabric.errors import AifabricError
from aifabric.fabric.files import replace_atomic, write_atomic


def test_write_atomic_gives_ordinary_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "report.html", "<html></html>")
    finally:
        os.umask(old)
    path = tmp_path / "report.html"
    assert path.read_text() == "<html></html>"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "run.json"
    write_atomic(path, b"old")

    def broken(tmp):
        with open(tmp, "w") as fh:
            fh.write("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        replace_atomic(path, broken)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


@pytest.mark.parametrize(
    "where, says",
    [
        ("missing/dir/out.html", "does not exist"),
        ("file/out.html", "is not a directory"),
        ("file/sub/out.html", "is not a directory"),
        ("folder", "is a directory"),
    ],
)
def test_a_place_that_cannot_be_written_is_one_sentence(tmp_path, where, says):
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder").mkdir()
    with pytest.raises(AifabricError, match=f"cannot write .*{says}"):
        write_atomic(tmp_path / where, "data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder"]
