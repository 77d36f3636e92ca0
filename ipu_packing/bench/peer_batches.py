"""What each contender of ``bench --peers`` (peers.py) is fed: transformers' BertForPreTraining inputs built
from our records (``data.reference.unpack``), padded to S or grouped by length as the HF Trainer groups them,
our layouts' micro batches, and ``Contents``, what a contender's batches hold, so that every contender can be
held to the same sequences, tokens and labels.

Shape legend: B sequences (or packs) per batch, L the batch's row length (S, or its longest sequence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np

from ..data.format import IGNORE_INDEX
from ..data.reference import Instance, unpack
from .throughput import Layout

MEGA_BATCH_MULT = 50
"""Micro batches per mega-batch of the Trainer's length grouping (at most; fewer for few sequences)."""


def layout_instances(layout: Layout) -> List[Instance]:
    """Every sequence of a layout, row by row and in slot order (``unpack`` of each record)."""
    arrays = layout.arrays
    return [s for p in range(layout.rows) for s in unpack({k: v[p] for k, v in arrays.items()})]


def hf_batch(instances: Sequence[Instance], length: int) -> Dict[str, np.ndarray]:
    """transformers' BertForPreTraining inputs for ``instances``, each padded to ``length`` (pad id 0): input_ids,
    token_type_ids, attention_mask (B, L); labels (B, L), each masked token's original id at its position and
    -100 elsewhere; next_sentence_label (B,)."""
    B = len(instances)
    input_ids = np.zeros((B, length), dtype=np.int64)  # (B, L)
    token_type_ids = np.zeros((B, length), dtype=np.int64)  # (B, L)
    attention_mask = np.zeros((B, length), dtype=np.int64)  # (B, L)
    labels = np.full((B, length), IGNORE_INDEX, dtype=np.int64)  # (B, L)
    next_sentence_label = np.zeros(B, dtype=np.int64)  # (B,)
    for i, s in enumerate(instances):
        n = len(s)
        if n > length:
            raise ValueError("a sequence of %d tokens does not fit a row of %d" % (n, length))
        input_ids[i, :n] = s.input_ids
        token_type_ids[i, :n] = s.token_type_ids
        attention_mask[i, :n] = 1
        labels[i, np.asarray(s.mlm_positions, dtype=np.int64)] = s.mlm_labels
        next_sentence_label[i] = s.nsp_label
    return dict(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, labels=labels,
                next_sentence_label=next_sentence_label)


def length_grouped_order(lengths: Sequence[int], batch_size: int, seed: int) -> List[int]:
    """The order of transformers' ``trainer_pt_utils.get_length_grouped_indices`` (the Trainer's
    ``group_by_length``), with a torch generator seeded by ``seed``: a random permutation cut into mega-batches
    of min(50, n // (4 * batch_size)) (at least 1) micro batches, each sorted by length, longest first, then
    the mega-batch holding the longest sequence swapped to the front (an out-of-memory shows at once).
    A test holds it equal to transformers' own function."""
    import torch

    mult = min(len(lengths) // (batch_size * 4), MEGA_BATCH_MULT) or 1
    generator = torch.Generator()
    generator.manual_seed(seed)
    indices = torch.randperm(len(lengths), generator=generator).tolist()
    size = mult * batch_size
    megabatches = [sorted(indices[i:i + size], key=lambda j: lengths[j], reverse=True)
                   for i in range(0, len(lengths), size)]
    if megabatches:
        longest = int(np.argmax([lengths[m[0]] for m in megabatches]))
        megabatches[0][0], megabatches[longest][0] = megabatches[longest][0], megabatches[0][0]
    return [i for m in megabatches for i in m]


def padded_batches(instances: Sequence[Instance], batch_size: int, S: int) -> List[Dict[str, np.ndarray]]:
    """``transformers padded``: consecutive batches of ``batch_size`` sequences, every row padded to S."""
    return [hf_batch(instances[i:i + batch_size], S) for i in range(0, len(instances), batch_size)]


def grouped_batches(instances: Sequence[Instance], batch_size: int, seed: int) -> List[Dict[str, np.ndarray]]:
    """``transformers grouped``: ``length_grouped_order`` cut into batches of ``batch_size``, each padded to its
    own longest sequence (what the Trainer's padding collator does)."""
    order = length_grouped_order([len(s) for s in instances], batch_size, seed)
    out = []
    for i in range(0, len(order), batch_size):
        chosen = [instances[j] for j in order[i:i + batch_size]]
        out.append(hf_batch(chosen, max(len(s) for s in chosen)))
    return out


def layout_batches(layout: Layout, batch_size: int) -> List[Dict[str, np.ndarray]]:
    """Our contenders' steps: consecutive ``batch_size`` rows of a layout (the last batch may be short)."""
    return [{k: v[i:i + batch_size] for k, v in layout.arrays.items()} for i in range(0, layout.rows, batch_size)]


@dataclass
class Contents:
    """What a contender's batches hold, to hold every contender to the same sequences."""

    sequences: int
    tokens: int
    """Real tokens."""
    computed_tokens: int
    """Rows x row length over every batch: the positions the model computes, padding included."""
    lengths: List[int]
    """Every sequence's length, sorted."""
    mlm_labels: List[int]
    """Every masked token's original id, sorted (a multiset)."""
    nsp_labels: List[int]
    """Every sequence's NSP label, sorted."""

    def same_sequences(self, other: "Contents") -> bool:
        """The same sequences, tokens and labels (padding aside)."""
        return ((self.sequences, self.tokens, self.lengths, self.mlm_labels, self.nsp_labels)
                == (other.sequences, other.tokens, other.lengths, other.mlm_labels, other.nsp_labels))


def hf_contents(batches: Sequence[Dict[str, np.ndarray]]) -> Contents:
    lengths, mlm, nsp, computed = [], [], [], 0
    for b in batches:
        lengths.extend(b["attention_mask"].sum(axis=1).tolist())
        mlm.extend(b["labels"][b["labels"] != IGNORE_INDEX].tolist())
        nsp.extend(b["next_sentence_label"].tolist())
        computed += int(b["input_ids"].size)
    return Contents(len(lengths), int(sum(lengths)), computed, sorted(lengths), sorted(mlm), sorted(nsp))


def layout_contents(batches: Sequence[Dict[str, np.ndarray]]) -> Contents:
    lengths, mlm, nsp, computed = [], [], [], 0
    for b in batches:
        for row in b["sequence_ids"]:
            counts = np.bincount(row[row > 0])
            lengths.extend(int(n) for n in counts[1:] if n > 0)
        mlm.extend(b["mlm_labels"][b["mlm_labels"] != IGNORE_INDEX].tolist())
        nsp.extend(b["nsp_labels"][b["nsp_labels"] != IGNORE_INDEX].tolist())
        computed += int(b["input_ids"].size)
    return Contents(len(lengths), int(sum(lengths)), computed, sorted(lengths), sorted(mlm), sorted(nsp))
