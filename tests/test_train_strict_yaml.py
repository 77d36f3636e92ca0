"""Strict configs: hostile YAML files and overrides, each through run_pretraining.py's main() (the one
wrapper): one line `error: <cause>` naming the cause, exit 2, nothing on stdout.

The mechanism is the one YAML reader, ipu_packing/train/strict_yaml.py `yaml_load`: a file is read at most
MAX_CONFIG_BYTES; anchors, aliases and merge keys (`<<`) are refused; nesting is at most MAX_DEPTH; a key
given twice in one mapping (a section twice in one file) is refused naming the key and both lines; a
value no YAML constructor can build (an integer of 5,000 digits) is a config error. Numbers as users
write them keep working (the last tests)."""

from __future__ import annotations

import os

import pytest

from ipu_packing.train import load_config
from ipu_packing.train.cli import main as train_main
from ipu_packing.train.loader import CONFIG_DIR
from ipu_packing.train.strict_yaml import MAX_CONFIG_BYTES, MAX_DEPTH

from app_fixtures import TINY

DEMO = os.path.join(CONFIG_DIR, "demo.yaml")


def _file(text):
    return lambda tmp: [_write(tmp, "c.yaml", text)]


def _write(tmp, name, text):
    path = os.path.join(str(tmp), name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _deep_list(depth):
    return "[" * depth + "1" + "]" * depth


def _deep_block(depth):
    return "".join("%sk%d:\n" % ("  " * i, i) for i in range(depth)) + "  " * depth + "v\n"


def _laughs(levels):
    lines = ["training:", "  steps: 1", "execution:", "  layers_per_ipu: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, levels):
        lines.append("  l%d: &l%d [%s]" % (i, i, ", ".join(["*l%d" % (i - 1)] * 10)))
    return "\n".join(lines) + "\n"


def _with_base(tmp):
    base = _write(tmp, "base.yaml", "base: %s\ntraining:\n  steps: 3\n  seed: 1\n  steps: 4\n" % DEMO)
    return [_write(tmp, "child.yaml", "base: %s\n" % os.path.basename(base))]


CASES = [
    # duplicate keys and sections: named, with the line of each
    ("dup-key", _file("training:\n  steps: 1\n  steps: 2\n"), ["duplicate key 'steps'", "line 3", "line 2"]),
    ("dup-section", _file("training:\n  steps: 1\ntraining:\n  seed: 2\n"), ["duplicate key 'training'", "line 3"]),
    ("dup-flow", _file("optimizer: {lr: 0.1, lr: 0.2}\n"), ["duplicate key 'lr'"]),
    ("dup-quoted", _file("training:\n  steps: 1\n  \"steps\": 2\n"), ["duplicate key 'steps'"]),
    ("dup-base", _file("base: demo\nbase: demo_512\n"), ["duplicate key 'base'"]),
    ("dup-null", _file("~: 1\nnull: 2\n"), ["duplicate key None"]),
    ("dup-int-spelling", _file("execution:\n  1: a\n  0x1: b\n"), ["duplicate key 1"]),
    ("dup-in-base-file", _with_base, ["base.yaml", "duplicate key 'steps'", "line 5"]),
    ("dup-in-list-item", _file("execution:\n  layers_per_ipu: [{a: 1, a: 2}]\n"), ["duplicate key 'a'"]),
    # anchors, aliases and merge keys: refused outright, so a small file cannot grow
    ("laughs-9", _file(_laughs(9)), ["alias", "line"]),
    ("alias-one", _file("training:\n  steps: &s 3\n  seed: *s\n"), ["alias", "line"]),
    ("anchor-alone", _file("training: &t\n  steps: 3\n"), ["anchor", "line 1"]),
    ("merge-key", _file("training:\n  <<: {steps: 3}\n"), ["merge key"]),
    ("alias-as-key", _file("training:\n  steps: &k seed\n  *k : 2\n"), ["alias"]),
    # nesting depth and size
    ("deep-flow-40", _file("execution:\n  layers_per_ipu: %s\n" % _deep_list(40)),
     ["nested deeper than %d" % MAX_DEPTH]),
    ("deep-flow-100000", _file("execution:\n  layers_per_ipu: %s\n" % _deep_list(100000)), ["nested deeper"]),
    ("deep-block", _file("training:\n" + "".join("  " + line + "\n" for line in _deep_block(40).splitlines())),
     ["nested deeper"]),
    ("big-file", _file("# padding\n" * (MAX_CONFIG_BYTES // 10 + 1) + "training:\n  steps: 1\n"),
     ["larger than %d bytes" % MAX_CONFIG_BYTES]),
    ("huge-int", _file("training:\n  steps: %s\n" % ("9" * 5000)), ["c.yaml", "5000 digits"]),
    # the same reader for every override value
    ("override-alias", lambda tmp: TINY + ["execution.layers_per_ipu=[&a 1, *a]"], ["alias"]),
    ("override-dup", lambda tmp: TINY + ["optimizer.betas={a: 1, a: 2}"], ["duplicate key 'a'", "optimizer.betas"]),
    ("override-deep", lambda tmp: TINY + ["execution.layers_per_ipu=" + _deep_list(50000)], ["nested deeper"]),
    ("override-huge-int", lambda tmp: TINY + ["training.steps=" + "1" * 5000], ["training.steps"]),
    ("override-big", lambda tmp: TINY + ["training.steps=" + " " * MAX_CONFIG_BYTES + "1"], ["larger than"]),
    # already refused before: kept
    ("python-tag", _file("training:\n  steps: !!python/object/apply:os.system [echo hi]\n"), ["not valid YAML"]),
    ("not-utf8", lambda tmp: [_write_bytes(tmp, b"training:\n  steps: \xff\n")], ["UTF-8"]),
]


def _write_bytes(tmp, data):
    path = os.path.join(str(tmp), "b.yaml")
    with open(path, "wb") as f:
        f.write(data)
    return path


def _argv(tmp, made):
    if made and made[0].endswith(".yaml"):
        return ["--config", made[0]] + made[1:]
    return ["--config", "demo"] + made


@pytest.mark.parametrize("name, make, words", CASES, ids=[c[0] for c in CASES])
def test_hostile_config_is_one_line(name, make, words, tmp_path, capsys):
    code = train_main(_argv(tmp_path, make(tmp_path)))
    out, err = capsys.readouterr()
    assert code == 2, (out, err[-400:])
    assert err.startswith("error: ") and err.count("\n") == 1, err[-400:]
    assert out == ""
    assert len(err) < 2000  # the line names the cause; it does not echo a 1 MiB value back
    for word in words:
        assert word in err, (word, err)


@pytest.mark.parametrize("text, value", [
    ("1e-3", 1e-3), ("5e-5", 5e-5), ("1E-3", 1e-3), ("3.0e-4", 3e-4), ("+1e-3", 1e-3), ("1_0e-3", 1e-2),
    ("0.001", 0.001), ("1.5e+2", 150.0),
])
def test_numbers_as_written_in_a_file_and_an_override(text, value, tmp_path):
    path = _write(tmp_path, "c.yaml", "base: %s\noptimizer:\n  lr: %s\n" % (DEMO, text))
    assert load_config(path).optimizer.lr == value
    assert load_config("demo", ["optimizer.lr=%s" % text]).optimizer.lr == value


@pytest.mark.parametrize("text, value", [("1_000", 1000), ("20", 20), ("0x10", 16), ("+7", 7)])
def test_integers_as_written(text, value):
    assert load_config("demo", ["training.steps=%s" % text]).training.steps == value


def test_a_base_and_its_child_may_set_the_same_key(tmp_path):
    """Across files is an override (the child wins), not a duplicate; so is an override given twice."""
    base = _write(tmp_path, "base.yaml", "base: %s\ntraining:\n  steps: 3\n" % DEMO)
    child = _write(tmp_path, "child.yaml", "base: %s\ntraining:\n  steps: 4\n" % os.path.basename(base))
    assert load_config(child).training.steps == 4
    assert load_config(child, ["training.steps=5", "training.steps=6"]).training.steps == 6


def test_a_bom_is_read_as_utf8(tmp_path):
    path = os.path.join(str(tmp_path), "bom.yaml")
    with open(path, "wb") as f:
        f.write(("\ufeffbase: %s\ntraining:\n  steps: 7\n" % DEMO).encode("utf-8"))
    assert load_config(path).training.steps == 7
