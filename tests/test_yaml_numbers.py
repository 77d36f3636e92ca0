"""Numbers in config files and overrides read as YAML 1.2 reads them (train/strict_yaml.py): a config that
loads has the number its author wrote, or is refused in one line naming the key; never another number.

Each row is one value for one key, loaded twice: in a config file (whose base is the shipped demo) and as a
command-line override. A row expects the number, or a refusal whose line holds the given words."""

from __future__ import annotations

import os

import pytest

from ipu_packing.errors import ConfigError
from ipu_packing.train import load_config
from ipu_packing.train.loader import CONFIG_DIR

DEMO = os.path.join(CONFIG_DIR, "demo.yaml")
REFUSED = "refused"

ROWS = [
    # a leading zero: octal 8 in YAML 1.1, decimal 10 in YAML 1.2: refused, naming the key
    ("steps-010", "training.steps", "010", REFUSED, ["training.steps", "leading-zero", "write 10", "0o10"]),
    ("seed-0017", "training.seed", "0017", REFUSED, ["training.seed", "octal 15", "decimal 17"]),
    ("steps-011", "training.steps", "011", REFUSED, ["training.steps", "leading-zero"]),
    ("steps-08", "training.steps", "08", REFUSED, ["training.steps", "leading-zero", "write 8"]),
    ("global-batch-0_64", "training.global_batch_sequences", "0_64", REFUSED, ["leading-zero"]),
    ("list-item-03", "execution.layers_per_ipu", "[1, 03]", REFUSED, ["execution.layers_per_ipu", "[1]: 03",
                                                                      "leading-zero"]),
    # base 60: YAML 1.1 reads 1:5 as 65; YAML 1.2 reads a string, which a number key refuses
    ("steps-1:5", "training.steps", "1:5", REFUSED, ["training.steps", "'1:5'"]),
    ("seed-1:30:00", "training.seed", "1:30:00", REFUSED, ["training.seed", "'1:30:00'"]),
    ("lr-1:5.5", "optimizer.lr", "1:5.5", REFUSED, ["optimizer.lr", "'1:5.5'"]),
    # YAML 1.2's octal, hexadecimal and binary integers
    ("steps-0o10", "training.steps", "0o10", 8, []),
    ("seed-0o777", "training.seed", "0o777", 511, []),
    ("steps-0x1F", "training.steps", "0x1F", 31, []),
    ("steps-0b101", "training.steps", "0b101", 5, []),
    # YAML 1.2's floats
    ("lr-1e-3", "optimizer.lr", "1e-3", 1e-3, []),
    ("lr-1E3", "optimizer.lr", "1E3", 1000.0, []),
    ("weight-decay-.5", "optimizer.weight_decay", ".5", 0.5, []),
    ("weight-decay-+.25e-1", "optimizer.weight_decay", "+.25e-1", 0.025, []),
    ("lr-2.", "optimizer.lr", "2.", 2.0, []),
    ("betas-.9-.999", "optimizer.betas", "[.9, .999]", [0.9, 0.999], []),
]


def _value(config, key):
    section, name = key.split(".")
    value = getattr(getattr(config, section if section != "execution" else "execution_spec"), name)
    return list(value) if isinstance(value, (list, tuple)) else value


@pytest.mark.parametrize("name, key, text, expected, words", ROWS, ids=[r[0] for r in ROWS])
def test_numbers_are_yaml_1_2_or_refused(name, key, text, expected, words, tmp_path):
    section, field = key.split(".")
    path = os.path.join(str(tmp_path), "mine.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write("base: %s\n%s:\n  %s: %s\n" % (DEMO, section, field, text))
    for load in (lambda: load_config(path), lambda: load_config("demo", ["%s=%s" % (key, text)])):
        if expected == REFUSED:
            with pytest.raises(ConfigError) as info:
                load()
            message = str(info.value)
            assert "\n" not in message
            for word in words:
                assert word in message, message
        else:
            value = _value(load(), key)
            assert value == expected and type(value) is type(expected), value
