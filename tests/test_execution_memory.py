"""The dry run's memory model per IPU: exact rows (weights, gradient accumulators at the type the adapter
passes to poptorch.optim, optimizer state on or off chip and sharded) checked against transformers'
parameter counts, and the estimated rows (stream buffer, pipeline stash, live activations) against values
worked out by hand for small cases."""

from __future__ import annotations

import sys

import pytest
import transformers

from ipu_packing.execution import ExecutionConfig
from ipu_packing.execution.dry_run import (
    dry_run_report,
    largest_tensors,
    layer_activation_elements,
    memory_choices,
    memory_per_device,
    min_gradient_accumulation,
    module_parameters,
    pipeline_groups,
    stash_depths,
)
from ipu_packing.execution.placement import plan_placement

LARGE = transformers.BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
SMALL = transformers.BertConfig(vocab_size=96, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=16, max_position_embeddings=16, type_vocab_size=2)


@pytest.fixture(autouse=True)
def no_poptorch(monkeypatch):
    monkeypatch.setitem(sys.modules, "poptorch", None)  # the dry run must not need it


def ipu(**kwargs):
    return ExecutionConfig(backend="poptorch", **kwargs)


def test_weights_per_ipu_are_exact_parameter_counts():
    config = transformers.BertConfig(vocab_size=96, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=80, max_position_embeddings=40, type_vocab_size=2)
    model = transformers.BertForPreTraining(config)
    _, rows = memory_per_device(config, ipu(layers_per_ipu=[1, 2], precision="fp16"))
    word = config.vocab_size * config.hidden_size  # the tied decoder weight, counted once with the embeddings
    own = {name: sum(p.numel() for p in model.get_submodule(name).parameters())
           for name in ("bert.embeddings", "bert.pooler", "cls", "bert.encoder.layer.0", "bert.encoder.layer.1")}
    ipu0 = own["bert.embeddings"] + own["bert.pooler"] + (own["cls"] - word) + own["bert.encoder.layer.0"]
    ipu1 = 2 * own["bert.encoder.layer.1"]
    assert [r["params"] for r in rows] == [ipu0, ipu1]
    assert ipu0 + ipu1 == sum(p.numel() for p in model.parameters())
    assert [r["weights"] for r in rows] == [2 * ipu0, 2 * ipu1]  # fp16
    _, fp32 = memory_per_device(config, ipu(layers_per_ipu=[1, 2]))
    assert [r["weights"] for r in fp32] == [4 * ipu0, 4 * ipu1]
    # the largest tensor of each module, as the stream buffer sizes it
    tied = model.bert.embeddings.word_embeddings.weight
    for name, n in largest_tensors(config).items():
        sizes = [p.numel() for p in model.get_submodule(name).parameters() if name != "cls" or p is not tied]
        assert n == max(sizes), name


@pytest.mark.parametrize(
    "kwargs, bytes_per_weight",
    [
        (dict(precision="fp16"), 2),  # follows an fp16 model (Graphcore's accum_type=float16)
        (dict(precision="fp32"), 4),  # follows an fp32 model (PopTorch's default float32)
        (dict(precision="fp16", gradient_accumulator_type="fp32"), 4),
        (dict(precision="fp32", gradient_accumulator_type="fp16"), 2),
        (dict(precision="fp16", gradient_accumulation=1), 0),  # no accumulation: PopART keeps no accumulators
    ],
)
def test_gradient_accumulators_at_the_type_the_adapter_passes(kwargs, bytes_per_weight):
    kwargs.setdefault("gradient_accumulation", 16)
    _, rows = memory_per_device(SMALL, ipu(layers_per_ipu=[1, 1], **kwargs))
    assert [r["gradients"] for r in rows] == [bytes_per_weight * r["params"] for r in rows]


def test_bert_large_ipu1_with_fp32_accumulators_holds_529_mb_of_weights_and_gradients():
    """BERT-Large's IPU 1 (7 layers of the [3, 7, 7, 7] split) in fp16 with fp32 gradient accumulators: 6 bytes per
    weight (2 for the weight, 4 for its accumulator), 529 MB."""
    e = ipu(layers_per_ipu=[3, 7, 7, 7], precision="fp16", gradient_accumulation=1024, micro_batch_size=2,
            gradient_accumulator_type="fp32")
    _, rows = memory_per_device(LARGE, e)
    layer = module_parameters(LARGE)["bert.encoder.layer.0"]
    assert rows[1]["weights"] + rows[1]["gradients"] == 7 * layer * 6
    assert round((rows[1]["weights"] + rows[1]["gradients"]) / 1e6) == 529


def test_optimizer_state_on_or_off_chip_and_sharded():
    layer = module_parameters(LARGE)["bert.encoder.layer.0"]
    word = LARGE.vocab_size * LARGE.hidden_size
    base = dict(layers_per_ipu=[3, 7, 7, 7], precision="fp16", gradient_accumulation=64, micro_batch_size=2,
                replication_factor=4)
    _, off = memory_per_device(LARGE, ipu(**base))
    assert off[1]["optimizer"] == 0 and off[1]["optimizer_offchip"] == 7 * layer * 8  # two fp32 moments
    assert off[0]["stream_buffer"] == word * 8  # the word embedding's moments stream in to update it
    assert off[1]["stream_buffer"] == LARGE.hidden_size * LARGE.intermediate_size * 8
    _, rts = memory_per_device(LARGE, ipu(replicated_tensor_sharding=True, **base))
    assert rts[1]["optimizer_offchip"] == 7 * layer * 8 / 4 and rts[0]["stream_buffer"] == word * 8 / 4
    _, on = memory_per_device(LARGE, ipu(optimizer_state_offchip=False, replicated_tensor_sharding=True, **base))
    assert on[1]["optimizer"] == 7 * layer * 8 / 4 and on[1]["optimizer_offchip"] == 0 and on[1]["stream_buffer"] == 0
    _, half = memory_per_device(LARGE, ipu(first_order_momentum_type="fp16", **base))
    assert half[1]["optimizer_offchip"] == 7 * layer * 6
    _, sgd = memory_per_device(LARGE, ipu(**base), optimizer="sgd")  # one state (velocity)
    assert sgd[1]["optimizer_offchip"] == 7 * layer * 4
    for r in (off[1], on[1]):
        assert r["total"] == sum(r[k] for k in ("weights", "gradients", "optimizer", "stream_buffer", "stash",
                                                "activations"))


def test_stash_depths_follow_popart_pipeline_stages():
    assert stash_depths(5) == [9, 7, 5, 3, 1] and stash_depths(3) == [5, 3, 1]
    plan = plan_placement(24, ExecutionConfig(layers_per_ipu=[3, 7, 7, 7]))
    groups = pipeline_groups(plan)
    assert [i for i, _ in groups] == [0, 1, 2, 3, 0]  # the heads come back to IPU 0: a fifth group
    assert [len(m) for _, m in groups] == [1 + 3, 7, 7, 7, 2]
    assert min_gradient_accumulation(5) == 9 and min_gradient_accumulation(1) == 1


def test_stash_and_activations_by_hand():
    """2 IPUs, layers [1, 1], B=2, S=16, H=8, I=16, N=2, fp32 (4 bytes). Groups: IPU 0 (embeddings +
    layer 0), IPU 1 (layer 1), IPU 0 (heads): depths 5, 3, 1.
    - one (B, S, H) tensor: 2*16*8*4 = 1024 bytes; the fp32 mask (B, S, S): 2*16*16*4 = 2048 bytes;
    - IPU 0 stashes layer 0's output (its input is made on the same IPU, recomputable) and the mask:
      5 * (1024 + 2048) = 15360;
    - IPU 1 stashes its received input and layer 1's output, and the mask: 3 * (2*1024 + 2048) = 12288;
    - one layer kept: B*S*(7H + 2I) + B*N*S*S = 32*(56 + 32) + 2*2*256 = 2816 + 1024 = 3840 elements,
      its peak adds 2 * 1024: 5888 elements = 23552 bytes on each IPU."""
    e = ipu(layers_per_ipu=[1, 1], micro_batch_size=2, gradient_accumulation=8)
    assert layer_activation_elements(SMALL, 2, 16) == (3840, 5888)
    _, rows = memory_per_device(SMALL, e, sequence_length=16)
    assert [r["stash"] for r in rows] == [15360, 12288]
    assert [r["stash_depth"] for r in rows] == [5, 3]
    assert [r["activations"] for r in rows] == [23552, 23552]
    # without per-layer checkpoints only the received input is stashed and the whole stage is recomputed
    _, whole = memory_per_device(SMALL, ipu(layers_per_ipu=[1, 1], micro_batch_size=2, gradient_accumulation=8,
                                            recompute_checkpoint_every_layer=False), sequence_length=16)
    assert [r["stash"] for r in whole] == [5 * 2048, 3 * (1024 + 2048)]
    # fp16 halves the activations and the mask (the model builds it in its dtype: 2*16*16*2 = 1024 bytes)
    _, half = memory_per_device(SMALL, ipu(layers_per_ipu=[1, 1], micro_batch_size=2, gradient_accumulation=8,
                                           precision="fp16"), sequence_length=16)
    assert [r["stash"] for r in half] == [5 * (512 + 1024), 3 * (2 * 512 + 1024)]
    # one IPU: no pipeline, no recomputation: both layers' activations live, one at its peak
    _, single = memory_per_device(SMALL, ipu(micro_batch_size=2, gradient_accumulation=8), sequence_length=16)
    assert single[0]["stash"] == 0 and single[0]["activations"] == 4 * (3840 + 5888)


def test_report_marks_estimates_flags_900_mb_and_a_too_small_accumulation():
    e = ipu(layers_per_ipu=[3, 7, 7, 7], precision="fp16", gradient_accumulation=1024, micro_batch_size=2,
            replication_factor=4, optimizer_state_offchip=False)
    report = dry_run_report(LARGE, e)
    for row in ("* stream buffer", "* stash", "* live activations"):
        assert row in report
    assert "  weights (fp16)" in report and "  grad accumulators (fp16)" in report
    # LAMB state on chip, unsharded: every IPU is over; sharded over 4 replicas, or off chip, none is
    assert all("ABOVE 900 MB: IPU %d counts" % i in report for i in range(4))
    sharded = ExecutionConfig(**dict(vars(e), replicated_tensor_sharding=True))
    assert "ABOVE 900 MB" not in dry_run_report(LARGE, sharded)
    assert "ABOVE 900 MB" not in dry_run_report(LARGE, ExecutionConfig(**dict(vars(e), optimizer_state_offchip=True)))
    assert "stash depths 9, 7, 5, 3, 1" in report
    assert "TOO SMALL" not in report
    small = dry_run_report(LARGE, ExecutionConfig(**dict(vars(e), gradient_accumulation=8)))
    assert "PopART needs gradient_accumulation >= 9; this config has 8: TOO SMALL" in small
    # the PopTorch options asked for are printed from describe_options
    assert "_Popart.setPatterns" in report and "outputMode" in report


def test_memory_choices_by_hand():
    """SMALL, layers [1, 1], B=2, S=16, H=8, V=96, M=6; groups IPU 0 (embeddings + layer 0, depth 5), IPU 1
    (layer 1, depth 3), IPU 0 (heads, depth 1).
    - fp16 mask: each stash entry saves (B, S, S) x 2 bytes = 1024: 5 * 1024 on IPU 0, 3 * 1024 on IPU 1;
    - fp16 MLM loss: no fp32 (B*M, V) copy on the heads' IPU 0: 2*6*96*4 = 4608;
    - fused QKV: two (B, S, H) partial gradients at 2 bytes, 2*2*16*8*2 = 1024, on each IPU with a layer."""
    e = ipu(layers_per_ipu=[1, 1], micro_batch_size=2, gradient_accumulation=8, precision="fp16")
    plan = plan_placement(2, e)
    assert memory_choices(SMALL, e, plan, 16, mlm_slots=6) == [
        {"saved_mask": 5 * 1024, "saved_mlm_logits": 4608, "saved_fused_qkv": 1024},
        {"saved_mask": 3 * 1024, "saved_mlm_logits": 0, "saved_fused_qkv": 1024},
    ]
    assert [r["saved_mlm_logits"] for r in memory_choices(SMALL, e, plan, 16)] == [None, None]  # M not known
    fp32 = ipu(layers_per_ipu=[1, 1], micro_batch_size=2, gradient_accumulation=8)
    assert memory_choices(SMALL, fp32, plan_placement(2, fp32), 16, mlm_slots=6) == [
        {"saved_mask": 0, "saved_mlm_logits": 0, "saved_fused_qkv": 2048},
        {"saved_mask": 0, "saved_mlm_logits": 0, "saved_fused_qkv": 2048},
    ]
    _, rows = memory_per_device(SMALL, e, sequence_length=16, mlm_slots=6)
    assert [r["saved_mask"] for r in rows] == [5 * 1024, 3 * 1024]
    for r in rows:  # the savings are not part of the total
        assert r["total"] == sum(r[k] for k in ("weights", "gradients", "optimizer", "stream_buffer", "stash",
                                                "activations"))


def test_a_fused_qkv_weight_can_become_the_largest_tensor_the_stream_buffer_holds():
    """SMALL has I = 2H: the fused (3H, H) = 192-element weight is larger than H x I = 128."""
    fused = transformers.BertConfig(**dict(SMALL.to_dict(), fused_qkv=True))
    assert largest_tensors(SMALL)["bert.encoder.layer.1"] == 128
    assert largest_tensors(fused)["bert.encoder.layer.1"] == 192
    assert largest_tensors(LARGE)["bert.encoder.layer.0"] == 1024 * 4096  # BERT-Large: I = 4H stays the largest
    e = ipu(layers_per_ipu=[1, 1], micro_batch_size=2, gradient_accumulation=8)
    plain, with_fused = memory_per_device(SMALL, e)[1][1], memory_per_device(fused, e)[1][1]
    assert plain["stream_buffer"] == 128 * 8 and with_fused["stream_buffer"] == 192 * 8  # two fp32 moments
    assert with_fused["params"] == plain["params"]


def test_bert_large_512_pod16_dry_run_rows_of_the_memory_choices():
    """The shipped config as the application runs its dry run: B 2, S 512, M 78 (mlm_slots(512, 3)), V 30522,
    H 1024, fp16, stash depths 9, 7, 5, 3 on IPUs 0-3."""
    from ipu_packing.data.format import mlm_slots
    from ipu_packing.train import load_config
    from ipu_packing.train.cli import dry_run

    config = load_config("bert_large_512_pod16")
    e = config.batch_accounting(config.nominal_packing_factor).execution
    assert mlm_slots(512, 3) == 78
    _, rows = memory_per_device(config.bert_config(), e, "lamb", 512, mlm_slots=78)
    mask = 2 * 512 * 512 * 2  # (B, S, S) at 2 bytes less than fp32's 4
    assert [r["saved_mask"] for r in rows] == [9 * mask, 7 * mask, 5 * mask, 3 * mask]
    assert [r["saved_mlm_logits"] for r in rows] == [2 * 78 * 30522 * 4, 0, 0, 0]  # 19,045,728 bytes on IPU 0
    assert [r["saved_fused_qkv"] for r in rows] == [2 * 2 * 512 * 1024 * 2] * 4  # 4,194,304: model.fused_qkv off
    # the stash holds the fp16 mask: IPU 1 stashes 7 x (8 layer tensors (B, S, H) + the mask) at 2 bytes
    assert rows[1]["stash"] == 7 * (8 * 2 * 512 * 1024 * 2 + 2 * 512 * 512 * 2) == 124780544
    report = dry_run(config)
    assert "* fp16 attention mask (in the stash above)       9.4 MB     7.3 MB     5.2 MB     3.1 MB" in report
    assert "* fp16 MLM loss: no fp32 logits copy, M 78      19.0 MB     0.0 MB     0.0 MB     0.0 MB" in report
    assert "* fused QKV: model.fused_qkv off, would save     4.2 MB     4.2 MB     4.2 MB     4.2 MB" in report
    assert "* stash (depth x B 2 x S 512)                   66.1 MB   124.8 MB    89.1 MB    53.5 MB" in report
    fused = dry_run(load_config("bert_large_512_pod16", ["model.fused_qkv=true"]))
    assert "* fused QKV: on (model.fused_qkv)                4.2 MB     4.2 MB     4.2 MB     4.2 MB" in fused
