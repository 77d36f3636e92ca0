"""Pieces the runners share: the model's inputs and step metrics, counting what a batch holds, the collectives
of the torch processes, and the torch runners' sampler, micro batches and precision helpers."""

from __future__ import annotations

import contextlib
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from ..data.format import FIELDS
from ..errors import LaunchError, UserError
from ..signals import ignore_stop_signals

BATCH_FIELDS = FIELDS  # the pretraining model's inputs in forward's order; shapes and meanings: data/format.py


def model_inputs(model: torch.nn.Module) -> Tuple[str, ...]:
    """The batch fields ``model``'s forward takes, in its argument order (each a tensor of the batch); a keyword-only
    argument is a setting, not a field (the question-answering model's num_slots)."""
    return tuple(name for name, p in inspect.signature(model.forward).parameters.items()
                 if p.kind is not inspect.Parameter.KEYWORD_ONLY)


def model_metrics(model: torch.nn.Module, metrics: Optional[Sequence[str]] = None) -> Tuple[str, ...]:
    """The step metrics of ``model``'s output, averaged over micro batches and replicas: ``metrics`` when given,
    else the model's own ``METRICS`` (its output's scalar fields, "loss" first)."""
    names = tuple(metrics if metrics is not None else getattr(model, "METRICS", ("loss",)))
    if not names or names[0] != "loss":
        raise ValueError("step metrics must start with 'loss', got %r" % (names,))
    return names


@dataclass
class StepMetrics:
    """What one host call reports: the model's step metrics (averaged over micro batches and replicas) and what
    the batch held. ``metrics.loss`` reads ``values["loss"]`` (and so for every metric name)."""

    values: Dict[str, float] = field(default_factory=dict)
    """The model's step metrics by name ("loss" first)."""
    sequences: int = 0
    """Real sequences in the step, all replicas together."""
    tokens: int = 0
    """Real (non-padding) tokens in the step, all replicas together."""
    packs: int = 0
    """Rows (packs) in the step, all replicas together."""
    optimizer_steps: int = 1
    """Optimizer steps this call ran (poptorch: device iterations)."""

    def __getattr__(self, name: str) -> float:
        values = self.__dict__.get("values") or {}
        if name in values:
            return values[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        values = self.__dict__.get("values")
        if values is not None and name in values:
            values[name] = value
        else:
            object.__setattr__(self, name, value)


def count_batch(batch: Mapping[str, torch.Tensor]) -> Tuple[int, int, int]:
    """(sequences, tokens, packs) in a batch: the sequences of each pack (its sequence ids run 1..k, so k is the
    largest), the non-padding tokens and the rows."""
    ids = torch.as_tensor(batch["sequence_ids"])  # (B, S)
    sequences = int(ids.max(dim=-1).values.clamp(min=0).sum()) if ids.numel() else 0
    tokens = int((ids != 0).sum())
    return sequences, tokens, int(ids.shape[0])


def ignoring_workers(num_workers: int) -> Dict[str, Any]:
    """DataLoader arguments of a run's loader: workers that ignore SIGINT and SIGTERM (the main process handles a
    signal sent to the whole group, stops at a step, and shuts them down)."""
    return {"num_workers": num_workers, "worker_init_fn": ignore_stop_signals if num_workers else None}


def reduce_over_instances(values: Dict[str, float], rows: Optional[List[List[float]]], names: Sequence[str],
                          metrics: int) -> Dict[str, float]:
    """The whole step from every PopRun instance's ``values`` (one row each, in ``names`` order; None: this
    instance alone): the first ``metrics`` names (losses, accuracies) averaged (each instance holds the same
    number of replicas), sequences, tokens and packs summed, the seconds the slowest instance's; plus
    ``instances``, how many instances the result covers."""
    if rows is None:
        out = dict(values)
        out["instances"] = 1
        return out
    out = {}  # type: Dict[str, float]
    for j, key in enumerate(names):
        column = [r[j] for r in rows]
        if j < metrics:
            out[key] = sum(column) / len(column)
        elif key in ("sequences", "tokens", "packs"):
            out[key] = sum(column)
        else:
            out[key] = max(column)
    out["instances"] = len(rows)
    return out


# ---- helpers of the torch runners (runner_ddp.py, runner_pipeline.py) ------------------------------------


def check_launch(config) -> None:
    """What init_distributed needs of the launch, checked before anything is built: CUDA when asked for,
    torchrun's environment when the config needs more than one process, and no more processes than it needs (a
    one-process config under torchrun's N would run N separate trainings into one run directory). Raises
    LaunchError."""
    if config.backend != "torch":
        return
    if config.device == "cuda" and not torch.cuda.is_available():
        raise LaunchError("execution.device is 'cuda' but torch sees no CUDA device")
    world = config.world_size
    started = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world == 1 and started > 1:
        raise LaunchError(
            "this config needs 1 process (replication 1 x stages 1), torchrun started %d: set "
            "execution.replication_factor=%d (DDP) or execution.layers_per_ipu to %d stages, or run it without "
            "torchrun" % (started, started, started))
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
    interface (runner.py): one process per replica or stage, no host instances, nothing compiled ahead; the
    host collectives go through torch.distributed when there is more than one process."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    rank: int
    world: int
    metrics: Tuple[str, ...]
    device: torch.device

    def agree(self, flag: int) -> int:
        """The largest ``flag`` over the torch processes (a max all-reduce); ``flag`` in one process."""
        if self.world <= 1:
            return int(flag)
        import torch.distributed as dist

        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        value = torch.tensor([float(flag)], dtype=torch.float64, device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value.item())

    def gather_rng_states(self, state: Dict[str, Any]) -> List[Dict[str, Any]]:
        """Every torch process's generator states, by rank (an all-gather); this process's in one process."""
        if self.world <= 1:
            return [state]
        import torch.distributed as dist

        parts = [None] * self.world  # type: List[Any]
        dist.all_gather_object(parts, state)
        return parts

    def reduce_metrics(self, values: Dict[str, float]) -> Dict[str, float]:
        """``values`` as they are: ``train_step`` already reduced the step over the torch processes."""
        return reduce_over_instances(values, None, (), 0)

    def agree_on_start(self, run_dir: str, step: int, resumed: bool, log) -> None:
        """Nothing to agree on: torchrun's processes read one run directory and start from its checkpoint."""

    def agree_ready(self, refused: Optional[UserError]) -> None:
        """Raise the writer's refusal (another run holds the directory); the other ranks fail their first
        collective when the writer leaves."""
        if refused is not None:
            raise refused

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


def micro_batches(batch, micro: int, count: int, device: torch.device,
                  fields: Sequence[str] = BATCH_FIELDS) -> List[Dict[str, torch.Tensor]]:
    """``count`` micro batches of ``micro`` rows of each of ``fields`` (the model's inputs), on ``device``."""
    return passes(batch, micro, [1] * count, device, fields)


def passes(batch, micro: int, sizes: Sequence[int], device: torch.device,
           fields: Sequence[str] = BATCH_FIELDS) -> List[Dict[str, torch.Tensor]]:
    """The batch's rows in consecutive passes of ``sizes[i]`` micro batches of ``micro`` rows each (ExecutionConfig
    ``pass_sizes``): each of ``fields`` (the model's inputs), on ``device``."""
    out, start = [], 0
    for size in sizes:
        end = start + size * micro
        out.append({k: torch.as_tensor(batch[k])[start:end].to(device) for k in fields})
        start = end
    return out


@contextlib.contextmanager
def deterministic_kernels(config) -> Iterator[None]:
    """``config.deterministic`` (ExecutionConfig) for the block's duration: torch's deterministic algorithms on,
    and cuBLAS's fixed workspace where CUBLAS_WORKSPACE_CONFIG is unset (read when CUDA first builds a cuBLAS
    handle, so before the first step); both are put back as they were after. An operation with no
    deterministic kernel raises torch's RuntimeError naming it."""
    if not config.deterministic or config.backend != "torch":
        yield
        return
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    workspace = "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    if workspace:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        if workspace:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


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


def metrics_from(stats: torch.Tensor, names: Sequence[str]) -> StepMetrics:
    """StepMetrics from [the metrics named ``names``..., sequences, tokens, packs]."""
    values = stats.tolist()
    return StepMetrics(dict(zip(names, values[: len(names)])), sequences=int(round(values[-3])),
                       tokens=int(round(values[-2])), packs=int(round(values[-1])))
