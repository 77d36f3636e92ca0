"""PopTorch adapter: a thin translation of ExecutionConfig into the documented PopTorch API.

Written against graphcore/poptorch ``python/options.py`` (Options, Training, Precision, PipelinedExecution),
``python/ops.py`` (BeginBlock, recomputationCheckpoint, identity_loss), ``python/optim.py`` (LAMB, AdamW),
``python/_poplar_executor.py`` (compile, optimizer state) and the user guide (batching: the DataLoader's
combined batch). poptorch ships only with Graphcore's Poplar SDK, so it is imported lazily, when the poptorch
backend is chosen. CI checks this file against a semantic stand-in of PopTorch (tests/fake_poptorch: blocks,
the IPU of every op, the weight-on-one-IPU rule, supported ops, optimizer state); only the IPU Model
(``make test-ipu``) and hardware run it for real. Under PopRun (several host instances) the options start
from popdist.poptorch.Options and each instance reads its share of the data: popdist_backend.py.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..errors import ConfigError
from .config import ExecutionConfig
from ..errors import BackendUnavailable
from .placement import check_pipeline_depth, ipu_blocks, model_stages, placement_rows
from .popdist_backend import Launch, instance_indices, popdist_options, resolve_launch
from .poprun_group import InstanceGroup, agree_on_start, agree_ready, instance_group
from .poptorch_options import (
    build_options,
    dataloader_kwargs,
    describe_options,
    optimizer_precision_kwargs,
    popart_options,
    popart_patterns,
    translate_optimizer,
)
from .runner_common import (
    StepMetrics,
    count_batch,
    ignoring_workers,
    model_inputs,
    model_metrics,
    reduce_over_instances,
)

SDK_MESSAGE = (
    "execution.backend 'poptorch' needs poptorch, which ships only with Graphcore's Poplar SDK "
    "(not on PyPI): enable the SDK and install its poptorch wheel, or use backend 'torch'"
)


def import_poptorch():
    try:
        import poptorch  # noqa: F401  (Poplar SDK only)
    except ImportError as exc:
        raise BackendUnavailable(SDK_MESSAGE) from exc
    return poptorch


def check_attention(attention: str) -> None:
    """Refuse (ConfigError, one line) an attention PopTorch cannot trace."""
    if attention != "dense":
        raise ConfigError(
            "execution.backend 'poptorch' runs attention 'dense' only (PopTorch's supported operations include "
            "neither scaled_dot_product_attention nor FlexAttention), got %r: set model.packed_attention=dense "
            "(the default)"
            % (attention,)
        )


def check_backend(attention: str, config: Optional[ExecutionConfig] = None) -> None:
    """What refuses a poptorch run before any model exists: an attention PopTorch cannot trace, no poptorch,
    and (given ``config``) a launch that does not match it (popdist_backend.resolve_launch). Raises
    ConfigError, BackendUnavailable or LaunchError (all UserErrors), each with a one-line message."""
    check_attention(attention)
    import_poptorch()
    if config is not None:
        resolve_launch(config)


def serialize_tied_decoder(model: torch.nn.Module, config: ExecutionConfig, poptorch) -> Any:
    """Run the MLM decoder (the one nn.Linear whose weight is an nn.Embedding's) as
    ``poptorch.serializedMatMul(x, weight.t(), OutputChannels, factor)`` + bias: ``factor`` matmuls over
    slices of the vocabulary, one after another, so the (tokens x vocab) product and its gradient are never
    live whole. This is what Graphcore's PipelinedBertForPretraining.parallelize does by swapping in its
    SerializedLinear (modeling.py:161-171, 43-76). Only the module's forward changes: parameters, their
    names and the tie are untouched. Returns the decoder, or None when the factor is 1."""
    factor = config.embedding_serialization_factor
    if factor == 1:
        return None
    tables = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    decoders = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and any(m.weight is w for w in tables)]
    if len(decoders) != 1:
        raise ConfigError("execution.embedding_serialization_factor %d needs exactly one decoder tied to an "
                         "embedding, found %d" % (factor, len(decoders)))
    decoder = decoders[0]
    if decoder.out_features % factor:
        raise ConfigError("execution.embedding_serialization_factor %d must divide the vocabulary size %d"
                         % (factor, decoder.out_features))
    mode = poptorch.MatMulSerializationMode.OutputChannels

    def forward(x: torch.Tensor) -> torch.Tensor:
        out = poptorch.serializedMatMul(x, decoder.weight.t(), mode, factor)  # (B, M, V)
        return out if decoder.bias is None else out + decoder.bias

    decoder.forward = forward
    return decoder


def apply_placement(model: torch.nn.Module, config: ExecutionConfig, poptorch, stages=None) -> list:
    """One PopTorch block per part the model declares (model/stages.py), begun by a ``BeginBlock`` forward
    pre-hook on the part's entry module, whose forward runs every op of the part, so no op runs outside a
    block and every weight is used on the one IPU of its part. Adds the per-layer recomputation checkpoints.
    ``stages``: the model's parts for ``config`` (placement.model_stages), computed here when not given.
    Returns [(part, recompute)] in execution order."""
    if stages is None:
        stages = model_stages(model, config)
    blocks = ipu_blocks(stages, config)
    for part, recompute in blocks:
        module = model.get_submodule(part.entry)
        poptorch.BeginBlock(module, part.name, ipu_id=part.device)
        if recompute:
            module.register_forward_hook(_RecomputeCheckpoint(poptorch))
    return blocks


class _RecomputeCheckpoint:
    """Forward hook: mark a layer's output(s) as recomputation checkpoints."""

    def __init__(self, poptorch) -> None:
        self.poptorch = poptorch

    def __call__(self, module, inputs, output):
        if isinstance(output, torch.Tensor):
            return self.poptorch.recomputationCheckpoint(output)
        return tuple(self.poptorch.recomputationCheckpoint(t) for t in output)


class _TrainingWrapper(torch.nn.Module):
    """Marks the model's loss for poptorch and returns its step metrics only, loss first, in a fixed order."""

    def __init__(self, model: torch.nn.Module, poptorch, inputs, metrics) -> None:
        super().__init__()
        self.model = model
        self._identity_loss = poptorch.identity_loss
        self._inputs, self._metrics = tuple(inputs), tuple(metrics)

    def forward(self, *fields):
        out = self.model(**dict(zip(self._inputs, fields)))
        loss = self._identity_loss(out.loss, reduction="none")
        return (loss,) + tuple(getattr(out, k) for k in self._metrics[1:])


class PoptorchRunner:
    """One ``train_step`` = one host call = ``device_iterations`` optimizer steps on every replica. A Runner
    (execution/runner.py); under PopRun one per host instance, its part in ``launch``."""

    rank = 0
    """One torch process per host instance: no torch.distributed rank (the PopRun instance is ``launch``'s)."""
    world = 1
    model: torch.nn.Module
    """The model on the host; ``sync_model`` copies the IPU weights into it."""
    launch: Launch
    """This PopRun instance's part (one host: instance 0 of 1)."""
    is_writer: bool
    """Whether this instance writes the run's files: instance 0."""
    metrics: Tuple[str, ...]
    """The model output's step metrics ``train_step`` reports, "loss" first."""
    group: Optional[InstanceGroup] = None
    """How the PopRun instances exchange (poprun_group.py), from ``agree_on_start`` on; None on one instance."""

    def __init__(self, model, optimizer, config: ExecutionConfig, scheduler=None, poptorch=None,
                 metrics=None) -> None:
        if poptorch is None:
            check_attention(getattr(model, "attention_implementation", "dense"))
            poptorch = import_poptorch()
        # The placement, computed once: the pipeline depth check reads it, then the blocks are begun from it.
        stages = model_stages(model, config)
        check_pipeline_depth(config, placement_rows(stages, config))  # PopART would refuse it at compile time
        self.poptorch = poptorch
        self.config = config
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.inputs = model_inputs(model)
        self.metrics = model_metrics(model, metrics)
        self.launch = resolve_launch(config)
        self.is_writer = self.launch.is_writer
        self.options = build_options(config, self.poptorch, popdist_options(config, self.launch))
        self.placement = apply_placement(model, config, self.poptorch, stages)
        serialize_tied_decoder(model, config, self.poptorch)  # execution.embedding_serialization_factor
        if config.precision == "fp16":
            model.half()
        model.train()
        self.ipu_optimizer = translate_optimizer(optimizer, config, self.poptorch)
        self._lrs = self._current_lrs()
        self.executor = self.poptorch.trainingModel(
            _TrainingWrapper(model, self.poptorch, self.inputs, self.metrics), options=self.options,
            optimizer=self.ipu_optimizer
        )

    def _current_lrs(self) -> List[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def dataloader(self, dataset, num_workers: int = 0):
        """poptorch.DataLoader: batch_size is the micro batch; each item is the combined batch of a host call
        of this instance. ``dataset`` is in step order (the training loop's epoch order); under several
        instances this one reads its slice of every step (popdist_backend.instance_indices)."""
        if self.launch.num_instances > 1:
            dataset = torch.utils.data.Subset(
                dataset, instance_indices(len(dataset), self.config, self.launch.instance))
        return self.poptorch.DataLoader(
            self.options,
            dataset,
            batch_size=self.config.micro_batch_size,
            shuffle=False,  # the training loop hands over its epoch order
            drop_last=True,
            auto_distributed_partitioning=False,  # the instance's share is cut above, once
            **ignoring_workers(num_workers),
            **dataloader_kwargs(self.config, self.poptorch),  # execution.dataloader_mode
        )

    def _args(self, batch) -> List[torch.Tensor]:
        return [torch.as_tensor(batch[k]) for k in self.inputs]

    def is_compiled(self) -> bool:
        """Whether the executor is compiled (or loaded from the executable cache) yet."""
        return bool(self.executor.isCompiled())

    def compile(self, batch) -> None:
        """Compile (or load from the executable cache) without running: the compile-only path, and the
        training loop's first step, whose compile it times apart."""
        self.executor.compile(*self._args(batch))

    def train_step(self, batch) -> StepMetrics:
        if self.config.compile_only:
            raise RuntimeError("execution.compile_only: call runner.compile(batch), "
                               "nothing can run on an offline target")
        outputs = self.executor(*self._args(batch))
        # Mean of what came back, divided by the micro batches summed into each value (output_mode "sum").
        summed = self.config.output_sum_count
        means = [float(torch.as_tensor(t).detach().float().mean()) / summed for t in outputs]
        steps = self.config.device_iterations
        if self.scheduler is not None:
            with warnings.catch_warnings():
                # The torch optimizer never steps here (poptorch.optim does, on the IPU): torch's
                # "scheduler.step() before optimizer.step()" warning does not apply.
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler")
                for _ in range(steps):
                    self.scheduler.step()
            lrs = self._current_lrs()
            if lrs != self._lrs:
                for group, lr in zip(self.ipu_optimizer.param_groups, lrs):
                    group["lr"] = lr
                self.executor.setOptimizer(self.ipu_optimizer)
                self._lrs = lrs
        sequences, tokens, packs = count_batch(batch)
        return StepMetrics(dict(zip(self.metrics, means)), sequences=sequences, tokens=tokens, packs=packs,
                           optimizer_steps=steps)

    # ---- host collectives: over the PopRun instances (poprun_group.py); this instance's own on one host ----

    def agree_on_start(self, run_dir: str, step: int, resumed: bool, log) -> None:
        """Under PopRun: the instances start from the same step and weights, or all stop (one line); with
        horovod, instance 0's weights are broadcast. Nothing on one instance."""
        self.group = instance_group(self.launch, run_dir)
        if self.group is not None:
            agree_on_start(self.group, step, resumed, self.model, log=log if self.is_writer else (lambda m: None))
            if not self.group.reduces_metrics:
                log("note: no horovod.torch: each step's metrics are instance 0's share (1 of %d instances; "
                    "\"instances\": 1 in metrics.jsonl); install the Poplar SDK's horovod wheel to reduce them over "
                    "the instances" % (self.group.num_instances,))

    def agree_ready(self, refused) -> None:
        """After instance 0 tried to take the run directory: every instance starts, or every one stops."""
        if self.group is None:
            if refused is not None:
                raise refused
            return
        agree_ready(self.group, refused)

    def agree(self, flag: int) -> int:
        """The largest ``flag`` over the instances that exchange every host call (horovod); this one's elsewhere."""
        if self.group is None or not self.group.reduces_metrics:
            return int(flag)
        return int(max(row[0] for row in self.group.allgather([float(flag)], name="ipu_packing.stop.%d"
                                                                 % self._agreements())))

    def _agreements(self) -> int:
        self._agreed = getattr(self, "_agreed", 0) + 1
        return self._agreed

    def gather_rng_states(self, state: Dict[str, Any]) -> List[Dict[str, Any]]:
        """This process's generator states: one torch process per instance, and instance 0 writes."""
        return [state]

    def reduce_metrics(self, values: Dict[str, float]) -> Dict[str, float]:
        """The whole step over the instances (means of the metrics, sums of the counts, the slowest seconds),
        where they exchange every host call; this instance's share elsewhere (``instances`` says which)."""
        if self.group is None or not self.group.reduces_metrics:
            return reduce_over_instances(values, None, (), 0)
        names = sorted(values, key=lambda k: (k not in self.metrics, self.metrics.index(k) if k in self.metrics
                                              else 0, k))
        rows = self.group.allgather([float(values[k]) for k in names], name="ipu_packing.step.%d"
                                    % self._agreements())
        return reduce_over_instances(values, rows, names, len(self.metrics))

    def sync_model(self) -> None:
        """Copy the IPU weights back into ``self.model`` (e.g. before saving a checkpoint)."""
        self.executor.copyWeightsToHost()

    def optimizer_state_dict(self) -> Dict[str, Any]:
        """The optimizer state to checkpoint: poptorch's, which holds the IPU state ("ipu_state",
        "ipu_param": LAMB/Adam moments and step) next to torch's param groups. Once the executor has run,
        ``state_dict()`` reads the state back from the IPUs (PoplarExecutor._get_optim_state_dict ->
        readOptimizerState); the torch optimizer never steps on this path and holds no moments."""
        return self.ipu_optimizer.state_dict()

    def load_optimizer_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore a checkpoint's optimizer state before the first host call: poptorch writes an IPU state
        loaded before the run to the device when it attaches (PoplarExecutor._on_device_attach). A state
        without IPU moments (saved before any step, or by a torch run) restores the param groups only."""
        self.optimizer.load_state_dict(state)
        if state.get("ipu_state") is not None and state.get("ipu_param") is not None:
            self.ipu_optimizer.load_state_dict(state)

    def close(self) -> None:
        self.executor.detachFromDevice()

    def release(self) -> None:
        """Detach from the IPUs if attached, so another executable can use them (the bench's two layouts):
        poptorch reads the weights and optimizer state back first, and attaches again on the next call."""
        if self.executor.isCompiled() and self.executor.isAttachedToDevice():
            self.executor.detachFromDevice()

    def attach(self) -> None:
        """Attach a compiled, released executable again ahead of its next call (so the call's time is the step's)."""
        if self.executor.isCompiled() and not self.executor.isAttachedToDevice():
            self.executor.attachToDevice()


class _InferenceWrapper(torch.nn.Module):
    """Returns the outputs the model serves only (its SERVED fields: a classifier's logits, question answering's
    token start and end logits): what an inference host call brings back. ``settings``: the model's keyword-only
    settings (question answering's num_slots, K, which it takes from its labels when it has them)."""

    def __init__(self, model: torch.nn.Module, inputs, served=("logits",)) -> None:
        super().__init__()
        self.model = model
        self._inputs = tuple(inputs)
        self._served = tuple(served)
        self.settings: Dict[str, Any] = {}

    def forward(self, *fields):
        out = self.model(**dict(zip(self._inputs, fields)), **self.settings)
        values = tuple(getattr(out, name) for name in self._served)
        return values[0] if len(values) == 1 else values


class PoptorchInference:
    """``poptorch.inferenceModel`` of a packed model with labels left out: the parts placed on the IPUs as
    training places them (model/stages.py), one compiled batch of ``packs_per_call`` packs (micro batch x device
    iterations x replicas; a pipeline gets at least as many device iterations as stages, as PopART asks), each
    call returning the logits of its packs. A caller pads a short last batch with empty packs."""

    def __init__(self, model: torch.nn.Module, config: ExecutionConfig, poptorch=None) -> None:
        import dataclasses

        if poptorch is None:
            check_attention(getattr(model, "attention_implementation", "dense"))
            poptorch = import_poptorch()
        config = dataclasses.replace(config, gradient_accumulation=1, output_mode="all",
                                     device_iterations=max(config.device_iterations, config.num_stages))
        self.poptorch, self.config = poptorch, config
        self.model = model
        import inspect

        self.inputs = tuple(name for name, p in inspect.signature(model.forward).parameters.items()
                            if p.default is inspect.Parameter.empty)  # the fields, not the labels (None to serve)
        self.options = build_options(config, poptorch, popdist_options(config, resolve_launch(config)))
        self.placement = apply_placement(model, config, poptorch, model_stages(model, config))
        if config.precision == "fp16":
            model.half()
        model.eval()
        self.served = tuple(getattr(model, "SERVED", ("logits",)))
        self.wrapper = _InferenceWrapper(model, self.inputs, self.served)
        self.executor = poptorch.inferenceModel(self.wrapper, options=self.options)

    @property
    def packs_per_call(self) -> int:
        return int(self.config.micro_batch_size * self.config.device_iterations * self.config.replication_factor)

    def _settle(self, batch) -> None:
        """The model's keyword-only settings from the first batch: num_slots is K, the width of its slot fields (the
        compiled graph holds it)."""
        import inspect

        params = inspect.signature(self.model.forward).parameters
        if "num_slots" in params and "num_slots" not in self.wrapper.settings:
            self.wrapper.settings["num_slots"] = int(torch.as_tensor(batch["example_ids"]).shape[1])

    def compile(self, batch) -> None:
        self._settle(batch)
        self.executor.compile(*[torch.as_tensor(batch[k]) for k in self.inputs])

    def __call__(self, batch):
        from types import SimpleNamespace

        self._settle(batch)
        got = self.executor(*[torch.as_tensor(batch[k]) for k in self.inputs])
        values = (got,) if len(self.served) == 1 else tuple(got)
        return SimpleNamespace(loss=None, count=None, **dict(zip(self.served, values)))


def make_poptorch_runner(model, optimizer, config: ExecutionConfig, scheduler=None, poptorch=None,
                         metrics=None) -> PoptorchRunner:
    return PoptorchRunner(model, optimizer, config, scheduler=scheduler, poptorch=poptorch, metrics=metrics)


__all__ = [
    "BackendUnavailable",
    "PoptorchInference",
    "PoptorchRunner",
    "SDK_MESSAGE",
    "apply_placement",
    "check_backend",
    "build_options",
    "check_attention",
    "dataloader_kwargs",
    "describe_options",
    "import_poptorch",
    "make_poptorch_runner",
    "optimizer_precision_kwargs",
    "popart_options",
    "popart_patterns",
    "serialize_tied_decoder",
    "translate_optimizer",
]
