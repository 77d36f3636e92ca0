"""`pack`: phase-2 data that users already have -> packed/ and padded/, keeping every instance exactly.

    python -m ipu_packing.data pack --input PATH|DIR|GLOB --vocab VOCAB --output DIR \\
        --max-sequences-per-pack K [--format auto|hdf5|tfrecord] [--workers N] [--no-padded] [--seed N]

Two sources, both already masked and paired by their producer (S is the data's, P its prediction slots
per instance):

* NVIDIA DeepLearningExamples BERT HDF5 (read with h5py): `input_ids`, `input_mask`, `segment_ids`
  [N, S]; `masked_lm_positions`, `masked_lm_ids` [N, P], zero-padded (a slot is used up to the first
  position 0: position 0 is the [CLS], never masked); `next_sentence_labels` [N].
* google-research/bert `create_pretraining_data.py` TFRecords of tf.train.Example (read without
  TensorFlow, both CRCs of every record checked; data/tfrecord.py): `input_ids`, `input_mask`,
  `segment_ids` [S]; `masked_lm_positions`, `masked_lm_ids`, `masked_lm_weights` [P] (a slot of
  weight 0 is unused and dropped); `next_sentence_labels` [1].

Nothing is re-masked or re-paired. A sequence is the tokens where `input_mask` is 1 (1s then 0s); its
segment A is where `segment_ids` is 0 and B where it is 1 (0s then 1s), which is exactly what the pack
format stores (token_type_ids, format.py); its masked positions and labels, and its NSP label (0: B
follows A, in both sources and in the pack format), are copied as they are. Token ids refer to the
vocabulary the data was made with, which neither format holds: --vocab names it (NVIDIA's and
Google's vocab.txt), and it is copied into each dataset as vocab.txt, as `prepare` does. Every
sequence must begin with that vocabulary's [CLS] and end with its [SEP], which catches a wrong
--vocab early.

M, the prediction slots per pack, is derived from the data: the most predictions any pack of K
sequences within S tokens can hold, given the most predictions the input's sequences of each length
have (format.max_pack_predictions, the same programme as the recipe's mlm_slots); every pack is
still checked against it when it is built.

Work, in two streaming passes (memory bounded by a chunk of records, not by the input):

1. Check the inputs: each file's format (HDF5 signature, or a TFRecord header whose CRC matches),
   keys and shapes, and that S and P agree across files (HDF5 shapes are in the file; a TFRecord
   file's come from its first record), before anything is created.
2. Worker processes convert chunks of records (HDF5: row ranges; TFRecord: one file per task, a
   block of records at a time) into instance files, checking every record, and return their lengths,
   their predictions per length and the files' sha256.
3. `pipeline.write_datasets`, the packing phase of `prepare`: one plan from all the lengths, then the
   scatter and gather passes, into a temporary directory renamed into place at the end
   (`pipeline.write_atomically`): an error leaves nothing behind.

Errors in the input are one DataError line naming the file and the record (or the key).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..packing.optimal import MAX_ROUNDS as LP_MAX_ROUNDS, TIME_LIMIT as LP_TIME_LIMIT
from .corpus import resolve_inputs
from .errors import DataError
from .format import VOCAB, max_pack_predictions, sha256_file
from .instances import Instances
from .packs import save_instances
from .vocab import LOWER_CASE_CHOICES, TokenizerSpec, load_tokenizer

FORMATS = ("auto", "hdf5", "tfrecord")
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
HDF5_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")
TOKEN_KEYS = ("input_ids", "input_mask", "segment_ids")  # [N, S]
MLM_KEYS = ("masked_lm_positions", "masked_lm_ids")  # [N, P]
TFRECORD_FEATURES = {"input_ids": "int64_list", "input_mask": "int64_list", "segment_ids": "int64_list",
                     "masked_lm_positions": "int64_list", "masked_lm_ids": "int64_list",
                     "masked_lm_weights": "float_list", "next_sentence_labels": "int64_list"}
H5PY_PIN = "h5py==3.16.0"


@dataclass
class PackConfig:
    """Everything `python -m ipu_packing.data pack` takes."""

    input: str
    """A file, a directory (every file below it) or a glob."""
    output: str
    """Output directory (must not exist or be empty); gets packed/ and padded/."""
    vocab: str
    """The vocab.txt (or Hugging Face tokenizer directory) the data's token ids refer to."""
    max_sequences_per_pack: int = 3
    """K of the packed dataset (the padded baseline has K = 1)."""
    format: str = "auto"
    """"hdf5", "tfrecord", or "auto" (each file by its first bytes; all must be the same)."""
    lower_case: str = "auto"
    """For a bare vocab.txt: whether the data was lower-cased ("auto": uncased unless the vocabulary
    has upper-case tokens); recorded in the manifest."""
    seed: int = 12345
    """Seed of the assignment and of the pack order."""
    workers: int = 0
    """Worker processes; 0 means min(4, CPUs). Does not change the output."""
    packing_algorithm: str = "optimal"
    lp_max_rounds: int = LP_MAX_ROUNDS
    lp_time_limit: Optional[float] = LP_TIME_LIMIT
    shard_bytes: int = 64 << 20
    """Approximate size of each output shard file."""
    chunk_tokens: int = 1 << 22
    """Token slots (records x S) per unit of work: memory per worker is a small multiple of it."""
    padded: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        if self.max_sequences_per_pack < 1:
            raise DataError("--max-sequences-per-pack must be >= 1, got %d" % self.max_sequences_per_pack)
        if self.workers < 0:
            raise DataError("--workers must be >= 0, got %d" % self.workers)
        if self.format not in FORMATS:
            raise DataError("--format must be one of %s, got %r" % ("/".join(FORMATS), self.format))
        if self.lower_case not in LOWER_CASE_CHOICES:
            raise DataError("--lower-case must be one of %s" % "/".join(LOWER_CASE_CHOICES))
        if not 0 <= self.seed < 2 ** 63:
            raise DataError("--seed must be in [0, 2**63), got %d" % self.seed)
        if self.shard_bytes < 1 or self.chunk_tokens < 1:
            raise DataError("shard_bytes and chunk_tokens must be >= 1")
        from ..packing import ALGORITHMS

        if self.packing_algorithm not in ALGORITHMS:
            raise DataError("--packing-algorithm must be one of %s, got %r" % ("/".join(ALGORITHMS), self.packing_algorithm))

    @property
    def num_workers(self) -> int:
        return self.workers or min(4, os.cpu_count() or 1)


@dataclass
class InputFile:
    path: str
    format: str  # "hdf5" or "tfrecord"
    max_seq_length: int  # S (0: an empty file)
    prediction_slots: int  # P
    records: Optional[int]  # N (None: a TFRecord file, counted when it is read)
    size: int = 0


# ---------------------------------------------------------------------------------------------------
# step 1: the inputs


def _h5py():
    try:
        import h5py
    except ImportError:
        raise DataError("reading HDF5 needs h5py: pip install %s" % H5PY_PIN) from None
    return h5py


def _head(path: str, size: int = 16) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError as error:
        raise DataError("%s: cannot read (%s)" % (path, error.strerror)) from None


def detect_format(path: str, wanted: str) -> str:
    """"hdf5", "tfrecord" (or "empty") for a file, by its first bytes; `wanted` is "auto" or the
    format it must have."""
    from .tfrecord import is_tfrecord

    head = _head(path)
    if not head:
        return "empty"
    if head[:8] == HDF5_SIGNATURE and wanted in ("auto", "hdf5"):
        return "hdf5"
    if wanted in ("auto", "tfrecord") and is_tfrecord(path):
        return "tfrecord"
    if wanted == "hdf5" and _h5py().is_hdf5(path):  # the signature after a user block
        return "hdf5"
    if wanted == "auto":
        try:
            import h5py
        except ImportError:
            h5py = None
        if h5py is not None and h5py.is_hdf5(path):
            return "hdf5"
        raise DataError("%s: neither an HDF5 file (NVIDIA BERT) nor a TFRecord file (google-research/bert): "
                        "its first bytes are neither format's" % path)
    if wanted == "hdf5":
        raise DataError("%s: not an HDF5 file (--format hdf5): it lacks the HDF5 signature" % path)
    raise DataError("%s: not a TFRecord file (--format tfrecord): its first record's length CRC does not match"
                    % path)


# What h5py raises for a damaged file (a bad checksum, a failed filter, a broken object header)
H5PY_READ_ERRORS = (OSError, KeyError, ValueError, RuntimeError)


def _inspect_hdf5(path: str) -> InputFile:
    h5py = _h5py()
    try:
        f = h5py.File(path, "r")
    except OSError as error:
        raise DataError("%s: not a readable HDF5 file (%s)" % (path, " ".join(str(error).split()))) from None
    shapes = {}
    with f:
        for key in HDF5_KEYS:
            if key not in f:
                raise DataError("%s: key %r is missing (an NVIDIA BERT HDF5 file has %s)"
                                % (path, key, ", ".join(HDF5_KEYS)))
            try:
                data = f[key]
                kind = data.dtype.kind if isinstance(data, h5py.Dataset) else None
                shape = tuple(int(x) for x in data.shape) if kind else ()
            except H5PY_READ_ERRORS as error:
                raise DataError("%s: key %r cannot be read: the file is damaged (%s)"
                                % (path, key, " ".join(str(error).split()))) from None
            if kind is None or kind not in "iu":
                raise DataError("%s: key %r should be an integer array, it is %s"
                                % (path, key, getattr(data, "dtype", "a group")))
            shapes[key] = shape
    n = shapes["input_ids"][0] if shapes["input_ids"] else 0
    expected = {key: "[N, S]" for key in TOKEN_KEYS}
    expected.update({key: "[N, P]" for key in MLM_KEYS}, next_sentence_labels="[N]")
    for key in HDF5_KEYS:
        shape = shapes[key]
        ndim_ok = len(shape) == 2 or (key == "next_sentence_labels" and (len(shape) == 1 or shape[1:] == (1,)))
        if not ndim_ok or shape[0] != n:
            raise DataError("%s: key %r has shape %s, expected %s with N = %d (the rows of 'input_ids')"
                            % (path, key, list(shape), expected[key], n))
    s = shapes["input_ids"][1]
    for key in TOKEN_KEYS[1:]:
        if shapes[key] != shapes["input_ids"]:
            raise DataError("%s: key %r has shape %s, 'input_ids' %s" % (path, key, list(shapes[key]),
                                                                         list(shapes["input_ids"])))
    if shapes["masked_lm_ids"] != shapes["masked_lm_positions"]:
        raise DataError("%s: key 'masked_lm_ids' has shape %s, 'masked_lm_positions' %s"
                        % (path, list(shapes["masked_lm_ids"]), list(shapes["masked_lm_positions"])))
    if s < 1:
        raise DataError("%s: key 'input_ids' has shape %s: S must be >= 1" % (path, list(shapes["input_ids"])))
    return InputFile(path, "hdf5", s, shapes["masked_lm_positions"][1], n, os.path.getsize(path))


def _inspect_tfrecord(path: str) -> InputFile:
    from .tfexample import parse_examples
    from .tfrecord import RecordError, read_batches

    try:
        for first, buf, starts, ends in read_batches(path, block=1 << 16):
            features = parse_examples(buf, starts[:1], ends[:1], TFRECORD_FEATURES, first)
            s = int(features["input_ids"].counts[0])
            p = int(features["masked_lm_positions"].counts[0])
            return InputFile(path, "tfrecord", s, p, None, os.path.getsize(path))
    except RecordError as error:
        raise DataError("%s: %s" % (path, error)) from None
    return InputFile(path, "tfrecord", 0, 0, 0, os.path.getsize(path))


def inspect_inputs(spec: str, wanted: str) -> List[InputFile]:
    """Every input file, checked: one format, keys and shapes, and the same S and P in all of them."""
    files = []
    for path in resolve_inputs(spec):
        kind = detect_format(path, wanted)
        if kind == "empty":  # no records (a TFRecord writer leaves an empty file for an empty shard)
            files.append(InputFile(path, "empty", 0, 0, 0, 0))
            continue
        files.append(_inspect_hdf5(path) if kind == "hdf5" else _inspect_tfrecord(path))
    real = [f for f in files if f.format != "empty" and f.max_seq_length]
    for f in real[1:]:
        first = real[0]
        if f.format != first.format:
            raise DataError("%s: is %s but %s is %s: pack one format at a time" % (f.path, f.format, first.path,
                                                                                    first.format))
        if f.max_seq_length != first.max_seq_length:
            raise DataError("%s: S = %d tokens per sequence but %s has S = %d: mixed sequence lengths across inputs"
                            % (f.path, f.max_seq_length, first.path, first.max_seq_length))
        if f.prediction_slots != first.prediction_slots:
            raise DataError("%s: %d masked_lm_positions per sequence but %s has %d: the shapes disagree across files"
                            % (f.path, f.prediction_slots, first.path, first.prediction_slots))
    if not real:
        raise DataError("%s: the input holds no records" % spec)
    return files


# ---------------------------------------------------------------------------------------------------
# step 2: records -> instances (worker processes)


@dataclass
class Checks:
    """What every record is checked against (sent to the workers)."""

    max_seq_length: int
    prediction_slots: int
    vocab_size: int
    cls_id: int
    sep_id: int


def _first(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad)[0])


def dense_to_instances(ids: np.ndarray, mask: np.ndarray, segments: np.ndarray, positions: np.ndarray,
                       labels: np.ndarray, used: np.ndarray, nsp: np.ndarray, checks: Checks,
                       where: Callable[[int], str]) -> Instances:
    """R records as dense arrays -> Instances, checking that each one is representable exactly.

    ids, mask, segments (R, S); positions, labels, used (R, P) (used: the slot holds a prediction);
    nsp (R,). `where(r)` names record r in an error ("FILE: record N")."""
    s = ids.shape[1]
    col = np.arange(s, dtype=np.int32)[None, :]  # (1, S)
    bad_mask = (mask != 0) & (mask != 1)
    if bad_mask.any():
        r = _first(bad_mask.any(axis=1))
        raise DataError("%s: input_mask holds %d; only 0 and 1 are allowed" % (where(r), mask[r][bad_mask[r]][0]))
    lengths = mask.sum(axis=1, dtype=np.int32)  # (R,)
    valid = col < lengths[:, None]  # (R, S)
    bad = (mask != valid).any(axis=1)
    if bad.any():
        raise DataError("%s: input_mask is not 1s then 0s (a sequence is the tokens before its padding)"
                        % where(_first(bad)))
    if (lengths == 0).any():
        raise DataError("%s: input_mask is all 0 (an empty sequence)" % where(_first(lengths == 0)))
    seg_valid = (segments != 0) & valid  # (R, S) B tokens
    bad = ((segments != 0) & (segments != 1) & valid).any(axis=1)
    if bad.any():
        raise DataError("%s: segment_ids holds a value other than 0 and 1" % where(_first(bad)))
    a_lengths = lengths - seg_valid.sum(axis=1, dtype=np.int32)  # (R,) tokens of [CLS] A [SEP]
    bad = (seg_valid != ((col >= a_lengths[:, None]) & valid)).any(axis=1)
    if bad.any():
        raise DataError("%s: segment_ids is not 0s then 1s within the sequence (segment A, then B): the pack "
                        "format cannot represent it" % where(_first(bad)))
    tokens = ids[valid]  # (T,) row-major: sequence after sequence
    bad_ids = (tokens < 0) | (tokens >= checks.vocab_size)
    if bad_ids.any():
        r = int(np.searchsorted(np.cumsum(lengths), _first(bad_ids), side="right"))
        raise DataError("%s: input_ids holds token id %d, outside the vocabulary of %d tokens (--vocab)"
                        % (where(r), tokens[_first(bad_ids)], checks.vocab_size))
    rows = np.arange(len(lengths))
    for name, at, token_id in (("[CLS]", np.zeros_like(lengths), checks.cls_id),
                               ("[SEP]", lengths - 1, checks.sep_id)):
        bad = ids[rows, at] != token_id
        if bad.any():
            r = _first(bad)
            raise DataError("%s: the sequence %s with token id %d, not %s (id %d in --vocab): is --vocab the "
                            "vocabulary the data was made with?" % (where(r), "starts" if name == "[CLS]" else "ends",
                                                                    ids[r, at[r]], name, token_id))
    counts = used.sum(axis=1, dtype=np.int32)  # (R,)
    mlm_positions = positions[used]
    mlm_labels = labels[used]
    if len(mlm_positions):
        within = np.repeat(lengths, counts)
        bad = (mlm_positions < 0) | (mlm_positions >= within)
        if bad.any():
            r = int(np.repeat(rows, counts)[_first(bad)])
            raise DataError("%s: masked_lm_positions holds %d, outside the sequence's %d tokens"
                            % (where(r), mlm_positions[_first(bad)], lengths[r]))
        same_row = np.repeat(rows, counts)
        bad = (np.diff(mlm_positions) <= 0) & (same_row[1:] == same_row[:-1])
        if bad.any():
            raise DataError("%s: masked_lm_positions are not in ascending order (or repeat one)"
                            % where(int(same_row[1:][_first(bad)])))
        bad = (mlm_labels < 0) | (mlm_labels >= checks.vocab_size)
        if bad.any():
            r = int(same_row[_first(bad)])
            raise DataError("%s: masked_lm_ids holds token id %d, outside the vocabulary of %d tokens (--vocab)"
                            % (where(r), mlm_labels[_first(bad)], checks.vocab_size))
    bad = (nsp != 0) & (nsp != 1)
    if bad.any():
        r = _first(bad)
        raise DataError("%s: next_sentence_labels holds %d; only 0 (B follows A) and 1 (B is random) are allowed"
                        % (where(r), nsp[r]))
    as32 = lambda a: np.ascontiguousarray(a, dtype=np.int32)
    return Instances(as32(tokens), lengths, as32(a_lengths), as32(nsp), counts, as32(mlm_positions), as32(mlm_labels))


@dataclass
class ChunkResult:
    """What a worker returns for one unit of work (the instances themselves stay in their files)."""

    paths: List[str]  # instance files, in order
    lengths: List[np.ndarray]  # (n_i,) uint16 per file
    num_masked: int
    max_predictions: np.ndarray  # (S + 1,) int64: most predictions of a sequence of each length (-1: none)
    records: int
    sha256: Optional[str] = None


def _summarise(instances: Instances, checks: Checks) -> Tuple[np.ndarray, int, np.ndarray]:
    most = np.full(checks.max_seq_length + 1, -1, dtype=np.int64)
    np.maximum.at(most, instances.lengths, instances.mlm_counts)
    return instances.lengths.astype(np.uint16 if checks.max_seq_length < 1 << 16 else np.int32), \
        int(instances.mlm_counts.sum()), most


def _record_namer(path: str, first: int) -> Callable[[int], str]:
    return lambda r: "%s: record %d" % (path, first + r)


def convert_hdf5_rows(path: str, start: int, stop: int, out: str, checks: Checks) -> ChunkResult:
    """Worker: rows [start, stop) of an NVIDIA BERT HDF5 file -> one instance file."""
    h5py = _h5py()
    arrays = {}
    key = None
    try:
        with h5py.File(path, "r") as f:
            for key in HDF5_KEYS:
                arrays[key] = f[key][start:stop]
    except H5PY_READ_ERRORS as error:
        raise DataError("%s: key %r, records %d-%d cannot be read: the file is damaged (%s)"
                        % (path, key, start, stop - 1, " ".join(str(error).split()))) from None
    positions = arrays["masked_lm_positions"]
    used = positions != 0  # zero-padded: position 0 is the [CLS], never a prediction
    prefix = np.arange(positions.shape[1])[None, :] < used.sum(axis=1)[:, None]
    bad = (used != prefix).any(axis=1)
    if bad.any():
        raise DataError("%s: record %d: masked_lm_positions has a position after a 0 (the padding of unused "
                        "slots)" % (path, start + _first(bad)))
    instances = dense_to_instances(arrays["input_ids"], arrays["input_mask"], arrays["segment_ids"], positions,
                                   arrays["masked_lm_ids"], used, arrays["next_sentence_labels"].reshape(-1),
                                   checks, _record_namer(path, start))
    save_instances(out, instances, checks.vocab_size)
    lengths, masked, most = _summarise(instances, checks)
    return ChunkResult([out], [lengths], masked, most, stop - start)


def convert_tfrecord_file(path: str, out_prefix: str, checks: Checks, block: int) -> ChunkResult:
    """Worker: a google-research/bert TFRecord file -> instance files, one per block of records read."""
    from .tfexample import parse_examples
    from .tfrecord import RecordError, read_batches

    s, p = checks.max_seq_length, checks.prediction_slots
    shapes = {"input_ids": s, "input_mask": s, "segment_ids": s, "masked_lm_positions": p, "masked_lm_ids": p,
              "masked_lm_weights": p, "next_sentence_labels": 1}
    result = ChunkResult([], [], 0, np.full(s + 1, -1, dtype=np.int64), 0)
    digest = hashlib.sha256()
    try:
        for first, buf, starts, ends in read_batches(path, block):
            digest.update(memoryview(buf)[:ends[-1] + 4])  # whole records: the next block starts after them
            features = parse_examples(buf, starts, ends, TFRECORD_FEATURES, first)
            r = len(starts)
            for name, width in shapes.items():
                wrong = np.flatnonzero(features[name].counts != width)
                if len(wrong):
                    raise RecordError(first + int(wrong[0]), "feature %r holds %d values, expected %d (as in the "
                                      "first record of the first file)" % (name, features[name].counts[wrong[0]],
                                                                           width))
            dense = {name: features[name].values.reshape(r, width) for name, width in shapes.items()}
            weights = dense["masked_lm_weights"]
            bad = (weights != 0) & (weights != 1)
            if bad.any():
                row = _first(bad.any(axis=1))
                raise RecordError(first + row, "masked_lm_weights holds %r; only 0 (an unused slot) and 1 can be "
                                  "kept exactly" % float(weights[row][bad[row]][0]))
            instances = dense_to_instances(dense["input_ids"], dense["input_mask"], dense["segment_ids"],
                                           dense["masked_lm_positions"], dense["masked_lm_ids"], weights != 0,
                                           dense["next_sentence_labels"].reshape(-1), checks,
                                           _record_namer(path, first))
            out = "%s-%05d.npz" % (out_prefix, len(result.paths))
            save_instances(out, instances, checks.vocab_size)
            lengths, masked, most = _summarise(instances, checks)
            result.paths.append(out)
            result.lengths.append(lengths)
            result.num_masked += masked
            np.maximum(result.max_predictions, most, out=result.max_predictions)
            result.records += r
    except RecordError as error:
        raise DataError("%s: %s" % (path, error)) from None
    result.sha256 = digest.hexdigest()
    return result


def _hash_file(path: str) -> ChunkResult:
    """Worker: an input file's sha256 (for the manifest's corpus field)."""
    return ChunkResult([], [], 0, np.zeros(0, dtype=np.int64), 0, sha256_file(path))


# ---------------------------------------------------------------------------------------------------
# step 3: the whole command


@dataclass
class PackResult:
    packed: dict
    padded: Optional[dict]
    seconds: Dict[str, float] = field(default_factory=dict)
    """Wall-clock seconds per phase: read, plan, scatter, write, total."""


def pack(config: PackConfig) -> PackResult:
    """Run the whole command (see the module notes)."""
    from .pipeline import _check_output, write_atomically

    output = os.path.abspath(config.output)
    _check_output(output)
    files = inspect_inputs(config.input, config.format)  # every input checked before anything is created
    spec = load_tokenizer(config.vocab, config.lower_case)
    return write_atomically(output, lambda temp: _pack_into(config, files, spec, temp), "packing")


def _tasks(files: List[InputFile], checks: Checks, work: str, config: PackConfig):
    rows = max(1, config.chunk_tokens // checks.max_seq_length)
    block = max(1 << 16, config.chunk_tokens)  # bytes of TFRecord read at a time (~1.3 tokens a byte at S=128)
    for index, f in enumerate(files):
        if f.format == "hdf5":
            yield _hash_file, (f.path,)
            for start in range(0, f.records or 0, rows):
                yield convert_hdf5_rows, (f.path, start, min(start + rows, f.records), os.path.join(
                    work, "instances-%05d-%08d.npz" % (index, start)), checks)
        elif f.format == "tfrecord":
            yield convert_tfrecord_file, (f.path, os.path.join(work, "instances-%05d" % index), checks, block)


def _run(fn, args):
    """Worker: one task of `_tasks` (the pass mixes conversion and hashing tasks, in input order)."""
    return fn(*args)


def _pack_into(config: PackConfig, files: List[InputFile], spec: TokenizerSpec, temp: str) -> PackResult:
    from .write import PackSettings, write_datasets
    from .workers import Workers, _progress

    seconds: Dict[str, float] = {}
    clock = [time.perf_counter()]
    start = clock[0]

    def lap(name: str) -> None:
        now = time.perf_counter()
        seconds[name] = now - clock[0]
        clock[0] = now

    real = [f for f in files if f.format != "empty"]
    s, p = real[0].max_seq_length, real[0].prediction_slots
    kind = real[0].format
    ids = spec.special_token_ids
    checks = Checks(s, p, len(spec.vocab), ids["[CLS]"], ids["[SEP]"])
    work = os.path.join(temp, "work")
    os.makedirs(work)
    total = sum(f.records for f in files if f.records is not None) if kind == "hdf5" else None
    bar = _progress("reading", config.progress, " records", total=total)
    workers = Workers(config.num_workers, None, None, config.seed)
    try:
        results = workers.map_bounded(_run, ((fn, args) for fn, args in _tasks(files, checks, work, config)),
                                      on_result=lambda result: bar.update(result.records))
        bar.close()
        paths = [path for r in results for path in r.paths]
        shard_lengths = [lengths for r in results for lengths in r.lengths]
        num_masked = sum(r.num_masked for r in results)
        most = np.full(s + 1, -1, dtype=np.int64)
        for r in results:
            if len(r.max_predictions):
                np.maximum(most, r.max_predictions, out=most)
        digests = [r.sha256 for r in results if r.sha256 is not None]
        num_records = sum(r.records for r in results)
        del results
        if num_records == 0:
            raise DataError("%s: the input holds no records" % config.input)
        lap("read")
        whole = hashlib.sha256()
        for f, digest in zip(real, digests):
            whole.update(("%s %d\n" % (digest, f.size)).encode("utf-8"))
        corpus = {"input": config.input, "format": kind, "files": len(files), "records": num_records,
                  "bytes": sum(f.size for f in files), "sha256": whole.hexdigest(),
                  "file_sha256": {f.path: d for f, d in zip(real, digests)},
                  "python": platform.python_version()}
        source = {"hdf5": "NVIDIA DeepLearningExamples BERT HDF5", "tfrecord": "google-research/bert TFRecord"}[kind]

        def describe(directory: str, kind_: str) -> dict:
            with open(os.path.join(directory, VOCAB), "w", encoding="utf-8", newline="\n") as f:
                f.write(spec.vocab_text())
            return {
                "vocab_file": VOCAB,
                "vocab_size": len(spec.vocab),
                "vocab_checksum": sha256_file(os.path.join(directory, VOCAB)),
                "do_lower_case": bool(spec.do_lower_case),
                "special_token_ids": spec.special_token_ids,
                "seed": config.seed,
                "recipe": {
                    "source": "%s, masked and paired by its producer (kept as it is)" % source,
                    "max_predictions_per_seq": p,
                    "most_predictions": int(most.max()),
                    "vocab_source": spec.source,
                },
                "corpus": corpus,
            }

        settings = PackSettings(
            max_seq_length=s, max_sequences_per_pack=config.max_sequences_per_pack, vocab_size=len(spec.vocab),
            seed=config.seed, mlm_slots=lambda k: max(1, max_pack_predictions(most, s, k)),
            packing_algorithm=config.packing_algorithm, lp_max_rounds=config.lp_max_rounds,
            lp_time_limit=config.lp_time_limit, shard_bytes=config.shard_bytes, padded=config.padded,
            progress=config.progress)
        manifests = write_datasets(paths, shard_lengths, num_masked, settings, temp, workers, describe, lap)
    except BaseException:
        bar.close()
        workers.abort()
        raise
    workers.close()
    shutil.rmtree(work, ignore_errors=True)
    seconds["total"] = time.perf_counter() - start
    return PackResult(manifests["packed"], manifests.get("padded"), seconds)
