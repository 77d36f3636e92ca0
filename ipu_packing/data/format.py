"""The pack format: one owner for the fields, their meaning, the ids, M, and how a pack is laid out.

Everything that makes or reads packs (the data pipeline, the benches, the synthetic packs of the
execution checks, the test fixtures, the model's loss) takes its definitions from here. numpy only. The
plain reference builder of a pack, `pack_sequences`, and its inverse `unpack` are in reference.py.

A dataset directory holds

    manifest.json          what is in the directory, with a checksum for every file (MANIFEST_KEYS)
    vocab.txt              the vocabulary the token ids refer to (one token a line, id = line number)
    shard-00000.npy ...    fixed-shape packs, one numpy structured array per shard

Each shard is a .npy file holding a 1-D array of records, one record per pack, so a user can open it
with numpy alone and memory-map it:

    packs = numpy.load("shard-00000.npy", mmap_mode="r")
    packs["input_ids"]          # (P, S) uint16 (int32 for a vocabulary over 65,536 tokens)

Fields of a pack (legend: P packs, S = max_seq_length tokens per pack, M = mlm_slots masked-token slots
per pack, K = max_sequences_per_pack sequence slots per pack). These are the field meanings; other
modules point here rather than repeat them. Each field is stored in the smallest integer type that
holds every value it can take (`field_dtypes`; the manifest records them): 6 bytes per token at
S <= 65,536 and a vocabulary under 65,536 tokens, instead of 16 for four int32 fields. Readers widen
them to int32 (`as_batch`, the Dataset), which is what the model and PopTorch take.

    input_ids       (S,)  token ids after masking; 0 ([PAD]) after the last sequence
    token_type_ids  (S,)  0 for [CLS] A [SEP], 1 for B [SEP], 0 on padding
    position_ids    (S,)  restart at 0 at each sequence's [CLS]; 0 on padding
    sequence_ids    (S,)  k for the k-th sequence of the pack (1-based), 0 on padding;
                          attention mask = (sequence_ids[q] == sequence_ids[k]) & (sequence_ids[q] != 0)
    mlm_positions   (M,)  positions (in the pack) of the masked tokens, ascending per sequence; 0 if unused
    mlm_labels      (M,)  original token id at that position; IGNORE_INDEX (-100) if unused
    cls_positions   (K,)  position of each sequence's [CLS]; 0 if unused
    nsp_labels      (K,)  0 = B follows A in the document, 1 = B is a random segment; IGNORE_INDEX if unused

A batch is the same fields stacked: (B, S), (B, M), (B, K), in the order of FIELDS, which is also the
order of the model's forward arguments. A record is contiguous on disk, so reading one pack is one
small sequential read. The padded baseline is the same format with K = 1.

Structural invariants. Besides each value's range, every pack of k sequences (1 <= k <= K) holds these;
the model reads attention, positions and both heads from them, so a pack that breaks one trains on
something other than what it claims. data/shards.py `check_packs` checks them all, vectorised, wherever
a dataset is opened (`validate_shards`: `open_dataset`, `inspect`, training) and on every pack the writer
builds before it is written; the first pack that breaks one is one DataError line naming the pack and
the invariant.

    sequences       sequence_ids is 1 at slot 0 and runs 1, 2, ..., k in contiguous runs in that order,
                    each step the same id or the next, then 0 (padding) to the end: no token of one
                    sequence carries another's id, and no sequence follows padding
    positions       position_ids is 0 at each sequence's first token, one more than the token before
                    inside a sequence, and 0 on padding
    token types     token_type_ids is 0 at each sequence's first token and never decreases inside a
                    sequence (segment A, then B), and is 0 on padding
    [CLS]           cls_positions[j] for j < k is the first token of sequence j + 1, and that token is
                    the vocabulary's [CLS] (the manifest's special_token_ids); cls_positions[j] is 0 for j >= k
    NSP slots       nsp_labels[j] is used (not IGNORE_INDEX) exactly when j < k: slot k - 1 holds sequence
                    k's label, so no slot is read by two sequences and no label sits on an empty slot
    MLM slots       the used slots (label not IGNORE_INDEX) come first; an unused slot's position is 0;
                    a used position lies on a real token (sequence id not 0) that is not a sequence's
                    [CLS]; the used positions strictly increase, so no position appears twice and each
                    sequence's predictions fill the slots after the previous sequence's, inside its own
                    tokens (a slot belongs to the sequence whose tokens its position falls in)

What a pack cannot show is not checked: whether an MLM label is the token that was masked there, or a
position inside the right sequence where two sequences' predictions could be exchanged without
breaking the order.

Tasks: one format, a field set per task. The fields above are the pretraining task's. A dataset for another
task (fine-tuning data, `prepare --task NAME`, data/finetune/) is the same format, directory, shards,
dtypes rule and checks, with its own field set (`FIELD_SETS`; each field's shape and kind of values in
`FIELD_TABLE`), told apart by the manifest's `task` key (absent: pretraining, so a pretraining dataset is
byte for byte what it was).

    Each task's recipe (tasks/sequence_classification.py, tasks/extractive_qa.py) describes its field set, in its
    model's forward order, the invariants of its packs besides sequences, positions, token types and [CLS]
    above, and its manifest `task` entry, with an example.

    A field's shape and kind of values (FIELD_TABLE) decide its stored type and range; a (K,) field is carried
    per sequence, an (S, ...) field other than the four token fields per token (data/write/packs.py), and a (K,)
    field of kind "answer_position" is stored relative to its sequence in the instances and moved to the pack
    position by the writer.

    The manifest of a task dataset has no mlm_slots, num_masked_tokens, recipe or corpus (they describe
    pretraining instances; PRETRAINING_MANIFEST_KEYS) and has `task` (its task's MANIFEST_KEYS, tasks/).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np

from .. import jsonin
from ..errors import InputError
from ..fsutil import atomic_write_text, contained_path, file_kind, open_regular
from ..fsutil import sha256_file  # noqa: F401  (importers of format use it)
from ..errors import DataError
from .limits import MAX_NUM_LABELS, MAX_SEQ_LENGTH, MAX_SEQUENCES_PER_PACK, MAX_VOCAB_SIZE  # noqa: F401
from .. import tasks

FORMAT_VERSION = 2
"""2: each field in its smallest type (field_dtypes). 1 (every field int32) is refused: re-prepare."""
MANIFEST = "manifest.json"
VOCAB = "vocab.txt"

IGNORE_INDEX = -100
"""Label of an unused MLM or NSP slot (torch's cross-entropy default ignore_index)."""

TOKEN_FIELDS = tasks.TOKEN_FIELDS  # (S,)
MLM_FIELDS = ("mlm_positions", "mlm_labels")  # (M,)
SEQUENCE_FIELDS = ("cls_positions", "nsp_labels")  # (K,)
FIELDS = tasks.PRETRAINING.fields
"""The pretraining task's fields, in the model's forward order (tasks/pretraining.py)."""

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""Tokens every vocabulary must have. A dataset records their ids in its manifest (special_token_ids);
the default vocabulary, data/synthetic.py's and every synthetic pack put them first, in this order:"""
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
FIRST_WORD_ID = len(SPECIAL_TOKENS)
"""Synthetic sequences draw their word tokens from [FIRST_WORD_ID, vocab_size)."""

MIN_SEQ_LENGTH = 5  # the shortest instance: [CLS] a [SEP] b [SEP]


# ---------------------------------------------------------------------------------------------------
# the field table: one format, a field set per task


@dataclass(frozen=True)
class Field:
    """One field of a pack: its shape per pack, in the legend's symbols, and the kind of values it holds, which
    decides its stored type (`field_dtypes`), its valid values (data/shards.py `check_packs`) and the value of an
    unused slot or of padding (`empty`)."""

    name: str
    shape: Tuple[Union[str, int], ...]
    """Per pack: ("S",), ("M",), ("K",), ("K", "L"); a number stands for itself (e.g. ("S", 2))."""
    values: str
    """A key of VALUE_KINDS."""
    empty: float = 0
    """The value of an unused slot and of padding."""


VALUE_KINDS = {
    "token": "a token id in [0, V)",
    "token_type": "0 (segment A) or 1 (segment B)",
    "position": "a position in the pack, [0, S)",
    "sequence": "a sequence id in [0, K]",
    "token_label": "a token id in [0, V), or IGNORE_INDEX",
    "binary_label": "0 or 1, or IGNORE_INDEX",
    "class": "a class in [0, L), or IGNORE_INDEX",
    "real": "a finite float32",
    "multi_hot": "0.0 or 1.0 (float32)",
    "example": "a row of the split in [0, num_sequences), or -1",
    "question": "a question (example) of the split in [0, num_examples), or -1",
    "answer_position": "a position in the pack, [0, S), or IGNORE_INDEX",
    "offset": "a character offset in a context, [0, 2**31 - 1), or -1 (not a context token)",
}
"""What a field's values are (Field.values)."""

FIELD_TABLE: Dict[str, Field] = {f.name: f for f in (
    Field("input_ids", ("S",), "token"),
    Field("token_type_ids", ("S",), "token_type"),
    Field("position_ids", ("S",), "position"),
    Field("sequence_ids", ("S",), "sequence"),
    Field("mlm_positions", ("M",), "position"),
    Field("mlm_labels", ("M",), "token_label", IGNORE_INDEX),
    Field("cls_positions", ("K",), "position"),
    Field("nsp_labels", ("K",), "binary_label", IGNORE_INDEX),
    Field("example_ids", ("K",), "example", -1),
    Field("start_positions", ("K",), "answer_position", IGNORE_INDEX),
    Field("end_positions", ("K",), "answer_position", IGNORE_INDEX),
    Field("feature_ids", ("K",), "example", -1),
    Field("offsets", ("S", 2), "offset", -1),
)}
"""Every field but a classification task's `labels`, whose shape and kind follow its problem type, and a
question-answering task's `example_ids` (QUESTION_IDS) (`FieldLayout.fields`)."""

QUESTION_IDS = Field("example_ids", ("K",), "question", -1)
"""A question-answering task's example_ids: a question's row, shared by its windows (feature_ids is the unique
one)."""

CLASS_LABELS = Field("labels", ("K",), "class", IGNORE_INDEX)  # single-label classification
REAL_LABELS = Field("labels", ("K",), "real", 0)  # regression, L = 1
REAL_LABEL_ROWS = Field("labels", ("K", "L"), "real", 0)  # regression, L > 1
MULTI_HOT_LABELS = Field("labels", ("K", "L"), "multi_hot", 0)  # multi-label classification

FIELD_SETS: Dict[str, Tuple[str, ...]] = {name: task.fields for name, task in tasks.TASKS.items()}
"""Each task's fields, in the model's forward order (each recipe's ``fields``, tasks/)."""

PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")
"""A classification task's problem types (transformers' `problem_type` names)."""


@dataclass(frozen=True)
class FieldLayout:
    """Which field set a dataset's packs hold, and what decides its fields' shapes and values beyond S, M, K and
    V: the task, and for classification its problem type, L and whether the split has labels. Read from a
    manifest with `field_layout` (no `task` key: PRETRAINING)."""

    name: str = tasks.PRETRAINING.name
    """A task's name (tasks.TASKS)."""
    problem_type: Optional[str] = None
    """Classification: one of PROBLEM_TYPES."""
    num_labels: int = 0
    """Classification: L (1 for a single regression target)."""
    has_labels: bool = True
    """Classification: False for a split without labels (every single-label slot IGNORE_INDEX, floats 0)."""
    num_examples: int = 0
    """Question answering: the split's questions (example_ids lie in [0, num_examples))."""

    def __post_init__(self) -> None:
        if self.name not in tasks.TASKS:
            raise DataError("task %r: not one of %s" % (self.name, "/".join(tasks.TASKS)))
        if "labels" in self.recipe.fields and self.problem_type not in PROBLEM_TYPES:
            raise DataError("problem type %r: not one of %s" % (self.problem_type, "/".join(PROBLEM_TYPES)))

    @property
    def recipe(self) -> "tasks.Task":
        """The task (tasks/) whose packs these are."""
        return tasks.TASKS[self.name]

    @property
    def is_pretraining(self) -> bool:
        """Whether the dataset has no `task` entry (pretraining's)."""
        return not self.recipe.fine_tuning

    @property
    def fields(self) -> Tuple[Field, ...]:
        """The fields of a pack, in order."""
        return tuple(self._field(name) for name in FIELD_SETS[self.name])

    @property
    def unique_ids(self) -> str:
        """The (K,) field of a task whose used values appear once in a dataset: a classification example's row, a
        question-answering window's."""
        return self.recipe.unique_ids

    def _field(self, name: str) -> Field:
        if name == "labels":
            return self._labels()
        if name == "example_ids" and self.recipe.unique_ids != "example_ids":  # windows of one question share it
            return QUESTION_IDS
        return FIELD_TABLE[name]

    @property
    def names(self) -> Tuple[str, ...]:
        return FIELD_SETS[self.name]

    @property
    def presence(self) -> str:
        """The (K,) field whose unused slots (its `empty` value) say which slots hold no sequence."""
        return self.recipe.presence

    def _labels(self) -> Field:
        if self.problem_type == "single_label_classification":
            return CLASS_LABELS
        if self.problem_type == "multi_label_classification":
            return MULTI_HOT_LABELS
        return REAL_LABELS if self.num_labels == 1 else REAL_LABEL_ROWS

    def shapes(self, max_seq_length: int, mlm_slots: int, max_sequences_per_pack: int) -> Dict[str, Tuple[int, ...]]:
        """{field: shape per pack} with the legend's symbols replaced by S, M, K and L."""
        sizes = {"S": max_seq_length, "M": mlm_slots, "K": max_sequences_per_pack, "L": self.num_labels}
        return {f.name: tuple(sizes[d] if isinstance(d, str) else d for d in f.shape) for f in self.fields}


PRETRAINING = FieldLayout()


def field_layout(manifest: Mapping[str, Any]) -> FieldLayout:
    """The FieldLayout of a (checked) manifest: its `task` key's, or PRETRAINING where it has none."""
    task = manifest.get("task")
    if task is None:
        return PRETRAINING
    return FieldLayout(task["name"], task.get("problem_type"), int(task.get("num_labels", 0)),
                      bool(task.get("has_labels", True)), int(task.get("num_examples", 0)))


def field_dtypes(max_seq_length: int, max_sequences_per_pack: int,
                 vocab_size: Optional[int] = None, task: FieldLayout = PRETRAINING) -> Dict[str, np.dtype]:
    """{field: stored dtype} of `task`'s fields: for integers the smallest little-endian type holding every value
    of the field, float32 for float labels.

    Token ids lie in [0, V) and labels in [0, V) or IGNORE_INDEX (signed); positions in [0, S);
    sequence ids in [0, K]; token types in {0, 1}; NSP labels in {0, 1, IGNORE_INDEX}; classes in [0, L) or
    IGNORE_INDEX; answer positions in [0, S) or IGNORE_INDEX (signed); example, feature ids and character
    offsets are int32. Shards always give the vocabulary size. Without one (vocab_size=None:
    packs built in memory as a batch, e.g. synthetic packs) every integer field is int32, as the model takes them.
    """
    if vocab_size is None:
        return {f.name: np.dtype("<f4" if f.values in ("real", "multi_hot") else "<i4") for f in task.fields}

    def unsigned(top: int) -> str:  # holds [0, top]
        return "<u1" if top < 1 << 8 else "<u2" if top < 1 << 16 else "<i4"

    def signed(top: int) -> str:  # holds [IGNORE_INDEX, top]
        return "<i1" if top < 1 << 7 else "<i2" if top < 1 << 15 else "<i4"

    kinds = {"token": unsigned(vocab_size - 1), "token_type": "<u1", "position": unsigned(max_seq_length - 1),
             "sequence": unsigned(max_sequences_per_pack), "token_label": "<i2" if vocab_size <= 1 << 15 else "<i4",
             "binary_label": "<i1", "class": signed(max(1, task.num_labels) - 1), "real": "<f4", "multi_hot": "<f4",
             "example": "<i4", "question": "<i4", "answer_position": signed(max_seq_length - 1), "offset": "<i4"}
    return {f.name: np.dtype(kinds[f.values]) for f in task.fields}


def pack_dtype(max_seq_length: int, mlm_slots: int, max_sequences_per_pack: int,
               vocab_size: Optional[int] = None, task: FieldLayout = PRETRAINING) -> np.dtype:
    """The numpy record type of one pack: `task`'s fields back to back, each of field_dtypes' type (a task without
    MLM fields ignores mlm_slots)."""
    kinds = field_dtypes(max_seq_length, max_sequences_per_pack, vocab_size, task)
    shapes = task.shapes(max_seq_length, mlm_slots, max_sequences_per_pack)
    return np.dtype([(name, kinds[name], shapes[name]) for name in task.names])


# ---------------------------------------------------------------------------------------------------
# M: masked-token slots per pack


def max_predictions(max_seq_length: int, masked_lm_prob: float = 0.15,
                    max_predictions_per_seq: Optional[int] = None) -> int:
    """Cap on predictions per sequence: max_predictions_per_seq, else ceil(masked_lm_prob * S)."""
    if max_predictions_per_seq is not None:
        return max_predictions_per_seq
    return int(math.ceil(masked_lm_prob * max_seq_length - 1e-9))


def num_to_predict(lengths: np.ndarray, masked_lm_prob: float, cap: int) -> np.ndarray:
    """(N,) int64 predictions a sequence of each length gets: the reference's
    min(cap, max(1, round(masked_lm_prob * length))), and never more than its candidates (length - 3)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    wanted = np.maximum(1, np.rint(lengths * masked_lm_prob).astype(np.int64))
    return np.minimum(np.minimum(wanted, cap), np.maximum(lengths - 3, 0))


def mlm_slots(max_seq_length: int, max_sequences_per_pack: int, masked_lm_prob: float = 0.15,
              max_predictions_per_seq: Optional[int] = None) -> int:
    """M: the most predictions any pack of K sequences within S tokens can hold.

    A sequence of length l gets f(l) = num_to_predict(l) predictions, so M is the exact maximum of
    f(l_1) + ... + f(l_k) over k <= K and l_1 + ... + l_k <= S, found by a small dynamic programme
    over lengths (K * S^2 steps). That is at most the paper's max_predictions + K - 1 and often less
    (20 at S=128, K=3; 78 at S=512, K=3; 19 and 77 for the padded K=1), so no slot is one that no
    pack can ever use. Every builder still checks each pack against M and raises on overflow.
    """
    s = max_seq_length
    gains = np.full(s + 1, -1, dtype=np.int64)
    gains[MIN_SEQ_LENGTH:] = num_to_predict(np.arange(MIN_SEQ_LENGTH, s + 1), masked_lm_prob,
                                            max_predictions(s, masked_lm_prob, max_predictions_per_seq))
    return max(1, max_pack_predictions(gains, s, max_sequences_per_pack))


def max_pack_predictions(gains: np.ndarray, max_seq_length: int, max_sequences_per_pack: int) -> int:
    """The most predictions a pack of at most K sequences within S tokens can hold when a sequence of
    length l has at most gains[l] of them ((S + 1,); gains[l] < 0: no sequence has length l).

    `mlm_slots` gives it the recipe's counts; `pack` (data/existing/pack.py) the most that the input's
    sequences of each length actually have. A dynamic programme over lengths (K * S^2 steps)."""
    s = max_seq_length
    gains = np.asarray(gains, dtype=np.int64)
    lengths = np.flatnonzero(gains[1:s + 1] >= 0) + 1
    best = np.full(s + 1, -1, dtype=np.int64)  # best[t]: most predictions with exactly t tokens so far
    best[0] = 0
    overall = 0
    # no pack holds more than S // (shortest length) sequences: the rounds past that change nothing
    rounds = min(max_sequences_per_pack, s // int(lengths[0])) if len(lengths) else 0
    for _ in range(rounds):
        new = np.full(s + 1, -1, dtype=np.int64)
        for length, gain in zip(lengths.tolist(), gains[lengths].tolist()):
            prev = best[: s + 1 - length]
            cand = np.where(prev >= 0, prev + gain, -1)
            np.maximum(new[length:], cand, out=new[length:])
        best = new
        overall = max(overall, int(best.max()))
    return overall


def as_batch(packs: np.ndarray, dtype: Any = np.int32) -> Dict[str, np.ndarray]:
    """(P,) records -> {field: (P, width...) contiguous array}, in the records' field order: integer fields of
    `dtype` (int32, as the model takes), float fields float32; dtype None keeps the stored types."""
    return {name: np.ascontiguousarray(packs[name], dtype=served_dtype(packs.dtype[name].base, dtype))
            for name in packs.dtype.names}


def served_dtype(stored: np.dtype, integers: Any = np.int32) -> Any:
    """The type a reader serves a field of `stored` type in: `integers` (int32, what the model takes) for an
    integer field, float32 for a float one; integers None keeps the stored type."""
    if integers is None:
        return None
    return np.float32 if np.dtype(stored).kind == "f" else integers


# ---------------------------------------------------------------------------------------------------
# manifest

# key -> (type(s), description); loading checks every key is present with the right type, and that
# there are no unknown keys.
MANIFEST_KEYS: Dict[str, Tuple[Any, str]] = {
    "format_version": (int, "version of this format"),
    "kind": (str, '"packed" or "padded"'),
    "max_seq_length": (int, "S: tokens per pack"),
    "max_sequences_per_pack": (int, "K: sequence slots per pack (1 for the padded baseline)"),
    "mlm_slots": (int, "M: masked-token slots per pack"),
    "vocab_file": (str, "vocabulary file in this directory"),
    "vocab_size": (int, "lines of vocab_file"),
    "vocab_checksum": (str, "sha256 of vocab_file"),
    "do_lower_case": (bool, "whether the tokenizer lower-cased the text"),
    "special_token_ids": (dict, "ids of [PAD] [UNK] [CLS] [SEP] [MASK]"),
    "num_sequences": (int, "NSP/MLM instances (= rows of the padded baseline)"),
    "num_packs": (int, "packs in all shards"),
    "num_tokens": (int, "real (non-padding) tokens in all packs"),
    "num_masked_tokens": (int, "MLM predictions in all packs"),
    "packing_algorithm": (str, "packing algorithm that made the plan"),
    "packing_efficiency": (float, "num_tokens / (num_packs * max_seq_length)"),
    "packing_factor": (float, "num_sequences / num_packs"),
    "sequence_length_histogram": (list, "bin i counts sequences of length i + 1"),
    "sequences_per_pack_histogram": (list, "bin k counts packs holding k + 1 sequences"),
    "seed": (int, "seed of the whole preparation"),
    "recipe": (dict, "instance recipe: masked_lm_prob, max_predictions_per_seq, ..."),
    "corpus": (dict, "where the text came from, and its checksum"),
    "shards": (list, "[{file, num_packs, sha256}] in order"),
    "field_dtypes": (dict, "{field: numpy dtype string} as stored (field_dtypes)"),
}


PRETRAINING_MANIFEST_KEYS = ("mlm_slots", "num_masked_tokens", "recipe", "corpus")
"""Keys of MANIFEST_KEYS that only a pretraining dataset has: a task dataset (one with a `task` key) has none of
them, and `task` instead."""

TASK_KEY: Tuple[Any, str] = (dict, "the task and its labels (TASK_KEYS); absent: pretraining")

TASK_KEYS: Dict[str, Dict[str, Tuple[Any, str]]] = {name: task.manifest_keys for name, task in tasks.TASKS.items()
                                                    if task.fine_tuning}
"""A task manifest's `task` entry keys, by its name (each recipe's ``manifest_keys``, tasks/)."""

SPLITS = ("train", "validation", "test")

OPTIONAL_MANIFEST_KEYS: Dict[str, Tuple[Any, str]] = {
    "strip_accents": (bool, "whether the tokenizer stripped accents; absent: exactly when it lower-cased (the "
                            "BertNormalizer rule every vocabulary-built tokenizer follows; data/vocab.py)"),
    "tokenize_chinese_chars": (bool, "whether the tokenizer split CJK ideographs into words of one character; "
                                     "absent: it did (transformers' default)"),
}
"""Keys a manifest may hold (checked like MANIFEST_KEYS where present): written only where the value says
something the others do not, so a dataset made before a key existed opens as it did."""


def pack_statistics(lengths: Optional[np.ndarray], mlm_counts: np.ndarray, sequences_per_pack: Optional[np.ndarray],
                    max_seq_length: int, max_sequences_per_pack: int,
                    sequences_per_pack_histogram: Optional[np.ndarray] = None,
                    sequence_length_histogram: Optional[np.ndarray] = None) -> Dict[str, Any]:
    """The manifest's counts for packs holding sequences of `lengths` with `mlm_counts` predictions,
    `sequences_per_pack` of them in each pack: num_sequences ... sequences_per_pack_histogram. Either
    array may be given as its histogram instead ((S,) sequences of length 1 .. S; (K,) packs of 1 .. K
    sequences)."""
    if sequence_length_histogram is None:
        sequence_length_histogram = np.bincount(np.asarray(lengths, dtype=np.int64) - 1, minlength=max_seq_length)
    sequence_length_histogram = np.asarray(sequence_length_histogram, dtype=np.int64)
    if sequences_per_pack_histogram is None:
        sequences_per_pack_histogram = (np.bincount(np.asarray(sequences_per_pack) - 1,
                                                    minlength=max_sequences_per_pack)
                                        if len(sequences_per_pack) else np.zeros(max_sequences_per_pack, np.int64))
    sequences_per_pack_histogram = np.asarray(sequences_per_pack_histogram, dtype=np.int64)
    num_sequences, num_packs = int(sequence_length_histogram.sum()), int(sequences_per_pack_histogram.sum())
    num_tokens = int(np.dot(sequence_length_histogram, np.arange(1, len(sequence_length_histogram) + 1)))
    return {
        "num_sequences": num_sequences,
        "num_packs": num_packs,
        "num_tokens": num_tokens,
        "num_masked_tokens": int(np.sum(mlm_counts)),
        "packing_efficiency": num_tokens / float(max(1, num_packs) * max_seq_length),
        "packing_factor": num_sequences / float(max(1, num_packs)),
        "sequence_length_histogram": sequence_length_histogram.tolist(),
        "sequences_per_pack_histogram": sequences_per_pack_histogram.tolist(),
    }


IDENTITY_KEYS = ("kind", "max_seq_length", "max_sequences_per_pack", "mlm_slots", "num_packs", "num_sequences",
                 "num_tokens", "num_masked_tokens")
"""Manifest keys a dataset's identity covers, besides its shards, vocabulary checksum and field dtypes (a task
dataset: those it has, and its `task`)."""


def dataset_identity(manifest: Mapping[str, Any]) -> str:
    """A dataset's content digest: sha256 of what its manifest says the data is, paths left out: every
    shard's pack count and sha256 in order, the vocabulary's checksum, the field dtypes, and IDENTITY_KEYS
    (and a task dataset's `task`, but for its tokenizer's and source file's paths). A copy of a dataset elsewhere
    has the same identity, another dataset of the same S, K and vocabulary has another. Checkpoints record it
    (dataset.content_sha256) and compare identifies runs' data by it; its value never changes for a given
    manifest."""
    facts = {
        "shards": [[int(s["num_packs"]), str(s["sha256"])] for s in manifest["shards"]],
        "vocab_checksum": manifest["vocab_checksum"],
        "field_dtypes": manifest["field_dtypes"],
    }
    task = manifest.get("task")
    for key in IDENTITY_KEYS:
        if task is None or key in manifest:
            facts[key] = manifest[key]
    if task is not None:  # paths left out: where the tokenizer and the source file were
        facts["task"] = {key: value for key, value in task.items() if key != "tokenizer"}
        facts["task"]["source"] = {key: value for key, value in task["source"].items() if key != "file"}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def manifest_keys(manifest: Mapping[str, Any]) -> Dict[str, Tuple[Any, str]]:
    """The keys a manifest must have: MANIFEST_KEYS for pretraining; for a task dataset (one with a `task` key)
    the same less PRETRAINING_MANIFEST_KEYS, plus `task`."""
    if "task" not in manifest:
        return MANIFEST_KEYS
    keys = {key: value for key, value in MANIFEST_KEYS.items() if key not in PRETRAINING_MANIFEST_KEYS}
    keys["task"] = TASK_KEY
    return keys


def write_manifest(directory: str, manifest: Dict[str, Any]) -> None:
    required = manifest_keys(manifest)
    unknown = sorted(set(manifest) - set(required) - set(OPTIONAL_MANIFEST_KEYS))
    missing = sorted(set(required) - set(manifest))
    assert not unknown and not missing, (unknown, missing)
    # fsync'd and renamed into place (ipu_packing/fsutil.py): a reader sees the old manifest or the new one
    atomic_write_text(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def read_manifest(directory: str) -> Dict[str, Any]:
    """Read manifest.json and check every value (`_check_manifest_values`); the shards are checked against it by
    data/shards.py `validate_shards`."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isdir(directory):
        what = "it is %s" % file_kind(os.stat(directory).st_mode) if os.path.exists(directory) else "no such directory"
        raise DataError("%s: not a dataset directory (%s)" % (directory, what))
    if not os.path.lexists(path):
        if os.path.isfile(os.path.join(directory, "packed", MANIFEST)):
            raise DataError("%s: holds packed/ and padded/; name one of them" % directory)
        splits = [name for name in SPLITS if os.path.isdir(os.path.join(directory, name))]
        if splits:
            raise DataError("%s: holds the task splits %s, each with packed/ and padded/; name one of them, e.g. %s"
                            % (directory, ", ".join(name + "/" for name in splits),
                               os.path.join(directory, splits[0], "packed")))
        raise DataError("%s: missing (not a prepared dataset directory)" % path)
    try:
        with open_regular(path, "rb", error=DataError) as f:  # a FIFO or a device: one line, never a hang
            manifest = jsonin.loads(f.read())
    except (UnicodeDecodeError, ValueError) as error:
        raise DataError("%s: not valid JSON: %s" % (path, str(error).splitlines()[0]))
    if not isinstance(manifest, dict):
        raise DataError("%s: not a JSON object" % path)
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise DataError("%s: format_version %r, this code reads %d: prepare the dataset again with "
                        "`python -m ipu_packing.data prepare`" % (path, version, FORMAT_VERSION))
    required = manifest_keys(manifest)
    _check_types(path, "field", manifest, required, OPTIONAL_MANIFEST_KEYS)
    if "task" in manifest:
        name = manifest["task"].get("name")
        if not isinstance(name, str) or name not in TASK_KEYS:
            raise DataError("%s: field 'task' entry 'name' is %r: not a task this code reads (%s)"
                            % (path, name, "/".join(TASK_KEYS)))
        _check_types(path, "field 'task' entry", manifest["task"], TASK_KEYS[name], {})
    _check_manifest_values(path, directory, manifest)
    return manifest


def _check_types(path: str, what: str, values: Mapping[str, Any], required: Mapping[str, Tuple[Any, str]],
                 optional: Mapping[str, Tuple[Any, str]]) -> None:
    """Every key of `required` present in `values`, each key of either with its type, no other key."""
    for key, (kind, _) in list(required.items()) + list(optional.items()):
        if key not in values:
            if key in optional:
                continue
            raise DataError("%s: %s %r is missing" % (path, what, key))
        value = values[key]
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float
              else isinstance(value, kind))
        if kind is int and isinstance(value, bool):
            ok = False
        if not ok:
            names = "/".join("null" if k is type(None) else k.__name__ for k in (kind if isinstance(kind, tuple)
                                                                                 else (kind,)))
            raise DataError("%s: %s %r should be %s, got %r" % (path, what, key, names, value))
    unknown = sorted(set(values) - set(required) - set(optional))
    if unknown:
        raise DataError("%s: unknown %s %r" % (path, what, unknown[0]))


def _integers(path: str, key: str, values: Any, length: int) -> np.ndarray:
    """(length,) int64 of a manifest list of integers >= 0, else DataError naming the first bad index."""
    if len(values) != length:
        raise DataError("%s: field %r has %d entries, expected %d" % (path, key, len(values), length))
    bad = [i for i, v in enumerate(values) if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 62]
    if bad:
        raise DataError("%s: field %r entry %d is %r, not an integer >= 0" % (path, key, bad[0], values[bad[0]]))
    return np.asarray(values, dtype=np.int64)


def _check_manifest_values(path: str, directory: str, m: Dict[str, Any]) -> None:
    """Every value of a type-checked manifest: sizes within data/limits.py's, ids inside the vocabulary, file
    names inside the directory, counts that agree with each other, finite ratios. The shards are checked
    against the counts when they are opened (data/shards.py)."""
    s, k, v = m["max_seq_length"], m["max_sequences_per_pack"], m["vocab_size"]
    pretraining = "task" not in m
    for key, low, high in (("max_seq_length", 1, MAX_SEQ_LENGTH), ("max_sequences_per_pack", 1, MAX_SEQUENCES_PER_PACK),
                           ("mlm_slots", 1, s), ("vocab_size", len(SPECIAL_TOKENS), MAX_VOCAB_SIZE)):
        if key in m and not low <= m[key] <= high:
            raise DataError("%s: field %r is %d, outside [%d, %d]" % (path, key, m[key], low, high))
    if m["kind"] not in ("packed", "padded") or (m["kind"] == "padded" and k != 1):
        raise DataError("%s: field 'kind' is %r with max_sequences_per_pack %d (packed, or padded with 1)"
                        % (path, m["kind"], k))
    task = PRETRAINING if pretraining else _check_task(path, m["task"])
    expected = {name: dtype.str for name, dtype in field_dtypes(s, k, v, task).items()}
    if m["field_dtypes"] != expected:
        raise DataError("%s: field 'field_dtypes' is %r, the format stores %r" % (path, m["field_dtypes"], expected))
    ids = m["special_token_ids"]
    if sorted(ids) != sorted(SPECIAL_TOKENS):
        raise DataError("%s: field 'special_token_ids' has keys %s, expected %s"
                        % (path, sorted(ids), list(SPECIAL_TOKENS)))
    for name in SPECIAL_TOKENS:
        if isinstance(ids[name], bool) or not isinstance(ids[name], int) or not 0 <= ids[name] < v:
            raise DataError("%s: field 'special_token_ids' entry %r is %r, not an id below vocab_size %d"
                            % (path, name, ids[name], v))
    if len(set(ids.values())) != len(ids):
        raise DataError("%s: field 'special_token_ids' gives two tokens one id (%r)" % (path, ids))
    for key in ("num_sequences", "num_packs", "num_tokens", "num_masked_tokens", "seed"):
        if key in m and m[key] < 0:
            raise DataError("%s: field %r is %d, must be >= 0" % (path, key, m[key]))
    companions = task.recipe.companion_files(m["task"]) if not pretraining else []  # [(file, sha256, keys)]
    names = [m["vocab_file"]] + [c[0] for c in companions]
    total = 0
    for i, shard in enumerate(m["shards"]):
        if not (isinstance(shard, dict) and sorted(shard) == ["file", "num_packs", "sha256"]
                and isinstance(shard["file"], str) and isinstance(shard["num_packs"], int)
                and not isinstance(shard["num_packs"], bool) and shard["num_packs"] >= 0
                and isinstance(shard["sha256"], str)):
            raise DataError("%s: field 'shards' entry %d should be {file, num_packs >= 0, sha256}" % (path, i))
        names.append(shard["file"])
        total += shard["num_packs"]
    files = len(names) - len(m["shards"])  # the vocabulary and the files the task entry names
    for i, name in enumerate(names):
        what = ("field 'vocab_file'" if i == 0 else "field 'task' entry %r" % companions[i - 1][2] if i < files
                else "field 'shards' entry %d (file %r)" % (i - files, name))
        try:
            contained_path(directory, name, "%s: %s" % (path, what))
        except InputError as error:
            raise DataError(str(error)) from None
        if name in names[:i]:
            raise DataError("%s: %s names a file named before it" % (path, what))
    lengths = _integers(path, "sequence_length_histogram", m["sequence_length_histogram"], s)
    per_pack = _integers(path, "sequences_per_pack_histogram", m["sequences_per_pack_histogram"], k)
    counts = (("num_packs", total, "the shards' num_packs"),
              ("num_packs", int(per_pack.sum()), "sequences_per_pack_histogram"),
              ("num_sequences", int(lengths.sum()), "sequence_length_histogram"),
              ("num_sequences", int(np.dot(per_pack, np.arange(1, k + 1))), "sequences_per_pack_histogram"),
              ("num_tokens", int(np.dot(lengths, np.arange(1, s + 1))), "sequence_length_histogram"))
    for key, implied, source in counts:
        if m[key] != implied:
            raise DataError("%s: field %r is %d but %s gives %d" % (path, key, m[key], source, implied))
    if pretraining and m["num_masked_tokens"] > min(m["num_tokens"], m["mlm_slots"] * m["num_packs"]):
        raise DataError("%s: field 'num_masked_tokens' is %d, more than the tokens (%d) or the slots (%d)"
                        % (path, m["num_masked_tokens"], m["num_tokens"], m["mlm_slots"] * m["num_packs"]))
    ratios = (("packing_factor", m["num_sequences"] / float(max(1, m["num_packs"]))),
              ("packing_efficiency", m["num_tokens"] / float(max(1, m["num_packs"]) * s)))
    for key, implied in ratios:
        if not math.isfinite(m[key]) or abs(m[key] - implied) > 1e-9 * max(1.0, implied):
            raise DataError("%s: field %r is %r but the counts give %r" % (path, key, m[key], implied))
    if not pretraining:
        task.recipe.hook("check_counts")(path, m)


def _check_task(path: str, task: Dict[str, Any]) -> FieldLayout:
    """A type-checked `task` entry's values on their own -> its FieldLayout; DataError naming the entry."""
    recipe = tasks.TASKS[task["name"]]
    recipe.hook("check_entry")(path, task)
    return field_layout({"task": task})


def check_classification_entry(path: str, task: Dict[str, Any]) -> None:
    """A classification `task` entry's values on their own (tasks/sequence_classification.py MANIFEST_KEYS)."""
    where = "%s: field 'task' entry" % path
    if task["problem_type"] not in PROBLEM_TYPES:
        raise DataError("%s 'problem_type' is %r, not one of %s"
                        % (where, task["problem_type"], "/".join(PROBLEM_TYPES)))
    n = task["num_labels"]
    low = 2 if task["problem_type"] == "single_label_classification" else 1
    if not low <= n <= MAX_NUM_LABELS:
        raise DataError("%s 'num_labels' is %d, outside [%d, %d]" % (where, n, low, MAX_NUM_LABELS))
    names = task["labels"]
    if names is not None:
        if task["problem_type"] == "regression":
            raise DataError("%s 'labels' names classes, but the problem type is regression" % where)
        if len(names) != n or not all(isinstance(x, str) for x in names) or len(set(names)) != n:
            raise DataError("%s 'labels' should be %d distinct names (num_labels), got %r" % (where, n, names))
    counts = task["label_counts"]
    if counts is not None:
        _integers(path, "task label_counts", counts, n)
    check_split(where, task)
    if not task["has_labels"] and (counts is not None or task["label_column"] is not None):
        raise DataError("%s 'has_labels' is false, but it names a label column or counts" % where)
    if not 1 <= len(task["text_columns"]) <= 2 or not all(isinstance(c, str) for c in task["text_columns"]):
        raise DataError("%s 'text_columns' should be one or two column names, got %r" % (where, task["text_columns"]))
    if task["truncated"] < 0:
        raise DataError("%s 'truncated' is %d, must be >= 0" % (where, task["truncated"]))


def check_question_entry(path: str, task: Dict[str, Any]) -> None:
    """A question-answering `task` entry's values on their own (tasks/extractive_qa.py MANIFEST_KEYS)."""
    where = "%s: field 'task' entry" % path
    check_split(where, task)
    for key in ("num_examples", "answered", "doc_stride", "questions_truncated", "windows_without_answer"):
        if task[key] < 0:
            raise DataError("%s %r is %d, must be >= 0" % (where, key, task[key]))
    if task["max_query_length"] < 1:
        raise DataError("%s 'max_query_length' is %d, must be >= 1" % (where, task["max_query_length"]))


def check_classification_counts(path: str, m: Dict[str, Any]) -> None:
    """A classification manifest's counts against each other: truncated and label counts within the examples."""
    task = m["task"]
    if task["truncated"] > m["num_sequences"]:
        raise DataError("%s: field 'task' entry 'truncated' is %d, more than the %d sequences"
                        % (path, task["truncated"], m["num_sequences"]))
    counts = task["label_counts"]
    single = task["problem_type"] == "single_label_classification"
    if counts is not None and single and sum(counts) != m["num_sequences"]:
        raise DataError("%s: field 'task' entry 'label_counts' adds up to %d, but num_sequences is %d"
                        % (path, sum(counts), m["num_sequences"]))


def check_question_counts(path: str, m: Dict[str, Any]) -> None:
    """A question-answering manifest's counts against each other: questions, answered and cut questions within
    the windows and questions."""
    task = m["task"]
    for key, most, of in (("num_examples", m["num_sequences"], "sequences (windows)"),
                          ("answered", task["num_examples"], "questions"),
                          ("questions_truncated", task["num_examples"], "questions"),
                          ("windows_without_answer", m["num_sequences"], "sequences (windows)")):
        if task[key] > most:
            raise DataError("%s: field 'task' entry %r is %d, more than the %d %s" % (path, key, task[key], most, of))


def check_split(where: str, task: Mapping[str, Any]) -> None:
    """A `task` entry's split: one of SPLITS."""
    if task["split"] not in SPLITS:
        raise DataError("%s 'split' is %r, not one of %s" % (where, task["split"], "/".join(SPLITS)))
