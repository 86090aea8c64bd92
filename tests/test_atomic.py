"""llmcomm.atomic: a file or a folder appears whole under its name, or not at all."""

from __future__ import annotations

import pytest

from llmcomm.atomic import atomic_dir, write_bytes


def test_folder_appears_whole_or_not_at_all(tmp_path) -> None:
    out = tmp_path / "ds"
    with pytest.raises(RuntimeError), atomic_dir(out) as tmp:
        (tmp / "a").write_text("1")
        assert not out.exists()
        raise RuntimeError("reader failed half-way")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    with atomic_dir(out) as tmp:
        (tmp / "a").write_text("1")
    assert [p.name for p in out.iterdir()] == ["a"]


def test_folder_replaced_only_when_asked_and_only_on_success(tmp_path) -> None:
    out = tmp_path / "ds"
    with atomic_dir(out) as tmp:
        (tmp / "old").write_text("0")
    with pytest.raises(FileExistsError):
        with atomic_dir(out):
            pass
    with pytest.raises(KeyError), atomic_dir(out, overwrite=True) as tmp:
        (tmp / "new").write_text("1")
        raise KeyError("failed")
    assert [p.name for p in out.iterdir()] == ["old"]
    with atomic_dir(out, overwrite=True) as tmp:
        (tmp / "new").write_text("1")
    assert [p.name for p in out.iterdir()] == ["new"] and [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_file_written_atomically(tmp_path) -> None:
    write_bytes(tmp_path / "sub" / "f.bin", b"abc")
    assert (tmp_path / "sub" / "f.bin").read_bytes() == b"abc" and len(list((tmp_path / "sub").iterdir())) == 1
