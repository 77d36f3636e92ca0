"""README's commands, tied to the tests that run them.

README gives two commands, `make pretrain` and `make test`; docs/walkthrough.md's are run as written by
tests/test_walkthrough.py, and docs/usage.md's torchrun line by tests/test_configs_attention_device.py.
`make pretrain` is `prepare --input default` at S=128, K=3 and then `run_pretraining.py --config demo`:
make's own dry run (`make -n -B`, as on a fresh clone) must give exactly those commands, with README's
paths, so that what tests/test_golden_losses.py runs (the same prepare, then the demo's first 20 steps) is
what a user runs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_commands():
    with open(os.path.join(ROOT, "README.md"), "r", encoding="utf-8") as f:
        text = f.read()
    (block,) = re.findall(r"^```\n(.*?)^```", text, flags=re.S | re.M)[:1]
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_gives_the_two_commands_of_the_contract():
    assert readme_commands() == ["make pretrain", "make test"]


def _dry_run(target: str):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    proc = subprocess.run(["make", "-n", "-B", target], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines() if line.startswith(".venv/bin/python")]


def test_make_pretrain_prepares_the_default_data_and_trains_the_demo():
    commands = _dry_run("pretrain")
    if len(commands) > 2:  # -B: make lists the venv's recipe too (python -m venv, pip install)
        commands = [c for c in commands if "pip" not in c]
    prepare, train = commands[-2:]
    assert prepare == [".venv/bin/python", "-m", "ipu_packing.data", "prepare", "--input", "default", "--output",
                       "output/data/demo_128", "--max-seq-length", "128", "--max-sequences-per-pack", "3"]
    assert train == [".venv/bin/python", "run_pretraining.py", "--config", "demo"]
    # the demo reads what prepare wrote, at the S and K it was prepared with (the golden losses' data)
    from ipu_packing.train import load_config

    demo = load_config("demo")
    assert demo.data.dir == "output/data/demo_128" and demo.data.layout == "packed"
    assert (demo.data.max_seq_length, demo.data.max_sequences_per_pack) == (128, 3)


def test_the_golden_losses_run_make_pretrains_commands():
    """tests/default_data.py prepares with the same options (plus --no-padded, --workers 1 and --quiet,
    which change no byte of packed/: tests/test_data_hashes.py), and tests/test_golden_losses.py trains
    `--config demo` on it."""
    with open(os.path.join(ROOT, "tests", "default_data.py"), "r", encoding="utf-8") as f:
        prepared = f.read()
    assert '"prepare", "--input", "default", "--output", output, "--max-seq-length", str(max_seq_length),' in prepared
    assert '"--max-sequences-per-pack", "3", "--no-padded", "--workers", "1", "--quiet"' in prepared
    with open(os.path.join(ROOT, "tests", "test_golden_losses.py"), "r", encoding="utf-8") as f:
        golden = f.read()
    assert '"run_pretraining.py"), "--config", "demo",' in golden
