"""The application on the poptorch backend, under the PopTorch stand-in (tests/fake_poptorch): compile-only
exits 0 naming the executable cache; checkpoints hold the IPU optimizer state and a resumed run hands it back
to the device; without poptorch the run stops with one line before any model is built."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

import app_fixtures as fx
from ipu_packing.data import open_dataset
from ipu_packing.train import load_config
from ipu_packing.train import loop
from ipu_packing.train import run_plan
from ipu_packing.train.cli import main
from ipu_packing.train.loop import execute, plan_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POPTORCH_TINY = fx.TINY + ["model.hidden_dropout_prob=0.0", "execution.micro_batch_size=2",
                          "training.global_batch_sequences=24", "execution.backend=poptorch",
                          "execution.layers_per_ipu=[1,1]", "execution.use_ipu_model=true", "checkpoint.export=false"]
"""app_fixtures.TINY without dropout on the PopTorch stand-in's IPU Model: two IPUs (a layer each), micro batch 2."""
# BERT-Large's POD16 config with a tiny hidden size: its 24 layers, [3, 7, 7, 7] split, batch and precision.
LARGE_TINY = ["model.hidden_size=16", "model.num_attention_heads=2", "model.intermediate_size=32",
              "model.vocab_size=128"]


def _config(data_dir, run_dir, *extra):
    return load_config("demo", POPTORCH_TINY + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run_dir]
                       + list(extra))


def _train(config):
    return execute(plan_run(config, open_dataset=open_dataset), log=lambda m: None)


def test_checkpoints_hold_the_ipu_optimizer_state_and_a_resume_hands_it_back(poptorch, data_dir, tmp_path):
    run = str(tmp_path / "run")
    config = _config(data_dir, run, "training.steps=4", "checkpoint.every_steps=2")
    _train(config)
    first, last = fx.checkpoints(run)
    saved = fx.load(first).optimizer
    # Read back from the device after two steps (the torch LAMB never stepped on this path: no moments).
    assert int(saved["ipu_state"]["step"]) == 2 and saved["ipu_param"]
    assert saved["state"] == {}

    os.unlink(last)  # as if the run had been killed after step 2
    os.unlink(os.path.join(run, "summary.json"))
    _train(config)
    resumed = poptorch.executors[-1]
    (written,) = resumed.written_states  # the checkpoint's state, written to the IPU before the first step
    assert int(written["ipu_state"]["step"]) == 2
    for name, value in saved["ipu_param"].items():
        assert torch.equal(written["ipu_param"][name], value)
    final = fx.load(fx.latest(run))
    assert final.step == 4 and int(final.optimizer["ipu_state"]["step"]) == 4


def test_without_poptorch_the_run_stops_in_one_line_before_building_the_model(monkeypatch, capsys, data_dir, tmp_path):
    monkeypatch.setitem(sys.modules, "poptorch", None)  # import poptorch -> ImportError

    def no_model(*args):
        raise AssertionError("the model was built")

    monkeypatch.setattr(run_plan, "build", no_model)
    args = ["--config", "demo"] + POPTORCH_TINY + ["data.dir=%s" % data_dir,
                                                   "checkpoint.output_dir=%s" % (tmp_path / "run")]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: execution.backend 'poptorch' needs poptorch") and "Poplar SDK" in err
    assert not os.path.exists(str(tmp_path / "run"))


def _run_cli(args, capsys):
    """run_pretraining.py's main() in this process (the cwd the test set; poptorch as the test installed it):
    its exit status, stdout and stderr."""
    code = main(args)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def test_compile_only_compiles_names_the_cache_and_exits_0(poptorch, one_thread, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["--config", "bert_large_512_pod16", "execution.compile_only=true"] + LARGE_TINY
    first = _run_cli(args, capsys)
    assert first.returncode == 0, first.stderr
    cache = os.path.join(str(tmp_path), "output", "executable_cache")
    assert first.stdout.splitlines()[-1] == "executable cache: %s" % cache
    assert "generated batch (S=512, K=3" in first.stdout
    assert len(os.listdir(cache)) == 1
    assert sorted(os.listdir(os.path.join(str(tmp_path), "output"))) == ["executable_cache"]  # no run, no checkpoint
    second = _run_cli(args, capsys)  # the same program: loaded from the cache, nothing new written
    assert second.returncode == 0, second.stderr
    assert len(os.listdir(cache)) == 1


def test_compile_only_without_poptorch_is_the_one_line_sdk_error(one_thread, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "poptorch", None)  # import poptorch -> ImportError
    done = _run_cli(["--config", "bert_large_512_pod16", "execution.compile_only=true"], capsys)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Poplar SDK" in done.stderr


def test_compile_only_with_a_prepared_dataset_compiles_for_its_first_batch(poptorch, data_dir, tmp_path):
    config = _config(data_dir, str(tmp_path / "run"), "execution.compile_only=true", "execution.use_ipu_model=false",
                     "execution.executable_cache_dir=%s" % (tmp_path / "cache"))
    lines = []
    summary = loop.compile_only(config, log=lines.append, open_dataset=open_dataset)
    (executor,) = poptorch.executors
    assert executor.isCompiled() and executor.calls == 0 and not executor.isAttachedToDevice()  # offline target
    assert "for the first batch of %s" % config.data.path in lines[0]
    assert lines[-1] == "executable cache: %s" % (tmp_path / "cache") and summary["executable_cache"]
    assert not os.path.exists(str(tmp_path / "run"))
