"""Graphcore's half-precision memory choices in the model: the dense attention mask in the model's dtype (fp16
for a ``.half()`` model, as transformers builds the mask of Graphcore's ``.half()`` model), and the MLM loss
taken from fp16 logits without an fp32 copy of them. The fp32 and fp64 paths must not change at all."""

from __future__ import annotations

import pytest
import torch

from ipu_packing.model.attention import MASK_VALUE, attend, dense_mask
from test_model import model_for, tiny_batch

HALF_KERNELS = "torch %s has no CPU kernel for this half-precision op" % torch.__version__


def _cpu_half_or_skip(fn):
    """Run ``fn``; skip (naming the torch version) where this torch has no CPU half kernels (torch < 2.1)."""
    try:
        return fn()
    except RuntimeError as error:
        if "Half" in str(error) and "not implemented" in str(error):
            pytest.skip("%s: %s" % (HALF_KERNELS, error))
        raise


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dense_mask_is_built_in_the_model_dtype_with_the_values_of_the_fp32_mask(dtype):
    model = model_for().to(dtype)
    sequence_ids = tiny_batch()["sequence_ids"]
    mask = model.bert.get_attention_mask(sequence_ids)
    assert mask.dtype == dtype
    assert mask.shape == (3, 1, 16, 16)
    # the numbers attend used to add: the fp32 mask cast to the scores' dtype in every layer
    assert torch.equal(mask, dense_mask(sequence_ids).to(dtype))
    assert dense_mask(sequence_ids).dtype == torch.float32  # the default stays fp32


def test_an_fp16_mask_has_half_the_bytes_of_the_fp32_one():
    sequence_ids = tiny_batch()["sequence_ids"]
    half = model_for().half().bert.get_attention_mask(sequence_ids)
    full = model_for().bert.get_attention_mask(sequence_ids)
    assert half.element_size() * half.numel() * 2 == full.element_size() * full.numel() == 3 * 16 * 16 * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fp32_and_fp64_models_give_bit_identical_outputs_and_gradients_to_the_fp32_mask(dtype):
    """The model with its own mask against the same layers fed the fp32 mask (what the model built before)."""
    model = model_for().to(dtype)
    batch = tiny_batch()
    out = model(**batch)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    h = model.bert.embeddings(batch["input_ids"], batch["token_type_ids"], batch["position_ids"])
    for layer in model.bert.encoder.layer:
        h = layer(h, dense_mask(batch["sequence_ids"]))
    old = model.pretraining_heads(h, batch["mlm_positions"], batch["mlm_labels"], batch["cls_positions"],
                                  batch["nsp_labels"])
    old.loss.backward()
    for name in out._fields:
        assert torch.equal(getattr(out, name), getattr(old, name)), name
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, grads[name]), name


def test_fp16_softmax_under_the_fp16_mask_is_exact_at_masked_keys_and_is_the_softmax_of_each_sequence():
    """Scores as large as 1000 in magnitude (attention scores are O(10)): every masked probability is exactly 0,
    every sum stays finite, and each row equals the softmax over its own sequence's keys alone."""
    sequence_ids = torch.tensor([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    mask = dense_mask(sequence_ids, torch.float16)  # (B, 1, S, S)
    generator = torch.Generator().manual_seed(0)
    for scale in (3.0, 30.0, 1000.0):
        scores = (scale * torch.randn(2, 4, 8, 8, generator=generator)).half()  # (B, N, S, S)
        summed = scores + mask
        assert torch.isfinite(summed).all() and summed.dtype == torch.float16
        probs = _cpu_half_or_skip(lambda: torch.softmax(summed, dim=-1))
        allowed = (mask == 0).expand_as(probs)
        assert (probs[~allowed] == 0).all()
        for b in range(2):
            for q in range(8):
                keys = (sequence_ids[b] == sequence_ids[b, q]).nonzero().squeeze(1)
                alone = torch.softmax(scores[b, :, q, keys].float(), dim=-1)  # (N, keys)
                assert (probs[b, :, q, keys].float() - alone).abs().max().item() <= 1e-3, (scale, b, q)


def test_half_model_attention_matches_the_fp32_mask_cast_in_each_layer():
    """A .half() model's attention with its fp16 mask gives bit for bit what the fp32 mask, cast to the scores'
    dtype in every layer (the old path), gave."""
    sequence_ids = tiny_batch()["sequence_ids"]
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 2, 16, 8, generator=generator).half() for _ in range(3))
    dropout = torch.nn.Dropout(0.0)
    new = _cpu_half_or_skip(lambda: attend("dense", q, k, v, dense_mask(sequence_ids, torch.float16), dropout))
    old = attend("dense", q, k, v, dense_mask(sequence_ids), dropout)
    assert new.dtype == torch.float16 and torch.equal(new, old)


def test_mask_value_is_exact_in_fp16_and_a_score_plus_it_stays_finite():
    assert torch.tensor(MASK_VALUE, dtype=torch.float16).item() == MASK_VALUE == -10000.0
    scores = torch.tensor([-55488.0, -1000.0, 0.0, 1000.0, 65504.0], dtype=torch.float16)
    assert torch.isfinite(scores + torch.tensor(MASK_VALUE, dtype=torch.float16)).all()
    # the alternative transformers uses today, finfo.min, overflows for a score of -16
    assert torch.isinf(torch.tensor(-16.0, dtype=torch.float16) + torch.finfo(torch.float16).min)
