"""The instances every source produces (`prepare`'s recipe, `pack`'s existing datasets) and the temporary
instance files that carry them, one file a shard, to the shared write phase (data/write/).

`Instances` holds N instances flat; `save_instances`/`load_instances` are its file (an uncompressed .npz in
compact types); `gather_instances` and `concat_instances` select and join them; `ranges` is the vectorised
index helper all of them use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence

import numpy as np


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + l) for each (s, l), vectorised."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths) + np.arange(total, dtype=np.int64)


@dataclass
class Instances:
    """N instances of one shard, flat. Instance i has tokens[token_offsets[i]:token_offsets[i+1]]
    (after masking; [CLS] A [SEP] B [SEP]) and predictions mlm_*[mlm_offsets[i]:mlm_offsets[i+1]]."""

    tokens: np.ndarray  # (T,) int32
    lengths: np.ndarray  # (N,) int32
    a_lengths: np.ndarray  # (N,) int32, tokens of [CLS] A [SEP]; token_type_ids are 1 from here on
    nsp_labels: np.ndarray  # (N,) int32
    mlm_counts: np.ndarray  # (N,) int32
    mlm_positions: np.ndarray  # (Q,) int32, within the instance, ascending per instance
    mlm_labels: np.ndarray  # (Q,) int32, original token ids
    extra: Dict[str, np.ndarray] = field(default_factory=dict)
    """A task's own per-instance columns, {name: (N,) or (N, L)} in their own type (e.g. a classification task's
    labels and example_ids; the pack field of the same name); pretraining has none. Task instances have no
    predictions (mlm_counts 0) and nsp_labels 0."""
    token_extra: Dict[str, np.ndarray] = field(default_factory=dict)
    """A task's own per-token columns, {name: (T,) or (T, w)} in their own type, token by token as `tokens` (e.g.
    a question-answering task's offsets, (T, 2)); the pack field of the same name. Pretraining and classification
    have none."""

    def __len__(self) -> int:
        return len(self.lengths)


INSTANCE_FIELDS = ("tokens", "lengths", "a_lengths", "nsp_labels", "mlm_counts", "mlm_positions", "mlm_labels")
PER_INSTANCE = ("lengths", "a_lengths", "nsp_labels", "mlm_counts")  # (N,)


def token_dtype(vocab_size: Optional[int]) -> np.dtype:
    """Type of token ids and MLM labels in the temporary instance and spill files."""
    return np.dtype("<u2" if vocab_size is not None and vocab_size <= 1 << 16 else "<i4")


def save_instances(path: str, instances: Instances, vocab_size: Optional[int] = None) -> None:
    """One shard's instances as one uncompressed .npz (one file, compact types)."""
    tokens = token_dtype(vocab_size)
    kinds = {"tokens": tokens, "mlm_labels": tokens, "mlm_positions": np.uint16, "lengths": np.uint16,
             "a_lengths": np.uint16, "nsp_labels": np.uint8, "mlm_counts": np.uint16}
    arrays = {}
    for name in INSTANCE_FIELDS:
        array = np.asarray(getattr(instances, name))
        kind = np.dtype(kinds[name])
        fits = array.size == 0 or (array.min() >= np.iinfo(kind).min and array.max() <= np.iinfo(kind).max)
        arrays[name] = array.astype(kind if fits else np.int32)
    for name in sorted(instances.extra):
        arrays[_EXTRA + name] = instances.extra[name]
    for name in sorted(instances.token_extra):
        arrays[_TOKEN_EXTRA + name] = instances.token_extra[name]
    with open(path, "wb") as f:
        np.savez(f, **arrays)


_EXTRA = "extra:"  # the file's name of an extra column
_TOKEN_EXTRA = "token:"  # the file's name of a per-token column


def load_instances(path: str) -> Instances:
    with np.load(path) as z:
        extra = {name[len(_EXTRA):]: z[name] for name in z.files if name.startswith(_EXTRA)}
        token_extra = {name[len(_TOKEN_EXTRA):]: z[name] for name in z.files if name.startswith(_TOKEN_EXTRA)}
        return Instances(**{name: z[name].astype(np.int32) for name in INSTANCE_FIELDS}, extra=extra,
                         token_extra=token_extra)


def gather_instances(instances: Instances, members: np.ndarray) -> Instances:
    """The instances `members` (indices into `instances`), in that order."""
    members = np.asarray(members, dtype=np.int64)
    lengths = instances.lengths.astype(np.int64)
    counts = instances.mlm_counts.astype(np.int64)
    token_start = np.cumsum(lengths) - lengths
    mlm_start = np.cumsum(counts) - counts
    tokens = ranges(token_start[members], lengths[members])
    mlm = ranges(mlm_start[members], counts[members])
    return Instances(instances.tokens[tokens], instances.lengths[members], instances.a_lengths[members],
                     instances.nsp_labels[members], instances.mlm_counts[members], instances.mlm_positions[mlm],
                     instances.mlm_labels[mlm], {name: column[members] for name, column in instances.extra.items()},
                     {name: column[tokens] for name, column in instances.token_extra.items()})


def concat_instances(parts: Sequence[Instances]) -> Instances:
    """The instances of `parts` one after the other (each with the same extra columns)."""
    if not parts:
        empty = np.zeros(0, dtype=np.int32)
        return Instances(empty, empty, empty, empty, empty, empty, empty)
    extra = {name: np.concatenate([p.extra[name] for p in parts]) for name in parts[0].extra}
    token_extra = {name: np.concatenate([p.token_extra[name] for p in parts]) for name in parts[0].token_extra}
    return Instances(*[np.concatenate([getattr(p, name) for p in parts]).astype(np.int32)
                       for name in ("tokens", "lengths", "a_lengths", "nsp_labels", "mlm_counts", "mlm_positions",
                                    "mlm_labels")], extra=extra, token_extra=token_extra)
