"""Synthetic packed batches for execution checks (shape, compile and equivalence checks; never training data).

Packs of random instances (data/random_instances.py) in the pack format of data/format.py (fields and
meanings are defined there), laid out by its reference builder (data/reference.py). The padded baseline
is the same thing with K = 1; ``trim_to_longest`` turns a batch of those into the "pad to the longest
sequence in the batch" layout whose shape changes from batch to batch.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from ipu_packing.data.format import TOKEN_FIELDS
from ipu_packing.data.random_instances import random_packs


def synthetic_packs(
    num_packs: int,
    seq_len: int,
    max_sequences_per_pack: int,
    max_masked: int,
    vocab_size: int,
    rng: np.random.Generator,
    min_sequence_length: int = 8,
) -> List[Dict[str, np.ndarray]]:
    """``num_packs`` packs of random instances (data/random_instances.py's rule); S = ``seq_len``,
    K = ``max_sequences_per_pack``, M = ``max_masked`` MLM slots (a pack keeps its first M predictions)."""
    S, K = seq_len, max_sequences_per_pack
    groups = []
    for _ in range(num_packs):
        k = int(rng.integers(1, K + 1))
        # Sequence lengths: random, at least min_sequence_length, all fitting in S together.
        budget = S - min_sequence_length * k
        cuts = np.sort(rng.integers(0, budget + 1, size=k))
        extra = np.diff(np.concatenate([[0], cuts]))
        groups.append((extra + min_sequence_length).astype(int).tolist())
    records = random_packs(rng, groups, S, K, vocab_size, M=max_masked)
    return [{name: np.array(record[name]) for name in record.dtype.names} for record in records]


def collate(packs: List[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    """Stack packs into a batch: (B, S), (B, M), (B, K)."""
    return {k: np.stack([p[k] for p in packs]) for k in packs[0]}


def trim_to_longest(batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The padded, unpacked alternative: cut the token axis to the longest real sequence in the batch."""
    longest = int((batch["sequence_ids"] != 0).sum(1).max())
    out = dict(batch)
    for k in TOKEN_FIELDS:
        out[k] = batch[k][:, :longest]
    return out


class PackDataset:
    """A list of packs as a map-style dataset (items are dicts of numpy arrays)."""

    def __init__(self, packs: List[Dict[str, np.ndarray]]) -> None:
        self.packs = packs

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, i: int) -> Dict[str, np.ndarray]:
        return self.packs[i]
