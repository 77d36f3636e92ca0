"""The PopTorch adapter against a semantic stand-in of PopTorch (tests/fake_poptorch, see its docstring):
every shipped IPU config, at a tiny hidden size with the config's own ``layers_per_ipu``, is traced as
PopTorch would trace its training step, and must pass PopART's compile-time rules (every weight on one IPU
while pipelining, every op in a block, inputs on one IPU, enough micro batches, supported ops only, the loss
through identity_loss). What the stand-in cannot tell (memory, tile mapping, numerics) only the ``ipu``-marked
tests (tests/test_execution_ipu.py, IPU Model) and hardware can.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from ipu_packing.execution import ExecutionConfig, make_runner
from ipu_packing.execution.placement import model_stages
from ipu_packing.execution.poptorch_backend import SDK_MESSAGE, BackendUnavailable, make_poptorch_runner
from synthetic_packs import PackDataset
from ipu_packing.model.stages import parameter_owners
from ipu_packing.train import load_config
from ipu_packing.train.optim import LAMB

import poptorch_stand_in as si
from shipped_configs import MULTI_HOST, SHIPPED, TINY_IPU_MODEL

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _runner(config, num_layers=None, optimizer_cls=LAMB, scheduler=None, seed=0):
    model = si.tiny_model(num_layers or sum(config.layers_per_ipu) or 2, seed=seed)
    optimizer = optimizer_cls(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01)
    if scheduler is not None:
        scheduler = scheduler(optimizer)
    return model, make_runner(model, optimizer, config, scheduler=scheduler)


def _compiled(poptorch, config, **kwargs):
    model, runner = _runner(config, **kwargs)
    runner.compile(si.host_call_batch(config.combined_batch_packs))
    (executor,) = poptorch.executors
    return model, runner, executor


def test_every_pod_config_is_shipped_with_the_poptorch_backend():
    assert sorted(SHIPPED) == sorted(
        "bert_%s_512_pod%d%s.yaml" % (m, p, v) for m in ("base", "large") for p in (16, 64) for v in ("", "_padded")
    )
    assert sorted(MULTI_HOST) == ["bert_large_512_pod128.yaml"]


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_ipu_config_compiles_as_popart_would(poptorch, name):
    config = SHIPPED[name]
    model, runner, executor = _compiled(poptorch, config)
    trace = executor.trace
    # Every op ran in a block on a real IPU of the replica, and every one of its IPUs runs something.
    assert all(ipu is not None for _, ipu, _ in trace.ops)
    assert {ipu for _, ipu, _ in trace.ops} == set(range(config.ipus_per_replica))
    # The parts the model declares, in order; embeddings and both heads on IPU 0, layers as the config says.
    ipu_of_layer = [ipu for ipu, n in enumerate(config.layers_per_ipu) for _ in range(n)]
    expected = [("Embedding", 0)] + [("Encoder%d" % i, ipu) for i, ipu in enumerate(ipu_of_layer)] + [("Heads", 0)]
    assert [b for b in dict.fromkeys(trace.block_order)] == expected
    heads = {ipu for op, ipu, block in trace.ops if block == "Heads"}
    assert heads == {0} and any(op == "nll_loss_forward" for op, _, b in trace.ops if b == "Heads")
    # The loss marked for PopTorch's backward, one recomputation checkpoint per layer when asked.
    assert [op for op, _, _ in trace.ops].count("poptorch.identity_loss") == 1
    assert trace.checkpoints == (len(ipu_of_layer) if config.recompute_checkpoint_every_layer else 0)
    assert executor.isCompiled() and executor.isAttachedToDevice()


def test_a_weight_on_two_ipus_is_refused_as_today_s_placement_was(poptorch, monkeypatch):
    """The placement this adapter used to apply, on the model as it used to run its heads: blocks on the
    embeddings, every layer, the pooler and ``cls``, whose forward was never called (the heads were called
    one by one). The tied MLM decoder then read the word embedding while the last layer's block was current,
    so that weight was consumed on IPU 0 and IPU 1: PopART refuses to copy a variable between IPUs."""
    config = ExecutionConfig(**TINY_IPU_MODEL)
    model = si.tiny_model(2)

    def heads_called_one_by_one(h, mlm_positions, mlm_labels, cls_positions, nsp_labels):
        from ipu_packing.model import modeling as mm

        mlm_labels, nsp_labels = mlm_labels.long(), nsp_labels.long()
        mlm_valid, nsp_valid = mlm_labels != -100, nsp_labels != -100
        mlm_logits = model.cls.predictions(mm._gather(h, mlm_positions, mlm_valid))
        nsp_logits = model.cls.seq_relationship(model.bert.pooler(mm._gather(h, cls_positions, nsp_valid)))
        mlm_loss, mlm_acc, mlm_n = mm._mean_loss_and_accuracy(mlm_logits, mlm_labels, mlm_valid)
        nsp_loss, nsp_acc, nsp_n = mm._mean_loss_and_accuracy(nsp_logits, nsp_labels, nsp_valid)
        return mm.PackedBertOutput(mlm_loss + nsp_loss, mlm_loss, nsp_loss, mlm_logits, nsp_logits, mlm_acc, nsp_acc,
                                   mlm_n, nsp_n)

    model.pretraining_heads = heads_called_one_by_one
    old_plan = [("bert.embeddings", "Embedding", 0), ("bert.encoder.layer.0", "Encoder0", 0),
                ("bert.encoder.layer.1", "Encoder1", 1), ("bert.pooler", "Pooler", 0), ("cls", "Classifier", 0)]
    import ipu_packing.execution.poptorch_backend as backend

    def old_apply_placement(model, config, poptorch, stages=None):
        for path, block, ipu in old_plan:
            poptorch.BeginBlock(model.get_submodule(path), block, ipu_id=ipu)
        return old_plan

    monkeypatch.setattr(backend, "apply_placement", old_apply_placement)
    runner = make_runner(model, LAMB(model.parameters()), config)
    with pytest.raises(poptorch.Error, match=r"Can not copy variable tensor .*word_embeddings.weight between virtual "
                                             r"graphs when pipelining.*IPUs \[0, 1\]"):
        runner.compile(si.host_call_batch(config.combined_batch_packs))


def test_a_block_context_around_the_heads_leaves_the_loss_outside_any_block(poptorch):
    """Why the heads' block begins on a module (a pre-hook with no end) and not with ``poptorch.Block`` /
    ``BlockFunction`` around the heads call: leaving the context ends the block, so identity_loss runs in no
    block and PopART refuses a graph where some ops have an IPU and others none."""
    config = ExecutionConfig(**TINY_IPU_MODEL)
    model, runner = _runner(config)
    poptorch.removeBlocks(model.cls)
    heads = model.pretraining_heads
    model.pretraining_heads = poptorch.BlockFunction("Heads", ipu_id=0)(heads)
    with pytest.raises(poptorch.Error, match="Either all Ops must have their virtual graph ids set.*identity_loss"):
        runner.compile(si.host_call_batch(config.combined_batch_packs))


@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_every_parameter_is_consumed_on_exactly_one_ipu_for_any_split(poptorch, num_layers):
    for split in si.splits(num_layers, 4):
        poptorch.executors.clear()
        config = ExecutionConfig(backend="poptorch", micro_batch_size=1, gradient_accumulation=2 * len(split) + 1,
                                 layers_per_ipu=split)
        model, runner = _runner(config, num_layers=num_layers)
        runner.compile(si.host_call_batch(config.combined_batch_packs))  # raises on a weight used on two IPUs
        owners = parameter_owners(model, model_stages(num_layers, config))  # one part owns each parameter
        assert owners["bert.embeddings.word_embeddings.weight"].device == 0
        (executor,) = poptorch.executors
        assert {ipu for _, ipu, _ in executor.trace.ops} <= set(range(len(split)))


def test_too_few_micro_batches_for_the_pipeline_is_refused(poptorch, monkeypatch):
    # Embedding+Encoder0 on IPU 0, Encoder1 on IPU 1, Heads on IPU 0: 3 forward groups after merging, 2*3-1 = 5
    # pipeline stages with their backward.
    config = ExecutionConfig(**dict(TINY_IPU_MODEL, gradient_accumulation=4))
    with pytest.raises(ValueError, match=r"^execution.layers_per_ipu \[1, 1\] pipelines 3 groups of consecutive "
                                         r"blocks on one IPU \(IPUs 0, 1, 0\), which PopART runs only with gradient "
                                         r"accumulation >= 2\*3-1 = 5, got 4$"):
        _runner(config)
    # the stand-in refuses it as PopART would, when the adapter does not
    import ipu_packing.execution.poptorch_backend as backend

    monkeypatch.setattr(backend, "check_pipeline_depth", lambda config, plan=None: None)
    _, runner = _runner(config)
    with pytest.raises(poptorch.Error, match=r"depth \(gradient accumulation factor\) must equal at least the number "
                                             r"of pipeline stages \(5\)"):
        runner.compile(si.host_call_batch(config.combined_batch_packs))


@pytest.mark.parametrize("layout, global_batch, refused", [("packed", 16, True), ("packed", 32, False),
                                                           ("padded", 8, True), ("padded", 10, False)])
def test_a_config_whose_accumulation_is_too_small_for_its_pipeline_is_refused_at_load(layout, global_batch, refused):
    from ipu_packing.errors import ConfigError

    overrides = ["execution.backend=poptorch", "execution.layers_per_ipu=[1,1]", "model.num_hidden_layers=2",
                 "execution.micro_batch_size=2", "data.layout=%s" % layout, "data.packing_factor_estimate=2.0",
                 "training.global_batch_sequences=%d" % global_batch]
    if not refused:
        assert load_config("demo", overrides).execution.gradient_accumulation >= 5
        return
    with pytest.raises(ConfigError) as error:
        load_config("demo", overrides)
    message = str(error.value)
    assert "\n" not in message and "gradient accumulation >= 2*3-1 = 5, got 4" in message
    for key in ("execution.layers_per_ipu", "training.global_batch_sequences", "execution.micro_batch_size",
                "execution.replication_factor"):
        assert key in message, key
    assert ("packing factor 2.000" in message) == (layout == "packed")


def test_an_op_poptorch_does_not_support_is_refused(poptorch):
    # erfinv is in no supported_ops.rst section, whatever the torch (sdpa is not an example: torch 2.0's CPU
    # kernel for it is a decomposition into supported ops, later ones a fused kernel)
    config = ExecutionConfig(**TINY_IPU_MODEL)
    model = si.tiny_model(2)
    model.bert.embeddings.LayerNorm.register_forward_hook(lambda module, args, out: torch.erfinv(torch.tanh(out) / 2))
    runner = make_poptorch_runner(model, LAMB(model.parameters()), config, poptorch=poptorch)  # past check_backend
    with pytest.raises(poptorch.Error, match=r"unsupported operation\(s\) \(not in PopTorch's supported_ops.rst\): "
                                             r"erfinv"):
        runner.compile(si.host_call_batch(config.combined_batch_packs))


def test_a_loss_not_marked_with_identity_loss_is_refused(poptorch):
    class Unmarked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x):
            return (self.linear(x).mean(),)

    model = Unmarked()
    executor = poptorch.trainingModel(model, poptorch.Options(), poptorch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="identity_loss"):
        executor.compile(torch.zeros(2, 4))


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_options_are_what_the_config_asks_for(poptorch, name):
    config = SHIPPED[name]
    _, runner = _runner(config)
    opts = runner.options
    assert opts.value("replicationFactor") == config.replication_factor
    assert opts.value("deviceIterations") == config.device_iterations
    assert opts.value("Training.gradientAccumulation") == config.gradient_accumulation
    assert opts.value("Training.accumulationAndReplicationReductionType") == poptorch.ReductionType.Mean
    assert opts.value("autoRoundNumIPUs") is True
    assert opts.value("randomSeed") == config.seed
    strategy = opts.value("setExecutionStrategy")
    assert isinstance(strategy, poptorch.PipelinedExecution) and strategy.args == (poptorch.AutoStage.AutoIncrement,)
    expected = {"IPU%d" % i: config.memory_proportion_for(i) for i in range(config.num_stages)}
    assert opts.value("setAvailableMemoryProportion") == expected
    assert opts.value("enableExecutableCaching") == config.executable_cache_dir
    assert opts.value("useIpuModel") is None and opts.value("useOfflineIpuTarget") is None
    fp16_hw = config.precision == "fp16" and not config.use_ipu_model
    assert opts.value("Precision.enableStochasticRounding") == (True if fp16_hw else None)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_precision_optimizer_and_loss_scaling(poptorch, name):
    config = SHIPPED[name]
    model, runner = _runner(config)
    (ex,) = poptorch.executors
    opt = ex._optimizer
    assert type(opt).__name__ == "LAMB" and opt is runner.ipu_optimizer
    assert opt.kwargs["loss_scaling"] == config.loss_scaling
    assert opt.kwargs["lr"] == 1e-3 and opt.kwargs["betas"] == (0.9, 0.99)
    assert opt.kwargs["weight_decay"] == 0.01 and opt.kwargs["eps"] == 1e-6
    assert opt.kwargs["bias_correction"] is True and "max_weight_norm" not in opt.kwargs
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    want = torch.float16 if config.precision == "fp16" else torch.float32
    assert {p.dtype for p in model.parameters()} == {want}
    assert ex._user_model.model is model and runner.model is model


def test_constructor_defaults_come_from_the_optimizer_not_its_first_group(poptorch):
    config = ExecutionConfig(**TINY_IPU_MODEL)
    model = si.tiny_model(2)
    params = list(model.parameters())
    optimizer = LAMB([{"params": params[:1], "weight_decay": 0.0, "max_weight_norm": 0.0},
                      {"params": params[1:]}], lr=1e-3, weight_decay=0.01)
    runner = make_runner(model, optimizer, config)
    opt = runner.ipu_optimizer
    assert opt.kwargs["weight_decay"] == 0.01 and "max_weight_norm" not in opt.kwargs
    assert opt.param_groups[0]["weight_decay"] == 0.0 and opt.param_groups[0]["max_weight_norm"] == 0.0


def test_adamw_translates_to_poptorch_adamw(poptorch):
    _, runner = _runner(ExecutionConfig(**TINY_IPU_MODEL), optimizer_cls=torch.optim.AdamW)
    assert type(runner.ipu_optimizer).__name__ == "AdamW" and runner.ipu_optimizer.kwargs["betas"] == (0.9, 0.99)


def test_unknown_optimizer_is_a_clear_error(poptorch):
    with pytest.raises(ValueError, match="no poptorch.optim equivalent for optimizer 'Adagrad'"):
        _runner(ExecutionConfig(**TINY_IPU_MODEL), optimizer_cls=lambda p, **kw: torch.optim.Adagrad(p, lr=kw["lr"]))


def test_dataloader_combined_batch_and_lr_schedule(poptorch):
    sched = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)  # noqa: E731
    config = ExecutionConfig(**TINY_IPU_MODEL)
    _, runner = _runner(config, scheduler=sched)
    # combined batch = micro x device iterations x replication x accumulation
    assert config.combined_batch_packs == 2 * 2 * 1 * 5
    loader = runner.dataloader(PackDataset(si.packs(3 * config.combined_batch_packs)))
    # an element of an asynchronous loader is valid until the next one is asked for: use it in the loop
    rows, sequences, metrics = [], [], []
    for batch in loader:
        rows.append(batch["input_ids"].shape[0])
        sequences.append(int((batch["nsp_labels"] != -100).sum()))
        metrics.append(runner.train_step(batch))
    assert rows == [20, 20, 20] and loader.micro_batch_size == 2
    # One host call = device_iterations optimizer steps: the scheduler steps twice per call, and the new
    # learning rate reaches the IPU through setOptimizer after every call that changed it.
    (ex,) = poptorch.executors
    assert [m.optimizer_steps for m in metrics] == [2, 2, 2]
    assert [lrs[0] for lrs in ex.set_optimizer_lrs] == [1e-3, 1e-3 * 0.5**2, 1e-3 * 0.5**4, 1e-3 * 0.5**6]
    assert [m.sequences for m in metrics] == sequences
    assert metrics[0].loss > 0 and ex.calls == 3


def test_compile_only_compiles_into_the_cache_and_refuses_to_run(poptorch, tmp_path):
    config = ExecutionConfig(backend="poptorch", micro_batch_size=2, gradient_accumulation=5, layers_per_ipu=[1, 1],
                             compile_only=True, executable_cache_dir=str(tmp_path / "cache"))
    batch = si.host_call_batch(config.combined_batch_packs)
    _, runner = _runner(config)
    runner.compile(batch)
    first = poptorch.executors[-1]
    assert first.isCompiled() and not first.isAttachedToDevice() and not first.loaded_from_cache
    assert os.listdir(str(tmp_path / "cache")) == [os.path.basename(first.cache_file)]
    with pytest.raises(RuntimeError, match="compile_only"):
        runner.train_step(batch)
    _, again = _runner(config)  # a second compile of the same program loads it from the cache
    again.compile(batch)
    assert poptorch.executors[-1].loaded_from_cache


def test_the_ipu_optimizer_state_is_read_back_and_handed_to_a_resumed_run(poptorch):
    config = ExecutionConfig(**TINY_IPU_MODEL)
    loader = lambda r: r.dataloader(PackDataset(si.packs(2 * config.combined_batch_packs)))  # noqa: E731
    _, first = _runner(config)
    assert first.optimizer_state_dict()["ipu_state"] is None  # nothing ran: no IPU state yet
    for batch in loader(first):
        first.train_step(batch)
    saved = first.optimizer_state_dict()  # read back from the device after the executor ran
    assert int(saved["ipu_state"]["step"]) == 2 * config.device_iterations
    assert set(saved["ipu_param"]) == {"model." + n for n, _ in first.model.named_parameters()}
    assert len(saved["param_groups"]) == len(first.optimizer.param_groups)

    _, resumed = _runner(config, seed=1)
    resumed.load_optimizer_state_dict(saved)
    batch = next(iter(loader(resumed)))
    resumed.train_step(batch)
    (written,) = poptorch.executors[-1].written_states  # written to the device on attach, before the first run
    assert written["ipu_state"] is not saved["ipu_state"] and int(written["ipu_state"]["step"]) == 4
    assert int(resumed.optimizer_state_dict()["ipu_state"]["step"]) == 3 * config.device_iterations


def test_a_state_without_ipu_moments_restores_only_the_param_groups(poptorch):
    config = ExecutionConfig(**TINY_IPU_MODEL)
    model, runner = _runner(config)
    state = LAMB(model.parameters(), lr=5e-4).state_dict()
    runner.load_optimizer_state_dict(state)
    assert runner.optimizer.param_groups[0]["lr"] == 5e-4
    runner.train_step(next(iter(runner.dataloader(PackDataset(si.packs(config.combined_batch_packs))))))
    assert poptorch.executors[-1].written_states == []


def test_without_poptorch_the_error_names_the_sdk(monkeypatch):
    monkeypatch.setitem(sys.modules, "poptorch", None)  # import poptorch -> ImportError
    model = si.tiny_model(2)
    with pytest.raises(BackendUnavailable, match="Poplar SDK") as err:
        make_runner(model, LAMB(model.parameters()), ExecutionConfig(backend="poptorch"))
    assert str(err.value) == SDK_MESSAGE


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_attention_other_than_dense_is_refused_on_poptorch(poptorch, attention):
    model = si.tiny_model(2)
    model.bert.attention_implementation = attention
    with pytest.raises(ValueError, match="runs attention 'dense' only.*got '%s'" % attention):
        make_runner(model, LAMB(model.parameters()), ExecutionConfig(backend="poptorch"))
