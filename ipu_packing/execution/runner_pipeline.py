"""``PipelineRunner``: ``torch.distributed.pipelining`` (imported lazily, torch >= 2.4), one process per stage,
the parts the model declares (model/stages.py) on the processes placement.py gives them, gradient
accumulation as the schedule's micro batches, GPipe or 1F1B."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .config import ExecutionConfig
from .placement import model_stages, owner_stage, plan_placement, torch_stages
from .runner_common import (
    StepBatchSampler,
    StepMetrics,
    TorchProcessRunner,
    autocast,
    count_batch,
    init_distributed,
    ignoring_workers,
    metrics_from,
    micro_batches,
    model_metrics,
    unscale,
)


class _Stage(torch.nn.Module):
    """The parts of the model one pipeline process runs. Between processes flow exactly the tensors that
    later parts read (the hidden states and the batch fields they need); anything a part builds for itself
    (the attention mask, rebuilt from ``sequence_ids`` on every stage: (B, S) ints are cheaper to send
    than a (B, S, S) mask) stays on its process."""

    def __init__(self, model, stages, part_stage: Sequence[int], stage: int, num_stages: int, config, device,
                 metrics: Sequence[str]) -> None:
        super().__init__()
        self.first = stage == 0
        self.last = stage == num_stages - 1
        self.parts = [p for p, s in zip(stages.parts, part_stage) if s == stage]
        # The parts' modules, registered so that this stage's parameters are the stage module's.
        self.held = torch.nn.ModuleList([model.get_submodule(m) for p in self.parts for m in p.modules])
        self.inputs = tuple(stages.inputs) if self.first else _carried(stages, part_stage, stage - 1)
        self.outputs = () if self.last else _carried(stages, part_stage, stage)
        object.__setattr__(self, "_model", model)  # not a submodule: its parameters stay with their stages
        self._stages = stages
        self._config = config
        self._device = device
        self._metrics = tuple(metrics)
        self.records = []  # type: List[torch.Tensor]

    def forward(self, *args):
        state = dict(zip(self.inputs, args))  # type: Dict[str, Any]
        with autocast(self._config, self._device):
            for part in self.parts:
                self._stages.run(self._model, part, state)
        if not self.last:
            return tuple(state[k] for k in self.outputs)
        out = state[self._stages.output]
        self.records.append(torch.stack([getattr(out, k).detach().double().cpu() for k in self._metrics]))
        return out.loss.float().reshape(1)  # (1,): the schedule concatenates the micro batches' outputs


def _carried(stages, part_stage: Sequence[int], stage: int) -> Tuple[str, ...]:
    """Names that leave process ``stage``: what parts of later processes read, produced on or before it."""
    available = list(stages.inputs)
    for part, s in zip(stages.parts, part_stage):
        if s <= stage:
            available += [w for w in part.writes if w not in available]
    needed = {r for part, s in zip(stages.parts, part_stage) if s > stage for r in part.reads}
    written = [k for k in available if k in needed and k not in stages.inputs]
    return tuple(written + [k for k in stages.inputs if k in needed])


class PipelineRunner(TorchProcessRunner):
    """One process per pipeline stage (``torchrun --nproc-per-node <stages>``), the same split as the IPUs,
    gradient accumulation as the schedule's micro batches. Every process holds a full copy of the model
    (``runner.model``) but computes and updates only its stage; ``sync_model`` gathers the weights and
    ``optimizer_state_dict`` the moments."""

    def __init__(self, model, optimizer, config: ExecutionConfig, scheduler=None, metrics=None) -> None:
        try:
            from torch.distributed import pipelining
        except ImportError as exc:  # torch < 2.4
            raise RuntimeError(
                "pipelined execution on torch needs torch.distributed.pipelining (torch >= 2.4), this is torch %s"
                % torch.__version__
            ) from exc
        import torch.distributed as dist

        if getattr(model, "attention_implementation", "dense") == "flex":
            raise ValueError("attention 'flex' is not for pipelined stages (its BlockMask is not a tensor a stage "
                             "can take): use varlen, sdpa or dense with layers_per_ipu %r" % (config.layers_per_ipu,))
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
        self.metrics = model_metrics(model, metrics)
        stages = model_stages(model, config)
        part_stage = torch_stages(stages, self.world)
        self.plan = plan_placement(model, config)
        self.inputs = tuple(stages.inputs)  # the model's forward arguments, in its order
        self.stage_modules = [_Stage(model, stages, part_stage, s, self.world, config, self.device, self.metrics)
                              for s in range(self.world)]
        self.stage_module = self.stage_modules[self.rank]
        self._scale = float(config.loss_scaling) if config.precision == "fp16" else 1.0
        self._pipelining = pipelining
        self.schedule = None
        self._shared: Optional[List[torch.nn.Parameter]] = None
        self._dist = dist

    def _build_schedule(self, batch) -> None:
        """Create the PipelineStage with explicit input/output examples (static metadata: no runtime shape
        inference, which would run the stage on uninitialised integer inputs), found by running the stages
        up to this one on the first micro batch (every process holds the whole model).

        That forward pass runs in training mode, so its dropout draws random numbers; it runs on a fork of
        the RNG (restored afterwards), otherwise a run resumed from a checkpoint, which builds its schedule
        on its first resumed step, would draw its dropout masks from a shifted stream."""
        cfg = self.config
        part = micro_batches(batch, cfg.micro_batch_size, 1, self.device, self.inputs)[0]
        devices = [self.device] if self.device.type == "cuda" else []  # CPU generator only, or it and this GPU's
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            args = tuple(part[k] for k in self.inputs)  # type: Tuple[torch.Tensor, ...]
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

    def dataloader(self, dataset, num_workers: int = 0):
        # Every stage walks the same order (only the first uses the inputs; all count sequences/tokens).
        sampler = StepBatchSampler(len(dataset), self.config, 0)
        return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, **ignoring_workers(num_workers))

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
            args = [torch.as_tensor(batch[k]).to(self.device) for k in self.inputs]
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
        unscale(self.model.parameters(), self._scale)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        if self.stage_module.last:
            stats = torch.stack(self.stage_module.records).mean(0)
        else:
            stats = torch.zeros(len(self.metrics), dtype=torch.float64)
        stats = stats.to(self.device)
        self._dist.broadcast(stats, src=self.world - 1)
        return metrics_from(torch.cat([stats.cpu(), torch.tensor(count_batch(batch), dtype=torch.float64)]),
                            self.metrics)

    def sync_model(self) -> None:
        """Broadcast every parameter and buffer from the stage that owns it, so ``runner.model`` is complete
        on every process (before saving or evaluating)."""
        for name, tensor in list(self.model.named_parameters()) + list(self.model.named_buffers()):
            with torch.no_grad():
                self._dist.broadcast(tensor.data, src=owner_stage(name, self.plan))

    def optimizer_state_dict(self) -> Dict[str, Any]:
        """The optimizer state of every parameter. Each stage keeps the moments of its own parameters on
        its process, so they are gathered (a collective: every process calls this)."""
        state = self.optimizer.state_dict()
        parts = [None] * self.world  # type: List[Any]
        self._dist.all_gather_object(parts, state["state"])
        merged = {}  # type: Dict[Any, Any]
        for part in parts:
            merged.update(part)
        state["state"] = merged
        return state


class _ScaledLoss:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return output.sum() * self.factor
