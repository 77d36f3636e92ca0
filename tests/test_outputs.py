"""Nothing of the user's overwritten (fsutil.check_output, the one rule of every output): an output is absent, a
regular file, or a directory that is empty or that this program made. A run directory (checkpoint.output_dir) that
is anything else (a model directory, a directory of the user's files, a symlink, a file, the dataset) is refused in
one line `error: ...`, exit status 2, before any work, and the path is left exactly as it was."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat

import pytest

import app_fixtures as fx
from ipu_packing.train.cli import main as train_main

pytestmark = pytest.mark.usefixtures("one_thread")


def state_of(root):
    """{relative path: (kind, sha256 of a regular file's bytes, symlink target)} of ``root`` and everything under
    it, symlinks and special files not followed nor opened."""
    out = {}
    paths = [root]
    if os.path.isdir(root) and not os.path.islink(root):
        for base, dirs, files in os.walk(root):
            paths += [os.path.join(base, name) for name in dirs + files]
    for path in paths:
        if not os.path.lexists(path):
            out[path] = None
            continue
        info = os.lstat(path)
        digest = None
        if stat.S_ISREG(info.st_mode):
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        target = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
        out[os.path.relpath(path, root)] = (stat.S_IFMT(info.st_mode), digest, target)
    return out


def one_line(err, *words):
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A transformers classifier directory (random weights, its tokenizer): what predict serves."""
    root = tmp_path_factory.mktemp("outputs")
    return fx.hf_classifier(str(root / "model"), 2, "single_label_classification")


# -- checkpoint.output_dir -----------------------------------------------------------------------------------


def _hf_model_dir(tmp_path, data_dir, classifier):
    shutil.copytree(classifier, str(tmp_path / "run"))
    return str(tmp_path / "run")


def _users_files(tmp_path, data_dir, classifier):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"mine": true}\n')
    (run / "metrics.jsonl").write_text('{"step": 1, "mine": true}\n')
    (run / ".draft.tmp").write_text("my draft\n")
    return str(run)


def _symlink_to_empty_dir(tmp_path, data_dir, classifier):
    (tmp_path / "real").mkdir()
    os.symlink(str(tmp_path / "real"), str(tmp_path / "run"))
    return str(tmp_path / "run")


def _a_file(tmp_path, data_dir, classifier):
    (tmp_path / "run").write_text("mine\n")
    return str(tmp_path / "run")


def _the_dataset(tmp_path, data_dir, classifier):
    shutil.copytree(data_dir, str(tmp_path / "data"))
    return str(tmp_path / "data")


RUN_ROWS = [
    ("a-transformers-model-directory", _hf_model_dir, "not empty"),
    ("a-directory-of-the-users-files", _users_files, "not empty"),
    ("a-symlink-to-an-empty-directory", _symlink_to_empty_dir, "is a symlink"),
    ("a-file", _a_file, "not a directory"),
    ("the-dataset", _the_dataset, "which this command reads"),
]


@pytest.mark.parametrize("name, make, words", RUN_ROWS, ids=[r[0] for r in RUN_ROWS])
def test_a_run_refuses_an_output_dir_it_must_not_write_into(name, make, words, data_dir, classifier, tmp_path,
                                                            capsys):
    run = make(tmp_path, data_dir, classifier)
    data = str(tmp_path / "data") if name == "the-dataset" else data_dir
    before = state_of(str(tmp_path))
    code = train_main(fx.tiny_run_args(data, run, "training.steps=2"))
    one_line(capsys.readouterr()[1], "checkpoint.output_dir %s" % run, words)
    assert code == 2
    assert state_of(str(tmp_path)) == before
