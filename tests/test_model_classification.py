"""PackedBertForSequenceClassification equals transformers' BertForSequenceClassification run on each sequence
alone, for every problem type and every attention implementation.

Reference: transformers' own model (eager attention) with the packed model's weights, eval mode (no dropout),
run on each sequence of the packs alone: a batch of one, unpadded. Its per-sequence losses are combined as
transformers combines them over a batch of those sequences: the mean over sequences (for regression and
multi-label each sequence's loss is already the mean over its L labels, and every sequence has L, so this is
the per-element mean MSELoss / BCEWithLogitsLoss take over the batch). One backward on each side, then every
parameter's gradient.

Asserted, for the logits of every real sequence, the loss and every parameter's gradient:
max |ours - theirs| / max(1, max |theirs|) <= 1e-12 in float64 (mathematical equality: what is left is
rounding) and <= 1e-5 in float32 (absolute for values of order one, relative for larger ones). The packs
(tests/task_packs.py) hold 1 to 6 sequences of random lengths, full or ending in padding, and empty slots
whose labels hold junk (a random class, or NaN for float labels): they must never be read.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers

from ipu_packing.model import PackedBertForSequenceClassification
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

PROBLEMS = {
    "single_label": ("single_label_classification", 3),
    "regression_1": ("regression", 1),
    "regression_3": ("regression", 3),
    "multi_label": ("multi_label_classification", 4),
}
ATTENTIONS = ["dense", "sdpa", "varlen",
              pytest.param("flex", marks=pytest.mark.skipif(flex_missing() is not None, reason=str(flex_missing())))]
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}
FIELDS = ("input_ids", "token_type_ids", "position_ids", "sequence_ids", "cls_positions")
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def make_labels(problem, num_labels, groups, batch, rng, dtype):
    """(packed labels, transformers' labels of each real sequence in slots() order). Empty slots get junk."""
    count, width = batch["cls_positions"].shape
    if problem == "single_label_classification":
        labels = torch.as_tensor(rng.integers(0, num_labels, size=(count, width)), dtype=torch.long)
        return labels, [labels[b, k].view(1) for b, k, _ in slots(groups)]
    shape = (count, width) if num_labels == 1 else (count, width, num_labels)
    values = rng.normal(size=shape) * 2.0 if problem == "regression" else rng.integers(0, 2, size=shape)
    labels = torch.as_tensor(values, dtype=dtype)
    for b, group in enumerate(groups):
        labels[b, len(group):] = math.nan  # an empty slot's labels: never read
    return labels, [labels[b, k].reshape(1, -1) if num_labels > 1 else labels[b, k].view(1)
                    for b, k, _ in slots(groups)]


def fields(batch):
    return {k: batch[k] for k in FIELDS}


def compare(problem, num_labels, attention, dtype, seed=0, **config):
    """Run both models; return (measured differences, our output, the reference's per-sequence logits)."""
    reference, packed = twins(transformers.BertForSequenceClassification, PackedBertForSequenceClassification,
                              attention, seed, num_labels=num_labels, problem_type=problem, **config)
    reference.to(dtype)
    packed.to(dtype)
    fused = any(name.endswith("attention.self.qkv.weight") for name, _ in packed.named_parameters())
    assert fused is bool(config.get("fused_qkv", False))  # the layout under test is the one asked for
    groups, batch = task_packs(seed)
    labels, per_sequence = make_labels(problem, num_labels, groups, batch, np.random.default_rng(seed + 1), dtype)
    backward = attention != "flex" or flex_backward_missing() is None
    with torch.set_grad_enabled(backward):
        out = packed(**fields(batch), labels=labels)
        theirs = [reference(**alone(seq), labels=label) for (_, _, seq), label in zip(slots(groups), per_sequence)]
    reference_loss = torch.stack([o.loss for o in theirs]).mean()  # the mean over the batch's sequences

    assert out.logits.shape == batch["cls_positions"].shape + (num_labels,) and out.logits.dtype == dtype
    assert out.loss.dtype == out.count.dtype == out.accuracy.dtype == dtype
    assert int(out.count) == len(theirs)
    diffs = {
        "logits": max(scaled_difference(out.logits[b, k], o.logits[0]) for (b, k, _), o in zip(slots(groups), theirs)),
        "loss": scaled_difference(out.loss, reference_loss),
    }
    if backward:
        reference_loss.backward()
        out.loss.backward()
        gradients = gradient_differences(packed, reference)
        diffs["gradients"] = max(gradients.values())
        for name in ("classifier.weight", "bert.pooler.dense.weight", "bert.embeddings.position_embeddings.weight",
                     "bert.encoder.layer.0.attention.self.query.weight"):
            assert reference.get_parameter(name).grad.abs().sum() > 0, name  # not trivially equal
    return diffs, out, theirs, groups, labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_classifier_equals_transformers_on_each_sequence_alone(name, attention, dtype):
    problem, num_labels = PROBLEMS[name]
    diffs, out, theirs, groups, labels = compare(problem, num_labels, attention, dtype)
    print("%s %s %s: %s" % (name, attention, dtype, ", ".join("%s %.1e" % kv for kv in diffs.items())))
    for what, diff in diffs.items():
        assert diff <= TOLERANCE[dtype], (what, diff)
    assert out.loss.item() > 0.05  # a real loss
    # the accuracy of transformers' logits over the same sequences
    if problem == "single_label_classification":
        right = [int(o.logits[0].argmax() == labels[b, k]) for (b, k, _), o in zip(slots(groups), theirs)]
        assert out.accuracy.item() == pytest.approx(sum(right) / len(right), abs=1e-6)
    elif problem == "multi_label_classification":
        right = [((o.logits[0] > 0) == (labels[b, k] > 0.5)).double().mean().item()
                 for (b, k, _), o in zip(slots(groups), theirs)]
        assert out.accuracy.item() == pytest.approx(sum(right) / len(right), abs=1e-6)
    else:
        assert out.accuracy.item() == 0.0


@pytest.mark.parametrize("attention", ["dense", "varlen"])
def test_fused_qkv_and_gelu_new_classifier_equals_transformers(attention):
    """The fused query/key/value projection (config.fused_qkv) and another activation, float64."""
    diffs, _, _, _, _ = compare("single_label_classification", 5, attention, torch.float64, seed=3,
                                fused_qkv=True, hidden_act="gelu_new", num_attention_heads=4)
    print("fused gelu_new %s: %s" % (attention, ", ".join("%s %.1e" % kv for kv in diffs.items())))
    assert max(diffs.values()) <= TOLERANCE[torch.float64], diffs


@pytest.mark.parametrize("num_labels, label_kind, expected", [
    (1, "float", "regression"), (3, "int", "single_label_classification"),
    (3, "float", "multi_label_classification")])
def test_problem_type_none_is_chosen_as_transformers_chooses(num_labels, label_kind, expected):
    """config.problem_type None: num_labels 1 -> regression, integer labels -> single label, else multi
    label, and the same loss as transformers' model, which chooses by the same rule."""
    reference, packed = twins(transformers.BertForSequenceClassification, PackedBertForSequenceClassification,
                              "dense", 0, num_labels=num_labels)
    reference.double()
    packed.double()
    groups, batch = task_packs(5)
    rng = np.random.default_rng(5)
    count, width = batch["cls_positions"].shape
    if label_kind == "int":
        labels = torch.as_tensor(rng.integers(0, num_labels, size=(count, width)))
    else:
        labels = torch.as_tensor(rng.integers(0, 2, size=(count, width) if num_labels == 1 else
                                              (count, width, num_labels)), dtype=torch.float64)
    out = packed(**fields(batch), labels=labels)
    losses = []
    for b, k, seq in slots(groups):
        label = labels[b, k].view(1) if labels.dim() == 2 else labels[b, k].view(1, -1)
        losses.append(reference(**alone(seq), labels=label).loss)
    assert reference.config.problem_type == expected and packed.config.problem_type is None
    assert abs(out.loss.item() - torch.stack(losses).mean().item()) <= 1e-12


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_micro_batches_combine_exactly_by_count(name):
    """Loss and accuracy of a batch = the count-weighted mean of those of its halves (float64, 1e-12)."""
    problem, num_labels = PROBLEMS[name]
    _, packed = twins(transformers.BertForSequenceClassification, PackedBertForSequenceClassification, "dense", 0,
                      num_labels=num_labels, problem_type=problem)
    packed.double()
    groups, batch = task_packs(7, num_packs=6)
    labels, _ = make_labels(problem, num_labels, groups, batch, np.random.default_rng(7), torch.float64)
    if problem == "single_label_classification":
        labels[0, 0] = -100  # a real sequence without a label: not counted
    with torch.no_grad():
        whole = packed(**fields(batch), labels=labels)
        halves = [packed(**{k: v[part] for k, v in fields(batch).items()}, labels=labels[part])
                  for part in (slice(0, 3), slice(3, None))]
    counts = sum(h.count for h in halves)
    assert whole.count.item() == counts.item() == sum(len(g) for g in groups) - (problem.startswith("single"))
    for field in ("loss", "accuracy"):
        combined = sum(getattr(h, field) * h.count for h in halves) / counts
        assert abs(getattr(whole, field).item() - combined.item()) <= 1e-12, field


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_no_valid_sequence_gives_zero_loss_and_finite_zero_gradients(name):
    problem, num_labels = PROBLEMS[name]
    _, packed = twins(transformers.BertForSequenceClassification, PackedBertForSequenceClassification, "dense", 0,
                      num_labels=num_labels, problem_type=problem)
    groups, batch = task_packs(2)
    labels, _ = make_labels(problem, num_labels, groups, batch, np.random.default_rng(2), torch.float32)
    empty = fields(batch)
    empty["sequence_ids"] = torch.zeros_like(batch["sequence_ids"])  # packs of padding only
    if problem == "single_label_classification":
        labels = torch.full_like(labels, -100)
        empty = fields(batch)  # real sequences, none labelled
    out = packed(**empty, labels=labels)
    out.loss.backward()
    assert out.loss.item() == 0.0 and out.count.item() == 0.0 and out.accuracy.item() == 0.0
    for parameter_name, parameter in packed.named_parameters():
        assert torch.equal(parameter.grad, torch.zeros_like(parameter.grad)), parameter_name


def test_serving_without_labels_and_int32_fields():
    """No labels: logits and the number of sequences, no loss; int32 fields (as packs are read) give the
    same logits as int64."""
    _, packed = twins(transformers.BertForSequenceClassification, PackedBertForSequenceClassification, "dense", 0,
                      num_labels=3)
    groups, batch = task_packs(4)
    with torch.no_grad():
        out = packed(**fields(batch))
        narrow = packed(**{k: v.to(torch.int32) for k, v in fields(batch).items()})
    assert out.loss is None and out.accuracy is None
    assert out.count.item() == sum(len(g) for g in groups)
    assert torch.equal(out.logits, narrow.logits)


def test_autocast_bf16_losses_are_float32():
    _, packed = twins(transformers.BertForSequenceClassification, PackedBertForSequenceClassification, "dense", 0,
                      num_labels=4, problem_type="multi_label_classification")
    groups, batch = task_packs(1)
    labels, _ = make_labels("multi_label_classification", 4, groups, batch, np.random.default_rng(1), torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = packed(**fields(batch), labels=labels)
        exact = packed.float()(**fields(batch), labels=labels)
    assert out.logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    assert abs(out.loss.item() - exact.loss.item()) < 0.05


def test_refusals_name_the_cause():
    config = dict(num_hidden_layers=1, num_attention_heads=2, hidden_size=8, vocab_size=20, intermediate_size=8)
    odd = transformers.BertConfig(**config)
    odd.problem_type = "ranking"  # transformers checks it in the constructor only
    with pytest.raises(ValueError, match="problem_type must be one of"):
        PackedBertForSequenceClassification(odd)
    with pytest.raises(ValueError, match="num_labels must be at least 1"):
        PackedBertForSequenceClassification(transformers.BertConfig(num_labels=0, **config))
    _, packed = twins(transformers.BertForSequenceClassification, PackedBertForSequenceClassification, "dense", 0,
                      num_labels=3, problem_type="regression")
    _, batch = task_packs(0)
    with pytest.raises(ValueError, match=r"regression labels must be \(B, K, num_labels\)"):
        packed(**fields(batch), labels=torch.zeros(batch["cls_positions"].shape))


@pytest.mark.parametrize("classifier_dropout, expected", [(None, 0.1), (0.3, 0.3)])
def test_dropout_before_the_classifier_is_transformers_choice(classifier_dropout, expected):
    """classifier_dropout when set, else hidden_dropout_prob (transformers' rule), and active in training."""
    config = dict(hidden_dropout_prob=0.1, classifier_dropout=classifier_dropout, num_labels=2)
    reference, packed = twins(transformers.BertForSequenceClassification, PackedBertForSequenceClassification,
                              "dense", 0, **config)
    assert packed.dropout.p == reference.dropout.p == expected
    _, batch = task_packs(0)
    packed.train()
    torch.manual_seed(0)
    first = packed(**fields(batch)).logits
    assert not torch.equal(first, packed(**fields(batch)).logits)  # dropout draws anew each call
