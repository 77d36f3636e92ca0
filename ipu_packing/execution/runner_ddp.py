"""``TorchRunner``: the packed model in one process, or DistributedDataParallel with one replica per process
(``torchrun``; gloo on CPU, NCCL on CUDA). Gradient accumulation runs the step's micro batches in passes
(ExecutionConfig ``pass_sizes``: several micro batches in one forward and backward where they fit
``execution.pass_memory_mb``), with DDP's ``no_sync`` until the last pass; each micro batch's loss is its own
mean (the model's ``loss_groups``) and the step's gradient the mean of the micro batches' (and replicas'), however
the passes fall."""

from __future__ import annotations

import contextlib
from typing import Any, Dict

import torch

from .config import ExecutionConfig
from .runner_common import (
    StepBatchSampler,
    StepMetrics,
    TorchProcessRunner,
    autocast,
    count_batch,
    init_distributed,
    ignoring_workers,
    metrics_from,
    model_inputs,
    model_metrics,
    passes,
    unscale,
)


class TorchRunner(TorchProcessRunner):
    """Single process, or DistributedDataParallel with one replica per process."""

    def __init__(self, model, optimizer, config: ExecutionConfig, scheduler=None, metrics=None) -> None:
        if config.num_stages != 1:
            raise ValueError("TorchRunner runs one stage; use PipelineRunner for layers_per_ipu %r"
                             % config.layers_per_ipu)
        self.config = config
        self.rank, self.world, self.device = init_distributed(config)
        self.model = model.to(self.device)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.inputs = model_inputs(model)
        self.metrics = model_metrics(model, metrics)
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

    def dataloader(self, dataset, num_workers: int = 0):
        sampler = StepBatchSampler(len(dataset), self.config, self.rank)
        return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, **ignoring_workers(num_workers))

    def train_step(self, batch) -> StepMetrics:
        cfg = self.config
        accumulation = cfg.gradient_accumulation
        scale = float(cfg.loss_scaling) if cfg.precision == "fp16" else 1.0
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(len(self.metrics), dtype=torch.float64)
        sizes = cfg.pass_sizes
        for i, (size, part) in enumerate(zip(sizes, passes(batch, cfg.micro_batch_size, sizes, self.device,
                                                           self.inputs))):
            last = i == len(sizes) - 1
            sync = contextlib.nullcontext() if (self.ddp is None or last) else self.ddp.no_sync()
            settings = {"loss_groups": size} if size > 1 else {}  # one micro batch: the model's own mean
            with sync:
                with autocast(cfg, self.device):
                    out = self._forward(**part, **settings)
                (out.loss.float() * (scale * size / accumulation)).backward()
            sums += torch.stack([getattr(out, k).detach().double().cpu() for k in self.metrics]) * size
        unscale(self.model.parameters(), scale)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        stats = torch.cat([sums / accumulation, torch.tensor(count_batch(batch), dtype=torch.float64)])  # summed below
        if self.world > 1:
            import torch.distributed as dist

            stats = stats.to(self.device)
            dist.all_reduce(stats)
            stats = stats.cpu()
            stats[: len(self.metrics)] /= self.world
        return metrics_from(stats, self.metrics)

    def sync_model(self) -> None:
        """Every process already holds every weight."""

    def optimizer_state_dict(self) -> Dict[str, Any]:
        """The optimizer state to checkpoint (every process holds all of it)."""
        return self.optimizer.state_dict()
