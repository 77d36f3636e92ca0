"""The training loop on a tiny model and a small prepared dataset (tests/app_fixtures.py):
metrics, checkpoints, bitwise resume after a kill, NaN stop (a real divergence too: exit 2 naming a finite
checkpoint), phase-1 init, export to transformers."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

import app_fixtures as fx
from ipu_packing.data import open_dataset
from ipu_packing.train import TrainingError, UserError
from ipu_packing.train.loop import plan_run
from ipu_packing.train.cli import main
from ipu_packing.train.state import TrainingState, non_finite_tensors

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY, tiny, train, losses = fx.TINY, fx.tiny, fx.train, fx.losses
# torch on one thread in every test (conftest.py): the killed subprocess runs with OMP_NUM_THREADS=1, same reductions
pytestmark = pytest.mark.usefixtures("one_thread")


def test_metrics_checkpoints_and_export(data_dir, tmp_path):
    run = str(tmp_path / "run")
    summary = train(tiny(data_dir, run, "training.steps=4", "checkpoint.every_steps=2", "logging.tensorboard=true"))
    rows = fx.metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    expected_keys = {"loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "sequences_per_second",
                     "tokens_per_second", "packing_factor", "sequences", "tokens", "packs", "lr"}
    assert expected_keys <= set(rows[0])
    for r in rows:
        assert r["packs"] == 9  # the step's 16 sequences in round(16 / 1.78) packs, one micro batch
        assert r["loss"] == pytest.approx(r["mlm_loss"] + r["nsp_loss"], rel=1e-6)
        assert r["packing_factor"] == pytest.approx(r["sequences"] / 9.0)
    # one epoch of 6 steps covers 54 packs; the first 4 steps hold distinct packs
    assert [os.path.basename(p) for p in fx.checkpoints(run)] == ["step_0000002.pt", "step_0000004.pt"]
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(os.path.join(run, "tensorboard")))
    state = fx.load(fx.latest(run))
    assert state.step == 4 and state.data == {"epoch": 0, "step_in_epoch": 4}
    assert {"model", "optimizer", "scheduler", "rng", "config", "dataset"} <= set(state.to_dict())
    assert summary["export"] == os.path.join(run, "final")

    # the export loads in transformers' BertForPreTraining and computes what our model computes
    import transformers

    from ipu_packing.model import PackedBertForPreTraining

    hf = transformers.BertForPreTraining.from_pretrained(os.path.join(run, "final")).eval()
    ours = PackedBertForPreTraining(tiny(data_dir, run).bert_config()).eval()
    ours.load_state_dict(state.model)
    assert (open(os.path.join(run, "final", "vocab.txt")).read()
            == open(os.path.join(data_dir, "packed", "vocab.txt")).read())
    pack = open_dataset(os.path.join(data_dir, "padded"), as_tensors=False)[0]
    n = int((pack["sequence_ids"] != 0).sum())
    ids = torch.as_tensor(pack["input_ids"][:n], dtype=torch.long)[None]
    types = torch.as_tensor(pack["token_type_ids"][:n], dtype=torch.long)[None]
    with torch.no_grad():
        hf_out = hf(input_ids=ids, token_type_ids=types)
        out = ours(**{k: torch.as_tensor(v)[None].long() for k, v in pack.items()})
    positions = torch.as_tensor(pack["mlm_positions"]).long()
    valid = torch.as_tensor(pack["mlm_labels"]) != -100
    assert torch.allclose(hf_out.prediction_logits[0, positions[valid]], out.mlm_logits[0, valid], atol=1e-5)
    assert torch.allclose(hf_out.seq_relationship_logits[0], out.nsp_logits[0, 0], atol=1e-5)


KILLER = r"""
import os, signal, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
from ipu_packing.data import open_dataset
from ipu_packing.train import load_config
from ipu_packing.train import metrics
from ipu_packing.train.loop import execute, plan_run
kill_after = int(sys.argv[2])
original = metrics.MetricsLogger.log
def log(self, record):
    original(self, record)
    if record.step == kill_after:
        os.kill(os.getpid(), signal.SIGKILL)  # a real kill: no cleanup, no atexit
metrics.MetricsLogger.log = log
config = load_config("demo", sys.argv[3:])
execute(plan_run(config, open_dataset=open_dataset), log=lambda m: None)
"""


@pytest.mark.slow
def test_resume_after_kill_gives_bitwise_the_same_losses(data_dir, tmp_path):
    # 8 steps over 6-step epochs: the resume point (step 4) and an epoch boundary are both crossed
    args = ["training.steps=8", "checkpoint.every_steps=2", "checkpoint.keep=3"]
    reference = str(tmp_path / "reference")
    train(tiny(data_dir, reference, *args))
    killed = str(tmp_path / "killed")
    overrides = TINY + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % killed] + args
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", KILLER, REPO, "5"] + overrides, env=env, capture_output=True,
                          text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert [os.path.basename(p) for p in fx.checkpoints(killed)] == ["step_0000002.pt", "step_0000004.pt"]
    assert [row[0] for row in losses(killed)] == [1, 2, 3, 4, 5]
    assert not [f for f in os.listdir(os.path.join(killed, "checkpoints")) if f.endswith(".tmp")]
    train(tiny(data_dir, killed, *args))  # checkpoint.resume=auto picks up step 4
    assert losses(killed) == losses(reference)  # exact float equality, steps 1..8
    summaries = [json.load(open(os.path.join(run, "summary.json"))) for run in (reference, killed)]
    for key in ("first_steps", "last_steps"):  # the run's first and last steps, wherever it was killed
        assert summaries[1][key] == summaries[0][key], key
    assert (summaries[0]["steps_this_run"], summaries[1]["steps_this_run"]) == (8, 4)
    ref_state = fx.load(fx.latest(reference))
    res_state = fx.load(fx.latest(killed))
    for key, value in ref_state.model.items():
        assert torch.equal(value, res_state.model[key]), key


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    run = str(tmp_path)
    fx.save(run, TrainingState(step=1, model={"w": torch.ones(2)}), keep=2)
    before = open(fx.latest(run), "rb").read()

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        fx.save(run, TrainingState(step=2, model={"w": torch.zeros(2)}), keep=2)
    assert os.listdir(os.path.join(run, "checkpoints")) == ["step_0000001.pt"]
    assert open(fx.latest(run), "rb").read() == before


def test_nan_loss_stops_and_keeps_last_good_checkpoint(data_dir, tmp_path):
    from ipu_packing.execution import make_runner

    def poisoned_runner(*args, **kwargs):
        runner = make_runner(*args, **kwargs)
        step = runner.train_step
        calls = []

        def train_step(batch):
            calls.append(1)
            metrics = step(batch)
            if len(calls) == 3:
                metrics.loss = float("nan")
            return metrics

        runner.train_step = train_step
        return runner

    run = str(tmp_path / "run")
    with pytest.raises(TrainingError) as info:
        train(tiny(data_dir, run, "training.steps=6", "checkpoint.every_steps=2"), make_runner=poisoned_runner)
    message = str(info.value)
    assert "nan" in message and "step 3" in message and "step_0000002.pt" in message
    assert [os.path.basename(p) for p in fx.checkpoints(run)] == ["step_0000002.pt"]
    assert fx.load(fx.latest(run)).step == 2
    assert not os.path.exists(os.path.join(run, "final"))


def test_a_real_divergence_stops_with_exit_2_naming_a_finite_checkpoint(data_dir, tmp_path, capsys):
    run = str(tmp_path / "run")
    code = main(["--config", "demo"] + TINY + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run,
                                               "optimizer.lr=1000", "schedule.warmup_fraction=0", "training.steps=30",
                                               "checkpoint.every_steps=1", "checkpoint.keep=100"])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and "diverged" in err
    named = err.split("finite throughout is ")[1].strip()
    assert os.path.isfile(named)
    saved = fx.checkpoints(run)
    assert saved and saved[-1] == named
    for path in saved:
        assert non_finite_tensors(fx.load(path).to_dict()) == [], path
    assert not os.path.exists(os.path.join(run, "final"))


def test_init_from_phase1_hf_dir_and_checkpoint(data_dir, tmp_path):
    first = str(tmp_path / "phase1")
    train(tiny(data_dir, first, "training.steps=2"))
    exported = fx.load(fx.latest(first)).model
    for source in (os.path.join(first, "final"), fx.latest(first), first):
        plan = plan_run(tiny(data_dir, str(tmp_path / "phase2"), "checkpoint.init_from=%s" % source),
                        open_dataset=open_dataset)
        assert plan.start_step == 0
        for key, value in plan.model.state_dict().items():
            assert torch.equal(value, exported[key]), (source, key)
    assert not os.path.exists(str(tmp_path / "phase2"))  # planning writes nothing


def test_init_from_other_architecture_is_a_user_error(data_dir, tmp_path):
    first = str(tmp_path / "phase1")
    train(tiny(data_dir, first, "training.steps=1"))
    other = ["model.hidden_size=16", "model.intermediate_size=32"]
    with pytest.raises(UserError) as info:  # the HF directory's config.json states 32 and 64: read by planning
        plan_run(tiny(data_dir, str(tmp_path / "p2"), *other + [
            "checkpoint.init_from=%s" % os.path.join(first, "final")]), open_dataset=open_dataset)
    assert "model.hidden_size is 16 in the config but 32 in its config.json" in str(info.value)
    for source in (os.path.join(first, "final"), first):  # overridden, or a run directory: the shapes differ
        with pytest.raises(UserError) as info:
            plan_run(tiny(data_dir, str(tmp_path / "p2"), *other + [
                "checkpoint.init_from=%s" % source,
                "checkpoint.init_override=[model.hidden_size,model.intermediate_size]"]), open_dataset=open_dataset)
        assert "shape" in str(info.value)


def test_padded_layout_and_option_2_betas(data_dir, tmp_path):
    padded = plan_run(tiny(data_dir, str(tmp_path / "a"), "data.layout=padded"), open_dataset=open_dataset)
    assert padded.data.packing_factor == 1.0 and padded.accounting.gradient_accumulation == 4
    assert padded.data.num_packs == 96
    betas = plan_run(tiny(data_dir, str(tmp_path / "b"), "training.batch_accounting=betas"), open_dataset=open_dataset)
    factor = 96 / float(betas.data.num_packs)
    assert betas.accounting.gradient_accumulation == 4
    for group in betas.optimizer.param_groups:
        assert group["betas"] == pytest.approx((0.9 ** factor, 0.999 ** factor))


def test_every_pack_is_seen_once_per_epoch(data_dir):
    config = tiny(data_dir, "unused")
    plan = plan_run(config, open_dataset=open_dataset)
    order = plan.data.epoch_order(config.training.seed, 0)
    assert sorted(order.tolist()) == list(range(plan.data.num_packs))
    assert not np.array_equal(order, plan.data.epoch_order(config.training.seed, 1))


def test_planning_reads_the_datasets_manifest_once(data_dir, tmp_path):
    """train/data.py reads and checks manifest.json at the boundary; the dataset it opens takes that manifest."""
    import sys as _sys

    from ipu_packing.data import format as fmt

    calls = []

    def count(frame, event, arg):
        if event == "call" and frame.f_code is fmt.read_manifest.__code__:
            calls.append(frame.f_locals.get("directory"))

    _sys.setprofile(count)
    try:
        plan = plan_run(tiny(data_dir, str(tmp_path / "run")), open_dataset=open_dataset)
    finally:
        _sys.setprofile(None)
    assert calls == [plan.data.path]
    assert plan.data.dataset.manifest == plan.data.manifest


def test_deterministic_kernels_hold_for_the_run_and_are_put_back(data_dir, tmp_path, monkeypatch):
    """execution.deterministic: torch's deterministic algorithms and cuBLAS's fixed workspace while the loop
    trains (what makes a CUDA resume bitwise), and the process as it was after; without it, nothing changes."""
    from ipu_packing.train import loop

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "unset by the test")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    seen = []
    real = loop.train

    def watched(plan, runner, log):
        seen.append((torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")))
        return real(plan, runner, log)

    monkeypatch.setattr(loop, "train", watched)
    train(tiny(data_dir, str(tmp_path / "a"), "training.steps=2", "execution.deterministic=true"))
    train(tiny(data_dir, str(tmp_path / "b"), "training.steps=2"))
    assert seen == [(True, ":4096:8"), (False, None)]
    assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert losses(str(tmp_path / "a")) == losses(str(tmp_path / "b"))  # on CPU the same kernels either way
