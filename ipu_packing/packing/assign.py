"""Assignment of real sequences to the packs of a plan.

PLACEHOLDER implementation with the final API: the packing work replaces the internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .plan import PackingPlan


def histogram_from_lengths(lengths, max_sequence_length: int) -> np.ndarray:
    """(S,) int64 histogram; bin i counts sequences of length i + 1."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.bincount(lengths - 1, minlength=max_sequence_length).astype(np.int64)


@dataclass(frozen=True)
class PackAssignment:
    """Packs as groups of sequence indices, stored flat (CSR).

    Pack p holds indices[offsets[p]:offsets[p + 1]], longest first.
    """

    indices: np.ndarray  # (N,) int64, every sequence index exactly once
    offsets: np.ndarray  # (P + 1,) int64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, p: int) -> np.ndarray:
        return self.indices[self.offsets[p] : self.offsets[p + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        for p in range(len(self)):
            yield self[p]


def assign_sequences(plan: PackingPlan, lengths, seed: int) -> PackAssignment:
    """Place each real sequence (by index into `lengths`) into a pack of the plan."""
    lengths = np.asarray(lengths, dtype=np.int64)
    rng = np.random.default_rng(seed)
    by_length = {}
    for length in range(1, plan.max_sequence_length + 1):
        idx = np.flatnonzero(lengths == length)
        rng.shuffle(idx)
        by_length[length] = list(idx)
    groups = []
    for strategy, repeat in zip(plan.strategies, plan.repeats):
        for _ in range(int(repeat)):
            groups.append([by_length[length].pop() for length in strategy])
    offsets = np.zeros(len(groups) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(g) for g in groups])
    indices = np.array([i for g in groups for i in g], dtype=np.int64)
    return PackAssignment(indices=indices, offsets=offsets)
