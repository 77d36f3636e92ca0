"""What the PopTorch adapter asks of PopTorch, as values: the options (Graphcore's ipu_options.py, call by
call), the PopART session options and patterns, the optimizer's translation to poptorch.optim with its
accumulator and moment types, the DataLoader mode, and the same as plain values for the dry run
(``describe_options``). Nothing here imports poptorch: the module is passed in (poptorch_backend.py)."""

from __future__ import annotations

from typing import Any, Dict

import torch

from .config import ACCUMULATE_OUTER_FRAGMENT_SCHEDULES, SUBGRAPH_COPYING_STRATEGIES, ExecutionConfig


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
    "build_options",
    "dataloader_kwargs",
    "describe_options",
    "optimizer_precision_kwargs",
    "popart_options",
    "popart_patterns",
    "translate_optimizer",
]
