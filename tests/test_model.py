"""Packed BERT behaviour: the composition contract, input dtypes, unused slots, empty packs, attention paths,
precision, dropout and torch.compile. Equivalence with transformers is in test_model_equivalence.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch._dynamo  # noqa: F401  (torch 2.0.x does not import it with torch)

from ipu_packing.model import PackedBertForPreTraining, PackedBertOutput
from ipu_packing.data.format import IGNORE_INDEX
from ipu_packing.model.attention import MASK_VALUE, dense_mask
from model_fixtures import FIELDS, assert_outputs_close, build_packs, model_for, random_packs, tiny_batch, tiny_config
from torch_features import requires_torch_compile

def test_output_is_named_tuple_of_tensors_with_shapes():
    batch = tiny_batch()
    out = model_for()(**batch)
    assert isinstance(out, tuple) and out._fields == FIELDS
    assert all(isinstance(value, torch.Tensor) for value in out)
    assert out.mlm_logits.shape == (3, 10, 64) and out.nsp_logits.shape == (3, 4, 2)
    for name in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "mlm_count", "nsp_count"):
        assert getattr(out, name).shape == (), name
    assert out.nsp_count.item() == 7.0
    assert out.mlm_count.item() == float((batch["mlm_labels"] != -100).sum())
    assert torch.allclose(out.loss, out.mlm_loss + out.nsp_loss)
    assert 0.0 <= out.mlm_accuracy.item() <= 1.0 and 0.0 <= out.nsp_accuracy.item() <= 1.0


def test_accuracy_counts_only_valid_slots():
    batch = tiny_batch()
    out = model_for()(**batch)
    valid = batch["nsp_labels"] != -100
    predicted = out.nsp_logits.argmax(-1)
    expected = ((predicted == batch["nsp_labels"]) & valid).sum().item() / valid.sum().item()
    assert out.nsp_accuracy.item() == pytest.approx(expected, abs=1e-7)
    # labels set to the argmax: accuracy 1 exactly, whatever the unused slots hold
    perfect = dict(batch)
    perfect["mlm_labels"] = torch.where(batch["mlm_labels"] != -100, out.mlm_logits.argmax(-1), batch["mlm_labels"])
    assert model_for()(**perfect).mlm_accuracy.item() == 1.0


def test_forward_is_the_public_composition():
    """The execution engineer splits the model with these calls; forward must be exactly their composition."""
    model = model_for()
    batch = tiny_batch()
    out = model(**batch)
    h = model.bert.embeddings(batch["input_ids"], batch["token_type_ids"], batch["position_ids"])
    assert h.shape == (3, 16, 16)
    mask = model.bert.get_attention_mask(batch["sequence_ids"])
    for layer in model.bert.encoder.layer:
        h = layer(h, mask)
        assert isinstance(h, torch.Tensor) and h.shape == (3, 16, 16)
    composed = model.pretraining_heads(
        h, batch["mlm_positions"], batch["mlm_labels"], batch["cls_positions"], batch["nsp_labels"]
    )
    assert_outputs_close(out, composed, atol=0.0)


def test_int32_and_int64_inputs_agree():
    model = model_for()
    assert_outputs_close(model(**tiny_batch(dtype=torch.int32)), model(**tiny_batch(dtype=torch.int64)), atol=0.0)


def test_unused_slots_are_never_read():
    """Unused MLM / CLS slots may hold any position (out of range, negative): outputs stay identical."""
    model = model_for()
    batch = tiny_batch()
    other = dict(batch)
    for positions, labels in (("mlm_positions", "mlm_labels"), ("cls_positions", "nsp_labels")):
        unused = batch[labels] == -100
        assert unused.any()
        other[positions] = torch.where(unused, torch.full_like(batch[positions], 10**6), batch[positions])
    a, b = model(**batch), model(**other)
    for name in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "mlm_count", "nsp_count"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    valid = batch["mlm_labels"] != -100
    assert torch.equal(a.mlm_logits[valid], b.mlm_logits[valid])


def test_padding_does_not_change_real_tokens():
    """Whatever padding tokens hold, real outputs are bit-for-bit unchanged (nothing real attends to padding)."""
    model = model_for()
    batch = tiny_batch()
    noisy = dict(batch)
    padding = batch["sequence_ids"] == 0
    assert padding.any()
    noisy["input_ids"] = torch.where(padding, torch.randint_like(batch["input_ids"], 1, 64), batch["input_ids"])
    noisy["token_type_ids"] = torch.where(padding, torch.ones_like(batch["token_type_ids"]), batch["token_type_ids"])
    random_positions = torch.randint_like(batch["position_ids"], 0, 32)
    noisy["position_ids"] = torch.where(padding, random_positions, batch["position_ids"])
    a, b = model(**batch), model(**noisy)
    assert torch.equal(a.loss, b.loss)
    assert torch.equal(a.nsp_logits[batch["nsp_labels"] != -100], b.nsp_logits[batch["nsp_labels"] != -100])


@pytest.mark.parametrize("attention", ["dense", "sdpa"])
def test_empty_packs_and_empty_batches_are_finite(attention):
    """A pack of pure padding (every row of its mask is padding-only) and a batch without labels: no NaN."""
    model = model_for(attention)
    batch = tiny_batch(lengths=([5, 6], [], [16]))
    out = model(**batch)
    assert all(torch.isfinite(value.float()).all() for value in out)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    empty = tiny_batch(lengths=([], []))
    out = model(**empty)
    assert all(torch.isfinite(value.float()).all() for value in out)
    assert out.loss.item() == 0.0 and out.mlm_count.item() == 0.0 and out.nsp_count.item() == 0.0


def test_dense_mask_is_block_diagonal_with_padding_apart():
    sequence_ids = torch.tensor([[1, 1, 2, 2, 2, 0]])
    allowed = dense_mask(sequence_ids)[0, 0] == 0
    expected = torch.tensor(
        [
            [1, 1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],  # padding sees only padding; no row is empty
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, expected)
    assert dense_mask(sequence_ids).dtype == torch.float32
    assert set(dense_mask(sequence_ids).unique().tolist()) == {0.0, MASK_VALUE}


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_attention_paths_agree():
    batch = tiny_batch()
    dense = model_for("dense")
    sdpa = PackedBertForPreTraining(dense.config, attention="sdpa").eval()
    sdpa.load_state_dict(dense.state_dict())
    a, b = dense(**batch), sdpa(**batch)
    assert_outputs_close(a, b, atol=1e-5)
    a.loss.backward()
    b.loss.backward()
    grads = dict(sdpa.named_parameters())
    for name, param in dense.named_parameters():
        assert (param.grad - grads[name].grad).abs().max().item() <= 1e-5, name
    if _has_flex():
        flex = PackedBertForPreTraining(dense.config, attention="flex").eval()
        flex.load_state_dict(dense.state_dict())
        with torch.no_grad():
            assert_outputs_close(dense(**batch), flex(**batch), atol=1e-5)


def _has_flex() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:  # torch < 2.5: no flex attention module (torch's, not this project's)
        return False
    return True


def test_attention_choice_by_argument_or_config():
    assert model_for().attention_implementation == "dense"
    assert PackedBertForPreTraining(tiny_config(), attention="sdpa").attention_implementation == "sdpa"
    config = tiny_config()
    config.packed_attention = "sdpa"
    model = PackedBertForPreTraining(config)
    assert model.attention_implementation == "sdpa"
    assert model.bert.get_attention_mask(torch.ones(1, 4, dtype=torch.long)).dtype == torch.float32  # additive
    assert PackedBertForPreTraining(config, attention="dense").attention_implementation == "dense"
    with pytest.raises(ValueError, match="attention must be one of"):
        PackedBertForPreTraining(tiny_config(), attention="sparse")
    with pytest.raises(ValueError, match="hidden_act"):
        PackedBertForPreTraining(tiny_config(hidden_act="nonsense"))


def test_decoder_is_tied_to_word_embeddings():
    model = model_for()
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    untied = PackedBertForPreTraining(tiny_config(tie_word_embeddings=False))
    assert untied.cls.predictions.decoder.weight is not untied.bert.embeddings.word_embeddings.weight


@pytest.mark.parametrize("attention", ["dense", "sdpa"])
def test_training_mode_dropout_is_active_and_finite(attention):
    model = model_for(attention, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1).train()
    batch = tiny_batch()
    torch.manual_seed(1)
    a = model(**batch)
    torch.manual_seed(2)
    b = model(**batch)
    assert torch.isfinite(a.loss) and a.loss.item() != b.loss.item()
    a.loss.backward()


def test_flex_without_flexattention_names_the_way_out():
    """The documented fallback on torch < 2.5 (the Poplar SDK's 2.0.1): a one-line error naming 'dense'/'sdpa'."""
    if _has_flex():
        pytest.skip("torch %s has FlexAttention; the fallback error is for torch < 2.5" % torch.__version__)
    with pytest.raises(RuntimeError, match=r"attention='flex' needs torch >= 2\.5 .*use 'dense' or 'sdpa'"):
        with torch.no_grad():
            model_for("flex")(**tiny_batch())


def test_flex_refuses_attention_dropout_in_training():
    if not _has_flex():
        pytest.skip("torch without FlexAttention")
    model = model_for("flex", attention_probs_dropout_prob=0.1).train()
    with pytest.raises(ValueError, match="no attention-probability dropout"):
        with torch.no_grad():
            model(**tiny_batch())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("attention", ["dense", "sdpa"])
def test_autocast_runs_and_stays_close_to_fp32(dtype, attention):
    model = model_for(attention)
    batch = tiny_batch()
    reference = model(**batch)
    try:
        with torch.autocast("cpu", dtype=dtype):
            out = model(**batch)
    except RuntimeError as error:  # pragma: no cover - depends on the torch build
        pytest.skip("CPU autocast to %s unsupported here: %s" % (dtype, error))
    for field in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "mlm_count", "nsp_count"):
        assert getattr(out, field).dtype == getattr(reference, field).dtype == torch.float32, field
    assert out.mlm_logits.dtype == dtype
    assert torch.isfinite(out.loss)
    assert abs(out.loss.item() - reference.loss.item()) <= 0.05 * reference.loss.item()
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@requires_torch_compile
@pytest.mark.slow
def test_torch_compile_fullgraph_matches_eager():
    """fullgraph=True fails on any graph break; aot_eager traces forward and backward cheaply (inductor, the
    default backend, compiles the same graph: set IPU_PACKING_TEST_INDUCTOR=1 to run it, ~2 min here)."""
    backend = "inductor" if os.environ.get("IPU_PACKING_TEST_INDUCTOR") == "1" else "aot_eager"
    model = model_for(num_hidden_layers=1)
    batch = tiny_batch(dtype=torch.int32)
    eager = model(**batch)
    eager.loss.backward()
    eager_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend=backend)
    out = compiled(**batch)
    assert isinstance(out, PackedBertOutput)
    assert_outputs_close(eager, out, atol=1e-5)
    out.loss.backward()
    for name, param in model.named_parameters():
        assert (param.grad - eager_grads[name]).abs().max().item() <= 1e-5, name


def test_ddp_passes_the_output_through_and_every_parameter_gets_a_gradient(tmp_path):
    """DDP (gloo, one process) returns the NamedTuple; two steps without find_unused_parameters would fail
    if any parameter (pooler, NSP head, ...) went unused."""
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed unavailable")
    dist.init_process_group("gloo", init_method="file://%s" % (tmp_path / "store"), rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(model_for(num_hidden_layers=1).train())
        for seed in (0, 1):
            out = model(**tiny_batch(seed))
            assert isinstance(out, PackedBertOutput)
            out.loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    finally:
        dist.destroy_process_group()


# ---- the packs the model tests are built on (model_fixtures.build_packs) ----------------------------------------
# The helper must keep the field meanings, or every model test built on it proves nothing.


def test_build_packs_follows_field_semantics():
    rng = np.random.default_rng(0)
    groups = random_packs(rng, [[5], [3, 4], [2, 3, 3]], vocab_size=50)
    batch = build_packs(groups, seq_len=8, max_sequences=3, mlm_slots=6, rng=rng)
    assert batch["sequence_ids"].tolist() == [
        [1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 2, 2, 2, 2, 0],
        [1, 1, 2, 2, 2, 3, 3, 3],
    ]
    assert batch["position_ids"].tolist() == [
        [0, 1, 2, 3, 4, 0, 0, 0],
        [0, 1, 2, 0, 1, 2, 3, 0],
        [0, 1, 0, 1, 2, 0, 1, 2],
    ]
    assert batch["cls_positions"][:, :1].tolist() == [[0], [0], [0]]
    assert batch["cls_positions"][1, :2].tolist() == [0, 3]
    assert batch["cls_positions"][2].tolist() == [0, 2, 5]
    assert batch["nsp_labels"][0, 1:].tolist() == [IGNORE_INDEX, IGNORE_INDEX]
    for row, group in enumerate(groups):
        valid = batch["mlm_labels"][row] != IGNORE_INDEX
        assert int(valid.sum()) == sum(len(seq.mlm_positions) for seq in group)
        for k, seq in enumerate(group):  # unpacking by sequence_ids gives back each sequence
            tokens = batch["input_ids"][row][batch["sequence_ids"][row] == k + 1]
            assert tokens.tolist() == seq.input_ids.tolist()
        owners = batch["sequence_ids"][row][batch["mlm_positions"][row][valid]]
        assert (owners > 0).all()  # every MLM position lies inside a sequence, never on [CLS]
        assert (batch["position_ids"][row][batch["mlm_positions"][row][valid]] > 0).all()
