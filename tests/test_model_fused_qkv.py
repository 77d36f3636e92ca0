"""The fused query/key/value projection (``model.fused_qkv``): one Linear(H, 3H) per layer instead of three
Linear(H, H), as Graphcore's BertFusedSelfAttention computes them (bert_fused_attention.py). Equal to the
unfused model (and to transformers) within 1e-12 in float64, outputs and gradients; transformers' weights
load into it and it exports them; the pipeline stages, the PopTorch stand-in, configs and checkpoints."""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pytest
import torch
import torch._dynamo  # noqa: F401  (torch 2.0.x does not import it with torch)
import transformers

from ipu_packing.execution import ExecutionConfig, make_runner
from ipu_packing.model import PackedBertForPreTraining
from ipu_packing.model.self_attention import BertFusedSelfAttention, BertSelfAttention, hf_layout
from ipu_packing.model.stages import OUTPUT, parameter_owners, pretraining_stages
from ipu_packing.train import load_config
from ipu_packing.errors import ConfigError, UserError
from ipu_packing.train.optim import LAMB, parameter_groups
from ipu_packing.train.fingerprint import check_fixed
from ipu_packing.train.state import TrainingState
from model_fixtures import (CONFIGS, FP64_ATOL, MAX_SEQUENCES, MLM_SLOTS, PACK_LENGTHS, SEQ_LEN, build_packs,
                            gather_reference, make_config, padded_hf_inputs, random_packs, randomize_, tiny_batch,
                            tiny_config, to_torch)
from app_fixtures import tiny, train
from ipu_packing.data import open_dataset
from ipu_packing.train.loop import plan_run
from torch_features import requires_torch_compile

import app_fixtures as fx
import poptorch_stand_in as si
from spawned import leave_after

QKV = ("query", "key", "value")


def fused_twin(model: PackedBertForPreTraining, attention: str = None) -> PackedBertForPreTraining:
    """A fused model holding ``model``'s weights (loaded from its query/key/value state dict)."""
    config = transformers.BertConfig.from_dict(model.config.to_dict())
    config.fused_qkv = True
    fused = PackedBertForPreTraining(config, attention=attention or model.attention_implementation)
    fused = fused.to(next(model.parameters()).dtype).train(model.training)
    assert all(isinstance(layer.attention.self, BertFusedSelfAttention) for layer in fused.bert.encoder.layer)
    result = fused.load_state_dict(model.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    return fused


def packed_batch(vocab_size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    groups = random_packs(rng, PACK_LENGTHS, vocab_size)
    return groups, to_torch(build_packs(groups, SEQ_LEN, MAX_SEQUENCES, MLM_SLOTS, rng))


def fused_grad_parts(fused: PackedBertForPreTraining):
    """name -> gradient in transformers' layout (each fused qkv gradient split into query, key, value)."""
    return hf_layout({name: p.grad for name, p in fused.named_parameters()})


@pytest.mark.parametrize("attention", ["dense", "sdpa", "varlen"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_equals_unfused_in_float64_outputs_and_gradients(name, attention):
    config = make_config(**CONFIGS[name])
    torch.manual_seed(0)
    unfused = PackedBertForPreTraining(config, attention=attention)
    randomize_(unfused, 0)
    unfused = unfused.double().eval()
    fused = fused_twin(unfused)
    assert isinstance(fused.bert.encoder.layer[0].attention.self, BertFusedSelfAttention)
    _, batch = packed_batch(config.vocab_size)
    a, b = unfused(**batch), fused(**batch)
    assert b.mlm_logits.dtype == torch.float64
    diffs = {field: (getattr(a, field) - getattr(b, field)).abs().max().item()
             for field in ("loss", "mlm_loss", "nsp_loss", "mlm_logits", "nsp_logits")}
    a.loss.backward()
    b.loss.backward()
    theirs = fused_grad_parts(fused)
    assert sorted(theirs) == sorted(n for n, _ in unfused.named_parameters())
    diffs["gradients"] = max((p.grad - theirs[n]).abs().max().item() for n, p in unfused.named_parameters())
    print("fp64 fused vs unfused %s %s: %s" % (name, attention, ", ".join("%s %.1e" % d for d in diffs.items())))
    for what, diff in diffs.items():
        assert diff <= FP64_ATOL, (what, diff)
    assert a.loss.item() > 0.5 and fused.bert.encoder.layer[0].attention.self.qkv.weight.grad.abs().sum() > 0
    assert a.mlm_accuracy.item() == b.mlm_accuracy.item() and a.mlm_count.item() == b.mlm_count.item()


def test_fused_equals_transformers_in_float64():
    """transformers' BertForPreTraining, per sequence, with the weights loaded straight from its state dict."""
    config = make_config(**CONFIGS["L3-H4-d64-V211"])
    reference = transformers.BertForPreTraining(config)
    randomize_(reference, 0)
    config.fused_qkv = True
    fused = PackedBertForPreTraining(config)
    assert [n for n, _ in fused.bert.encoder.layer[0].attention.self.named_parameters()] == ["qkv.weight", "qkv.bias"]
    fused.load_state_dict(reference.state_dict())
    reference, fused = reference.double().eval(), fused.double().eval()
    groups, batch = packed_batch(config.vocab_size)
    hf_inputs = padded_hf_inputs([seq for group in groups for seq in group])
    hf_out, out = reference(**hf_inputs), fused(**batch)
    mlm_ref, nsp_ref = gather_reference(groups, batch, hf_out, hf_inputs)
    mlm_valid, nsp_valid = batch["mlm_labels"] != -100, batch["nsp_labels"] != -100
    assert (out.mlm_logits[mlm_valid] - mlm_ref[mlm_valid]).abs().max().item() <= FP64_ATOL
    assert (out.nsp_logits[nsp_valid] - nsp_ref[nsp_valid]).abs().max().item() <= FP64_ATOL
    assert abs(out.loss.item() - hf_out.loss.item()) <= FP64_ATOL
    hf_out.loss.backward()
    out.loss.backward()
    ours = fused_grad_parts(fused)
    for name, param in reference.named_parameters():
        assert (ours[name] - param.grad).abs().max().item() <= FP64_ATOL, name


def test_one_qkv_parameter_per_layer_holding_query_key_value_in_order():
    unfused = PackedBertForPreTraining(tiny_config()).eval()
    fused = fused_twin(unfused)
    names = [n for n, _ in fused.named_parameters()]
    assert not any(".query." in n or ".key." in n or ".value." in n for n in names)
    for i, layer in enumerate(fused.bert.encoder.layer):
        own = layer.attention.self
        assert own.qkv.weight.shape == (48, 16) and own.qkv.bias.shape == (48,)
        theirs = unfused.bert.encoder.layer[i].attention.self
        assert isinstance(theirs, BertSelfAttention)
        assert torch.equal(own.qkv.weight, torch.cat([getattr(theirs, p).weight for p in QKV]))
        assert torch.equal(own.qkv.bias, torch.cat([getattr(theirs, p).bias for p in QKV]))
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in unfused.parameters())
    # LAMB's groups: the fused weight is a matrix (decay, trust ratio), its bias a bias
    groups = parameter_groups(fused, 0.01)
    qkv = fused.bert.encoder.layer[0].attention.self.qkv
    assert any(p is qkv.weight for p in groups[0]["params"]) and any(p is qkv.bias for p in groups[2]["params"])


def test_state_dicts_load_across_layouts_and_export_in_transformers_layout():
    unfused = PackedBertForPreTraining(tiny_config())
    with torch.no_grad():
        for p in unfused.parameters():
            p.normal_()
    fused = fused_twin(unfused)
    back = PackedBertForPreTraining(tiny_config())
    assert not back.load_state_dict(fused.state_dict()).missing_keys  # the unfused model splits a fused state
    for name, value in unfused.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name
    exported, expected = fused.hf_state_dict(), unfused.hf_state_dict()
    assert list(exported) == list(expected)  # transformers' names, in its order
    assert all(torch.equal(exported[k], expected[k]) and exported[k].is_contiguous() for k in expected)


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_transformers_weights_load_into_the_fused_model_and_it_saves_what_transformers_loads(tmp_path, safe):
    torch.manual_seed(0)
    reference = transformers.BertForPreTraining(tiny_config()).eval()
    reference.save_pretrained(str(tmp_path / "hf"), safe_serialization=safe)
    fused = PackedBertForPreTraining.from_pretrained(str(tmp_path / "hf"), fused_qkv=True).eval()
    unfused = PackedBertForPreTraining.from_pretrained(str(tmp_path / "hf")).eval()
    assert isinstance(fused.bert.encoder.layer[0].attention.self, BertFusedSelfAttention)
    assert isinstance(unfused.bert.encoder.layer[0].attention.self, BertSelfAttention)
    batch = tiny_batch()
    assert (fused(**batch).mlm_logits - unfused(**batch).mlm_logits).abs().max().item() <= 1e-5
    fused.save_pretrained(str(tmp_path / "ours"), safe_serialization=safe)
    loaded, info = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "ours"), output_loading_info=True)
    assert set(info["missing_keys"]) <= {"cls.predictions.decoder.weight"}
    assert info["unexpected_keys"] == [] and info["mismatched_keys"] == []
    for name, value in reference.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    again = PackedBertForPreTraining.from_pretrained(str(tmp_path / "ours"))  # config.json records fused_qkv
    assert again.config.fused_qkv is True and isinstance(again.bert.encoder.layer[1].attention.self,
                                                           BertFusedSelfAttention)
    assert torch.equal(again.bert.encoder.layer[1].attention.self.qkv.weight,
                       fused.bert.encoder.layer[1].attention.self.qkv.weight)


def test_the_pipeline_stages_run_the_fused_model_and_own_every_parameter():
    unfused = si.tiny_model(3, dropout=0.0).eval()
    fused = fused_twin(unfused)
    batch = {k: torch.as_tensor(v) for k, v in si.collate(si.packs(4)).items()}
    stages = pretraining_stages(3, [1, 2])
    state = dict(batch)
    for part in stages.parts:
        stages.run(fused, part, state)
    whole = fused(**batch)
    assert torch.equal(state[OUTPUT].loss, whole.loss) and torch.equal(state[OUTPUT].mlm_logits, whole.mlm_logits)
    assert (whole.loss - unfused(**batch).loss).abs().item() <= 1e-5
    owners = parameter_owners(fused, stages)
    assert owners["bert.encoder.layer.2.attention.self.qkv.weight"].name == "Encoder2"
    assert owners["bert.encoder.layer.2.attention.self.qkv.weight"].device == 1


def test_the_fused_model_compiles_through_the_poptorch_stand_in(monkeypatch):
    """fp16, pipelined [1, 1]: every op is one PopTorch supports and each weight is consumed on one IPU."""
    poptorch = si.load_stand_in()
    monkeypatch.setitem(sys.modules, "poptorch", poptorch)
    model = fused_twin(si.tiny_model(2))
    config = ExecutionConfig(backend="poptorch", micro_batch_size=2, gradient_accumulation=5, layers_per_ipu=[1, 1],
                             precision="fp16", device_iterations=1)
    runner = make_runner(model, LAMB(model.parameters(), lr=1e-3), config)
    runner.compile(si.host_call_batch(config.combined_batch_packs))
    (executor,) = poptorch.executors
    assert executor.isCompiled()
    ops = {(op, block) for op, _, block in executor.trace.ops}
    assert ("slice", "Encoder0") in ops and ("slice", "Encoder1") in ops  # q, k, v are slices of one product


def test_model_fused_qkv_is_a_config_key_that_reaches_the_model():
    config = load_config("bert_large_512_pod16", ["model.fused_qkv=true", "model.num_hidden_layers=2",
                                                  "model.hidden_size=16", "model.num_attention_heads=2",
                                                  "model.intermediate_size=32", "execution.layers_per_ipu=[0,1,1,0]"])
    bert = config.bert_config()
    assert bert.fused_qkv is True
    model = PackedBertForPreTraining(bert)
    assert isinstance(model.bert.encoder.layer[0].attention.self, BertFusedSelfAttention)
    assert load_config("bert_large_512_pod16").bert_config().to_dict().get("fused_qkv", False) is False
    with pytest.raises(ConfigError, match="model.fused_qkv must be true or false"):
        load_config("demo", ["model.fused_qkv=3"])
    with pytest.raises(ValueError, match="fused_qkv must be true or false"):
        PackedBertForPreTraining(tiny_config(fused_qkv="yes"))


def test_a_resume_that_changes_fused_qkv_is_refused_naming_init_from():
    config = load_config("demo", ["model.fused_qkv=true"])
    state = TrainingState(step=1, model={}, config=load_config("demo").to_dict())
    with pytest.raises(UserError, match="trained with model.fused_qkv=false, this config has true.*init_from=ckpt"):
        check_fixed(config, {}, state, "ckpt")
    check_fixed(config, {}, dataclasses.replace(state, config=config.to_dict()), "ckpt")  # same layout


def test_a_fused_run_starts_from_unfused_weights_and_exports_what_transformers_loads(data_dir, tmp_path):
    first = str(tmp_path / "phase1")
    train(tiny(data_dir, first, "training.steps=2"))
    exported = fx.load(fx.latest(first)).model  # query/key/value names
    for source in (os.path.join(first, "final"), fx.latest(first), first):
        plan = plan_run(tiny(data_dir, str(tmp_path / "phase2"), "model.fused_qkv=true",
                             "checkpoint.init_from=%s" % source), open_dataset=open_dataset)
        assert isinstance(plan.model.bert.encoder.layer[0].attention.self, BertFusedSelfAttention)
        ours = hf_layout(plan.model.state_dict())
        assert sorted(ours) == sorted(exported)
        for key, value in exported.items():
            assert torch.equal(ours[key], value), (source, key)
    second = str(tmp_path / "fused")
    train(tiny(data_dir, second, "training.steps=2", "model.fused_qkv=true"))
    final = os.path.join(second, "final")
    loaded, info = transformers.BertForPreTraining.from_pretrained(final, output_loading_info=True)
    assert info["unexpected_keys"] == [] and set(info["missing_keys"]) <= {"cls.predictions.decoder.weight"}
    state = fx.load(fx.latest(second)).model
    assert "bert.encoder.layer.0.attention.self.qkv.weight" in state  # the run's own checkpoints stay fused
    assert torch.equal(loaded.bert.encoder.layer[0].attention.self.key.weight,
                       state["bert.encoder.layer.0.attention.self.qkv.weight"].chunk(3)[1])


@requires_torch_compile
@pytest.mark.slow
def test_the_fused_model_compiles_fullgraph_and_matches_eager():
    torch.manual_seed(0)
    model = PackedBertForPreTraining(tiny_config(num_hidden_layers=1, fused_qkv=True)).eval()
    assert isinstance(model.bert.encoder.layer[0].attention.self, BertFusedSelfAttention)
    batch = tiny_batch(dtype=torch.int32)
    eager = model(**batch)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend="aot_eager")(**batch)
    assert (compiled.loss - eager.loss).abs().item() <= 1e-5
    assert (compiled.mlm_logits - eager.mlm_logits).abs().max().item() <= 1e-5


def _train_fused(config: ExecutionConfig):
    """3 SGD steps of the fused tiny model from a fixed initialisation; its state in transformers' layout."""
    from execution_fixtures import make_packs, tiny_bert_config

    from synthetic_packs import PackDataset

    torch.manual_seed(0)
    bert = tiny_bert_config(2)
    bert.fused_qkv = True
    model = PackedBertForPreTraining(bert)
    assert isinstance(model.bert.encoder.layer[1].attention.self, BertFusedSelfAttention)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    runner = make_runner(model, optimizer, config)
    dataset = PackDataset(make_packs(3 * config.global_batch_packs, seed=1))
    losses = [runner.train_step(batch).loss for batch in runner.dataloader(dataset)]
    runner.sync_model()
    return hf_layout({k: v.detach().clone() for k, v in runner.model.state_dict().items()}), losses


def _fused_pipeline_worker(rank, world, port, outdir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)

    def work():
        state = _train_fused(ExecutionConfig(micro_batch_size=2, gradient_accumulation=4, layers_per_ipu=[1, 1]))
        torch.save(state, os.path.join(outdir, "rank%d.pt" % rank))

    leave_after(work)


@pytest.mark.serial
@pytest.mark.slow
def test_a_two_stage_torch_pipeline_of_the_fused_model_matches_one_process(tmp_path):
    """torch.distributed.pipelining (GPipe, 2 processes, gloo) against one process, as
    test_execution_distributed does for the unfused model: weights within 1e-5 after 3 steps."""
    from execution_fixtures import free_port
    from torch_features import PIPELINING_MISSING

    import torch.multiprocessing as mp

    if PIPELINING_MISSING:
        pytest.skip(PIPELINING_MISSING)
    torch.set_num_threads(1)
    mp.spawn(_fused_pipeline_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    reference, ref_losses = _train_fused(ExecutionConfig(micro_batch_size=2, gradient_accumulation=4))
    assert "bert.encoder.layer.1.attention.self.key.weight" in reference
    assert len(ref_losses) == 3 and abs(ref_losses[2] - ref_losses[0]) > 1e-3  # it trains: the check is not vacuous
    for rank in range(2):
        state, losses = torch.load(os.path.join(str(tmp_path), "rank%d.pt" % rank))
        assert state.keys() == reference.keys()
        assert max(float((state[k] - reference[k]).abs().max()) for k in state) <= 1e-5
        assert losses == pytest.approx(ref_losses, abs=1e-5)
