"""Rule 6 (issue 24), outputs honour the umask. The mechanism is ipu_packing/fsutil.py: every file
`atomic_open` writes gets `file_mode()` = 0o666 & ~umask (mkstemp alone gives 0600), and every directory
`make_temp_dir` makes gets `dir_mode()` = 0o777 & ~umask (mkdtemp alone gives 0700). A table of umasks and
writers, then a real training run in a subprocess under umask 002: its config, summary and checkpoints
are group-readable and group-writable, as `open` would have made them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

import app_fixtures as fx
from ipu_packing import fsutil

from app_fixtures import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UMASKS = [0o022, 0o002, 0o077, 0o027, 0o000, 0o007]


@pytest.fixture()
def umask():
    saved = os.umask(0o022)
    os.umask(saved)
    yield lambda mask: os.umask(mask)
    os.umask(saved)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _text(path):
    fsutil.atomic_write_text(path, "x")


def _bytes(path):
    fsutil.atomic_write_bytes(path, b"x")


def _open_text(path):
    with fsutil.atomic_open(path, "w", encoding="utf-8") as f:
        f.write("x")


def _replace_existing(path):
    with open(path, "w") as f:  # an older file of another mode: the new one gets the umask's mode
        f.write("old")
    os.chmod(path, 0o600)
    fsutil.atomic_write_text(path, "new")


def _in_new_directory(path):
    fsutil.atomic_write_bytes(os.path.join(path + ".d", "deeper", "f"), b"x")
    os.replace(os.path.join(path + ".d", "deeper", "f"), path)


WRITERS = [("atomic_write_text", _text), ("atomic_write_bytes", _bytes), ("atomic_open", _open_text),
           ("replace-0600-file", _replace_existing), ("in-new-directory", _in_new_directory)]


@pytest.mark.parametrize("mask", UMASKS, ids=["umask%03o" % m for m in UMASKS])
@pytest.mark.parametrize("name, writer", WRITERS, ids=[w[0] for w in WRITERS])
def test_files_get_the_umask_mode(name, writer, mask, umask, tmp_path):
    umask(mask)
    path = str(tmp_path / "out.bin")
    writer(path)
    assert _mode(path) == 0o666 & ~mask, oct(_mode(path))
    assert fsutil.file_mode() == 0o666 & ~mask and fsutil.dir_mode() == 0o777 & ~mask


@pytest.mark.parametrize("mask", UMASKS, ids=["umask%03o" % m for m in UMASKS])
def test_temporary_output_directories_get_the_umask_mode(mask, umask, tmp_path):
    umask(mask)
    path = fsutil.make_temp_dir(prefix=".out.", dir=str(tmp_path))
    assert os.path.isdir(path) and _mode(path) == 0o777 & ~mask, oct(_mode(path))


def test_the_umask_is_read_without_changing_it(umask):
    umask(0o027)
    assert fsutil.current_umask() == 0o027
    assert os.umask(0o027) == 0o027


@pytest.mark.parametrize("mask", [0o002, 0o022], ids=["umask002", "umask022"])
def test_a_training_run_is_shareable(mask, tmp_path):
    data = fx.write_prepared(str(tmp_path / "data"), S=32, K=3, V=64, num_sequences=96, seed=0)
    run = str(tmp_path / "run")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    command = [sys.executable, os.path.join(ROOT, "run_pretraining.py")] + TINY + [
        "data.dir=%s" % data, "checkpoint.output_dir=%s" % run, "training.steps=2", "checkpoint.export=false"]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: os.umask(mask))
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = [os.path.join(run, "config.json"), os.path.join(run, "summary.json")]
    written += [os.path.join(run, "checkpoints", n) for n in os.listdir(os.path.join(run, "checkpoints"))]
    assert len(written) >= 3
    modes = {os.path.relpath(p, run): oct(_mode(p)) for p in written}
    assert set(modes.values()) == {oct(0o666 & ~mask)}, modes
