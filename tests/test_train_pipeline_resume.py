"""A 2-stage pipelined run (torch.distributed.pipelining, 2 processes, gloo on CPU) resumed from a checkpoint
logs bitwise the same losses, and ends with bitwise the same weights, as the uninterrupted run.

The processes are started as in tests/test_execution_distributed.py (torch.multiprocessing with the
environment torchrun sets). The reference trains 8 steps with a checkpoint every 2; the resumed run is a
copy of its directory without the step-6 and step-8 checkpoints, so `checkpoint.resume=auto` continues
from step 4 and reruns steps 5-8. Dropout is on, so any random number drawn outside the step stream (or a
missing per-stage RNG state) changes the resumed losses.
"""

import os
import shutil

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import pytest

import app_fixtures as fx
from ipu_packing.data import open_dataset
from ipu_packing.train import load_config
from ipu_packing.train.loop import execute, plan_run
from torch_features import PIPELINING_MISSING
from spawned import leave_after
from execution_fixtures import free_port

PIPELINED = fx.TINY + ["model.attention_probs_dropout_prob=0.1", "execution.layers_per_ipu=[1,1]", "training.steps=8",
                      "checkpoint.every_steps=2", "checkpoint.keep=4", "checkpoint.export=false"]
"""app_fixtures.TINY on two pipeline stages (a layer each), attention dropout on too, 8 steps, a checkpoint every 2."""


def _worker(rank, world, port, data_dir, reference, resumed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)

    def work():
        for run_dir in (reference, resumed):
            config = load_config("demo", PIPELINED + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run_dir])
            plan = plan_run(config, open_dataset=open_dataset)
            execute(plan, log=lambda m: None)
            with open(os.path.join(os.path.dirname(run_dir), "last_saved.rank%d" % rank), "w") as f:
                f.write(str(plan.checkpointer.last_saved))  # what a stop's line names on this process
            dist.barrier()
            if run_dir == reference and rank == 0:
                _interrupted_copy(reference, resumed)
            dist.barrier()

    leave_after(work)


def _interrupted_copy(reference, resumed):
    """The reference run's directory as a run stopped after step 4 leaves it."""
    shutil.copytree(reference, resumed)
    for step in (6, 8):
        os.unlink(os.path.join(resumed, "checkpoints", "step_%07d.pt" % step))
    os.unlink(os.path.join(resumed, "summary.json"))  # written at the end only, as the export
    if os.path.isdir(os.path.join(resumed, "final")):
        shutil.rmtree(os.path.join(resumed, "final"))


def _losses(run_dir):
    return [(r["step"], r["loss"], r["mlm_loss"], r["nsp_loss"])
            for r in fx.metrics(run_dir)]


@pytest.mark.skipif(PIPELINING_MISSING is not None, reason=PIPELINING_MISSING or "")
@pytest.mark.serial
@pytest.mark.slow
def test_pipelined_resume_gives_bitwise_the_same_losses(data_dir, tmp_path):
    reference, resumed = str(tmp_path / "reference"), str(tmp_path / "resumed")
    # One pair of processes runs both: the reference, then (after rank 0 copied it) the resumed run.
    mp.spawn(_worker, args=(2, free_port(), data_dir, reference, resumed), nprocs=2, join=True)
    assert [os.path.basename(p) for p in fx.checkpoints(reference)] == [
        "step_0000002.pt", "step_0000004.pt", "step_0000006.pt", "step_0000008.pt"]
    for rank in range(2):  # the last checkpoint, on the process that wrote it and on the one that did not
        with open(str(tmp_path / ("last_saved.rank%d" % rank))) as f:
            assert f.read() == os.path.join(resumed, "checkpoints", "step_0000008.pt"), rank

    ref_losses, res_losses = _losses(reference), _losses(resumed)
    assert [row[0] for row in res_losses] == list(range(1, 9))
    assert res_losses == ref_losses  # exact float equality, steps 5..8 recomputed after the resume
    ref_state = fx.load(fx.latest(reference))
    res_state = fx.load(fx.latest(resumed))
    for key, value in ref_state.model.items():
        assert torch.equal(value, res_state.model[key]), key
