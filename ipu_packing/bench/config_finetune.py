"""``bench --config`` on a fine-tuning config (task.name classification or question_answering): both layouts' rows
from the task's prepared train split, the same examples (a question-answering task's: windows) in each.

- packed: the packs of DIR/<split>/packed in the order of the run's first epoch (TrainingData.epoch_order, as
  the training loop orders them), as many as the warm-up call and the timed calls of the packed layout need,
  and more until their examples also fill the padded layout's calls;
- padded: the examples of exactly these packs, in pack and slot order, each as its own row of
  DIR/<split>/padded (the row whose ``example_ids``, for question answering ``feature_ids``, names it; prepare
  wrote both layouts of the split in one run). Each row's tokens and labels are checked against its sequence in
  the pack (an answer's start and end counted from the sequence's own [CLS]).

Both are the prepared records themselves (nothing is laid out again), so each layout is timed on what its own
training run would read. Each layout's timed calls take rows from the front of this one stream of examples:
the padded steps' examples are the first ones of the packed steps' (or the packed steps' the first of the
padded ones', whichever layout's steps hold fewer sequences). The model is the config's, built as training
builds it (train/build.py, the task's class and label settings), with the architecture of a Hugging Face
``checkpoint.init_from`` directory as training takes it (phase1.with_init_architecture); its weights are not
loaded: they change no timing.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from .inputs import BenchError, first_epoch_packs


def open_task_data(packed_config, padded_config) -> Tuple[Any, Any, Any]:
    """(packed TrainingData, padded TrainingData, Task): the split of both layouts, read, checked against the
    configs and opened as training opens them (shards validated), and the run's task from the manifest."""
    from ipu_packing.data import open_dataset
    from ipu_packing.train.data import open_run_data, open_shards

    packed, task = open_run_data(packed_config, opened=False)  # the same split of both layouts: checked first
    padded, _ = open_run_data(padded_config, opened=False)
    if padded.manifest["task"].get("labels") != packed.manifest["task"].get("labels") or (
            padded.num_sequences != packed.num_sequences):
        raise BenchError("datasets %s and %s are not the same split (other labels or examples): prepare both "
                         "layouts in one `prepare --task` run" % (packed.path, padded.path))
    for data in (packed, padded):
        open_shards(data, lambda directory, **kw: open_dataset(directory, as_tensors=False, **kw))
    return packed, padded, task


def stack(records: List[Dict[str, np.ndarray]], names) -> Dict[str, np.ndarray]:
    """{field: (P, ...)} of the records, in the format's field order."""
    return {name: np.stack([r[name] for r in records]) for name in names}


def sequence_tokens(record: Dict[str, np.ndarray], slot: int) -> np.ndarray:
    """The input ids of the sequence in ``slot`` of a record (its tokens are contiguous from its [CLS])."""
    start = int(record["cls_positions"][slot])
    length = int((np.asarray(record["sequence_ids"]) == slot + 1).sum())
    return np.asarray(record["input_ids"][start:start + length])


def sequence_labels(record: Dict[str, np.ndarray], slot: int) -> np.ndarray:
    """The labels of the sequence in ``slot``: its class or targets (classification), or its answer's start and end
    counted from its own [CLS] (question answering: the pack holds them as positions in the row)."""
    if "start_positions" in record:
        cls = int(record["cls_positions"][slot])
        return np.asarray([int(record["start_positions"][slot]) - cls, int(record["end_positions"][slot]) - cls])
    return np.asarray(record["labels"][slot])


def task_layouts(config, packed, padded, packed_rows: int, padded_rows: int
                 ) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray], Dict[str, Any]]:
    """(packed rows, padded rows, source): the module docstring's two layouts of the same examples, at least
    ``packed_rows`` packs and ``padded_rows`` examples; every example of the chosen packs has its padded row."""
    from ipu_packing.data.format import field_layout

    unique = field_layout(packed.manifest).unique_ids  # a classification example's row, a QA window's
    records = first_epoch_packs(config, packed, packed_rows, padded_rows,
                                lambda record: int((np.asarray(record[unique]) >= 0).sum()), "examples")
    examples = [(p, k, int(e)) for p, record in enumerate(records)  # (pack, slot, unique id) in pack and slot order
                for k, e in enumerate(np.asarray(record[unique])) if e >= 0]
    wanted = {e for _, _, e in examples}
    row_of = {}  # unique id -> its padded row
    for i in range(len(padded.dataset)):
        e = int(padded.dataset[i][unique][0])
        if e in wanted:
            row_of[e] = i
            if len(row_of) == len(wanted):
                break
    rows = []
    for p, k, e in examples:
        if e not in row_of:
            raise BenchError("example %d of %s has no row in %s: prepare both layouts in one `prepare --task` run"
                             % (e, packed.path, padded.path))
        row = padded.dataset[row_of[e]]
        if not (np.array_equal(sequence_tokens(row, 0), sequence_tokens(records[p], k))
                and np.array_equal(sequence_labels(row, 0), sequence_labels(records[p], k))):
            raise BenchError("example %d has other tokens or labels in %s than in %s: prepare both layouts in one "
                             "`prepare --task` run" % (e, padded.path, packed.path))
        rows.append(row)
    names = packed.dataset.fields
    return stack(records, names), stack(rows, names), {
        "source": packed.path, "padded_source": padded.path, "examples": len(examples), "matched_by": unique,
        "example_ids": [e for _, _, e in examples]}


__all__ = ["open_task_data", "sequence_labels", "sequence_tokens", "task_layouts"]
