"""Both dry-run commands go through the one config loader (ipu_packing.train) and print the same report:
`python -m ipu_packing.execution dry-run --config X` and `python run_pretraining.py --config X --dry-run`."""

from __future__ import annotations

import os
import re
import sys

import pytest

from app_fixtures import both_dry_runs as both, call
from ipu_packing.train.cli import execution_main
from ipu_packing.train.cli import main as train_main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLOBAL_BATCH = re.compile(r"global batch per optimizer step .*?(\d+) packs")


@pytest.fixture(autouse=True)
def no_poptorch(monkeypatch):
    monkeypatch.setitem(sys.modules, "poptorch", None)  # a dry run must not need it


def packs_per_step(report):
    found = GLOBAL_BATCH.findall(report)
    assert len(found) == 1, report
    return int(found[0])


def test_large_pod16_packs_per_step_agree():
    # micro 2 x accumulation (16,384 / (2 x 4) = 2048, divided by the estimated packing factor 2.0) x 4 replicas
    path = os.path.join(REPO, "configs", "bert_large_512_pod16.yaml")
    (code_e, out_e, err_e), (code_t, out_t, err_t) = both(path)
    assert (code_e, code_t) == (0, 0), (err_e, err_t)
    assert packs_per_step(out_e) == packs_per_step(out_t) == 2 * 1024 * 4 == 8192
    assert "8192 packs/step" in out_t
    assert out_e == out_t


@pytest.mark.parametrize("name", ["demo", "demo_padded", "bert_base_512_pod64", "bert_large_512_pod16_padded"])
def test_same_report_by_name_and_overrides(name):
    (code_e, out_e, _), (code_t, out_t, _) = both(name, "data.packing_factor_estimate=1.5")
    assert code_e == code_t == 0
    assert out_e == out_t and out_e.startswith("config %s:" % name)


@pytest.mark.parametrize(
    "text, message",
    [
        ("execution:\n  replication: 2\n", "unknown key execution.replication"),
        ("model:\n  hiden_size: 3\n", "unknown key model.hiden_size"),
        ("model:\n  num_hidden_layers: 4\nexecution:\n  layers_per_ipu: [1, 1]\n",
         "sums to 2, but model.num_hidden_layers is 4"),
        ("execution:\n  backend: tpu\n", "execution.backend must be one of"),
        ("train:\n  anything: 1\n", "unknown config section 'train'"),
        ("[1, 2", "not valid YAML"),
    ],
)
def test_bad_config_is_one_line_exit_2_from_both(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    for code, out, err in both(str(path)):
        assert code == 2 and out == ""
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_missing_config_file():
    for code, out, err in both("/nonexistent/x.yaml"):
        assert code == 2 and out == "" and "not found" in err and err.count("\n") == 1


@pytest.mark.slow
def test_module_command_runs(tmp_path):
    """`python -m ipu_packing.execution dry-run` as a reader types it, against the in-process report."""
    import subprocess

    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "ipu_packing.execution", "dry-run", "--config",
                           "bert_large_512_pod16"], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    _, out_t, _ = call(train_main, ["--config", "bert_large_512_pod16", "--dry-run"])
    assert proc.stdout == out_t and packs_per_step(proc.stdout) == 8192


def test_usage_error_is_one_line():
    code, out, err = call(execution_main, ["dry-run"])
    assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1 and "--config" in err


def test_the_activation_estimates_use_the_data_s_sequence_length():
    # data.max_seq_length 128 of a 512-position model: the stash and activations are those of S = 128
    (code, out, err), (tcode, tout, terr) = both("bert_large_512_pod16", "data.max_seq_length=128")
    assert code == tcode == 0, (err, terr)
    assert "* stash (depth x B 2 x S 128)" in out and out == tout
