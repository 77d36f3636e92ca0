"""Pieces every runner shares: the batch fields, the step metrics, and counting what a batch holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Tuple

import torch

BATCH_FIELDS = (
    "input_ids",  # (B, S) int32
    "token_type_ids",  # (B, S)
    "position_ids",  # (B, S) restarting at 0 for every sequence of a pack
    "sequence_ids",  # (B, S) 1..K for the pack's sequences, 0 for padding
    "mlm_positions",  # (B, M) token index of each masked slot
    "mlm_labels",  # (B, M) original token id, -100 for unused slots
    "cls_positions",  # (B, K) token index of each sequence's [CLS]
    "nsp_labels",  # (B, K) 0/1, -100 for unused slots
)
"""Model inputs, in the order the model's forward takes them (legend: B packs, S tokens, M masked slots,
K sequences per pack)."""


@dataclass
class StepMetrics:
    loss: float
    mlm_loss: float
    nsp_loss: float
    mlm_accuracy: float
    nsp_accuracy: float
    sequences: int
    """Real sequences in the step, all replicas together."""
    tokens: int
    """Real (non-padding) tokens in the step, all replicas together."""
    optimizer_steps: int = 1
    """Optimizer steps this call ran (poptorch: device iterations)."""


def count_batch(batch: Mapping[str, torch.Tensor]) -> Tuple[int, int]:
    """(sequences, tokens) in a batch: NSP slots in use, and non-padding tokens."""
    sequences = int((torch.as_tensor(batch["nsp_labels"]) != -100).sum())
    tokens = int((torch.as_tensor(batch["sequence_ids"]) != 0).sum())
    return sequences, tokens
