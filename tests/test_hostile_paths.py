"""Rule 2 (issue 24), paths inside files stay inside their directory. The mechanism is
ipu_packing/fsutil.py `contained_path(root, name)`: the one place a name read from a file becomes a path.
It refuses a non-string or empty name, a NUL, an absolute path, a `..` that climbs out, and a name whose
real path (symlinks resolved) leaves the root's real path.

Three tables: the helper itself; a Hugging Face sharded directory (`model.safetensors.index.json`) read by
`PackedBertForPreTraining.from_pretrained`; and the same directory as `checkpoint.init_from` of
run_pretraining.py, which must end in one line, exit 2."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import transformers

import app_fixtures as fx
from ipu_packing.errors import InputError
from ipu_packing.fsutil import contained_path
from ipu_packing.model import PackedBertForPreTraining
from ipu_packing.train.cli import main as train_main

from app_fixtures import TINY

INDEX = "model.safetensors.index.json"


@pytest.fixture()
def tree(tmp_path):
    """tmp/root/{a.txt, sub/b.txt, in_link -> a.txt, out_link -> ../outside.txt, out_dir -> ../elsewhere}."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    (tmp_path / "outside.txt").write_text("secret")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "c.txt").write_text("c")
    os.symlink("a.txt", str(root / "in_link"))
    os.symlink(os.path.join("..", "outside.txt"), str(root / "out_link"))
    os.symlink(str(tmp_path / "elsewhere"), str(root / "out_dir"))
    os.symlink("/etc", str(root / "etc_link"))
    return str(root)


REFUSED = [
    ("absolute", lambda root: "/etc/passwd", "absolute"),
    ("absolute-into-root", lambda root: os.path.join(root, "a.txt"), "absolute"),
    ("double-slash", lambda root: "//etc/passwd", "absolute"),
    ("dotdot", lambda root: "../outside.txt", "leaves"),
    ("dotdot-deep", lambda root: "sub/../../outside.txt", "leaves"),
    ("dotdot-dot", lambda root: "./../outside.txt", "leaves"),
    ("dotdot-many", lambda root: "/".join([".."] * 30) + "/etc/passwd", "leaves"),
    ("dotdot-sibling", lambda root: "../root2/a.txt", "leaves"),
    ("symlink-file-out", lambda root: "out_link", "symlink"),
    ("symlink-dir-out", lambda root: "out_dir/c.txt", "symlink"),
    ("symlink-etc", lambda root: "etc_link/passwd", "symlink"),
    ("symlink-dir-missing-file", lambda root: "out_dir/not_there", "symlink"),
    ("empty", lambda root: "", "not a file name"),
    ("nul", lambda root: "a.txt\0.safetensors", "not a file name"),
    ("int", lambda root: 7, "not a file name"),
    ("none", lambda root: None, "not a file name"),
    ("list", lambda root: ["a.txt"], "not a file name"),
]

KEPT = [
    ("plain", "a.txt", "a.txt"),
    ("subdir", "sub/b.txt", "sub/b.txt"),
    ("dot", "./a.txt", "a.txt"),
    ("dotdot-inside", "sub/../a.txt", "a.txt"),
    ("symlink-inside", "in_link", "in_link"),
    ("not-yet-there", "sub/new.bin", "sub/new.bin"),
]


@pytest.mark.parametrize("name, relative, words", REFUSED, ids=[c[0] for c in REFUSED])
def test_contained_path_refuses(name, relative, words, tree):
    with pytest.raises(InputError, match=words) as info:
        contained_path(tree, relative(tree), "shard")
    assert str(info.value).startswith("shard ") and "\n" not in str(info.value)


@pytest.mark.parametrize("name, relative, expected", KEPT, ids=[c[0] for c in KEPT])
def test_contained_path_keeps(name, relative, expected, tree):
    assert contained_path(tree, relative) == os.path.join(tree, expected)


def _tiny_hf_config():
    return transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=512)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A sharded transformers BertForPreTraining directory of TINY's shape (two or more shards)."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    transformers.BertForPreTraining(_tiny_hf_config()).save_pretrained(str(root / "clean"), max_shard_size="40KB")
    with open(str(root / "clean" / INDEX)) as f:
        index = json.load(f)
    assert len(set(index["weight_map"].values())) >= 2
    return str(root)


def _hostile_dir(sharded, tmp_path, how):
    """A copy of the sharded directory whose index names the first shard the way ``how`` says."""
    directory = str(tmp_path / "hostile")
    shutil.copytree(os.path.join(sharded, "clean"), directory)
    with open(os.path.join(directory, INDEX)) as f:
        index = json.load(f)
    first = sorted(set(index["weight_map"].values()))[0]
    outside = str(tmp_path / "outside")
    os.makedirs(outside, exist_ok=True)
    shutil.move(os.path.join(directory, first), os.path.join(outside, first))
    if how == "absolute":
        name = os.path.join(outside, first)
    elif how == "dotdot":
        name = os.path.join("..", "outside", first)
    elif how == "symlink":
        os.symlink(os.path.join(outside, first), os.path.join(directory, first))
        name = first
    elif how == "symlinked-subdir":
        os.symlink(outside, os.path.join(directory, "shards"))
        name = "shards/" + first
    elif how == "not-a-string":
        name = {"file": first}
    else:
        raise AssertionError(how)
    index["weight_map"] = {k: (name if v == first else v) for k, v in index["weight_map"].items()}
    with open(os.path.join(directory, INDEX), "w") as f:
        json.dump(index, f)
    return directory


def _index_text(sharded, tmp_path, text):
    directory = str(tmp_path / "hostile")
    shutil.copytree(os.path.join(sharded, "clean"), directory)
    with open(os.path.join(directory, INDEX), "w") as f:
        f.write(text)
    return directory


HF_CASES = [
    ("absolute", lambda s, t: _hostile_dir(s, t, "absolute"), ["absolute"]),
    ("dotdot", lambda s, t: _hostile_dir(s, t, "dotdot"), ["leaves"]),
    ("symlink", lambda s, t: _hostile_dir(s, t, "symlink"), ["symlink"]),
    ("symlinked-subdir", lambda s, t: _hostile_dir(s, t, "symlinked-subdir"), ["symlink"]),
    ("not-a-string", lambda s, t: _hostile_dir(s, t, "not-a-string"), ["not a file name"]),
    ("weight-map-list", lambda s, t: _index_text(s, t, '{"weight_map": ["a", "b"]}'), ["weight_map"]),
    ("index-a-list", lambda s, t: _index_text(s, t, "[1, 2]"), ["weight_map"]),
    ("index-torn", lambda s, t: _index_text(s, t, '{"weight_map": {"a": "model-0'), ["not a JSON index"]),
    ("index-deep", lambda s, t: _index_text(s, t, "[" * 100000 + "]" * 100000), ["not a JSON index"]),
]


@pytest.mark.parametrize("name, make, words", HF_CASES, ids=[c[0] for c in HF_CASES])
def test_from_pretrained_reads_only_inside_the_directory(name, make, words, sharded, tmp_path):
    directory = make(sharded, tmp_path)
    with pytest.raises(InputError) as info:
        PackedBertForPreTraining.from_pretrained(directory)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_a_clean_sharded_directory_still_loads(sharded):
    model = PackedBertForPreTraining.from_pretrained(os.path.join(sharded, "clean"))
    assert model.config.hidden_size == 32


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return fx.write_prepared(str(tmp_path_factory.mktemp("data")), S=32, K=3, V=64, num_sequences=96, seed=0)


@pytest.mark.parametrize("name, make, words", HF_CASES[:5], ids=[c[0] for c in HF_CASES[:5]])
def test_init_from_a_hostile_index_is_one_line(name, make, words, sharded, dataset, tmp_path, capsys):
    directory = make(sharded, tmp_path)
    code = train_main(["--config", "demo"] + TINY + ["data.dir=%s" % dataset, "training.steps=1",
                                                     "checkpoint.output_dir=%s" % str(tmp_path / "run"),
                                                     "checkpoint.init_from=%s" % directory,
                                                     # the phase-1 config's eps (1e-12) against demo's: kept;
                                                     # no vocab.txt beside it: started from all the same
                                                     "checkpoint.init_override=[model.layer_norm_eps,vocab]"])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, err
