"""Distributed equivalence on CPU.

Two processes (torch.multiprocessing, with the environment torchrun would set; gloo) train N optimizer steps as
(a) DDP with 2 replicas and (b) a 2-stage torch.distributed.pipelining pipeline (GPipe and 1F1B); each must
end with the weights one process reaches with the same global batch (same packs, same micro batches,
accumulation x replicas).

Optimizer: SGD with momentum (lr 0.05), whose update is linear in the gradient. The runs differ only in
float32 summation order (DDP averages two partial gradient sums, the pipeline sums the tied embedding's two
partial gradients across processes), i.e. gradient differences of ~1e-7 relative, which a linear update
passes on unamplified: over N=3 steps the weights differ by ~1e-8..1e-7 (printed). Tolerance atol 1e-5
sits two orders above that and far below what a real mistake does (a wrong micro-batch split, loss scaling
or a missed tied-gradient sum moves weights by ~lr x grad ~ 1e-3; the test also checks training moved
the weights by > 100 x atol). Adam-type optimizers are unsuitable for this check: they normalise each
gradient entry, so a gradient that is zero in exact arithmetic (the attention key bias: softmax ignores a
constant added to every key) turns float noise of 1e-12 into +-lr updates that differ in sign between
runs (measured with AdamW lr 1e-3: 3e-4 on layer.0.qkv.bias, every other weight within 1e-7).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ipu_packing.errors import UserError
from ipu_packing.execution import ExecutionConfig, make_runner

from execution_fixtures import build_model, free_port, make_packs, train_with_sgd
from torch_features import PIPELINING_MISSING
from spawned import leave_after

STEPS = 3
MICRO = 2
ATOL = 1e-5


def train(config: ExecutionConfig, num_layers: int = 2):
    """Train STEPS steps from a fixed initialisation; returns (state dict, per-step losses, per-step (sequences,
    tokens, packs) as the runner reports them)."""
    counts = []
    state, losses = train_with_sgd(build_model(num_layers, seed=0), config,
                                   make_packs(STEPS * config.global_batch_packs, seed=1), STEPS, counts)
    return state, losses, counts


def _worker(rank, world, port, jobs, outdir):
    # What torchrun exports; the first runner joins the process group from these (gloo on CPU).
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)

    def work():
        for name, kwargs in jobs:
            torch.save(train(ExecutionConfig(**kwargs)), os.path.join(outdir, "%s.rank%d.pt" % (name, rank)))
        assert dist.get_backend() == "gloo"

    leave_after(work)


def _spawn(jobs, tmp_path):
    mp.spawn(_worker, args=(2, free_port(), jobs, str(tmp_path)), nprocs=2, join=True)
    return {
        (name, rank): torch.load(os.path.join(str(tmp_path), "%s.rank%d.pt" % (name, rank)))
        for name, _ in jobs
        for rank in range(2)
    }


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def distributed_runs(tmp_path_factory):
    jobs = [
        ("ddp", dict(micro_batch_size=MICRO, gradient_accumulation=2, replication_factor=2)),
        # each replica's 2 micro batches in one pass (the model's loss_groups) under DDP
        ("ddp_passes", dict(micro_batch_size=MICRO, gradient_accumulation=2, replication_factor=2,
                            micro_batches_per_pass=2)),
        ("gpipe", dict(micro_batch_size=MICRO, gradient_accumulation=4, layers_per_ipu=[1, 1])),
        ("1f1b", dict(micro_batch_size=MICRO, gradient_accumulation=4, layers_per_ipu=[1, 1],
                      pipeline_schedule="1f1b")),
    ]
    if PIPELINING_MISSING:  # torch < 2.4 (the Poplar SDK's 2.0.1): DDP only, the pipeline cases skip
        jobs = [job for job in jobs if "layers_per_ipu" not in job[1]]
    return _spawn(jobs, tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def single_process():
    torch.manual_seed(0)
    return train(ExecutionConfig(micro_batch_size=MICRO, gradient_accumulation=4))


@pytest.mark.parametrize("name", ["ddp", "ddp_passes", "gpipe", "1f1b"])
@pytest.mark.serial
@pytest.mark.slow
def test_two_processes_match_one(distributed_runs, single_process, name):
    if name != "ddp" and PIPELINING_MISSING:
        pytest.skip(PIPELINING_MISSING)
    ref_state, ref_losses, ref_counts = single_process
    assert [packs for _, _, packs in ref_counts] == [2 * MICRO * 2] * STEPS  # the global batch's rows
    for rank in range(2):
        state, losses, counts = distributed_runs[(name, rank)]
        assert counts == ref_counts  # sequences, tokens and packs of the whole step, all processes together
        diff = _max_diff(state, ref_state)
        worst = max(state, key=lambda k: float((state[k].float() - ref_state[k].float()).abs().max()))
        print("%s rank %d: max |w - w_single| = %.3g (%s)" % (name, rank, diff, worst))
        assert diff <= ATOL
        assert losses == pytest.approx(ref_losses, abs=1e-5)
    # And training moved the weights by far more than the tolerance (the comparison is not vacuous).
    init = build_model(2, seed=0).state_dict()
    assert _max_diff(ref_state, init) > 100 * ATOL


def test_config_asks_for_the_processes_it_needs():
    with pytest.raises(UserError, match="torchrun --nproc-per-node 2"):
        make_runner(build_model(), torch.optim.SGD(build_model().parameters(), lr=0.1),
                    ExecutionConfig(replication_factor=2))


def test_a_one_process_config_under_several_torchrun_processes_is_refused(monkeypatch):
    """torchrun --nproc-per-node 2 of a one-process config would run two separate trainings into one run
    directory (one wins its lock, the other fails, or both write): refused, naming the settings that use both."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(UserError) as info:
        make_runner(build_model(), torch.optim.SGD(build_model().parameters(), lr=0.1), ExecutionConfig())
    assert str(info.value) == ("this config needs 1 process (replication 1 x stages 1), torchrun started 2: set "
                               "execution.replication_factor=2 (DDP) or execution.layers_per_ipu to 2 stages, or run "
                               "it without torchrun")
