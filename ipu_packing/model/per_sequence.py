"""Per-slot pieces every head shares (pretraining, classification, question answering): the gather at slot
positions, which sequence slots of a pack are real, and the losses over the valid slots.

Per-sequence tensors from ``sequence_ids`` (B, S), for K sequence slots:

    slots_in_use(sequence_ids, K)     # (B, K) bool: slot k holds a sequence, k < max(sequence_ids) of its row
    slot_membership(sequence_ids, K)  # (B, K, S) bool: token s belongs to sequence k + 1

Both come from a field every pack has, as the pack format numbers the sequences of a row 1..n with no gap
(data/format.py). ``cls_positions`` cannot say it (its unused value, 0, is also sequence 1's [CLS]).

Every op here is in PopTorch's supported-ops list (tests/assets/poptorch_supported_ops.txt): gathers, not
boolean indexing, and no shape that depends on the data.

Shape legend: B packs, S tokens per pack, P slots (MLM or sequence slots), K sequence slots, H hidden size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..data.format import IGNORE_INDEX  # the pack format's label of an unused slot (numpy only)


def gather_positions(h: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """h (B, S, H) at positions (B, P) -> (B, P, H); invalid slots read position 0 (never out of range)."""
    index = torch.where(valid, positions.long(), torch.zeros_like(positions, dtype=torch.long))
    return torch.gather(h, 1, index.unsqueeze(-1).expand(-1, -1, h.shape[-1]))


def loss_dtype(logits: torch.Tensor) -> torch.dtype:
    """Losses, accuracies and counts: float32 for fp16/bf16 logits (a half-precision sum of thousands of
    losses, or a count above 2048, would round), else the logits' dtype (float64 stays float64)."""
    return torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype


def mean_loss_and_accuracy(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, groups: int = 1):
    """Mean cross-entropy and accuracy over valid slots (0 when none) and their count: scalars in
    ``loss_dtype(logits)``. ``groups`` > 1 (the rows of ``groups`` micro batches of a step in one pass, in order,
    the same number of rows each): each group's mean over its own valid slots, then the mean of the groups'
    (``group_means``), which is what a step accumulating those micro batches one by one computes.

    fp16/bf16 logits: each slot's loss is taken in the logits' dtype and only those (B*M,) losses are cast to
    float32 and summed, so no float32 copy of the (B*M, V) logits (nor a float32 log-softmax of them, kept
    for the backward) is made; Graphcore's app also takes F.cross_entropy of its fp16 logits
    (nlp/bert/pytorch/modeling.py:302-304). Each slot's loss rounds to its dtype (fp16: 2**-11 relative);
    docs/model.md gives the measured difference. Under torch.autocast, cross_entropy runs in float32 anyway
    (autocast's own cast). float32/float64 logits: one summed cross_entropy, as before."""
    half = logits.dtype in (torch.float16, torch.bfloat16)
    dtype = loss_dtype(logits)
    if groups > 1:
        flat, targets = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
        per_slot = F.cross_entropy(flat, targets, ignore_index=IGNORE_INDEX, reduction="none").to(dtype)
        correct = ((logits.argmax(dim=-1) == labels) & valid).to(dtype)
        counts = group_sums(valid.to(dtype), groups)
        return (group_means(group_sums(per_slot.view(valid.shape), groups), counts),
                group_means(group_sums(correct, groups), counts), counts.sum())
    count = valid.sum().to(dtype)
    denominator = count.clamp(min=1.0)
    flat, targets = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    if half:
        per_slot = F.cross_entropy(flat, targets, ignore_index=IGNORE_INDEX, reduction="none")  # (B*M,), 0 if unused
        loss_sum = per_slot.to(dtype).sum()
    else:
        loss_sum = F.cross_entropy(flat, targets, ignore_index=IGNORE_INDEX, reduction="sum")
    correct = (logits.argmax(dim=-1) == labels) & valid
    return loss_sum / denominator, correct.sum().to(dtype) / denominator, count


def group_sums(values: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, ...) -> (groups,): the sum of each group's rows, the B rows split in ``groups`` consecutive groups of
    B / groups rows (the micro batches of a pass)."""
    return values.reshape(groups, -1).sum(dim=-1)


def group_means(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """() the mean over groups of each group's mean, ``sums / counts`` (0 for a group with nothing counted)."""
    return (sums / counts.clamp(min=1.0)).mean()


def slots_in_use(sequence_ids: torch.Tensor, num_slots: int) -> torch.Tensor:
    """(B, S) sequence ids -> (B, K) bool, True where slot k (0-based) holds a sequence of its pack."""
    count = sequence_ids.amax(dim=-1, keepdim=True).long()  # (B, 1) sequences in the pack
    slots = torch.arange(num_slots, device=sequence_ids.device)  # (K,)
    return slots.unsqueeze(0) < count  # (B, K)


def slot_membership(sequence_ids: torch.Tensor, num_slots: int) -> torch.Tensor:
    """(B, S) sequence ids -> (B, K, S) bool, True where token s belongs to the sequence of slot k."""
    ids = torch.arange(1, num_slots + 1, device=sequence_ids.device)  # (K,) the 1-based sequence ids
    return sequence_ids.long().unsqueeze(1) == ids.view(1, -1, 1)  # (B, K, S)


def squared_error(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Element-wise (x - y)^2, torch.nn.MSELoss's term."""
    return (logits - labels) ** 2


def binary_cross_entropy_with_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Element-wise BCE of sigmoid(x) against y, in the stable form torch's BCEWithLogitsLoss takes:
    (1 - y) x + log(1 + exp(-x)) with log(1 + exp(-x)) = relu(-x) + log1p(exp(-|x|)). Written out in ops
    PopTorch lists (relu, abs, exp, log1p), as one aten kernel would not pass its supported-ops check."""
    return (1.0 - labels) * logits + F.relu(-logits) + torch.log1p(torch.exp(-logits.abs()))


__all__ = [
    "binary_cross_entropy_with_logits",
    "gather_positions",
    "group_means",
    "group_sums",
    "loss_dtype",
    "mean_loss_and_accuracy",
    "slot_membership",
    "slots_in_use",
    "squared_error",
]
