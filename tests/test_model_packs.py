"""A small pack builder for the model tests, and tests that it follows the pack-field semantics.

The data pipeline builds real packs; the model tests need packs whose every sequence is also known on its
own, so they can run transformers' BertForPreTraining on the same sequences unpacked. Field semantics
(as in the data issue): position_ids restart at 0 at each [CLS]; sequence_ids is 0 for padding and k for
the k-th sequence (1-based); cls_positions[k-1] is the index of sequence k's first token; unused MLM / NSP
slots hold -100 labels (and, here, deliberately arbitrary positions).
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import torch

IGNORE = -100


class Instance:
    """One NSP instance: tokens, segment ids, masked positions (within the sequence) and labels."""

    def __init__(self, input_ids, token_type_ids, mlm_positions, mlm_labels, nsp_label):
        self.input_ids = np.asarray(input_ids, dtype=np.int64)  # (L,)
        self.token_type_ids = np.asarray(token_type_ids, dtype=np.int64)  # (L,)
        self.mlm_positions = np.asarray(mlm_positions, dtype=np.int64)  # (P,)
        self.mlm_labels = np.asarray(mlm_labels, dtype=np.int64)  # (P,)
        self.nsp_label = int(nsp_label)

    def __len__(self) -> int:
        return len(self.input_ids)


def random_sequence(rng: np.random.Generator, length: int, vocab_size: int, max_masked: int = 3) -> Instance:
    """A random sequence: token 0 is [CLS] (never masked), two segments, up to ``max_masked`` masked tokens."""
    ids = rng.integers(1, vocab_size, size=length)
    split = max(1, length // 2)
    types = np.array([0] * split + [1] * (length - split))
    count = int(min(length - 1, rng.integers(1, max_masked + 1)))
    positions = np.sort(rng.choice(np.arange(1, length), size=count, replace=False))
    labels = rng.integers(0, vocab_size, size=count)
    return Instance(ids, types, positions, labels, rng.integers(0, 2))


def build_packs(
    packs: Sequence[Sequence[Instance]], seq_len: int, max_sequences: int, mlm_slots: int, rng: np.random.Generator
) -> Dict[str, np.ndarray]:
    """Pack each group of sequences into one row; int32 arrays (B, S), (B, M), (B, K) as the data issue fixes.

    Unused MLM / CLS slots get label -100 and a random position (in or out of range) to prove that the model
    never reads them.
    """
    batch = len(packs)
    out = {
        "input_ids": np.zeros((batch, seq_len), np.int32),
        "token_type_ids": np.zeros((batch, seq_len), np.int32),
        "position_ids": np.zeros((batch, seq_len), np.int32),
        "sequence_ids": np.zeros((batch, seq_len), np.int32),
        "mlm_positions": rng.integers(-200, 200, size=(batch, mlm_slots)).astype(np.int32),
        "mlm_labels": np.full((batch, mlm_slots), IGNORE, np.int32),
        "cls_positions": rng.integers(-200, 200, size=(batch, max_sequences)).astype(np.int32),
        "nsp_labels": np.full((batch, max_sequences), IGNORE, np.int32),
    }
    for row, group in enumerate(packs):
        if len(group) > max_sequences:
            raise ValueError("pack %d holds %d sequences > K=%d" % (row, len(group), max_sequences))
        start, slot = 0, 0
        for k, seq in enumerate(group):
            end = start + len(seq)
            if end > seq_len:
                raise ValueError("pack %d overflows S=%d" % (row, seq_len))
            out["input_ids"][row, start:end] = seq.input_ids
            out["token_type_ids"][row, start:end] = seq.token_type_ids
            out["position_ids"][row, start:end] = np.arange(len(seq))
            out["sequence_ids"][row, start:end] = k + 1
            out["cls_positions"][row, k] = start
            out["nsp_labels"][row, k] = seq.nsp_label
            for position, label in zip(seq.mlm_positions, seq.mlm_labels):
                if slot >= mlm_slots:
                    raise ValueError("pack %d overflows M=%d" % (row, mlm_slots))
                out["mlm_positions"][row, slot] = start + position
                out["mlm_labels"][row, slot] = label
                slot += 1
            start = end
    return out


def to_torch(batch: Dict[str, np.ndarray], dtype: torch.dtype = torch.int64) -> Dict[str, torch.Tensor]:
    return {key: torch.as_tensor(value).to(dtype) for key, value in batch.items()}


def padded_hf_inputs(sequences: List[Instance]) -> Dict[str, torch.Tensor]:
    """The same sequences unpacked, one per row, right-padded: the inputs of transformers' BertForPreTraining."""
    width = max(len(seq) for seq in sequences)
    count = len(sequences)
    input_ids = torch.zeros((count, width), dtype=torch.long)
    token_type_ids = torch.zeros((count, width), dtype=torch.long)
    attention_mask = torch.zeros((count, width), dtype=torch.long)
    labels = torch.full((count, width), IGNORE, dtype=torch.long)
    for row, seq in enumerate(sequences):
        length = len(seq)
        input_ids[row, :length] = torch.as_tensor(seq.input_ids)
        token_type_ids[row, :length] = torch.as_tensor(seq.token_type_ids)
        attention_mask[row, :length] = 1
        labels[row, torch.as_tensor(seq.mlm_positions)] = torch.as_tensor(seq.mlm_labels)
    next_sentence_label = torch.tensor([seq.nsp_label for seq in sequences], dtype=torch.long)
    return dict(
        input_ids=input_ids,
        token_type_ids=token_type_ids,
        attention_mask=attention_mask,
        labels=labels,
        next_sentence_label=next_sentence_label,
    )


def random_packs(rng: np.random.Generator, lengths: Sequence[Sequence[int]], vocab_size: int):
    """Random sequences grouped as ``lengths`` (one list of sequence lengths per pack)."""
    return [[random_sequence(rng, length, vocab_size) for length in group] for group in lengths]


# ---------------------------------------------------------------------------------------------------------
# The helper itself must follow the field semantics, or every model test built on it proves nothing.


def test_build_packs_follows_field_semantics():
    rng = np.random.default_rng(0)
    groups = random_packs(rng, [[5], [3, 4], [2, 3, 3]], vocab_size=50)
    batch = build_packs(groups, seq_len=8, max_sequences=3, mlm_slots=6, rng=rng)
    assert batch["sequence_ids"].tolist() == [
        [1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 2, 2, 2, 2, 0],
        [1, 1, 2, 2, 2, 3, 3, 3],
    ]
    assert batch["position_ids"].tolist() == [
        [0, 1, 2, 3, 4, 0, 0, 0],
        [0, 1, 2, 0, 1, 2, 3, 0],
        [0, 1, 0, 1, 2, 0, 1, 2],
    ]
    assert batch["cls_positions"][:, :1].tolist() == [[0], [0], [0]]
    assert batch["cls_positions"][1, :2].tolist() == [0, 3]
    assert batch["cls_positions"][2].tolist() == [0, 2, 5]
    assert batch["nsp_labels"][0, 1:].tolist() == [IGNORE, IGNORE]
    for row, group in enumerate(groups):
        valid = batch["mlm_labels"][row] != IGNORE
        assert int(valid.sum()) == sum(len(seq.mlm_positions) for seq in group)
        for k, seq in enumerate(group):  # unpacking by sequence_ids gives back each sequence
            tokens = batch["input_ids"][row][batch["sequence_ids"][row] == k + 1]
            assert tokens.tolist() == seq.input_ids.tolist()
        owners = batch["sequence_ids"][row][batch["mlm_positions"][row][valid]]
        assert (owners > 0).all()  # every MLM position lies inside a sequence, never on [CLS]
        assert (batch["position_ids"][row][batch["mlm_positions"][row][valid]] > 0).all()
