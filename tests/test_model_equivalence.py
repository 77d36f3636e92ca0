"""Packed BERT equals transformers' BertForPreTraining run on each sequence alone (the paper's claim, proven).

Reference: transformers' own BertForPreTraining (eager attention), identical random weights, eval mode, fp32 and fp64,
run on the same sequences unpacked: one sequence per row, right-padded, with attention_mask. Its loss is
mean MLM cross-entropy over all masked tokens of the batch + mean NSP cross-entropy over its sequences: the
same means the packed model computes over a batch of packs. One backward on each, then every gradient.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model_fixtures import CONFIGS, FP64_ATOL, GRAD_ATOL, LOGIT_ATOL, LOSS_RTOL, SEQ_LEN, gather_reference, run_both


@pytest.mark.parametrize("attention", ["dense", "sdpa"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_packed_equals_unpacked_transformers(name, attention):
    reference, packed, groups, batch, hf_inputs = run_both(CONFIGS[name], attention)
    hf_out = reference(**hf_inputs)
    out = packed(**batch)

    mlm_valid = batch["mlm_labels"] != -100
    nsp_valid = batch["nsp_labels"] != -100
    mlm_ref, nsp_ref = gather_reference(groups, batch, hf_out, hf_inputs)
    assert int(mlm_valid.sum()) == int((hf_inputs["labels"] != -100).sum()) == int(out.mlm_count)
    assert int(nsp_valid.sum()) == len(hf_inputs["next_sentence_label"]) == int(out.nsp_count)

    # logits at the masked positions and per sequence
    mlm_diff = (out.mlm_logits[mlm_valid] - mlm_ref[mlm_valid]).abs().max().item()
    nsp_diff = (out.nsp_logits[nsp_valid] - nsp_ref[nsp_valid]).abs().max().item()
    assert mlm_diff <= LOGIT_ATOL, mlm_diff
    assert nsp_diff <= LOGIT_ATOL, nsp_diff

    # the same means: transformers' loss, and each half recomputed from its logits
    hf_labels = hf_inputs["labels"]
    ref_mlm_loss = F.cross_entropy(hf_out.prediction_logits[hf_labels != -100], hf_labels[hf_labels != -100])
    ref_nsp_loss = F.cross_entropy(hf_out.seq_relationship_logits, hf_inputs["next_sentence_label"])
    loss_rel = 0.0
    for ours, theirs in ((out.mlm_loss, ref_mlm_loss), (out.nsp_loss, ref_nsp_loss), (out.loss, hf_out.loss)):
        assert abs(ours.item() - theirs.item()) <= LOSS_RTOL * abs(theirs.item()), (ours.item(), theirs.item())
        loss_rel = max(loss_rel, abs(ours.item() - theirs.item()) / abs(theirs.item()))
    assert out.mlm_loss.item() > 0.5 and out.nsp_loss.item() > 0.05  # non-trivial values

    # one backward each: every parameter's gradient
    hf_out.loss.backward()
    out.loss.backward()
    theirs = dict(reference.named_parameters())
    ours = dict(packed.named_parameters())
    assert sorted(ours) == sorted(theirs)
    grad_diff = 0.0
    for param_name, param in ours.items():
        assert param.grad is not None, param_name
        diff = (param.grad - theirs[param_name].grad).abs().max().item()
        assert diff <= GRAD_ATOL, (param_name, diff)
        grad_diff = max(grad_diff, diff)
    print("fp32 %s %s: mlm logits %.1e, nsp logits %.1e, loss %.1e relative, gradients %.1e"
          % (name, attention, mlm_diff, nsp_diff, loss_rel, grad_diff))
    for name in ("bert.embeddings.position_embeddings.weight", "cls.predictions.bias", "bert.pooler.dense.weight"):
        assert ours[name].grad.abs().sum() > 0, name  # gradients are not trivially equal


@pytest.mark.parametrize("attention", ["dense", "sdpa"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_packed_equals_unpacked_transformers_fp64(name, attention):
    """The same comparison in float64: logits, the model's own losses and every gradient of its loss within
    1e-12 (measured ~1e-15). The losses stay float64 in a float64 model."""
    reference, packed, groups, batch, hf_inputs = run_both(CONFIGS[name], attention)
    reference.double()
    packed.double()
    hf_out = reference(**hf_inputs)
    out = packed(**batch)
    assert out.mlm_logits.dtype == out.nsp_logits.dtype == hf_out.prediction_logits.dtype == torch.float64
    for field in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "mlm_count", "nsp_count"):
        assert getattr(out, field).dtype == torch.float64, field

    mlm_valid = batch["mlm_labels"] != -100
    nsp_valid = batch["nsp_labels"] != -100
    mlm_ref, nsp_ref = gather_reference(groups, batch, hf_out, hf_inputs)
    hf_labels = hf_inputs["labels"]
    ref_mlm_loss = F.cross_entropy(hf_out.prediction_logits[hf_labels != -100], hf_labels[hf_labels != -100])
    ref_nsp_loss = F.cross_entropy(hf_out.seq_relationship_logits, hf_inputs["next_sentence_label"])
    diffs = {
        "mlm logits": (out.mlm_logits[mlm_valid] - mlm_ref[mlm_valid]).abs().max().item(),
        "nsp logits": (out.nsp_logits[nsp_valid] - nsp_ref[nsp_valid]).abs().max().item(),
        "mlm loss": abs(out.mlm_loss.item() - ref_mlm_loss.item()),
        "nsp loss": abs(out.nsp_loss.item() - ref_nsp_loss.item()),
        "loss": abs(out.loss.item() - hf_out.loss.item()),
    }

    hf_out.loss.backward()
    out.loss.backward()
    theirs = dict(reference.named_parameters())
    diffs["gradients"] = max(
        (param.grad - theirs[param_name].grad).abs().max().item() for param_name, param in packed.named_parameters()
    )
    print("fp64 %s %s: %s" % (name, attention, ", ".join("%s %.1e" % item for item in diffs.items())))
    for what, diff in diffs.items():
        assert diff <= FP64_ATOL, (what, diff)
    assert out.loss.item() > 0.5 and packed.bert.embeddings.position_embeddings.weight.grad.abs().sum() > 0


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_packed_equals_unpacked_flex():
    """FlexAttention path, forward only: torch has no FlexAttention backward on CPU (CUDA has one)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    reference, packed, groups, batch, hf_inputs = run_both(CONFIGS["L2-H2-d32-V97"], "flex")
    with torch.no_grad():
        hf_out = reference(**hf_inputs)
        out = packed(**batch)
    mlm_ref, nsp_ref = gather_reference(groups, batch, hf_out, hf_inputs)
    mlm_valid = batch["mlm_labels"] != -100
    nsp_valid = batch["nsp_labels"] != -100
    assert (out.mlm_logits[mlm_valid] - mlm_ref[mlm_valid]).abs().max().item() <= LOGIT_ATOL
    assert (out.nsp_logits[nsp_valid] - nsp_ref[nsp_valid]).abs().max().item() <= LOGIT_ATOL
    assert abs(out.loss.item() - hf_out.loss.item()) <= LOSS_RTOL * abs(hf_out.loss.item())


@pytest.mark.parametrize("variant", ["one block per pack", "positions not restarting"])
def test_plain_concatenation_differs(variant):
    """What the mask (and restarting positions) prevent: without them, multi-sequence packs see each other."""
    reference, packed, groups, batch, hf_inputs = run_both(CONFIGS["L2-H2-d32-V97"], "dense")
    with torch.no_grad():
        hf_out = reference(**hf_inputs)
        mlm_ref, nsp_ref = gather_reference(groups, batch, hf_out, hf_inputs)
        contaminated = dict(batch)
        if variant == "one block per pack":
            contaminated["sequence_ids"] = (batch["sequence_ids"] > 0).long()
        else:
            contaminated["position_ids"] = torch.arange(SEQ_LEN).expand_as(batch["position_ids"]).clone()
        right = packed(**batch)
        wrong = packed(**contaminated)
    multi = torch.tensor([len(group) > 1 for group in groups])  # packs holding more than one sequence
    mlm_valid = batch["mlm_labels"] != -100
    nsp_valid = batch["nsp_labels"] != -100
    ok_mlm = (right.mlm_logits - mlm_ref).abs()[mlm_valid].max().item()
    bad_mlm = (wrong.mlm_logits - mlm_ref).abs()[mlm_valid & multi[:, None]].max().item()
    bad_nsp = (wrong.nsp_logits - nsp_ref).abs()[nsp_valid & multi[:, None]].max().item()
    assert ok_mlm <= LOGIT_ATOL
    assert bad_mlm > 0.1 and bad_nsp > 0.01, (bad_mlm, bad_nsp)
    # the single-sequence pack is unaffected either way: the difference comes from the other sequences
    single = mlm_valid & ~multi[:, None]
    assert (wrong.mlm_logits - mlm_ref).abs()[single].max().item() <= LOGIT_ATOL
