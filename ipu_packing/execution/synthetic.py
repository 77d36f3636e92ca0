"""Synthetic packed batches for execution checks (shape, compile and equivalence checks; never training data).

A pack is a row of S tokens holding up to K sequences back to back; ``sequence_ids`` numbers them 1..K and
marks padding 0, ``position_ids`` restart at 0 for every sequence, each sequence has one [CLS] slot for NSP
and its masked tokens take MLM slots. Unused MLM/NSP slots have label -100 and position 0. The padded
baseline is the same thing with K = 1; ``trim_to_longest`` turns a batch of those into the
"pad to the longest sequence in the batch" layout whose shape changes from batch to batch.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np

CLS_ID = 2
SEP_ID = 3
MASK_ID = 4
FIRST_WORD_ID = 5


def synthetic_packs(
    num_packs: int,
    seq_len: int,
    max_sequences_per_pack: int,
    max_masked: int,
    vocab_size: int,
    rng: np.random.Generator,
    min_sequence_length: int = 8,
) -> List[Dict[str, np.ndarray]]:
    """``num_packs`` packs of random sequences; M = ``max_masked`` MLM slots, K = ``max_sequences_per_pack``."""
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
        pack = {
            "input_ids": np.zeros(S, np.int32),
            "token_type_ids": np.zeros(S, np.int32),
            "position_ids": np.zeros(S, np.int32),
            "sequence_ids": np.zeros(S, np.int32),
            "mlm_positions": np.zeros(M, np.int32),
            "mlm_labels": np.full(M, -100, np.int32),
            "cls_positions": np.zeros(K, np.int32),
            "nsp_labels": np.full(K, -100, np.int32),
        }
        start, masked = 0, []
        for j, n in enumerate(lengths):
            tokens = rng.integers(FIRST_WORD_ID, vocab_size, size=n)
            tokens[0] = CLS_ID
            tokens[n // 2] = SEP_ID
            tokens[-1] = SEP_ID
            sl = slice(start, start + n)
            pack["input_ids"][sl] = tokens
            pack["token_type_ids"][start + n // 2 + 1 : start + n] = 1
            pack["position_ids"][sl] = np.arange(n)
            pack["sequence_ids"][sl] = j + 1
            pack["cls_positions"][j] = start
            pack["nsp_labels"][j] = int(rng.integers(0, 2))
            candidates = [start + i for i in range(1, n) if tokens[i] != SEP_ID]
            want = max(1, int(round(0.15 * n)))
            masked += list(rng.choice(candidates, size=min(want, len(candidates)), replace=False))
            start += n
        masked = sorted(masked)[:M]
        for slot, pos in enumerate(masked):
            pack["mlm_positions"][slot] = pos
            pack["mlm_labels"][slot] = pack["input_ids"][pos]
            pack["input_ids"][pos] = MASK_ID
        packs.append(pack)
    return packs


def collate(packs: List[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    """Stack packs into a batch: (B, S), (B, M), (B, K)."""
    return {k: np.stack([p[k] for p in packs]) for k in packs[0]}


def trim_to_longest(batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The padded, unpacked alternative: cut the token axis to the longest real sequence in the batch."""
    longest = int((batch["sequence_ids"] != 0).sum(1).max())
    out = dict(batch)
    for k in ("input_ids", "token_type_ids", "position_ids", "sequence_ids"):
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
