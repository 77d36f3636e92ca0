"""`pack`: phase-2 data that users already have -> packed/ and padded/, keeping every instance exactly.

    python -m ipu_packing.data pack --input PATH|DIR|GLOB --vocab VOCAB --output DIR \\
        --max-sequences-per-pack K [--format auto|hdf5|tfrecord] [--workers N] [--no-padded] [--seed N]

Two sources, both already masked and paired by their producer (S is the data's, P its prediction slots
per instance):

* NVIDIA DeepLearningExamples BERT HDF5 (read with h5py): `input_ids`, `input_mask`, `segment_ids`
  [N, S]; `masked_lm_positions`, `masked_lm_ids` [N, P], zero-padded (a slot is used up to the first
  position 0: position 0 is the [CLS], never masked); `next_sentence_labels` [N].
* google-research/bert `create_pretraining_data.py` TFRecords of tf.train.Example (read without
  TensorFlow, both CRCs of every record checked; data/existing/tfrecord.py): `input_ids`, `input_mask`,
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
   (`write/output.py`, `write_atomically`): an error leaves nothing behind.

Errors in the input are one DataError line naming the file and the record (or the key).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from ..write.datasets import PackingOptions
from ...errors import DataError
from ..write.output import claim_output, write_atomically
from .read import FORMATS, Checks, InputFile, convert_hdf5_rows, convert_tfrecord_file, hash_file, inspect_inputs
from ..format import max_pack_predictions
from ..limits import check_pack_sizes
from ..vocab import LOWER_CASE_CHOICES, TokenizerSpec, load_tokenizer


@dataclass
class PackConfig:
    """Everything `python -m ipu_packing.data pack` takes."""

    input: str
    """A file, a directory (every file below it) or a glob."""
    output: str
    """Output directory (must not exist or be empty); gets packed/ and padded/."""
    vocab: str
    """The vocab.txt (or Hugging Face tokenizer directory) the data's token ids refer to."""
    format: str = "auto"
    """"hdf5", "tfrecord", or "auto" (each file by its first bytes; all must be the same)."""
    lower_case: str = "auto"
    """For a bare vocab.txt: whether the data was lower-cased ("auto": uncased unless the vocabulary
    has upper-case tokens); recorded in the manifest."""
    chunk_tokens: int = 1 << 22
    """Token slots (records x S) per unit of work: memory per worker is a small multiple of it."""
    packing: PackingOptions = field(default_factory=PackingOptions)
    """K, the seed, workers, the algorithm, shard size, padded/ (shared with `prepare`)."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise DataError("--format must be one of %s, got %r" % ("/".join(FORMATS), self.format))
        if self.lower_case not in LOWER_CASE_CHOICES:
            raise DataError("--lower-case must be one of %s" % "/".join(LOWER_CASE_CHOICES))
        if self.chunk_tokens < 1:
            raise DataError("chunk_tokens must be >= 1, got %r" % self.chunk_tokens)


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
    output = os.path.abspath(config.output)
    with claim_output(output, "pack", [config.input, config.vocab]):  # checked and held before any input is read
        files = inspect_inputs(config.input, config.format)  # every input checked before anything is created
        first = next(f for f in files if f.format != "empty")
        check_pack_sizes(first.max_seq_length, config.packing.max_sequences_per_pack, first.path)
        spec = load_tokenizer(config.vocab, config.lower_case)
        return write_atomically(output, lambda temp: _pack_into(config, files, spec, temp), "packing")


def _tasks(files: List[InputFile], checks: Checks, work: str, config: PackConfig):
    rows = max(1, config.chunk_tokens // checks.max_seq_length)
    block = max(1 << 16, config.chunk_tokens)  # bytes of TFRecord read at a time (~1.3 tokens a byte at S=128)
    for index, f in enumerate(files):
        if f.format == "hdf5":
            yield hash_file, (f.path,)
            for start in range(0, f.records or 0, rows):
                yield convert_hdf5_rows, (f.path, start, min(start + rows, f.records), os.path.join(
                    work, "instances-%05d-%08d.npz" % (index, start)), checks)
        elif f.format == "tfrecord":
            yield convert_tfrecord_file, (f.path, os.path.join(work, "instances-%05d" % index), checks, block)


def _run(fn, args):
    """Worker: one task of `_tasks` (the pass mixes conversion and hashing tasks, in input order)."""
    return fn(*args)


def _pack_into(config: PackConfig, files: List[InputFile], spec: TokenizerSpec, temp: str) -> PackResult:
    from ..write.datasets import PackSettings, write_datasets
    from ..write.workers import Phases, Workers, progress

    lap = Phases()

    real = [f for f in files if f.format != "empty"]
    s, p = real[0].max_seq_length, real[0].prediction_slots
    kind = real[0].format
    ids = spec.special_token_ids
    checks = Checks(s, p, len(spec.vocab), ids["[CLS]"], ids["[SEP]"])
    work = os.path.join(temp, "work")
    os.makedirs(work)
    total = sum(f.records for f in files if f.records is not None) if kind == "hdf5" else None
    bar = progress("reading", config.packing.progress, " records", total=total)
    workers = Workers(config.packing.num_workers)
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
            return {
                **spec.write_vocab(directory),
                "seed": config.packing.seed,
                "recipe": {
                    "source": "%s, masked and paired by its producer (kept as it is)" % source,
                    "max_predictions_per_seq": p,
                    "most_predictions": int(most.max()),
                    "vocab_source": spec.source,
                },
                "corpus": corpus,
            }

        settings = PackSettings(max_seq_length=s, vocab_size=len(spec.vocab), options=config.packing,
                                mlm_slots=lambda k: max(1, max_pack_predictions(most, s, k)), cls_id=ids["[CLS]"])
        manifests = write_datasets(paths, shard_lengths, num_masked, settings, temp, workers, describe, lap)
    except BaseException:
        bar.close()
        workers.abort()
        raise
    workers.close()
    shutil.rmtree(work, ignore_errors=True)
    seconds = lap.total()
    return PackResult(manifests["packed"], manifests.get("padded"), seconds)
