"""Pieces every runner shares: the batch fields, the step metrics, and counting what a batch holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Tuple

import torch

from ..data.format import FIELDS, IGNORE_INDEX

BATCH_FIELDS = FIELDS  # model inputs in forward's order; shapes and meanings: data/format.py


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
    sequences = int((torch.as_tensor(batch["nsp_labels"]) != IGNORE_INDEX).sum())
    tokens = int((torch.as_tensor(batch["sequence_ids"]) != 0).sum())
    return sequences, tokens
