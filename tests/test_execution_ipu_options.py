"""Graphcore's memory settings reach PopTorch: for every shipped IPU config, each ExecutionConfig field arrives
through the PopTorch stand-in (tests/fake_poptorch), whose every name (Options methods, enums, optimizer and
DataLoader arguments, ``_Popart.set`` keys and their value kinds, PopART pattern names) comes from lists
extracted from the real sources (tests/assets/*.txt name their repository, commit and file). The expected
values are written out here as Graphcore's BERT app sets them (graphcore/examples nlp/bert/pytorch
ipu_options.py, optimization.py, configs_pretraining.yml, pretraining_data.py), not recomputed from the adapter.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import asdict

import pytest
import torch
import transformers

from ipu_packing.execution import ExecutionConfig, make_runner
from ipu_packing.execution import poptorch_backend as pb
from ipu_packing.model import PackedBertForPreTraining
from ipu_packing.train.optim import LAMB

import poptorch_stand_in as si
from shipped_configs import SHIPPED

NAMES = si.load_stand_in()  # for its name tables (API, POPART_ENUMS); each test gets a fresh stand-in
API, POPART_ENUMS = NAMES.API, NAMES.POPART_ENUMS


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


def test_the_stand_in_knows_only_the_real_names(poptorch):
    public = {n for n, v in vars(poptorch).items()
              if not n.startswith("_") and callable(v) and getattr(v, "__module__", None) == "poptorch"}
    # poptorch.Error, poptorch.optim, the classes behind optim and trainingModel; a stand-in helper
    helpers = {"Error", "optim", "Optimizer", "PoplarExecutor", "documented_name"}
    assert public - helpers <= API["top"], sorted(public - helpers - API["top"])
    opts = poptorch.Options()
    with pytest.raises(AttributeError, match="no Training.gradientAccumulations"):
        opts.Training.gradientAccumulations(2)
    with pytest.raises(AttributeError, match="no Options.setPatterns"):
        opts.setPatterns({})
    with pytest.raises(poptorch.Error, match="no PopART option 'tiedGather'"):
        opts._Popart.set("tiedGather", True)
    with pytest.raises(poptorch.Error, match="'subgraphCopyingStrategy' takes a uint64, got 'JustInTime'"):
        opts._Popart.set("subgraphCopyingStrategy", "JustInTime")
    with pytest.raises(poptorch.Error, match=r"no pattern\(s\) \['TiedGathers'\]"):
        opts._Popart.setPatterns({"TiedGather": True, "TiedGathers": True})
    assert opts.calls == []
    with pytest.raises(TypeError, match=r"unexpected arguments \['first_order_momentum_accum_type'\]"):
        poptorch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, first_order_momentum_accum_type=torch.half)
    assert set(inspect.signature(poptorch.DataLoader.__init__).parameters) - {"self", "kwargs"} <= {
        n.split(".", 1)[1] for n in API["param"] if n.startswith("DataLoader.")}
    with pytest.raises(poptorch.Error, match="factor 3 is not a factor of the output channels 8"):
        poptorch.serializedMatMul(torch.ones(2, 4), torch.ones(4, 8),
                                  poptorch.MatMulSerializationMode.OutputChannels, 3)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_graphcore_settings_arrive_for_every_shipped_config(poptorch, name):
    e = SHIPPED[name]
    opts = pb.build_options(e, poptorch)
    assert opts.args("Options.outputMode") == [(poptorch.OutputMode.Sum,)]  # ipu_options.py:62
    assert opts.args("Precision.setPartialsType") == [(torch.float16,)]  # :97-98
    assert opts.args("Precision.enableStochasticRounding") == [(True,)]  # :94
    assert opts.popart() == GRAPHCORE_POPART
    assert opts.args("_Popart.setPatterns") == [(GRAPHCORE_PATTERNS,)]  # :115
    (settings,) = opts.args("TensorLocations.setOptimizerLocation")
    # optimizer state off chip, sharded over the replicas (configs_pretraining.yml:30, 85, 151)
    assert settings[0]._log == [
        ("TensorLocationSettings.useOnChipStorage", (False,), {}),
        ("TensorLocationSettings.useReplicatedTensorSharding", (True,), {}),
    ]
    assert e.embedding_serialization_factor == 2  # configs_pretraining.yml:121 (base), 161 (large)
    # describe_options (what the dry run prints) reports exactly what was asked for
    d = pb.describe_options(e)
    assert d["outputMode"] == "Sum" and d["Precision.setPartialsType"] == "half"
    assert d["_Popart.set"] == opts.popart() and d["_Popart.setPatterns"] == GRAPHCORE_PATTERNS
    assert d["TensorLocations.setOptimizerLocation"] == {"useOnChipStorage": False, "useReplicatedTensorSharding": True}
    assert d["serializedMatMul(tied MLM decoder, OutputChannels)"] == 2
    assert d["DataLoader mode"] == "AsyncRebatched"
    assert d["optimizer types"] == {"accum_type": "fp16", "first_order_momentum_accum_type": "fp32",
                                    "second_order_momentum_accum_type": "fp32"}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_lamb_types_and_dataloader_mode_arrive_through_the_runner(poptorch, name, monkeypatch):
    # a tiny model, the config's settings
    e = ExecutionConfig(**dict(asdict(SHIPPED[name]), layers_per_ipu=[0, 1, 1], available_memory_proportion=[]))
    model = PackedBertForPreTraining(_tiny(2))
    runner = make_runner(model, LAMB(model.parameters(), lr=1e-3), e)
    (executor,) = poptorch.executors
    opt = runner.ipu_optimizer
    assert executor._optimizer is opt and type(opt) is poptorch.optim.LAMB
    # optimization.py:76-78: accum_type=float16, first moment float32 (enable_half_first_order_momentum
    # False, configs_pretraining.yml:31), second moment float32
    assert opt.kwargs["accum_type"] is torch.float16
    assert opt.kwargs["first_order_momentum_accum_type"] is torch.float32
    assert opt.kwargs["second_order_momentum_accum_type"] is torch.float32
    asked = []  # the DataLoader's arguments (an asynchronous one would start its worker process)
    monkeypatch.setattr(poptorch, "DataLoader", lambda *args, **kwargs: asked.append(kwargs))
    runner.dataloader([], num_workers=0)
    assert asked[0]["mode"] is poptorch.DataLoaderMode.AsyncRebatched  # pretraining_data.py:260
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
    getattr(NAMES.optim, optimizer)([torch.zeros(1, requires_grad=True)], lr=0.1, **got)  # the stand-in takes them


def test_non_default_settings_arrive(poptorch):
    e = ExecutionConfig(backend="poptorch", precision="fp32", half_partials=True, output_mode="all",
                        dataloader_mode="sync", tied_gather=False, accumulate_outer_fragment_schedule="serial",
                        subgraph_copying_strategy="on_enter_and_exit", engine_options={},
                        disable_grad_accumulation_tensor_streams=False)
    opts = pb.build_options(e, poptorch)
    assert opts.args("Options.outputMode") == [(poptorch.OutputMode.All,)]
    assert opts.args("Precision.setPartialsType") == []  # fp32 matmuls keep fp32 partials
    # one IPU: no accumulate-outer-fragment scheduling across IPUs; no engine options when empty
    assert opts.popart() == {"disableGradAccumulationTensorStreams": False, "subgraphCopyingStrategy": 0,
                                 "scheduleNonWeightUpdateGradientConsumersEarly": True}
    assert opts.args("_Popart.setPatterns") == [
        ({"TiedGather": False, "TiedGatherAccumulate": False, "UpdateInplacePrioritiesForIpu": True},)
    ]
    assert pb.dataloader_kwargs(e, poptorch) == {"mode": poptorch.DataLoaderMode.Sync}
    pipelined = ExecutionConfig(backend="poptorch", layers_per_ipu=[1, 1], accumulate_outer_fragment_schedule="serial",
                                accumulate_outer_fragment_excluded_ipus=[])
    got = pb.build_options(pipelined, poptorch).popart()
    assert got["accumulateOuterFragmentSettings.schedule"] == POPART_ENUMS["AccumulateOuterFragmentSchedule.Serial"]
    assert got["accumulateOuterFragmentSettings.excludedVirtualGraphs"] == []


@pytest.mark.parametrize("mode, returned", [("sum", (2, 6)), ("all", (12, 1)), ("final", (2, 1))])
def test_output_mode_is_divided_back_to_a_mean_per_micro_batch(poptorch, monkeypatch, mode, returned):
    """OutputMode.Sum returns, per replica, the sum over gradient accumulation x device iterations micro
    batches (poptorch options.py:1699-1700); All a value per micro batch; Final each replica's last. The
    runner reports the mean per micro batch."""
    e = ExecutionConfig(backend="poptorch", micro_batch_size=1, gradient_accumulation=3, device_iterations=2,
                        replication_factor=2, output_mode=mode)
    assert e.output_sum_count == returned[1]
    assert ExecutionConfig(output_mode="all", gradient_accumulation=3).output_sum_count == 1
    model = PackedBertForPreTraining(_tiny(1))
    runner = make_runner(model, LAMB(model.parameters(), lr=1e-3), e)
    batch = si.host_call_batch(e.combined_batch_packs)
    runner.compile(batch)  # traced with the real forward; then every micro batch returns these values
    per_micro_batch = [2.0, 1.5, 1.0, 0.5, 0.25]  # loss, mlm, nsp, accuracies
    names = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")
    monkeypatch.setattr(model, "forward", lambda **fields: types.SimpleNamespace(
        **{k: torch.tensor(v) for k, v in zip(names, per_micro_batch)}))
    m = runner.train_step(batch)
    assert (m.loss, m.mlm_loss, m.nsp_loss, m.mlm_accuracy, m.nsp_accuracy) == tuple(per_micro_batch)
    # what the host got: (count,) values, each the sum of (micro batches summed) values
    (executor,) = poptorch.executors
    raw = executor(*runner._args(batch))
    count, summed = returned
    assert [t.tolist() for t in raw] == [[summed * v] * count for v in per_micro_batch]


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


def test_a_serialization_factor_that_does_not_divide_the_vocabulary_is_refused_with_the_config():
    """The config refuses it when it is read, so --dry-run says what the run would (bert-large's 30,522 = 2 x
    15,261: 2 divides it, 4 does not); a torch run serializes nothing and takes any factor."""
    from ipu_packing.train import ConfigError, load_config

    assert load_config("bert_large_512_pod16", ["execution.embedding_serialization_factor=2"])
    with pytest.raises(ConfigError, match="embedding_serialization_factor 4 must divide the vocabulary size 30522"):
        load_config("bert_large_512_pod16", ["execution.embedding_serialization_factor=4"])
    assert load_config("demo", ["execution.embedding_serialization_factor=3"])  # backend torch


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
