"""Durable replacement: old content or all of the new, fsync of the file and of its directory."""

import os
import stat

import pytest

from ipu_packing import fsutil


def test_replace_is_all_or_nothing(tmp_path):
    path = str(tmp_path / "manifest.json")
    fsutil.atomic_write_text(path, "old")
    with pytest.raises(RuntimeError):
        with fsutil.atomic_open(path, "w", encoding="utf-8") as f:
            f.write("half of the new")
            raise RuntimeError("killed mid-write")
    assert open(path).read() == "old"
    assert os.listdir(str(tmp_path)) == ["manifest.json"]  # no temporary left
    fsutil.atomic_write_bytes(path, b"new")
    assert open(path, "rb").read() == b"new"


@pytest.fixture
def synced(monkeypatch):
    """For every os.fsync call, whether its descriptor was a directory."""
    calls = []
    real = os.fsync

    def record(fd):
        calls.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return calls


def test_file_and_directory_are_fsynced(tmp_path, synced):
    fsutil.atomic_write_text(str(tmp_path / "a.txt"), "x")
    assert synced == [False, True]  # the data, then the directory entry


def test_stale_temporaries_are_removed(tmp_path):
    for name in (".step_0000010.pt.abc123.tmp", ".manifest.json.x.tmp", "keep.tmp", "step_0000010.pt"):
        (tmp_path / name).write_text("")
    assert fsutil.remove_stale_temporaries(str(tmp_path)) == 2
    assert sorted(os.listdir(str(tmp_path))) == ["keep.tmp", "step_0000010.pt"]


def test_fsync_tree_syncs_every_file_and_directory(tmp_path, synced):
    (tmp_path / "packed").mkdir()
    for name in ("packed/shard-00000.npy", "packed/manifest.json", "top.txt"):
        (tmp_path / name).write_text("x")
    del synced[:]  # only what fsync_tree does
    fsutil.fsync_tree(str(tmp_path))
    assert sorted(synced) == [False, False, False, True, True]
