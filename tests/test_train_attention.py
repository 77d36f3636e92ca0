"""model.packed_attention as a training setting: dense, sdpa and varlen train the same model (the same
function of the weights, so the same losses to float32 rounding), through the training loop, DDP and a
pipeline; the choice reaches the checkpoint's config and the export's config.json; a run resumes with
another attention. flex trains on CUDA only (FlexAttention has no backward on CPU): its refusal is in
tests/test_configs_attention_device.py."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import torch.multiprocessing as mp

import app_fixtures as fx
from ipu_packing.data import open_dataset
from ipu_packing.execution import ExecutionConfig, make_runner
from synthetic_packs import PackDataset
from ipu_packing.model import PackedBertForPreTraining
from ipu_packing.train import load_config
from ipu_packing.train.loop import execute, plan_run

from spawned import leave_after
from execution_fixtures import build_model, make_packs, tiny_bert_config
from torch_features import PIPELINING_MISSING

pytestmark = pytest.mark.usefixtures("one_thread")

NO_ATTENTION_DROPOUT = fx.TINY + ["model.attention_probs_dropout_prob=0.0"]
"""app_fixtures.TINY with attention dropout off whatever the demo config says: the three attentions draw the same
random stream only for the hidden dropout."""
ATTENTIONS = ("dense", "sdpa", "varlen")
FP32_REL = 1e-6  # measured: at most 8.7e-8 relative over 4 steps (float32 rounding only)


def tiny(data_dir, run_dir, *extra):
    return load_config("demo", NO_ATTENTION_DROPOUT + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run_dir]
                       + list(extra))


def train(config):
    return execute(plan_run(config, open_dataset=open_dataset), log=lambda m: None)


def losses(run_dir):
    return [(r["step"], r["loss"], r["mlm_loss"], r["nsp_loss"])
            for r in fx.metrics(run_dir)]


def assert_same_losses(got, want, rel=FP32_REL):
    assert [row[0] for row in got] == [row[0] for row in want]
    for a, b in zip(got, want):
        assert a[1:] == pytest.approx(b[1:], rel=rel), (a, b)


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    """Each attention trained 4 steps (hidden dropout 0.1: the same random stream for all three)."""
    root = tmp_path_factory.mktemp("attention")
    out = {}
    for name in ATTENTIONS:
        run = str(root / name)
        train(tiny(data_dir, run, "model.packed_attention=%s" % name, "training.steps=4", "checkpoint.every_steps=2",
                   "checkpoint.keep=3"))
        out[name] = run
    return out


@pytest.mark.parametrize("name", ["sdpa", "varlen"])
def test_each_attention_trains_the_same_losses(runs, name):
    got, want = losses(runs[name]), losses(runs["dense"])
    worst = max(abs(x - y) / abs(y) for a, b in zip(got, want) for x, y in zip(a[1:], b[1:]))
    print("%s against dense: largest relative difference of loss, mlm_loss, nsp_loss over 4 steps %.3g"
          % (name, worst))
    assert_same_losses(got, want)
    # (that each run used its own attention is test_the_attention_reaches_the_model_checkpoint_and_export's:
    # the losses may be bitwise dense's where torch's CPU SDPA computes the same sums, as torch 2.0.1's does)


@pytest.mark.parametrize("name", ATTENTIONS)
def test_the_attention_reaches_the_model_checkpoint_and_export(runs, name):
    state = fx.load(fx.latest(runs[name]))
    assert state.config["model"]["packed_attention"] == name
    with open(os.path.join(runs[name], "config.json")) as f:
        assert json.load(f)["model"]["packed_attention"] == name
    with open(os.path.join(runs[name], "final", "config.json")) as f:
        assert json.load(f)["packed_attention"] == name


def test_a_run_resumes_with_another_attention(runs, data_dir, tmp_path):
    # dense's run, cut back to its step-2 checkpoint, continued with varlen: the same losses as dense went on
    run = str(tmp_path / "resumed")
    shutil.copytree(runs["dense"], run)
    os.unlink(fx.latest(run))  # step_0000004.pt
    shutil.rmtree(os.path.join(run, "final"))
    os.unlink(os.path.join(run, "summary.json"))
    assert os.path.basename(fx.latest(run)) == "step_0000002.pt"
    train(tiny(data_dir, run, "model.packed_attention=varlen", "training.steps=4", "checkpoint.every_steps=2",
               "checkpoint.keep=3"))
    got = losses(run)
    assert_same_losses(got, losses(runs["dense"]))
    assert got[:2] == losses(runs["dense"])[:2]  # steps 1-2 are dense's own records
    with open(os.path.join(run, "final", "config.json")) as f:
        assert json.load(f)["packed_attention"] == "varlen"


# ---- DDP and a 2-stage pipeline, varlen, against one process with dense --------------------------------------

STEPS, MICRO = 3, 2


def _train_runner(config: ExecutionConfig, attention: str):
    bert = tiny_bert_config(2)
    bert.packed_attention = attention  # as config.bert_config() passes model.packed_attention
    torch.manual_seed(0)
    model = PackedBertForPreTraining(bert)  # build_model(2, seed=0)'s weights
    assert model.attention_implementation == attention
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    runner = make_runner(model, optimizer, config)
    dataset = PackDataset(make_packs(STEPS * config.global_batch_packs, seed=1))
    out = [runner.train_step(batch).loss for batch in runner.dataloader(dataset)]
    runner.sync_model()
    return {k: v.detach().clone() for k, v in runner.model.state_dict().items()}, out


def _worker(rank, world, port, jobs, outdir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)

    def work():
        for name, kwargs in jobs:
            torch.save(_train_runner(ExecutionConfig(**kwargs), "varlen"),
                       os.path.join(outdir, "%s.rank%d.pt" % (name, rank)))

    leave_after(work)


@pytest.mark.serial
@pytest.mark.slow
def test_varlen_under_ddp_and_on_pipeline_stages_matches_one_dense_process(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    jobs = [("ddp", dict(micro_batch_size=MICRO, gradient_accumulation=2, replication_factor=2))]
    if not PIPELINING_MISSING:
        jobs.append(("gpipe", dict(micro_batch_size=MICRO, gradient_accumulation=4, layers_per_ipu=[1, 1])))
    mp.spawn(_worker, args=(2, port, jobs, str(tmp_path)), nprocs=2, join=True)
    ref_state, ref_losses = _train_runner(ExecutionConfig(micro_batch_size=MICRO, gradient_accumulation=4), "dense")
    for name, _ in jobs:
        for rank in range(2):
            state, got = torch.load(os.path.join(str(tmp_path), "%s.rank%d.pt" % (name, rank)))
            diff = max(float((state[k] - ref_state[k]).abs().max()) for k in ref_state)
            print("%s varlen rank %d: max |w - w_dense_single| = %.3g" % (name, rank, diff))
            assert diff <= 1e-5
            assert got == pytest.approx(ref_losses, abs=1e-5)
    init = build_model(2, seed=0).state_dict()
    assert max(float((ref_state[k] - init[k]).abs().max()) for k in init) > 1e-3  # training moved the weights
