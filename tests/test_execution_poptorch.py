"""PopTorch contract: a recording stand-in for the documented poptorch calls checks, for every IPU config,
that the options and the block placement the adapter emits are the ones the config asks for.

The stand-in accepts only method names that poptorch documents (python/options.py, ops.py, optim.py) so a
misspelt or invented call fails here; it cannot tell whether Poplar accepts the resulting program, which
only the ``ipu``-marked tests (tests/test_execution_ipu.py) and real hardware can.
"""

from __future__ import annotations

import enum
from dataclasses import asdict
import glob
import os
import sys
import types

import pytest
import torch
from ipu_packing.execution import ExecutionConfig, make_runner
from ipu_packing.train import load_config
from ipu_packing.execution.poptorch_backend import SDK_MESSAGE, BackendUnavailable
from ipu_packing.execution.synthetic import PackDataset

from test_execution_fixtures import build_model, make_packs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Documented poptorch.Options methods (graphcore/poptorch python/options.py) the stand-in accepts.
DOCUMENTED = {
    "": {
        "autoRoundNumIPUs", "randomSeed", "replicationFactor", "deviceIterations", "outputMode",
        "setExecutionStrategy", "setAvailableMemoryProportion", "enableExecutableCaching", "useIpuModel",
        "useOfflineIpuTarget", "connectionType", "enableSyntheticData", "logDir", "modelName",
    },
    "Training.": {"gradientAccumulation", "accumulationAndReplicationReductionType", "setAutomaticLossScaling"},
    "Precision.": {"enableStochasticRounding", "setPartialsType", "halfFloatCasting"},
    "TensorLocations.": {"setOptimizerLocation", "setWeightLocation", "setActivationLocation", "numIOTiles"},
    "TensorLocationSettings.": {"useOnChipStorage", "useReplicatedTensorSharding", "minElementsForOffChip"},
    "_Popart.": {"set", "setPatterns"},
}


class _Recording:
    def __init__(self, log, prefix):
        self._log, self._prefix = log, prefix

    def __getattr__(self, name):
        if name.startswith("_") or name not in DOCUMENTED[self._prefix]:
            raise AttributeError("poptorch.Options has no documented method %s%s" % (self._prefix, name))

        def call(*args, **kwargs):
            self._log.append((self._prefix + name, args, kwargs))
            return self

        return call


class FakeOptions(_Recording):
    def __init__(self):
        super().__init__([], "")
        self.calls = self._log
        self.Training = _Recording(self._log, "Training.")
        self.Precision = _Recording(self._log, "Precision.")
        self.TensorLocations = _Recording(self._log, "TensorLocations.")
        self._Popart = _Recording(self._log, "_Popart.")

    def value(self, name, default=None):
        found = [a for n, a, _ in self.calls if n == name]
        if not found:
            return default
        return found[-1][0] if found[-1] else ()


class FakeOptimizer:
    def __init__(self, params, **kwargs):
        self.param_groups = [dict(g) for g in params]
        self.kwargs = kwargs


class FakeExecutor:
    def __init__(self, module, options, optimizer, poptorch):
        self.module, self.options, self.optimizer, self.poptorch = module, options, optimizer, poptorch
        self.set_optimizer_lrs = []
        self.compiled = False

    def __call__(self, *args):
        return self.module(*args)  # the host runs the wrapped model once: enough to trace hooks and outputs

    def compile(self, *args):
        self.compiled = True

    def setOptimizer(self, optimizer):
        self.set_optimizer_lrs.append([g["lr"] for g in optimizer.param_groups])

    def copyWeightsToHost(self):
        pass

    def detachFromDevice(self):
        pass


def make_fake_poptorch():
    pt = types.ModuleType("poptorch")
    pt.blocks, pt.checkpoints, pt.executors, pt.strategies, pt.loaders = [], [], [], [], []
    pt.ReductionType = enum.Enum("ReductionType", "Sum Mean NoReduction")
    pt.OutputMode = enum.Enum("OutputMode", "Final EveryN All Sum Default")
    pt.AutoStage = enum.Enum("AutoStage", "SameAsIpu AutoIncrement")
    pt.DataLoaderMode = enum.Enum("DataLoaderMode", "Sync Async AsyncRebatched")
    pt.MatMulSerializationMode = enum.Enum("MatMulSerializationMode",
                                           "InputChannels ReducingDim OutputChannels Disabled")
    pt.serializedMatMul = lambda lhs, rhs, mode, factor=0, keep_precision=False: lhs @ rhs
    pt.Options = FakeOptions
    pt.TensorLocationSettings = lambda: _Recording([], "TensorLocationSettings.")

    def BeginBlock(layer_to_call, user_id=None, ipu_id=None):
        assert isinstance(layer_to_call, torch.nn.Module)
        pt.blocks.append((layer_to_call, user_id, ipu_id))
        return layer_to_call

    def recomputationCheckpoint(*tensors):
        pt.checkpoints.append(tuple(t.shape for t in tensors))
        return tensors[0] if len(tensors) == 1 else tensors

    def identity_loss(x, reduction):
        assert reduction in ("sum", "mean", "none")
        return x

    def PipelinedExecution(*args):
        pt.strategies.append(args)
        return ("PipelinedExecution", args)

    def trainingModel(model, options=None, optimizer=None):
        ex = FakeExecutor(model, options, optimizer, pt)
        pt.executors.append(ex)
        return ex

    def DataLoader(options, dataset, batch_size=1, shuffle=None, num_workers=0, drop_last=True, **kwargs):
        combined = (
            batch_size
            * options.value("deviceIterations", 1)
            * options.value("replicationFactor", 1)
            * options.value("Training.gradientAccumulation", 1)
        )
        pt.loaders.append(dict(batch_size=batch_size, combined=combined))
        return torch.utils.data.DataLoader(dataset, batch_size=combined, drop_last=drop_last, num_workers=num_workers)

    pt.BeginBlock, pt.recomputationCheckpoint, pt.identity_loss = BeginBlock, recomputationCheckpoint, identity_loss
    pt.PipelinedExecution, pt.trainingModel, pt.DataLoader = PipelinedExecution, trainingModel, DataLoader
    pt.optim = types.SimpleNamespace(
        **{name: type(name, (FakeOptimizer,), {}) for name in ("LAMB", "AdamW", "Adam", "SGD")}
    )
    return pt


@pytest.fixture
def fake_poptorch(monkeypatch):
    pt = make_fake_poptorch()
    monkeypatch.setitem(sys.modules, "poptorch", pt)
    return pt


class LAMB(torch.optim.Optimizer):
    """Stands for the application's torch LAMB (same class name and hyperparameters)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, bias_correction=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, max_weight_norm=None))
        self.bias_correction = bias_correction  # optimizer-wide, as the application's LAMB keeps it


# ---- configs: the shipped ones, plus BERT-Base/Large POD16/POD64 shapes from the published IPU app --------

INLINE = {
    "base_pod16": (12, dict(backend="poptorch", micro_batch_size=32, gradient_accumulation=256, replication_factor=4,
                            layers_per_ipu=[0, 4, 4, 4], available_memory_proportion=[0.25], precision="fp16",
                            loss_scaling=16384.0, device_iterations=1)),
    "large_pod16": (24, dict(backend="poptorch", micro_batch_size=8, gradient_accumulation=1024, replication_factor=4,
                             layers_per_ipu=[3, 7, 7, 7], available_memory_proportion=[0.15, 0.25, 0.25, 0.25],
                             precision="fp16", loss_scaling=4096.0, executable_cache_dir="/tmp/ipu_cache")),
    "large_pod64": (24, dict(backend="poptorch", micro_batch_size=8, gradient_accumulation=256, replication_factor=16,
                             layers_per_ipu=[3, 7, 7, 7], available_memory_proportion=[0.14, 0.19, 0.19, 0.19],
                             precision="fp16", loss_scaling=32768.0, device_iterations=2,
                             recompute_checkpoint_every_layer=True, replicated_tensor_sharding=True)),
    "tiny_ipu_model": (2, dict(backend="poptorch", micro_batch_size=2, gradient_accumulation=3, layers_per_ipu=[1, 1],
                               use_ipu_model=True, recompute_checkpoint_every_layer=False, device_iterations=2,
                               optimizer_state_offchip=False)),
    "tiny_single_ipu_compile_only": (2, dict(backend="poptorch", micro_batch_size=2, compile_only=True)),
}


def shipped_ipu_configs():
    """configs/*.yaml for the poptorch backend, loaded by the application's own loader, so each case is the
    ExecutionConfig as run (gradient accumulation derived from the global batch and the packing factor)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml"))):
        config = load_config(path)
        if config.execution.backend == "poptorch":
            found[os.path.basename(path)] = (config.bert_config().num_hidden_layers, asdict(config.execution))
    return found


CASES = dict(INLINE, **shipped_ipu_configs())


def _runner(case, optimizer_cls=LAMB, scheduler=None):
    layers, kwargs = CASES[case]
    config = ExecutionConfig(**kwargs)
    model = build_model(layers)
    optimizer = optimizer_cls(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01)
    if scheduler is not None:
        scheduler = scheduler(optimizer)
    return config, model, make_runner(model, optimizer, config, scheduler=scheduler)


@pytest.mark.parametrize("case", sorted(CASES))
def test_options_are_what_the_config_asks_for(fake_poptorch, case):
    config, _, runner = _runner(case)
    opts = runner.options
    assert opts.value("replicationFactor") == config.replication_factor
    assert opts.value("deviceIterations") == config.device_iterations
    assert opts.value("Training.gradientAccumulation") == config.gradient_accumulation
    assert opts.value("Training.accumulationAndReplicationReductionType") == fake_poptorch.ReductionType.Mean
    assert opts.value("autoRoundNumIPUs") is True
    assert opts.value("randomSeed") == config.seed
    if config.num_stages > 1:
        assert opts.value("setExecutionStrategy") == ("PipelinedExecution", (fake_poptorch.AutoStage.AutoIncrement,))
    else:
        assert opts.value("setExecutionStrategy") is None
    if config.available_memory_proportion:
        expected = {"IPU%d" % i: config.memory_proportion_for(i) for i in range(config.num_stages)}
        assert opts.value("setAvailableMemoryProportion") == expected
    else:
        assert opts.value("setAvailableMemoryProportion") is None
    assert opts.value("enableExecutableCaching") == config.executable_cache_dir
    assert opts.value("useIpuModel") == (True if config.use_ipu_model else None)
    assert opts.value("useOfflineIpuTarget") == (() if config.compile_only else None)
    settings = opts.value("TensorLocations.setOptimizerLocation")
    assert settings._log == [
        ("TensorLocationSettings.useOnChipStorage", (not config.optimizer_state_offchip,), {}),
        ("TensorLocationSettings.useReplicatedTensorSharding", (config.replicated_tensor_sharding,), {}),
    ]
    fp16_hw = config.precision == "fp16" and not config.use_ipu_model
    assert opts.value("Precision.enableStochasticRounding") == (True if fp16_hw else None)


@pytest.mark.parametrize("case", sorted(CASES))
def test_block_placement_is_what_the_config_asks_for(fake_poptorch, case):
    config, model, runner = _runner(case)
    layers = model.bert.encoder.layer
    expected = [(model.bert.embeddings, "Embedding", 0)]
    ipu_of_layer = [ipu for ipu, n in enumerate(config.layers_per_ipu or [len(layers)]) for _ in range(n)]
    expected += [(layer, "Encoder%d" % i, ipu_of_layer[i]) for i, layer in enumerate(layers)]
    # Pooler and pretraining heads (MLM decoder tied to the word embedding) back on IPU 0, as published.
    expected += [(model.bert.pooler, "Pooler", 0), (model.cls, "Classifier", 0)]
    got = fake_poptorch.blocks
    assert [(b, u, i) for b, u, i in got] == expected  # identity of modules, names, IPUs, order
    assert sorted(set(i for _, _, i in got)) == list(range(config.num_stages))
    # One recomputation checkpoint per layer output when asked, none otherwise (hooks fire in forward).
    if config.compile_only or config.precision == "fp16":
        return
    batch = next(iter(runner.dataloader(PackDataset(make_packs(config.combined_batch_packs)))))
    runner.train_step(batch)
    assert len(fake_poptorch.checkpoints) == (len(layers) if config.recompute_checkpoint_every_layer else 0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_precision_optimizer_and_loss_scaling(fake_poptorch, case):
    config, model, runner = _runner(case)
    (ex,) = fake_poptorch.executors
    assert type(ex.optimizer).__name__ == "LAMB"
    assert ex.optimizer.kwargs["loss_scaling"] == config.loss_scaling
    assert ex.optimizer.kwargs["lr"] == 1e-3 and ex.optimizer.kwargs["betas"] == (0.9, 0.99)
    assert ex.optimizer.kwargs["weight_decay"] == 0.01 and ex.optimizer.kwargs["eps"] == 1e-6
    assert ex.optimizer.kwargs["bias_correction"] is False and "max_weight_norm" not in ex.optimizer.kwargs
    assert all("bias_correction" not in g for g in ex.optimizer.param_groups)  # not a per-group variable
    assert sum(len(g["params"]) for g in ex.optimizer.param_groups) == len(list(model.parameters()))
    want = torch.float16 if config.precision == "fp16" else torch.float32
    assert {p.dtype for p in model.parameters()} == {want}
    assert ex.module.model is model and runner.model is model


def test_adamw_translates_to_poptorch_adamw(fake_poptorch):
    _, _, runner = _runner("tiny_ipu_model", optimizer_cls=torch.optim.AdamW)
    opt = fake_poptorch.executors[0].optimizer
    assert type(opt).__name__ == "AdamW" and opt.kwargs["betas"] == (0.9, 0.99)


def test_unknown_optimizer_is_a_clear_error(fake_poptorch):
    with pytest.raises(ValueError, match="no poptorch.optim equivalent for optimizer 'Adagrad'"):
        _runner("tiny_ipu_model", optimizer_cls=lambda p, **kw: torch.optim.Adagrad(p, lr=kw["lr"]))


def test_dataloader_combined_batch_and_lr_schedule(fake_poptorch):
    sched = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)  # noqa: E731
    config, _, runner = _runner("tiny_ipu_model", scheduler=sched)
    # combined batch = micro x device iterations x replication x accumulation
    assert config.combined_batch_packs == 2 * 2 * 1 * 3
    loader = runner.dataloader(PackDataset(make_packs(3 * config.combined_batch_packs)))
    assert fake_poptorch.loaders == [dict(batch_size=2, combined=12)]
    batches = list(loader)
    assert len(batches) == 3 and batches[0]["input_ids"].shape[0] == 12
    metrics = [runner.train_step(b) for b in batches]
    # One host call = device_iterations optimizer steps: the scheduler steps twice per call, and the new
    # learning rate reaches the IPU through setOptimizer after every call that changed it.
    assert [m.optimizer_steps for m in metrics] == [2, 2, 2]
    assert fake_poptorch.executors[0].set_optimizer_lrs == [[1e-3 * 0.5**2], [1e-3 * 0.5**4], [1e-3 * 0.5**6]]
    assert metrics[0].sequences == int((batches[0]["nsp_labels"] != -100).sum())
    assert metrics[0].loss > 0


def test_compile_only_compiles_and_refuses_to_train(fake_poptorch):
    config, _, runner = _runner("tiny_single_ipu_compile_only")
    batch = next(iter(runner.dataloader(PackDataset(make_packs(config.combined_batch_packs)))))
    runner.compile(batch)
    assert fake_poptorch.executors[0].compiled
    with pytest.raises(RuntimeError, match="compile_only"):
        runner.train_step(batch)


def test_without_poptorch_the_error_names_the_sdk(monkeypatch):
    monkeypatch.setitem(sys.modules, "poptorch", None)  # import poptorch -> ImportError
    model = build_model()
    with pytest.raises(BackendUnavailable, match="Poplar SDK") as err:
        make_runner(model, LAMB(model.parameters()), ExecutionConfig(backend="poptorch"))
    assert str(err.value) == SDK_MESSAGE
