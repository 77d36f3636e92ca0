"""Graphcore's memory settings reach PopTorch: for every shipped IPU config, each ExecutionConfig field arrives
through a recording poptorch whose every name (Options methods, enums, optimizer and DataLoader arguments,
``_Popart.set`` keys and their value kinds, PopART pattern names) is checked against lists extracted from
the real sources (tests/assets/*.txt name their repository, commit and file). The expected values are
written out here as Graphcore's BERT app sets them (graphcore/examples nlp/bert/pytorch ipu_options.py,
optimization.py, configs_pretraining.yml, pretraining_data.py), not recomputed from the adapter.
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
import transformers

from ipu_packing.execution import ExecutionConfig, make_runner
from ipu_packing.execution import poptorch_backend as pb
from ipu_packing.model import PackedBertForPreTraining
from ipu_packing.train import load_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = os.path.join(REPO, "tests", "assets")


def _lines(name):
    with open(os.path.join(ASSETS, name)) as f:
        return [line.split() for line in f if line.strip() and not line.startswith("#")]


API = {}  # kind -> set of names, e.g. API["method"] = {"Options.outputMode", ...}
for kind, name in _lines("poptorch_api_names.txt"):
    API.setdefault(kind, set()).add(name)
POPART_KEYS = dict(_lines("popart_session_options.txt"))  # key -> value kind
PATTERNS = {p for (p,) in _lines("popart_patterns.txt")}
POPART_ENUMS = {name: int(value) for name, value in _lines("popart_enums.txt")}


# ---- a recording poptorch that knows only the real names -------------------------------------------------


def _value_fits(kind, value):
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "uint64":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if kind == "double":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "container":  # a list of strings, or a dict of strings to strings
        if isinstance(value, dict):
            return all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    raise AssertionError(kind)


class Recorder:
    """Stands for one poptorch options class: accepts only the methods python/options.py defines on it."""

    def __init__(self, cls, log):
        self._cls, self._log = cls, log

    def __getattr__(self, name):
        if name.startswith("__") or "%s.%s" % (self._cls, name) not in API["method"]:
            raise AttributeError("poptorch %s has no method %s" % (self._cls, name))

        def call(*args, **kwargs):
            self._log.append(("%s.%s" % (self._cls, name), args, kwargs))
            return self

        return call


class PopartRecorder(Recorder):
    def __init__(self, log):
        super().__init__("_PopartOptions", log)

    def set(self, key, value):  # the one _PopartOptions method the adapter calls with PopART names
        assert key in POPART_KEYS, "PopTorch forwards no PopART option %r" % key
        assert _value_fits(POPART_KEYS[key], value), (key, POPART_KEYS[key], value)
        self._log.append(("_PopartOptions.set", (key, value), {}))
        return self

    def setPatterns(self, patterns, level=2):
        assert isinstance(patterns, dict) and all(isinstance(v, bool) for v in patterns.values())
        unknown = sorted(set(patterns) - PATTERNS)
        assert not unknown, "PopART has no pattern(s) %s" % unknown
        self._log.append(("_PopartOptions.setPatterns", (patterns,), {"level": level}))
        return self


class Options(Recorder):
    def __init__(self):
        super().__init__("Options", [])
        self.calls = self._log
        # the properties of Options (options.py:1337-1379), each an options class of its own
        self.Training = Recorder("_TrainingOptions", self._log)
        self.Precision = Recorder("_PrecisionOptions", self._log)
        self.TensorLocations = Recorder("_TensorLocationOptions", self._log)
        self._Popart = PopartRecorder(self._log)
        for prop in ("Training", "Precision", "TensorLocations", "_Popart"):
            assert "Options." + prop in API["method"]

    def args(self, name):
        found = [a for n, a, _ in self.calls if n == name]
        return found

    def popart_set(self):
        return dict(a for n, a, _ in self.calls if n == "_PopartOptions.set")


def _enum(name):
    members = sorted(m.split(".", 1)[1] for m in API["enum"] if m.split(".", 1)[0] == name)
    assert members, name
    return enum.Enum(name, members)


def _checked_callable(cls, kind, record):
    """A callable accepting exactly the keyword arguments the real ``cls.__init__`` has."""
    params = {n.split(".", 1)[1] for n in API[kind] if n.split(".", 1)[0] == cls}
    assert params, cls

    def make(*args, **kwargs):
        unknown = sorted(set(kwargs) - params)
        assert not unknown, "poptorch %s takes no argument(s) %s" % (cls, unknown)
        return record(cls, args, kwargs)

    return make


class Executor:
    def __init__(self, module, options, optimizer):
        self.module, self.options, self.optimizer = module, options, optimizer
        self.returns = None

    def __call__(self, *args):
        return self.returns if self.returns is not None else self.module(*args)

    def setOptimizer(self, optimizer):
        pass


def make_poptorch():
    pt = types.ModuleType("poptorch")
    pt.optimizers, pt.loaders, pt.executors, pt.serialized = [], [], [], []
    for name in ("OutputMode", "ReductionType", "AutoStage", "DataLoaderMode", "MatMulSerializationMode"):
        assert name in API["top"], name
        setattr(pt, name, _enum(name))
    pt.Options = Options
    pt.TensorLocationSettings = lambda: Recorder("TensorLocationSettings", [])
    pt.PipelinedExecution = lambda *a: ("PipelinedExecution", a)
    pt.BeginBlock = lambda module, user_id=None, ipu_id=None: module
    pt.recomputationCheckpoint = lambda *t: t[0] if len(t) == 1 else t
    pt.identity_loss = lambda x, reduction: x

    def serializedMatMul(lhs, rhs, mode, factor=0, keep_precision=False):
        # OutputChannels: ``factor`` matmuls over column slices of rhs (poptorch python/ops.py:388-413)
        assert mode is pt.MatMulSerializationMode.OutputChannels and rhs.shape[-1] % factor == 0
        pt.serialized.append((tuple(lhs.shape), tuple(rhs.shape), factor))
        return torch.cat([(lhs.float() @ part.float()).to(lhs.dtype) for part in rhs.chunk(factor, dim=-1)], dim=-1)

    pt.serializedMatMul = serializedMatMul

    def record_optimizer(cls, args, kwargs):
        opt = types.SimpleNamespace(cls=cls, param_groups=[dict(g) for g in args[0]], kwargs=kwargs)
        pt.optimizers.append(opt)
        return opt

    pt.optim = types.SimpleNamespace(
        **{c: _checked_callable(c, "optim", record_optimizer) for c in ("LAMB", "AdamW", "Adam", "SGD")}
    )

    def record_loader(cls, args, kwargs):
        pt.loaders.append(kwargs)
        return []

    pt.DataLoader = _checked_callable("DataLoader", "param", record_loader)

    def trainingModel(model, options=None, optimizer=None):
        ex = Executor(model, options, optimizer)
        pt.executors.append(ex)
        return ex

    pt.trainingModel = trainingModel
    for name in ("Options", "TensorLocationSettings", "PipelinedExecution", "BeginBlock", "recomputationCheckpoint",
                 "identity_loss", "serializedMatMul", "DataLoader", "trainingModel"):
        assert name in API["top"], name
    return pt


@pytest.fixture
def poptorch(monkeypatch):
    pt = make_poptorch()
    monkeypatch.setitem(sys.modules, "poptorch", pt)
    return pt


# ---- the shipped IPU configs, loaded by the application's loader ---------------------------------------


def shipped_ipu_configs():
    found = {}
    for path in sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml"))):
        config = load_config(path)
        if config.execution.backend == "poptorch":
            found[os.path.basename(path)] = config
    return found


SHIPPED = shipped_ipu_configs()

# What Graphcore's ipu_options.py:104-132 sets (graphcore/examples 3cc8f81f), written out here.
GRAPHCORE_POPART = {
    "disableGradAccumulationTensorStreams": True,  # :106
    "accumulateOuterFragmentSettings.schedule": POPART_ENUMS["AccumulateOuterFragmentSchedule.OverlapMemoryOptimized"],
    "accumulateOuterFragmentSettings.excludedVirtualGraphs": ["0"],  # :111
    "subgraphCopyingStrategy": POPART_ENUMS["SubgraphCopyingStrategy.JustInTime"],  # :113
    "scheduleNonWeightUpdateGradientConsumersEarly": True,  # :114
    "engineOptions": {"opt.useAutoloader": "true", "target.syncReplicasIndependently": "true"},  # :118-121
}
GRAPHCORE_PATTERNS = {"TiedGather": True, "TiedGatherAccumulate": True, "UpdateInplacePrioritiesForIpu": True}


def test_every_pod_config_is_shipped_with_the_poptorch_backend():
    assert sorted(SHIPPED) == sorted(
        "bert_%s_512_%s%s.yaml" % (size, pod, pad)
        for size in ("base", "large") for pod in ("pod16", "pod64") for pad in ("", "_padded")
    )


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_graphcore_settings_arrive_for_every_shipped_config(poptorch, name):
    e = SHIPPED[name].execution
    opts = pb.build_options(e, poptorch)
    assert opts.args("Options.outputMode") == [(poptorch.OutputMode.Sum,)]  # ipu_options.py:62
    assert opts.args("_PrecisionOptions.setPartialsType") == [(torch.float16,)]  # :97-98
    assert opts.args("_PrecisionOptions.enableStochasticRounding") == [(True,)]  # :94
    assert opts.popart_set() == GRAPHCORE_POPART
    assert opts.args("_PopartOptions.setPatterns") == [(GRAPHCORE_PATTERNS,)]  # :115
    (settings,) = opts.args("_TensorLocationOptions.setOptimizerLocation")
    # optimizer state off chip, sharded over the replicas (configs_pretraining.yml:30, 85, 151)
    assert settings[0]._log == [
        ("TensorLocationSettings.useOnChipStorage", (False,), {}),
        ("TensorLocationSettings.useReplicatedTensorSharding", (True,), {}),
    ]
    assert e.embedding_serialization_factor == 2  # configs_pretraining.yml:121 (base), 161 (large)
    # describe_options (what the dry run prints) reports exactly what was asked for
    d = pb.describe_options(e)
    assert d["outputMode"] == "Sum" and d["Precision.setPartialsType"] == "half"
    assert d["_Popart.set"] == opts.popart_set() and d["_Popart.setPatterns"] == GRAPHCORE_PATTERNS
    assert d["TensorLocations.setOptimizerLocation"] == {"useOnChipStorage": False, "useReplicatedTensorSharding": True}
    assert d["serializedMatMul(tied MLM decoder, OutputChannels)"] == 2
    assert d["DataLoader mode"] == "AsyncRebatched"
    assert d["optimizer types"] == {"accum_type": "fp16", "first_order_momentum_accum_type": "fp32",
                                    "second_order_momentum_accum_type": "fp32"}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_lamb_types_and_dataloader_mode_arrive_through_the_runner(poptorch, name):
    config = SHIPPED[name]
    # a tiny model, the config's settings
    e = ExecutionConfig(**dict(asdict(config.execution), layers_per_ipu=[0, 1, 1], available_memory_proportion=[]))
    model = PackedBertForPreTraining(_tiny(2))
    from ipu_packing.train.optim import LAMB

    runner = make_runner(model, LAMB(model.parameters(), lr=1e-3), e)
    (opt,) = poptorch.optimizers
    assert opt.cls == "LAMB"
    # optimization.py:76-78: accum_type=float16, first moment float32 (enable_half_first_order_momentum
    # False, configs_pretraining.yml:31), second moment float32
    assert opt.kwargs["accum_type"] is torch.float16
    assert opt.kwargs["first_order_momentum_accum_type"] is torch.float32
    assert opt.kwargs["second_order_momentum_accum_type"] is torch.float32
    runner.dataloader([], num_workers=0)
    assert poptorch.loaders[-1]["mode"] is poptorch.DataLoaderMode.AsyncRebatched  # pretraining_data.py:260
    # the tied decoder runs as a serialized matmul (factor 2 over the vocabulary)
    assert poptorch.serialized == []
    x = torch.randn(2, 3, model.config.hidden_size).half()
    model.cls.predictions.decoder(x)
    assert poptorch.serialized == [((2, 3, model.config.hidden_size), (model.config.hidden_size, 96), 2)]


def _tiny(layers):
    return transformers.BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=64, type_vocab_size=2)


@pytest.mark.parametrize(
    "kwargs, optimizer, expected",
    [
        (dict(precision="fp16"), "LAMB", dict(accum_type=torch.float16, first_order_momentum_accum_type=torch.float32,
                                              second_order_momentum_accum_type=torch.float32)),
        # fp32 model: accumulators follow the weights, as PopTorch's own default (optim.py:733-734)
        (dict(precision="fp32"), "AdamW", dict(accum_type=torch.float32, first_order_momentum_accum_type=torch.float32,
                                               second_order_momentum_accum_type=torch.float32)),
        (dict(precision="fp16", gradient_accumulator_type="fp32", first_order_momentum_type="fp16"), "Adam",
         dict(accum_type=torch.float32, first_order_momentum_accum_type=torch.float16,
              second_order_momentum_accum_type=torch.float32)),
        (dict(precision="fp16", first_order_momentum_type="fp16"), "SGD",
         dict(accum_type=torch.float16, velocity_accum_type=torch.float16)),
    ],
)
def test_optimizer_precision_kwargs_are_real_poptorch_arguments(kwargs, optimizer, expected):
    got = pb.optimizer_precision_kwargs(ExecutionConfig(backend="poptorch", **kwargs), optimizer)
    assert got == expected
    assert {"%s.%s" % (optimizer, k) for k in got} <= API["optim"]


def test_non_default_settings_arrive(poptorch):
    e = ExecutionConfig(backend="poptorch", precision="fp32", half_partials=True, output_mode="all",
                        dataloader_mode="sync", tied_gather=False, accumulate_outer_fragment_schedule="serial",
                        subgraph_copying_strategy="on_enter_and_exit", engine_options={},
                        disable_grad_accumulation_tensor_streams=False)
    opts = pb.build_options(e, poptorch)
    assert opts.args("Options.outputMode") == [(poptorch.OutputMode.All,)]
    assert opts.args("_PrecisionOptions.setPartialsType") == []  # fp32 matmuls keep fp32 partials
    # one IPU: no accumulate-outer-fragment scheduling across IPUs; no engine options when empty
    assert opts.popart_set() == {"disableGradAccumulationTensorStreams": False, "subgraphCopyingStrategy": 0,
                                 "scheduleNonWeightUpdateGradientConsumersEarly": True}
    assert opts.args("_PopartOptions.setPatterns") == [
        ({"TiedGather": False, "TiedGatherAccumulate": False, "UpdateInplacePrioritiesForIpu": True},)
    ]
    assert pb.dataloader_kwargs(e, poptorch) == {"mode": poptorch.DataLoaderMode.Sync}
    pipelined = ExecutionConfig(backend="poptorch", layers_per_ipu=[1, 1], accumulate_outer_fragment_schedule="serial",
                                accumulate_outer_fragment_excluded_ipus=[])
    got = pb.build_options(pipelined, poptorch).popart_set()
    assert got["accumulateOuterFragmentSettings.schedule"] == POPART_ENUMS["AccumulateOuterFragmentSchedule.Serial"]
    assert got["accumulateOuterFragmentSettings.excludedVirtualGraphs"] == []


def test_output_sum_is_divided_back_to_a_mean_per_micro_batch(poptorch):
    """OutputMode.Sum returns, per replica, the sum over gradient accumulation x device iterations micro
    batches (poptorch options.py:1699-1700); the runner reports the mean per micro batch."""
    e = ExecutionConfig(backend="poptorch", micro_batch_size=1, gradient_accumulation=3, device_iterations=2,
                        replication_factor=2)
    assert e.output_sum_count == 6 and ExecutionConfig(output_mode="all", gradient_accumulation=3).output_sum_count == 1
    model = PackedBertForPreTraining(_tiny(1))
    from ipu_packing.train.optim import LAMB

    runner = make_runner(model, LAMB(model.parameters(), lr=1e-3), e)
    per_micro_batch = [2.0, 1.5, 1.0, 0.5, 0.25]  # loss, mlm, nsp, accuracies
    # two replicas, each the sum of 6 micro batches with these values
    poptorch.executors[0].returns = tuple(torch.full((2,), 6 * v) for v in per_micro_batch)
    batch = {k: torch.zeros(e.combined_batch_packs, 4, dtype=torch.long) for k in pb.BATCH_FIELDS}
    m = runner.train_step(batch)
    assert (m.loss, m.mlm_loss, m.nsp_loss, m.mlm_accuracy, m.nsp_accuracy) == tuple(per_micro_batch)


def test_serialized_decoder_computes_the_same_and_keeps_the_tie(poptorch):
    model = PackedBertForPreTraining(_tiny(1))
    decoder = model.cls.predictions.decoder
    x = torch.randn(2, 5, 32)
    before = decoder(x)
    names = [n for n, _ in model.named_parameters()]
    assert pb.serialize_tied_decoder(model, ExecutionConfig(backend="poptorch", embedding_serialization_factor=3),
                                     poptorch) is decoder
    assert poptorch.serialized == []
    after = decoder(x)
    assert poptorch.serialized == [((2, 5, 32), (32, 96), 3)]
    torch.testing.assert_close(after, before)
    assert decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert [n for n, _ in model.named_parameters()] == names
    assert pb.serialize_tied_decoder(model, ExecutionConfig(backend="poptorch"), poptorch) is None
    with pytest.raises(ValueError, match="must divide the vocabulary size 96"):
        pb.serialize_tied_decoder(PackedBertForPreTraining(_tiny(1)),
                                  ExecutionConfig(backend="poptorch", embedding_serialization_factor=5), poptorch)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(embedding_serialization_factor=0), "embedding_serialization_factor must be an integer >= 1, got 0"),
        (dict(gradient_accumulator_type="bf16"), "gradient_accumulator_type must be one of ('fp16', 'fp32')"),
        (dict(first_order_momentum_type=None), "first_order_momentum_type must be one of"),
        (dict(output_mode="every_n"), "output_mode must be one of ('sum', 'all', 'final')"),
        (dict(dataloader_mode="fast"), "dataloader_mode must be one of"),
        (dict(accumulate_outer_fragment_schedule="overlap"), "accumulate_outer_fragment_schedule must be one of"),
        (dict(subgraph_copying_strategy="late"), "subgraph_copying_strategy must be one of"),
        (dict(layers_per_ipu=[1, 1], accumulate_outer_fragment_excluded_ipus=[2]), "IPU indices in [0, 2)"),
        (dict(engine_options={"opt.useAutoloader": True}), "engine_options must map strings to strings"),
    ],
)
def test_bad_memory_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError) as err:
        ExecutionConfig(**kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_accumulator_type_follows_the_weights_unless_set():
    assert ExecutionConfig(precision="fp16").accumulator_type == "fp16"
    assert ExecutionConfig(precision="fp32").accumulator_type == "fp32"
    assert ExecutionConfig(precision="bf16").accumulator_type == "fp32"
    assert ExecutionConfig(precision="fp16", gradient_accumulator_type="fp32").accumulator_type == "fp32"
