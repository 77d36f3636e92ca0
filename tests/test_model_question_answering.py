"""PackedBertForQuestionAnswering equals transformers' BertForQuestionAnswering run on each sequence (window)
alone, for every attention implementation; each sequence's softmax runs over its own positions only.

Reference: transformers' own model (eager attention) with the packed model's weights, eval mode, run on each
window alone (a batch of one, unpadded) with its start/end positions relative to its [CLS]; its per-window
losses (CE(start) + CE(end)) / 2 averaged over the windows, which is transformers' loss over a batch of those
windows when every window has both labels. One backward on each side, then every parameter's gradient.

Asserted for the start/end logits of every window (at its own positions), both losses, the loss and every
parameter's gradient: max |ours - theirs| / max(1, max |theirs|) <= 1e-12 in float64 and <= 1e-5 in float32.
Every other position of a slot's row holds the dtype's most negative finite value, exactly. The packs
(tests/task_packs.py) hold 1 to 6 windows of random lengths with padding and empty slots, whose labels hold
junk positions (inside other windows, in padding or out of the row): they must never count.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers

from ipu_packing.model import PackedBertForQuestionAnswering
from ipu_packing.model.question_answering import excluded_value
from task_packs import (
    alone,
    flex_backward_missing,
    flex_missing,
    gradient_differences,
    scaled_difference,
    slots,
    task_packs,
    twins,
)

ATTENTIONS = ["dense", "sdpa", "varlen",
              pytest.param("flex", marks=pytest.mark.skipif(flex_missing() is not None, reason=str(flex_missing())))]
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}
FIELDS = ("input_ids", "token_type_ids", "position_ids", "sequence_ids")
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def fields(batch):
    return {k: batch[k] for k in FIELDS}


def make_positions(groups, batch, rng):
    """(start, end) (B, K) row positions, and each window's (start, end) relative to its [CLS]. Empty slots:
    random junk in [-200, 200) (other windows, padding, outside the row)."""
    shape = batch["cls_positions"].shape
    start = torch.as_tensor(rng.integers(-200, 200, size=shape))
    end = torch.as_tensor(rng.integers(-200, 200, size=shape))
    relative = []
    for b, k, seq in slots(groups):
        first = int(batch["cls_positions"][b, k])
        s, e = (int(x) for x in rng.integers(0, len(seq), size=2))
        start[b, k], end[b, k] = first + s, first + e
        relative.append((torch.tensor([s]), torch.tensor([e])))
    return start, end, relative


def qa_twins(attention, dtype, seed=0, **config):
    reference, packed = twins(transformers.BertForQuestionAnswering, PackedBertForQuestionAnswering, attention, seed,
                              **config)
    return reference.to(dtype), packed.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_qa_equals_transformers_on_each_window_alone(attention, dtype):
    reference, packed = qa_twins(attention, dtype)
    groups, batch = task_packs(11)
    start, end, relative = make_positions(groups, batch, np.random.default_rng(11))
    backward = attention != "flex" or flex_backward_missing() is None
    with torch.set_grad_enabled(backward):
        out = packed(**fields(batch), start_positions=start, end_positions=end)
        theirs = [reference(**alone(seq), start_positions=s, end_positions=e)
                  for (_, _, seq), (s, e) in zip(slots(groups), relative)]
    count = len(theirs)
    reference_loss = torch.stack([o.loss for o in theirs]).mean()
    start_loss = sum(F.cross_entropy(o.start_logits, s) for o, (s, _) in zip(theirs, relative)) / count
    end_loss = sum(F.cross_entropy(o.end_logits, e) for o, (_, e) in zip(theirs, relative)) / count

    rows = batch["cls_positions"].shape + (batch["input_ids"].shape[1],)  # (B, K, S)
    assert out.start_logits.shape == out.end_logits.shape == rows
    assert out.token_start_logits.shape == batch["input_ids"].shape
    assert out.loss.dtype == out.start_count.dtype == dtype and out.start_logits.dtype == dtype
    assert int(out.start_count) == int(out.end_count) == count
    diffs = {"start logits": 0.0, "end logits": 0.0, "token logits": 0.0}
    floor = excluded_value(dtype)
    for (b, k, seq), o in zip(slots(groups), theirs):
        own = batch["sequence_ids"][b] == k + 1
        for key, ours, token, ref in (("start logits", out.start_logits, out.token_start_logits, o.start_logits),
                                      ("end logits", out.end_logits, out.token_end_logits, o.end_logits)):
            diffs[key] = max(diffs[key], scaled_difference(ours[b, k][own], ref[0]))
            diffs["token logits"] = max(diffs["token logits"], scaled_difference(token[b][own], ref[0]))
            assert (ours[b, k][~own] == floor).all()  # every other position excluded, with the finite floor
    for b, group in enumerate(groups):
        assert (out.start_logits[b, len(group):] == floor).all()  # empty slots: nothing of their own
    diffs["start loss"] = scaled_difference(out.start_loss, start_loss)
    diffs["end loss"] = scaled_difference(out.end_loss, end_loss)
    diffs["loss"] = scaled_difference(out.loss, reference_loss)
    if backward:
        reference_loss.backward()
        out.loss.backward()
        diffs["gradients"] = max(gradient_differences(packed, reference).values())
        for name in ("qa_outputs.weight", "qa_outputs.bias", "bert.embeddings.position_embeddings.weight"):
            assert reference.get_parameter(name).grad.abs().sum() > 0, name
    print("qa %s %s: %s" % (attention, dtype, ", ".join("%s %.1e" % kv for kv in diffs.items())))
    for what, diff in diffs.items():
        assert diff <= TOLERANCE[dtype], (what, diff)
    assert out.loss.item() > 0.5


def test_fused_qkv_qa_equals_transformers():
    reference, packed = qa_twins("dense", torch.float64, seed=4, fused_qkv=True)
    assert "bert.encoder.layer.0.attention.self.qkv.weight" in dict(packed.named_parameters())
    groups, batch = task_packs(4)
    start, end, relative = make_positions(groups, batch, np.random.default_rng(4))
    out = packed(**fields(batch), start_positions=start, end_positions=end)
    theirs = [reference(**alone(seq), start_positions=s, end_positions=e).loss
              for (_, _, seq), (s, e) in zip(slots(groups), relative)]
    reference_loss = torch.stack(theirs).mean()
    reference_loss.backward()
    out.loss.backward()
    assert scaled_difference(out.loss, reference_loss) <= 1e-12
    assert max(gradient_differences(packed, reference).values()) <= 1e-12


def crafted_pack(dtype):
    """One pack of two windows and padding; a hook on the last layer adds a large multiple of qa_outputs'
    start and end directions to window 2's hidden states only, so window 2's tokens score far above window
    1's. Only window 1 is labelled."""
    reference, packed = qa_twins("dense", dtype, seed=2)
    groups, batch = task_packs(2, lengths=[[9, 12]])
    window_2 = batch["sequence_ids"] == 2  # (1, S)
    direction = packed.qa_outputs.weight.detach().sum(0)  # raises the start and the end logit alike

    def lift(module, inputs, output):
        return output + 500.0 * window_2.unsqueeze(-1).to(output.dtype) * direction / direction.norm()

    packed.bert.encoder.layer[-1].register_forward_hook(lift)
    first = int(batch["cls_positions"][0, 0])
    start = torch.tensor([[first + 3, -100]])
    end = torch.tensor([[first + 6, -100]])
    return reference, packed, groups, batch, start, end


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_another_window_scoring_far_higher_leaves_a_window_s_loss_unchanged(dtype):
    reference, packed, groups, batch, start, end = crafted_pack(dtype)
    out = packed(**fields(batch), start_positions=start, end_positions=end)
    own_1, own_2 = (batch["sequence_ids"][0] == 1), (batch["sequence_ids"][0] == 2)
    alone_out = reference(**alone(groups[0][0]), start_positions=torch.tensor([3]), end_positions=torch.tensor([6]))
    tolerance = TOLERANCE[dtype]
    for token, ours, theirs in ((out.token_start_logits, out.start_logits, alone_out.start_logits),
                                (out.token_end_logits, out.end_logits, alone_out.end_logits)):
        gap = token[0][own_2].min() - token[0][own_1].max()
        assert gap > 100, gap.item()  # window 2's every token above window 1's best by e^100
        log_probabilities = torch.log_softmax(ours[0, 0], -1)[own_1]  # window 1's, over the row
        assert scaled_difference(log_probabilities, torch.log_softmax(theirs[0], -1)) <= tolerance
    assert scaled_difference(out.loss, alone_out.loss) <= tolerance
    assert int(out.start_count) == int(out.end_count) == 1
    # What the exclusion prevents: a softmax over the whole row puts window 1's label e^-100 below window 2.
    whole_row = F.cross_entropy(out.token_start_logits[0:1], start[0, :1])
    assert whole_row.item() > 100 * alone_out.loss.item()


def test_labels_outside_their_own_window_are_ignored_and_counted_out():
    """A position in another window, in padding or beyond the row is ignored (transformers ignores a position
    past its window's end); start and end are counted apart, and each loss is the mean over its valid ones."""
    _, packed = qa_twins("dense", torch.float64)
    groups, batch = task_packs(6)
    start, end, _ = make_positions(groups, batch, np.random.default_rng(6))
    out = packed(**fields(batch), start_positions=start, end_positions=end)
    moved = start.clone()
    real = [(b, k) for b, k, _ in slots(groups)]
    (b0, k0), (b1, k1) = real[0], real[-1]
    moved[b0, k0] = int(batch["cls_positions"][b0, k0]) + len(groups[b0][k0])  # the next window or padding
    moved[b1, k1] = 10 ** 6  # beyond the row
    changed = packed(**fields(batch), start_positions=moved, end_positions=end)
    assert int(changed.start_count) == int(out.start_count) - 2 and int(changed.end_count) == int(out.end_count)
    keep = torch.zeros_like(start, dtype=torch.bool)
    for b, k in real[1:-1]:
        keep[b, k] = True
    expected = F.cross_entropy(out.start_logits[keep], start[keep])
    assert abs(changed.start_loss.item() - expected.item()) <= 1e-12
    assert changed.end_loss.item() == out.end_loss.item()


def test_micro_batches_combine_exactly_by_count():
    _, packed = qa_twins("dense", torch.float64)
    groups, batch = task_packs(8)
    start, end, _ = make_positions(groups, batch, np.random.default_rng(8))
    with torch.no_grad():
        whole = packed(**fields(batch), start_positions=start, end_positions=end)
        halves = [packed(**{k: v[part] for k, v in fields(batch).items()}, start_positions=start[part],
                         end_positions=end[part]) for part in (slice(0, 3), slice(3, None))]
    for side in ("start", "end"):
        counts = sum(getattr(h, side + "_count") for h in halves)
        for field in ("loss", "accuracy"):
            combined = sum(getattr(h, "%s_%s" % (side, field)) * getattr(h, side + "_count") for h in halves) / counts
            assert abs(getattr(whole, "%s_%s" % (side, field)).item() - combined.item()) <= 1e-12, (side, field)


def test_no_valid_label_gives_zero_loss_finite_logits_and_zero_gradients():
    _, packed = qa_twins("dense", torch.float32)
    groups, batch = task_packs(3)
    ignore = torch.full_like(batch["cls_positions"], -100)
    out = packed(**fields(batch), start_positions=ignore, end_positions=ignore)
    out.loss.backward()
    assert out.loss.item() == 0.0 and out.start_count.item() == 0.0 and out.end_count.item() == 0.0
    assert torch.isfinite(out.start_logits).all() and torch.isfinite(out.end_logits).all()
    for name, parameter in packed.named_parameters():
        assert torch.equal(parameter.grad, torch.zeros_like(parameter.grad)), name


def test_serving_without_labels():
    _, packed = qa_twins("dense", torch.float32)
    groups, batch = task_packs(3)
    with torch.no_grad():
        out = packed(**fields(batch), num_slots=batch["cls_positions"].shape[1])
    assert out.loss is None and out.start_count is None
    assert out.start_logits.shape == batch["cls_positions"].shape + (batch["input_ids"].shape[1],)
    with pytest.raises(ValueError, match="give num_slots"):
        packed(**fields(batch))
    with pytest.raises(ValueError, match="num_labels must be 2"):
        PackedBertForQuestionAnswering(transformers.BertConfig(num_labels=3, hidden_size=8, num_attention_heads=2,
                                                               num_hidden_layers=1, intermediate_size=8))
