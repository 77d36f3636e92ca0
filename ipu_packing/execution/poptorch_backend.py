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
from typing import Any, Dict, List

import torch

from ..errors import ConfigError, UserError
from .config import ACCUMULATE_OUTER_FRAGMENT_SCHEDULES, SUBGRAPH_COPYING_STRATEGIES, ExecutionConfig
from .placement import check_pipeline_depth, ipu_blocks, model_stages
from .popdist_backend import instance_indices, popdist_options, resolve_launch
from .runner_common import BATCH_FIELDS, StepMetrics, count_batch

SDK_MESSAGE = (
    "execution.backend 'poptorch' needs poptorch, which ships only with Graphcore's Poplar SDK "
    "(not on PyPI): enable the SDK and install its poptorch wheel, or use backend 'torch'"
)


class BackendUnavailable(UserError, RuntimeError):
    """The chosen backend cannot be imported here."""


def import_poptorch():
    try:
        import poptorch  # noqa: F401  (Poplar SDK only)
    except ImportError as exc:
        raise BackendUnavailable(SDK_MESSAGE) from exc
    return poptorch


def check_backend(attention: str, config: ExecutionConfig = None) -> None:
    """What refuses a poptorch run before any model exists: an attention PopTorch cannot trace, no poptorch,
    and (given ``config``) a launch that does not match it (popdist_backend.resolve_launch). Raises
    ConfigError, BackendUnavailable or LaunchError (all UserErrors), each with a one-line message."""
    if attention != "dense":
        raise ConfigError(
            "execution.backend 'poptorch' runs attention 'dense' only (PopTorch's supported operations include "
            "neither scaled_dot_product_attention nor FlexAttention), got %r: set model.packed_attention=dense "
            "(the default)"
            % (attention,)
        )
    import_poptorch()
    if config is not None:
        resolve_launch(config)


def build_options(config: ExecutionConfig, poptorch, opts: Any = None) -> Any:
    """poptorch.Options for ``config`` (training): the calls of Graphcore's BERT app (graphcore/examples
    nlp/bert/pytorch/ipu_options.py), each from an ExecutionConfig field. ``opts``: the
    popdist.poptorch.Options of a PopRun instance, which already holds its (local) replication factor
    (ipu_options.py:36-45); None starts from poptorch.Options() with the config's replication."""
    if opts is None:
        opts = poptorch.Options()
        opts.replicationFactor(config.replication_factor)
    opts.autoRoundNumIPUs(True)
    opts.randomSeed(config.seed)
    opts.deviceIterations(config.device_iterations)
    opts.Training.gradientAccumulation(config.gradient_accumulation)
    # Mean over micro batches and replicas, so the update does not depend on how the global batch is split.
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Mean)
    # Sum (Graphcore's choice): one value per replica per host call, summed over its micro batches; the
    # runner divides by config.output_sum_count. All/Final return per-micro-batch values.
    opts.outputMode(getattr(poptorch.OutputMode, _OUTPUT_MODES[config.output_mode]))
    if config.num_stages > 1:
        opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    opts.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings()
        .useOnChipStorage(not config.optimizer_state_offchip)
        .useReplicatedTensorSharding(config.replicated_tensor_sharding)
    )
    if config.available_memory_proportion:
        opts.setAvailableMemoryProportion(
            {"IPU%d" % ipu: config.memory_proportion_for(ipu) for ipu in range(config.ipus_per_replica)}
        )
    if config.executable_cache_dir:
        opts.enableExecutableCaching(config.executable_cache_dir)
    if config.use_ipu_model:
        opts.useIpuModel(True)
    if config.compile_only:
        opts.useOfflineIpuTarget()
    if config.precision == "fp16" and not config.use_ipu_model:
        # Recommended for fp16 training on hardware (the IPU Model does not model stochastic rounding).
        opts.Precision.enableStochasticRounding(True)
    if _half_partials(config):
        opts.Precision.setPartialsType(torch.float16)
    for key, value in popart_options(config).items():
        opts._Popart.set(key, value)
    opts._Popart.setPatterns(popart_patterns(config))
    return opts


_OUTPUT_MODES = {"sum": "Sum", "all": "All", "final": "Final"}  # ExecutionConfig.output_mode -> poptorch.OutputMode
# ExecutionConfig.dataloader_mode -> poptorch.DataLoaderMode
_DATALOADER_MODES = {"sync": "Sync", "async": "Async", "async_rebatched": "AsyncRebatched"}
_TORCH_TYPES = {"fp16": torch.float16, "fp32": torch.float32}
# poptorch.optim class -> its (accumulator, first moment, second moment) keyword names (poptorch python/optim.py:
# SGD 209-210 (velocity is its only state), Adam 342-344, AdamW 461-463, LAMB 694-696)
_PRECISION_KWARGS = {
    "LAMB": ("accum_type", "first_order_momentum_accum_type", "second_order_momentum_accum_type"),
    "AdamW": ("accum_type", "first_order_momentum_accum_type", "second_order_momentum_accum_type"),
    "Adam": ("accum_type", "first_order_momentum_accum_type", "second_order_momentum_accum_type"),
    "SGD": ("accum_type", "velocity_accum_type"),
}


def _half_partials(config: ExecutionConfig) -> bool:
    return config.half_partials and config.precision == "fp16"


def popart_options(config: ExecutionConfig) -> Dict[str, Any]:
    """The ``opts._Popart.set(key, value)`` calls of Graphcore's ipu_options.py:104-132, as {key: value}.
    PopART enums go as their integer value (poptorch options.py:384-385); every key is one that PopTorch
    forwards to popart::SessionOptions (poptorch popart_compiler/source/SessionOptions.cpp)."""
    d = {
        "disableGradAccumulationTensorStreams": bool(config.disable_grad_accumulation_tensor_streams),
        "subgraphCopyingStrategy": SUBGRAPH_COPYING_STRATEGIES.index(config.subgraph_copying_strategy),
        "scheduleNonWeightUpdateGradientConsumersEarly": bool(
            config.schedule_non_weight_update_gradient_consumers_early
        ),
    }  # type: Dict[str, Any]
    if config.num_stages > 1:
        # The accumulate outer fragment (the weight update after the accumulation loop) is scheduled across
        # IPUs only in pipelined mode (popart sessionoptions.hpp:580-583).
        d["accumulateOuterFragmentSettings.schedule"] = ACCUMULATE_OUTER_FRAGMENT_SCHEDULES.index(
            config.accumulate_outer_fragment_schedule
        )
        d["accumulateOuterFragmentSettings.excludedVirtualGraphs"] = [
            str(i) for i in config.accumulate_outer_fragment_excluded_ipus
        ]
    if config.engine_options:
        d["engineOptions"] = dict(config.engine_options)
    return d


def popart_patterns(config: ExecutionConfig) -> Dict[str, bool]:
    """``opts._Popart.setPatterns(...)`` of Graphcore's ipu_options.py:115."""
    return {
        "TiedGather": bool(config.tied_gather),
        "TiedGatherAccumulate": bool(config.tied_gather),
        "UpdateInplacePrioritiesForIpu": bool(config.update_inplace_priorities_for_ipu),
    }


def optimizer_precision_kwargs(config: ExecutionConfig, optimizer: str) -> Dict[str, torch.dtype]:
    """Accumulator and optimizer-state types for poptorch.optim.``optimizer`` (its class name), as
    Graphcore's optimization.py:54,76-78 passes them: gradient accumulators in ``config.accumulator_type``,
    first moment (SGD: velocity) in ``first_order_momentum_type``, second moment in
    ``second_order_momentum_type``. translate_optimizer passes them on."""
    if optimizer not in _PRECISION_KWARGS:
        raise ValueError("no poptorch.optim precision arguments for %r (supported: %s)"
                         % (optimizer, sorted(_PRECISION_KWARGS)))
    types = (config.accumulator_type, config.first_order_momentum_type, config.second_order_momentum_type)
    return {k: _TORCH_TYPES[t] for k, t in zip(_PRECISION_KWARGS[optimizer], types)}


def dataloader_kwargs(config: ExecutionConfig, poptorch) -> Dict[str, Any]:
    """Extra poptorch.DataLoader arguments: ``mode`` (Graphcore's pretraining_data.py:260)."""
    return {"mode": getattr(poptorch.DataLoaderMode, _DATALOADER_MODES[config.dataloader_mode])}


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


def apply_placement(model: torch.nn.Module, config: ExecutionConfig, poptorch) -> list:
    """One PopTorch block per part the model declares (model/stages.py), begun by a ``BeginBlock`` forward
    pre-hook on the part's entry module, whose forward runs every op of the part, so no op runs outside a
    block and every weight is used on the one IPU of its part. Adds the per-layer recomputation checkpoints.
    Returns [(part, recompute)] in execution order."""
    blocks = ipu_blocks(model_stages(int(model.config.num_hidden_layers), config), config)
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


# torch optimizer class name -> (poptorch.optim class, per-group hyperparameters, optimizer-wide attributes)
_OPTIMIZERS = {
    "LAMB": ("LAMB", ("lr", "betas", "eps", "weight_decay", "max_weight_norm"), ("bias_correction",)),
    "AdamW": ("AdamW", ("lr", "betas", "eps", "weight_decay"), ("bias_correction",)),
    "Adam": ("Adam", ("lr", "betas", "eps", "weight_decay"), ()),
    "SGD": ("SGD", ("lr", "momentum", "dampening", "weight_decay", "nesterov"), ()),
}


def translate_optimizer(optimizer: torch.optim.Optimizer, config: ExecutionConfig, poptorch):
    """The poptorch.optim equivalent of a torch optimizer: same class name, same param groups with every
    per-group hyperparameter spelled out, the torch optimizer's defaults as constructor arguments (so the
    order of the groups does not matter), optimizer-wide flags kept as attributes of the torch optimizer
    (the application's LAMB keeps ``bias_correction`` there), plus the static loss scale (poptorch applies
    it inside the optimizer)."""
    name = type(optimizer).__name__
    if name not in _OPTIMIZERS:
        raise ValueError("no poptorch.optim equivalent for optimizer %r (supported: %s)" % (name, sorted(_OPTIMIZERS)))
    target, keys, attributes = _OPTIMIZERS[name]
    groups = []
    for group in optimizer.param_groups:
        g = {"params": group["params"]}  # type: Dict[str, Any]
        for k in keys:
            if group.get(k) is not None:
                g[k] = tuple(group[k]) if k == "betas" else group[k]
        groups.append(g)
    kwargs = {}  # type: Dict[str, Any]
    for k in keys:
        if optimizer.defaults.get(k) is not None:
            kwargs[k] = tuple(optimizer.defaults[k]) if k == "betas" else optimizer.defaults[k]
    for attr in attributes:
        value = getattr(optimizer, attr, None)
        if value is None:
            value = optimizer.defaults.get(attr)
        if value is not None:
            kwargs[attr] = value
    kwargs.update(optimizer_precision_kwargs(config, target))  # accumulator and moment types
    return getattr(poptorch.optim, target)(groups, loss_scaling=float(config.loss_scaling), **kwargs)


class _TrainingWrapper(torch.nn.Module):
    """Marks the model's loss for poptorch and returns tensors only, in a fixed order."""

    OUTPUTS = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")

    def __init__(self, model: torch.nn.Module, poptorch) -> None:
        super().__init__()
        self.model = model
        self._identity_loss = poptorch.identity_loss

    def forward(self, *fields):
        out = self.model(**dict(zip(BATCH_FIELDS, fields)))
        loss = self._identity_loss(out.loss, reduction="none")
        return (loss,) + tuple(getattr(out, k) for k in self.OUTPUTS[1:])


class PoptorchRunner:
    """One ``train_step`` = one host call = ``device_iterations`` optimizer steps on every replica."""

    def __init__(self, model, optimizer, config: ExecutionConfig, scheduler=None, poptorch=None) -> None:
        if poptorch is None:
            check_backend(getattr(model, "attention_implementation", "dense"))
            poptorch = import_poptorch()
        check_pipeline_depth(config)  # PopART would refuse it at compile time
        self.poptorch = poptorch
        self.config = config
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.launch = resolve_launch(config)  # this PopRun instance's part (one host: instance 0 of 1)
        self.is_writer = self.launch.is_writer  # the training loop writes files on instance 0 only
        self.options = build_options(config, self.poptorch, popdist_options(config, self.launch))
        self.placement = apply_placement(model, config, self.poptorch)
        serialize_tied_decoder(model, config, self.poptorch)  # execution.embedding_serialization_factor
        if config.precision == "fp16":
            model.half()
        elif config.precision == "bf16":
            raise ConfigError("execution.precision bf16 is not available on IPUs: use fp16 or fp32")
        model.train()
        self.ipu_optimizer = translate_optimizer(optimizer, config, self.poptorch)
        self._lrs = self._current_lrs()
        self.executor = self.poptorch.trainingModel(
            _TrainingWrapper(model, self.poptorch), options=self.options, optimizer=self.ipu_optimizer
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
            num_workers=num_workers,
            drop_last=True,
            auto_distributed_partitioning=False,  # the instance's share is cut above, once
            **dataloader_kwargs(self.config, self.poptorch),  # execution.dataloader_mode
        )

    def _args(self, batch) -> List[torch.Tensor]:
        return [torch.as_tensor(batch[k]) for k in BATCH_FIELDS]

    def compile(self, batch) -> None:
        """Compile (or load from the executable cache) without running: the compile-only path."""
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
        sequences, tokens = count_batch(batch)
        return StepMetrics(
            loss=means[0],
            mlm_loss=means[1],
            nsp_loss=means[2],
            mlm_accuracy=means[3],
            nsp_accuracy=means[4],
            sequences=sequences,
            tokens=tokens,
            optimizer_steps=steps,
        )

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


def make_poptorch_runner(model, optimizer, config: ExecutionConfig, scheduler=None, poptorch=None) -> PoptorchRunner:
    return PoptorchRunner(model, optimizer, config, scheduler=scheduler, poptorch=poptorch)


def describe_options(config: ExecutionConfig) -> Dict[str, Any]:
    """What build_options, translate_optimizer, dataloader_kwargs and serialize_tied_decoder ask PopTorch
    for, as plain values (printed by the dry run; tests check they agree with the calls)."""
    d = {
        "Options": "popdist.poptorch.Options(ipus_per_replica=%d) under poprun, else poptorch.Options()"
        % config.ipus_per_replica if config.num_instances == 1 else
        "popdist.poptorch.Options(ipus_per_replica=%d)" % config.ipus_per_replica,
        "replicationFactor (per instance)": config.local_replicas,
        "deviceIterations": config.device_iterations,
        "Training.gradientAccumulation": config.gradient_accumulation,
        "pipelined": config.num_stages > 1,
        "outputMode": _OUTPUT_MODES[config.output_mode],
        "availableMemoryProportion": {
            "IPU%d" % i: config.memory_proportion_for(i) for i in range(config.ipus_per_replica)
        }
        if config.available_memory_proportion
        else None,
        "TensorLocations.setOptimizerLocation": {
            "useOnChipStorage": not config.optimizer_state_offchip,
            "useReplicatedTensorSharding": config.replicated_tensor_sharding,
        },
        "Precision.enableStochasticRounding": config.precision == "fp16" and not config.use_ipu_model,
        "Precision.setPartialsType": "half" if _half_partials(config) else None,
        "_Popart.set": popart_options(config),
        "_Popart.setPatterns": popart_patterns(config),
        "optimizer types": {
            "accum_type": config.accumulator_type,
            "first_order_momentum_accum_type": config.first_order_momentum_type,
            "second_order_momentum_accum_type": config.second_order_momentum_type,
        },
        "DataLoader mode": _DATALOADER_MODES[config.dataloader_mode],
        "serializedMatMul(tied MLM decoder, OutputChannels)": config.embedding_serialization_factor
        if config.embedding_serialization_factor > 1
        else None,
        "executableCache": config.executable_cache_dir,
        "useIpuModel": config.use_ipu_model,
        "offlineTarget(compile only)": config.compile_only,
        "loss_scaling": config.loss_scaling,
    }  # type: Dict[str, Any]
    return d


__all__ = [
    "BackendUnavailable",
    "PoptorchRunner",
    "SDK_MESSAGE",
    "apply_placement",
    "check_backend",
    "build_options",
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
