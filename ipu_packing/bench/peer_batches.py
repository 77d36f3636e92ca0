"""What each contender of ``bench --peers`` (peers.py) is fed: transformers' BertForPreTraining inputs built
from our records (``data.reference.unpack``), padded to S or grouped by length as the HF Trainer groups them
(``hf_batches``, which pads the classifier bench's transformers inputs too), our layouts' micro batches, and
``Contents``, what a contender's batches hold, so that every contender can be held to the same sequences, tokens
and labels.

Shape legend: B sequences (or packs) per batch, L the batch's row length (S, or its longest sequence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

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


def hf_batch(rows: Sequence[Dict[str, Any]], length: Optional[int] = None) -> Dict[str, np.ndarray]:
    """transformers' inputs of ``rows`` (each one sequence's fields: a list as long as its input_ids, or one
    number), padded to ``length`` (None: the longest row): each list field (B, L), padded with 0 (``labels``:
    -100), attention_mask (B, L) over the real tokens, each number field (B,)."""
    L = length or max(len(r["input_ids"]) for r in rows)
    out = {"attention_mask": np.zeros((len(rows), L), dtype=np.int64)}  # (B, L)
    for name, value in rows[0].items():
        out[name] = (np.full((len(rows), L), IGNORE_INDEX if name == "labels" else 0, dtype=np.int64) if np.ndim(value)
                     else np.zeros(len(rows), dtype=np.int64))  # (B, L) or (B,)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        if n > L:
            raise ValueError("a sequence of %d tokens does not fit a row of %d" % (n, L))
        out["attention_mask"][i, :n] = 1
        for name, value in row.items():
            if np.ndim(value):
                out[name][i, :n] = value
            else:
                out[name][i] = value
    return out


def hf_batches(rows: Sequence[Dict[str, Any]], order: Sequence[int], batch_size: int,
               length: Optional[int] = None) -> List[Dict[str, np.ndarray]]:
    """``order`` cut into batches of ``batch_size`` rows, each padded to ``length`` (None: its longest row)."""
    return [hf_batch([rows[j] for j in order[i:i + batch_size]], length) for i in range(0, len(order), batch_size)]


def pretraining_row(s: Instance) -> Dict[str, Any]:
    """transformers' BertForPreTraining fields of one sequence: input_ids, token_type_ids, labels (each masked
    token's original id at its position, -100 elsewhere), next_sentence_label."""
    labels = np.full(len(s), IGNORE_INDEX, dtype=np.int64)
    labels[np.asarray(s.mlm_positions, dtype=np.int64)] = s.mlm_labels
    return dict(input_ids=s.input_ids, token_type_ids=s.token_type_ids, labels=labels, next_sentence_label=s.nsp_label)


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
    return hf_batches([pretraining_row(s) for s in instances], range(len(instances)), batch_size, S)


def grouped_batches(instances: Sequence[Instance], batch_size: int, seed: int) -> List[Dict[str, np.ndarray]]:
    """``transformers grouped``: ``length_grouped_order`` cut into batches of ``batch_size``, each padded to its
    own longest sequence (what the Trainer's padding collator does)."""
    order = length_grouped_order([len(s) for s in instances], batch_size, seed)
    return hf_batches([pretraining_row(s) for s in instances], order, batch_size)


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
