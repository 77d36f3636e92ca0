"""Pieces the runners share: the batch fields, the step metrics, counting what a batch holds, and the torch
runners' process group, sampler, micro batches and precision helpers."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Tuple

import torch

from ..data.format import FIELDS, IGNORE_INDEX
from ..errors import LaunchError

BATCH_FIELDS = FIELDS  # model inputs in forward's order; shapes and meanings: data/format.py


@dataclass
class StepMetrics:
    loss: float
    mlm_loss: float
    nsp_loss: float
    mlm_accuracy: float
    nsp_accuracy: float
    sequences: int
    """Real sequences in the step, all replicas together."""
    tokens: int
    """Real (non-padding) tokens in the step, all replicas together."""
    optimizer_steps: int = 1
    """Optimizer steps this call ran (poptorch: device iterations)."""


def count_batch(batch: Mapping[str, torch.Tensor]) -> Tuple[int, int]:
    """(sequences, tokens) in a batch: NSP slots in use, and non-padding tokens."""
    sequences = int((torch.as_tensor(batch["nsp_labels"]) != IGNORE_INDEX).sum())
    tokens = int((torch.as_tensor(batch["sequence_ids"]) != 0).sum())
    return sequences, tokens


# ---- helpers of the torch runners (runner_ddp.py, runner_pipeline.py) ------------------------------------

METRICS = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")
"""The StepMetrics averaged over micro batches (and replicas)."""


def check_launch(config) -> None:
    """What init_distributed needs of the launch, checked before anything is built: CUDA when asked for,
    and torchrun's environment when the config needs more than one process. Raises LaunchError."""
    if config.backend != "torch":
        return
    if config.device == "cuda" and not torch.cuda.is_available():
        raise LaunchError("execution.device is 'cuda' but torch sees no CUDA device")
    world = config.world_size
    if world > 1 and ("RANK" not in os.environ or "WORLD_SIZE" not in os.environ):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise LaunchError(
                "this config needs %d processes (replication %d x stages %d): launch it with "
                "`torchrun --nproc-per-node %d ...`" % (world, config.replication_factor, config.num_stages, world)
            )


def init_distributed(config) -> Tuple[int, int, torch.device]:
    """(rank, world size, device) for this process; joins the torchrun process group when the config
    needs more than one process (reads RANK, WORLD_SIZE, LOCAL_RANK; gloo on CPU, NCCL on CUDA)."""
    check_launch(config)
    world = config.world_size
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if config.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world == 1:
        return 0, 1, device
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if config.device == "cuda" else "gloo")
    if dist.get_world_size() != world:
        raise LaunchError(
            "this config needs %d processes (replication %d x stages %d), torchrun started %d"
            % (world, config.replication_factor, config.num_stages, dist.get_world_size())
        )
    return dist.get_rank(), world, device


class TorchProcessRunner:
    """What the torch runners (runner_ddp.TorchRunner, runner_pipeline.PipelineRunner) share of the Runner
    interface (runner.py): one process per replica or stage, no host instances, nothing compiled ahead."""

    launch = None
    """No PopRun instances on torch."""
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    rank: int
    world: int

    @property
    def is_writer(self) -> bool:
        """The first torchrun process writes the run's files."""
        return self.rank == 0

    def is_compiled(self) -> bool:
        """Always: torch compiles nothing ahead of the first step (torch.compile compiles on it)."""
        return True

    def compile(self, batch) -> None:
        """Nothing to do ahead of time on torch."""

    def load_optimizer_state_dict(self, state: Dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)


class StepBatchSampler(torch.utils.data.Sampler):
    """Index lists for one process, in dataset order (the training loop decides the order: it hands over
    a Subset in its epoch order). Optimizer step s takes packs [s*G, (s+1)*G), G = packs per step over all
    replicas; replica r takes its contiguous slice [r*P, (r+1)*P) of them, P = packs per replica step.
    Every replica therefore sees different packs and one process with replication 1 and the same global
    batch sees exactly their union, in micro-batch order."""

    def __init__(self, num_items: int, config, rank: int) -> None:
        self.num_items = num_items
        self.step_packs = config.global_batch_packs
        self.replica_packs = config.packs_per_replica_step
        self.rank = rank

    def __len__(self) -> int:
        return self.num_items // self.step_packs

    def __iter__(self) -> Iterator[List[int]]:
        return step_slices(self.num_items, self.step_packs, self.replica_packs, self.rank)


def step_slices(num_items: int, step_packs: int, part_packs: int, part: int) -> Iterator[List[int]]:
    """For every whole step s of ``step_packs`` items: part ``part``'s contiguous slice
    [s*step_packs + part*part_packs, ... + part_packs). With parts = step_packs / part_packs, the parts'
    slices of a step are disjoint and cover it: a torch replica's share (StepBatchSampler) or a PopRun
    instance's (popdist_backend.instance_indices). An incomplete last step is left out, for every part."""
    if not (0 <= part and (part + 1) * part_packs <= step_packs):
        raise ValueError("part %d of %d items does not fit a step of %d" % (part, part_packs, step_packs))
    for s in range(num_items // step_packs):
        start = s * step_packs + part * part_packs
        yield list(range(start, start + part_packs))


def micro_batches(batch, micro: int, count: int, device: torch.device) -> List[Dict[str, torch.Tensor]]:
    return [
        {k: torch.as_tensor(batch[k])[i * micro : (i + 1) * micro].to(device) for k in BATCH_FIELDS}
        for i in range(count)
    ]


def autocast(config, device: torch.device):
    if config.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.float16 if config.precision == "fp16" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype)


def unscale(params, scale: float) -> None:
    if scale != 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.div_(scale)


def metrics_from(stats: torch.Tensor) -> StepMetrics:
    """StepMetrics from [METRICS..., sequences, tokens]."""
    values = stats.tolist()
    return StepMetrics(
        sequences=int(round(values[-2])),
        tokens=int(round(values[-1])),
        **dict(zip(METRICS, values[: len(METRICS)])),
    )
