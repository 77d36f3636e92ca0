"""Runners: one ExecutionConfig, three ways to run the packed model.

    runner = make_runner(model, optimizer, config, scheduler=None)
    for batch in runner.dataloader(dataset):        # one item = one optimizer step's packs for this process
        metrics = runner.train_step(batch)          # StepMetrics, identical on every process
    runner.sync_model()                             # runner.model now holds every current weight
    runner.model                                    # the unwrapped single-device model

- ``TorchRunner``: one process, or DistributedDataParallel over ``torchrun`` (gloo on CPU, NCCL on CUDA);
  gradient accumulation runs micro batches with DDP's ``no_sync`` until the last one.
- ``PipelineRunner``: ``torch.distributed.pipelining`` (imported lazily, torch >= 2.4), one process per stage,
  the same layers-per-stage split as the IPUs, micro batches = gradient accumulation, GPipe or 1F1B.
- ``PoptorchRunner`` (poptorch_backend.py): Graphcore IPUs, lazily imported.

Loss and gradient conventions are the same everywhere: every micro batch's loss is the model's mean over
its own masked tokens / sequences, the step's gradient is the mean of the micro batches' gradients (and of
the replicas'), so a global batch gives the same update however it is split.
"""

from __future__ import annotations

import contextlib
import os
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from .config import ExecutionConfig
from .placement import Placement, owner_stage, plan_placement
from .runner_common import BATCH_FIELDS, StepMetrics, count_batch

__all__ = ["BATCH_FIELDS", "PipelineRunner", "StepMetrics", "TorchRunner", "init_distributed", "make_runner"]

_METRICS = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")


# ---- process group ----------------------------------------------------------------------------------


def init_distributed(config: ExecutionConfig) -> Tuple[int, int, torch.device]:
    """(rank, world size, device) for this process; joins the torchrun process group when the config
    needs more than one process (reads RANK, WORLD_SIZE, LOCAL_RANK; gloo on CPU, NCCL on CUDA)."""
    world = config.world_size
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if config.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("execution.device is 'cuda' but torch sees no CUDA device")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world == 1:
        return 0, 1, device
    import torch.distributed as dist

    if not dist.is_initialized():
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise RuntimeError(
                "this config needs %d processes (replication %d x stages %d): launch it with "
                "`torchrun --nproc-per-node %d ...`" % (world, config.replication_factor, config.num_stages, world)
            )
        dist.init_process_group("nccl" if config.device == "cuda" else "gloo")
    if dist.get_world_size() != world:
        raise RuntimeError(
            "this config needs %d processes (replication %d x stages %d), torchrun started %d"
            % (world, config.replication_factor, config.num_stages, dist.get_world_size())
        )
    return dist.get_rank(), world, device


# ---- data -------------------------------------------------------------------------------------------


class StepBatchSampler(torch.utils.data.Sampler):
    """Index lists for one process. Optimizer step s takes packs [s*G, (s+1)*G) of the (optionally
    shuffled) dataset order, G = packs per step over all replicas; replica r takes its contiguous slice
    [r*P, (r+1)*P) of them, P = packs per replica step. Every replica therefore sees different packs and
    one process with replication 1 and the same global batch sees exactly their union, in micro-batch order."""

    def __init__(self, num_items: int, config: ExecutionConfig, rank: int, shuffle: bool = False) -> None:
        self.num_items = num_items
        self.step_packs = config.global_batch_packs
        self.replica_packs = config.packs_per_replica_step
        self.rank = rank
        self.shuffle = shuffle
        self.seed = config.seed
        self.epoch = 0

    def __len__(self) -> int:
        return self.num_items // self.step_packs

    def __iter__(self) -> Iterator[List[int]]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_items, generator=g).tolist()
        else:
            order = list(range(self.num_items))
        self.epoch += 1
        for s in range(len(self)):
            start = s * self.step_packs + self.rank * self.replica_packs
            yield order[start : start + self.replica_packs]


def _micro_batches(batch, micro: int, count: int, device: torch.device) -> List[Dict[str, torch.Tensor]]:
    return [
        {k: torch.as_tensor(batch[k])[i * micro : (i + 1) * micro].to(device) for k in BATCH_FIELDS}
        for i in range(count)
    ]


def _autocast(config: ExecutionConfig, device: torch.device):
    if config.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.float16 if config.precision == "fp16" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype)


def _unscale(params, scale: float) -> None:
    if scale != 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.div_(scale)


# ---- one process or DDP -----------------------------------------------------------------------------


class TorchRunner:
    """Single process, or DistributedDataParallel with one replica per process."""

    def __init__(self, model, optimizer, config: ExecutionConfig, scheduler=None) -> None:
        if config.num_stages != 1:
            raise ValueError("TorchRunner runs one stage; use PipelineRunner for layers_per_ipu %r" % config.layers_per_ipu)
        self.config = config
        self.rank, self.world, self.device = init_distributed(config)
        self.model = model.to(self.device)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.ddp = None
        self._forward = self.model
        if self.world > 1:
            if config.torch_compile:
                raise ValueError("execution.torch_compile is supported for a single process only")
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=ids)
            self._forward = self.ddp
        elif config.torch_compile:
            # Packs have one shape (micro_batch, S), so the whole forward+loss is one static graph.
            self._forward = torch.compile(
                self.model, fullgraph=True, dynamic=False, backend=config.torch_compile_backend
            )

    def dataloader(self, dataset, num_workers: int = 0, shuffle: bool = False):
        sampler = StepBatchSampler(len(dataset), self.config, self.rank, shuffle=shuffle)
        return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers)

    def compile(self, batch) -> None:
        """Nothing to do ahead of time on torch (torch.compile compiles on the first step)."""

    def train_step(self, batch) -> StepMetrics:
        cfg = self.config
        accumulation = cfg.gradient_accumulation
        scale = float(cfg.loss_scaling) if cfg.precision == "fp16" else 1.0
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(len(_METRICS), dtype=torch.float64)
        for i, part in enumerate(_micro_batches(batch, cfg.micro_batch_size, accumulation, self.device)):
            last = i == accumulation - 1
            sync = contextlib.nullcontext() if (self.ddp is None or last) else self.ddp.no_sync()
            with sync:
                with _autocast(cfg, self.device):
                    out = self._forward(**part)
                (out.loss.float() * (scale / accumulation)).backward()
            sums += torch.stack([getattr(out, k).detach().double().cpu() for k in _METRICS])
        _unscale(self.model.parameters(), scale)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        sequences, tokens = count_batch(batch)
        stats = torch.cat([sums / accumulation, torch.tensor([sequences, tokens], dtype=torch.float64)])
        if self.world > 1:
            import torch.distributed as dist

            stats = stats.to(self.device)
            dist.all_reduce(stats)
            stats = stats.cpu()
            stats[: len(_METRICS)] /= self.world
        return _metrics(stats)

    def sync_model(self) -> None:
        """Every process already holds every weight."""


def _metrics(stats: torch.Tensor) -> StepMetrics:
    values = stats.tolist()
    return StepMetrics(
        sequences=int(round(values[-2])),
        tokens=int(round(values[-1])),
        **dict(zip(_METRICS, values[: len(_METRICS)])),
    )


# ---- torch.distributed.pipelining ---------------------------------------------------------------------


class _Stage(torch.nn.Module):
    """The part of the packed BERT one pipeline process runs. Between stages flow the hidden states and
    the integer fields later stages still need; the attention mask is rebuilt from ``sequence_ids`` on
    every stage (cheaper to recompute than to send: (B, S) ints instead of a (B, S, S) mask)."""

    CARRIED = ("sequence_ids", "mlm_positions", "mlm_labels", "cls_positions", "nsp_labels")

    def __init__(self, model, plan: List[Placement], stage: int, num_stages: int, config, device) -> None:
        super().__init__()
        self.first = stage == 0
        self.last = stage == num_stages - 1
        self.layers = torch.nn.ModuleList(
            [model.get_submodule(p.module) for p in plan if p.module.startswith("bert.encoder.layer.") and p.stage == stage]
        )
        if self.first:
            self.embeddings = model.bert.embeddings
        if self.last:
            # Everything outside the embeddings and the encoder: pooler, MLM/NSP heads (and their tied decoder).
            self.heads = torch.nn.ModuleDict(
                {n: m for n, m in model.named_children() if n != "bert"}
            )
            self.bert_rest = torch.nn.ModuleDict(
                {n: m for n, m in model.bert.named_children() if n not in ("embeddings", "encoder")}
            )
        object.__setattr__(self, "_model", model)  # not a submodule: its parameters stay with their stages
        self._config = config
        self._device = device
        self.records = []  # type: List[torch.Tensor]

    def forward(self, *args):
        with _autocast(self._config, self._device):
            if self.first:
                fields = dict(zip(BATCH_FIELDS, args))
                h = self.embeddings(fields["input_ids"], fields["token_type_ids"], fields["position_ids"])
                carried = tuple(fields[k] for k in self.CARRIED)
            else:
                h, carried = args[0], tuple(args[1:])
            mask = self._model.bert.get_attention_mask(carried[0])
            for layer in self.layers:
                h = layer(h, mask)
            if not self.last:
                return (h,) + carried
            out = self._model.pretraining_heads(h, *carried[1:])
        self.records.append(torch.stack([getattr(out, k).detach().double().cpu() for k in _METRICS]))
        return out.loss.float().reshape(1)  # (1,): the schedule concatenates the micro batches' outputs


class PipelineRunner:
    """One process per pipeline stage (``torchrun --nproc-per-node <stages>``), the same layer split as the
    IPUs, gradient accumulation as the schedule's micro batches. Every process holds a full copy of the
    model (``runner.model``) but computes and updates only its stage; ``sync_model`` gathers the weights."""

    def __init__(self, model, optimizer, config: ExecutionConfig, scheduler=None) -> None:
        try:
            from torch.distributed import pipelining
        except ImportError as exc:  # torch < 2.4
            raise RuntimeError(
                "pipelined execution on torch needs torch.distributed.pipelining (torch >= 2.4), this is torch %s"
                % torch.__version__
            ) from exc
        import torch.distributed as dist

        if config.replication_factor != 1:
            raise ValueError(
                "backend torch runs either DDP replication or a pipeline, not both "
                "(replication_factor %d with %d stages)" % (config.replication_factor, config.num_stages)
            )
        if config.pipeline_schedule == "1f1b" and config.gradient_accumulation < config.num_stages:
            raise ValueError(
                "pipeline_schedule 1f1b needs gradient_accumulation >= stages (%d < %d)"
                % (config.gradient_accumulation, config.num_stages)
            )
        self.config = config
        self.rank, self.world, self.device = init_distributed(config)
        self.model = model.to(self.device)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.plan = plan_placement(len(model.bert.encoder.layer), config)
        self.stage_modules = [_Stage(model, self.plan, s, self.world, config, self.device) for s in range(self.world)]
        self.stage_module = self.stage_modules[self.rank]
        self._scale = float(config.loss_scaling) if config.precision == "fp16" else 1.0
        self._pipelining = pipelining
        self.schedule = None
        self._shared = None  # type: Optional[List[torch.nn.Parameter]]
        self._dist = dist

    def _build_schedule(self, batch) -> None:
        """Create the PipelineStage with explicit input/output examples (static metadata: no runtime shape
        inference, which would run the stage on uninitialised integer inputs), found by running the stages
        up to this one on the first micro batch (every process holds the whole model).

        That forward pass runs in training mode, so its dropout draws random numbers; it runs on a fork of
        the RNG (restored afterwards), otherwise a run resumed from a checkpoint, which builds its schedule
        on its first resumed step, would draw its dropout masks from a shifted stream."""
        cfg = self.config
        part = _micro_batches(batch, cfg.micro_batch_size, 1, self.device)[0]
        devices = [self.device] if self.device.type == "cuda" else []  # CPU generator only, or it and this GPU's
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            args = tuple(part[k] for k in BATCH_FIELDS)  # type: Tuple[torch.Tensor, ...]
            inputs = args
            for stage in self.stage_modules[: self.rank + 1]:
                inputs, out = args, stage(*args)
                args = out if isinstance(out, tuple) else (out,)
                stage.records = []
        # Floating tensors between stages carry gradients (the metadata says so; no_grad cleared the flag).
        inputs, args = [tuple(t.detach().requires_grad_(t.is_floating_point()) for t in ts) for ts in (inputs, args)]
        stage = self._pipelining.PipelineStage(
            self.stage_module, self.rank, self.world, self.device, input_args=inputs, output_args=args
        )
        schedule_cls = (
            self._pipelining.ScheduleGPipe if cfg.pipeline_schedule == "gpipe" else self._pipelining.Schedule1F1B
        )
        accumulation = cfg.gradient_accumulation
        # Each micro batch's loss is divided by the number of micro batches here (so the gradients are the
        # mean over micro batches for every parameter, whichever module it belongs to): scale_grads=False.
        kwargs = dict(n_microbatches=accumulation, loss_fn=_ScaledLoss(self._scale / accumulation))
        try:
            self.schedule = schedule_cls(stage, scale_grads=False, **kwargs)
        except TypeError:  # torch < 2.6: no scale_grads, gradients were never scaled
            self.schedule = schedule_cls(stage, **kwargs)

    def dataloader(self, dataset, num_workers: int = 0, shuffle: bool = False):
        # Every stage walks the same order (only the first uses the inputs; all count sequences/tokens).
        sampler = StepBatchSampler(len(dataset), self.config, 0, shuffle=shuffle)
        return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers)

    def compile(self, batch) -> None:
        """Nothing to do ahead of time on torch."""

    def _shared_params(self) -> List[torch.nn.Parameter]:
        """Parameters that received gradients on more than one stage (the tied word embedding / MLM decoder
        weight), found once from the first step's gradients."""
        if self._shared is None:
            params = list(self.model.parameters())
            used = torch.tensor([p.grad is not None for p in params], dtype=torch.int64)
            self._dist.all_reduce(used)
            self._shared = [p for p, n in zip(params, used.tolist()) if n > 1]
        return self._shared

    def train_step(self, batch) -> StepMetrics:
        cfg = self.config
        self.model.train()
        if self.schedule is None:
            self._build_schedule(batch)
        self.optimizer.zero_grad(set_to_none=True)
        self.stage_module.records = []
        if self.stage_module.first:
            args = [torch.as_tensor(batch[k]).to(self.device) for k in BATCH_FIELDS]
            self.schedule.step(*args)
        elif self.stage_module.last:
            target = torch.zeros(cfg.packs_per_replica_step, device=self.device)  # the loss needs no target
            self.schedule.step(target=target)
        else:
            self.schedule.step()
        # Tied weights: sum the partial gradients of every stage using them; every copy then takes the same update.
        for p in self._shared_params():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self._dist.all_reduce(p.grad)
        _unscale(self.model.parameters(), self._scale)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        if self.stage_module.last:
            stats = torch.stack(self.stage_module.records).mean(0)
        else:
            stats = torch.zeros(len(_METRICS), dtype=torch.float64)
        stats = stats.to(self.device)
        self._dist.broadcast(stats, src=self.world - 1)
        sequences, tokens = count_batch(batch)
        return _metrics(torch.cat([stats.cpu(), torch.tensor([sequences, tokens], dtype=torch.float64)]))

    def sync_model(self) -> None:
        """Broadcast every parameter and buffer from the stage that owns it, so ``runner.model`` is complete
        on every process (before saving or evaluating)."""
        for name, tensor in list(self.model.named_parameters()) + list(self.model.named_buffers()):
            with torch.no_grad():
                self._dist.broadcast(tensor.data, src=owner_stage(name, self.plan))


class _ScaledLoss:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return output.sum() * self.factor


# ---- entry point ------------------------------------------------------------------------------------


def make_runner(model, optimizer, config: ExecutionConfig, scheduler=None):
    """The runner ``config`` asks for. The poptorch backend imports poptorch here, and only here."""
    if config.backend == "poptorch":
        from .poptorch_backend import make_poptorch_runner

        return make_poptorch_runner(model, optimizer, config, scheduler=scheduler)
    config.layer_stages(len(model.bert.encoder.layer))  # one-line error when layers_per_ipu does not fit
    if config.num_stages > 1:
        return PipelineRunner(model, optimizer, config, scheduler=scheduler)
    return TorchRunner(model, optimizer, config, scheduler=scheduler)
