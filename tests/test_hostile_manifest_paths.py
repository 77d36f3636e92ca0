"""Rule 2 (issue 24) for a dataset's manifest: the files it names (vocab_file, each shard's file) stay inside
the dataset directory. The mechanism is data/format.py `read_manifest`, which joins each name only through
fsutil.contained_path (no absolute path, no `..` out, no symlink whose real path leaves the directory, no name
twice); data/shards.py opens the shards through the same helper.

Each hostile row points at a real, valid copy of the data outside the directory (its checksum rewritten), so
only the containment check can refuse it."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import app_fixtures as fx
from ipu_packing.data import open_dataset
from ipu_packing.errors import UserError


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return fx.write_prepared(str(tmp_path_factory.mktemp("paths")), S=32, K=3, V=64, num_sequences=96)


def _edit(directory, change):
    path = os.path.join(directory, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    change(manifest, directory)
    with open(path, "w") as f:
        json.dump(manifest, f)


def _outside(directory, name):
    """A copy of the dataset's file `name` beside (outside) the directory; returns its path."""
    target = os.path.join(os.path.dirname(directory), "outside-" + name)
    shutil.copyfile(os.path.join(directory, name), target)
    return target


def shard_named(how):
    def change(manifest, directory):
        name = manifest["shards"][0]["file"]
        target = _outside(directory, name)
        manifest["shards"][0]["file"] = how(directory, name, target)
    return change


def vocab_named(how):
    def change(manifest, directory):
        target = _outside(directory, "vocab.txt")
        manifest["vocab_file"] = how(directory, "vocab.txt", target)
    return change


def _symlink(directory, name, target):
    os.remove(os.path.join(directory, name))
    os.symlink(target, os.path.join(directory, name))
    return name


def _symlinked_dir(directory, name, target):
    os.symlink(os.path.dirname(target), os.path.join(directory, "up"))
    return os.path.join("up", os.path.basename(target))


def _twice(manifest, directory):
    first = manifest["shards"][0]
    manifest["shards"][1] = dict(first)
    manifest["num_packs"] = 2 * first["num_packs"]


ROWS = [
    ("shard-absolute", shard_named(lambda d, n, t: t), "absolute"),
    ("shard-dotdot", shard_named(lambda d, n, t: "../" + os.path.basename(t)), "leaves"),
    ("shard-dotdot-deep", shard_named(lambda d, n, t: "x/../../" + os.path.basename(t)), "leaves"),
    ("shard-symlink-out", shard_named(_symlink), "symlink"),
    ("shard-through-symlinked-dir", shard_named(_symlinked_dir), "symlink"),
    ("shard-empty-name", shard_named(lambda d, n, t: ""), "not a file name"),
    ("shard-nul", shard_named(lambda d, n, t: n + "\0x"), "not a file name"),
    ("shard-named-twice", _twice, "named before"),
    ("vocab-absolute", vocab_named(lambda d, n, t: t), "absolute"),
    ("vocab-dotdot", vocab_named(lambda d, n, t: "../" + os.path.basename(t)), "leaves"),
    ("vocab-symlink-out", vocab_named(_symlink), "symlink"),
    ("vocab-through-symlinked-dir", vocab_named(_symlinked_dir), "symlink"),
    ("vocab-etc", vocab_named(lambda d, n, t: "../../../../../../../../etc/hostname"), "leaves"),
]


@pytest.mark.parametrize("name, change, words", ROWS, ids=[r[0] for r in ROWS])
def test_a_manifest_names_only_files_inside_its_directory(name, change, words, clean, tmp_path):
    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(clean, "packed"), directory)
    _edit(directory, change)
    with pytest.raises(UserError) as info:
        open_dataset(directory)
    message = str(info.value)
    assert words in message and "manifest.json" in message and "\n" not in message, message


def test_a_symlink_inside_the_directory_is_kept(clean, tmp_path):
    directory = str(tmp_path / "packed")
    shutil.copytree(os.path.join(clean, "packed"), directory)
    os.rename(os.path.join(directory, "vocab.txt"), os.path.join(directory, "vocab-real.txt"))
    os.symlink("vocab-real.txt", os.path.join(directory, "vocab.txt"))
    assert len(open_dataset(directory)) > 0
