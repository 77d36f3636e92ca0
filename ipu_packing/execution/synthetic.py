"""Synthetic packed batches for execution checks (shape, compile and equivalence checks; never training data).

Packs of random sequences in the pack format of data/format.py (fields and meanings are defined
there), laid out by its reference builder. The padded baseline is the same thing with K = 1;
``trim_to_longest`` turns a batch of those into the "pad to the longest sequence in the batch"
layout whose shape changes from batch to batch.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from ..data.format import CLS_ID, FIRST_WORD_ID, MASK_ID, SEP_ID, TOKEN_FIELDS
from ..data.reference import Instance, pack_sequences


def synthetic_packs(
    num_packs: int,
    seq_len: int,
    max_sequences_per_pack: int,
    max_masked: int,
    vocab_size: int,
    rng: np.random.Generator,
    min_sequence_length: int = 8,
) -> List[Dict[str, np.ndarray]]:
    """``num_packs`` packs of random sequences; S = ``seq_len``, K = ``max_sequences_per_pack``,
    M = ``max_masked`` MLM slots (a pack keeps its first M masked positions)."""
    if vocab_size <= FIRST_WORD_ID:
        raise ValueError("vocab_size must exceed %d" % FIRST_WORD_ID)
    packs = []
    S, K, M = seq_len, max_sequences_per_pack, max_masked
    for _ in range(num_packs):
        k = int(rng.integers(1, K + 1))
        # Sequence lengths: random, at least min_sequence_length, all fitting in S together.
        budget = S - min_sequence_length * k
        cuts = np.sort(rng.integers(0, budget + 1, size=k))
        extra = np.diff(np.concatenate([[0], cuts]))
        lengths = (extra + min_sequence_length).astype(int)
        drawn, masked = [], []
        for n in lengths:
            tokens = rng.integers(FIRST_WORD_ID, vocab_size, size=n)
            tokens[0] = CLS_ID
            tokens[n // 2] = SEP_ID
            tokens[-1] = SEP_ID
            nsp = int(rng.integers(0, 2))
            candidates = [i for i in range(1, n) if tokens[i] != SEP_ID]
            want = max(1, int(round(0.15 * n)))
            chosen = rng.choice(candidates, size=min(want, len(candidates)), replace=False)
            masked.append(np.sort(chosen))
            drawn.append((tokens, nsp))
        # The pack keeps its first M masked positions, in pack order.
        keep = M
        sequences = []
        for (tokens, nsp), positions in zip(drawn, masked):
            positions = positions[:max(0, keep)]
            keep -= len(positions)
            labels = tokens[positions].copy()
            tokens[positions] = MASK_ID
            types = (np.arange(len(tokens)) > len(tokens) // 2).astype(np.int64)
            sequences.append(Instance(tokens, types, positions, labels, nsp))
        record = pack_sequences([sequences], S, K, M)[0]
        packs.append({name: np.array(record[name]) for name in record.dtype.names})
    return packs


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
