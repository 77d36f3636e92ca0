"""Packs for the model tests, laid out by the pack format's reference builder (data/format.py).

The model tests need packs whose every sequence is also known on its own, so they can run
transformers' BertForPreTraining on the same sequences unpacked. The field meanings are format.py's;
on top of them, unused MLM / NSP slots here get arbitrary positions, to prove the model never reads them.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import torch

from ipu_packing.data.format import IGNORE_INDEX, as_batch
from ipu_packing.data.reference import Instance, pack_sequences


def random_sequence(rng: np.random.Generator, length: int, vocab_size: int, max_masked: int = 3) -> Instance:
    """A random sequence: token 0 is [CLS] (never masked), two segments, up to ``max_masked`` masked tokens.

    Not data/random_instances.py's NSP/MLM rule, on purpose: the model tests need predictions in sequences of
    2 and 3 tokens, ids drawn over the whole vocabulary (special ids included) and labels unrelated to the
    ids, to show that the packed model matches transformers' whatever the tokens hold."""
    ids = rng.integers(1, vocab_size, size=length)
    split = max(1, length // 2)
    types = np.array([0] * split + [1] * (length - split))
    count = int(min(length - 1, rng.integers(1, max_masked + 1)))
    positions = np.sort(rng.choice(np.arange(1, length), size=count, replace=False))
    labels = rng.integers(0, vocab_size, size=count)
    return Instance(ids, types, positions, labels, int(rng.integers(0, 2)))


def build_packs(
    packs: Sequence[Sequence[Instance]], seq_len: int, max_sequences: int, mlm_slots: int, rng: np.random.Generator
) -> Dict[str, np.ndarray]:
    """pack_sequences(packs, S, K, M) as int32 arrays (B, S), (B, M), (B, K), except that unused MLM / CLS
    slots get a random position (in or out of range): the model must never read them."""
    batch = as_batch(pack_sequences(packs, seq_len, max_sequences, mlm_slots))
    for positions, labels in (("mlm_positions", "mlm_labels"), ("cls_positions", "nsp_labels")):
        noise = rng.integers(-200, 200, size=batch[positions].shape).astype(np.int32)
        batch[positions] = np.where(batch[labels] == IGNORE_INDEX, noise, batch[positions])
    return batch


def to_torch(batch: Dict[str, np.ndarray], dtype: torch.dtype = torch.int64) -> Dict[str, torch.Tensor]:
    return {key: torch.as_tensor(value).to(dtype) for key, value in batch.items()}


def padded_hf_inputs(sequences: List[Instance]) -> Dict[str, torch.Tensor]:
    """The same sequences unpacked, one per row, right-padded: the inputs of transformers' BertForPreTraining."""
    width = max(len(seq) for seq in sequences)
    count = len(sequences)
    input_ids = torch.zeros((count, width), dtype=torch.long)
    token_type_ids = torch.zeros((count, width), dtype=torch.long)
    attention_mask = torch.zeros((count, width), dtype=torch.long)
    labels = torch.full((count, width), IGNORE_INDEX, dtype=torch.long)
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
# The helper must keep the field meanings, or every model test built on it proves nothing.


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
    assert batch["nsp_labels"][0, 1:].tolist() == [IGNORE_INDEX, IGNORE_INDEX]
    for row, group in enumerate(groups):
        valid = batch["mlm_labels"][row] != IGNORE_INDEX
        assert int(valid.sum()) == sum(len(seq.mlm_positions) for seq in group)
        for k, seq in enumerate(group):  # unpacking by sequence_ids gives back each sequence
            tokens = batch["input_ids"][row][batch["sequence_ids"][row] == k + 1]
            assert tokens.tolist() == seq.input_ids.tolist()
        owners = batch["sequence_ids"][row][batch["mlm_positions"][row][valid]]
        assert (owners > 0).all()  # every MLM position lies inside a sequence, never on [CLS]
        assert (batch["position_ids"][row][batch["mlm_positions"][row][valid]] > 0).all()
