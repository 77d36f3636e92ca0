"""Pretraining data: raw text -> NSP/MLM instances -> fixed-shape packs -> memory-mapped shards.

Command line::

    python -m ipu_packing.data prepare --input PATH|default --output DIR \\
        --max-seq-length S --max-sequences-per-pack K [--vocab PATH|default | --train-vocab N] [--seed N] [...]
    python -m ipu_packing.data pack --input PATH|DIR|GLOB --vocab VOCAB --output DIR \\
        --max-sequences-per-pack K [--format auto|hdf5|tfrecord] [--workers N] [--no-padded] [--seed N]
    python -m ipu_packing.data inspect DIR/packed
    python -m ipu_packing.data prepare --task NAME --train FILE --validation FILE [--test FILE] \
        --tokenizer DIR --output DIR --max-seq-length S --max-sequences-per-pack K     (or --input default: the demo)

`prepare` writes DIR/packed/ (K sequences per pack) and DIR/padded/ (the same instances, one per
row: K = 1, the padded baseline), each a dataset directory: manifest.json, shard-*.npy and a copy of
the vocabulary as vocab.txt (so a tokenizer can be exported from the data directory alone). It refuses
to write into an existing non-empty DIR, and leaves nothing behind on failure. Same input, options
and seed give byte-identical files, whatever --workers is.

The pack fields, their shapes and meanings, IGNORE_INDEX, the special-token ids and M's sizing are
defined once, in format.py.

Python::

    from ipu_packing.data import open_dataset, DataError
    ds = open_dataset("DIR/packed")
    len(ds); ds[i]            # pack i: dict with exactly the eight fields (a task's: its own), int32 torch tensors
    ds.manifest               # manifest.json as a dict (also attribute access; keys: format.MANIFEST_KEYS)
    ds.packing_factor         # num_sequences / num_packs (1.0 for padded/)
    ds.vocab_path             # DIR/packed/vocab.txt

It is a map-style torch Dataset in the order the packs are stored; the training loop decides the
order of each epoch (train/data.py, TrainingData.epoch_order) and hands the DataLoader a sampler.

Errors caused by the user (missing input, bad UTF-8 naming file and line, bad vocabulary, corrupt
shard or manifest naming the shard and the field, non-empty output) raise `DataError`, whose message
is one line; the command line prints it and exits with status 2.

`pack` writes the same two datasets from data that is already masked and paired (NVIDIA BERT HDF5,
google-research/bert TFRecords), keeping every instance exactly (existing/pack.py).

`prepare --task NAME` (a fine-tuning task) writes DIR/train, DIR/validation and DIR/test, each with packed/ and
padded/, from the task's files (`prepare --help`: what each reads) tokenized with the model's own tokenizer
(finetune/): the same format with the task's field set (format.FIELD_SETS), so `open_dataset(DIR/train/packed)[i]`
is a dict of the task's fields (classification: input_ids, token_type_ids, position_ids, sequence_ids,
cls_positions, labels, example_ids); `ds.task` is the task with the dataset's settings (a classifier's problem
type and labels), `ds.manifest["task"]` its entry. Each task's recipe (tasks/) describes its fields, their
invariants and its entry.

Rooms: `prepare` and `pack` each turn their source into instance files, which the write phase they
share packs into shards and manifests.

- text/ (`prepare`): corpus (text -> documents), recipe (documents -> NSP/MLM instances), shard_worker
  (the worker's shard task), pipeline (the command: PrepareConfig, prepare).
- existing/ (`pack`): read (HDF5 and TFRecord inputs -> instances), tfrecord and tfexample (TFRecord
  framing and tf.train.Example without TensorFlow), pack (the command: PackConfig, pack).
- finetune/ (`prepare --task`): rows (split files -> rows), labels (columns and labels as run_glue.py decides them),
  encode (the worker's tokenization), demo (the embedded demo task), preparation (the command's task half);
  questions, windows, qa_demo, qa_preparation and answers (question answering, as run_qa.py does it).
- write/ (both): datasets (PackingOptions, one plan, scatter and gather, manifests), packs (the vectorised
  pack writer and its two streaming passes), workers (the worker processes), output (the output
  directory, written atomically).
- shared: format (the pack format, M's sizing and the manifest with its value checks, numpy only), shards
  (every shard's values and counts checked against its manifest when a dataset is opened), limits (the size
  limits of both commands), reference (its plain reference builder), instance_files (Instances and their
  temporary files), vocab (tokenizers), dataset (torch Dataset), random_instances (the one generator of random
  NSP/MLM instances and packs, for tests and benchmarks), cli. The data benchmarks are bench/'s
  (`python -m ipu_packing.bench.pack_existing`, `.prepare_scale`).
"""

from ..errors import DataError
from .format import FIELDS, IGNORE_INDEX, pack_dtype

__all__ = ["DataError", "FIELDS", "IGNORE_INDEX", "pack_dtype", "open_dataset", "PackedDataset",
           "PrepareConfig", "prepare"]


def open_dataset(directory, **kwargs):
    """Open and validate a dataset directory -> PackedDataset (a torch Dataset; see dataset.py)."""
    from .dataset import PackedDataset

    return PackedDataset(directory, **kwargs)


def __getattr__(name):  # lazy: the prepare command does not need torch
    if name == "PackedDataset":
        from .dataset import PackedDataset

        return PackedDataset
    if name in ("PrepareConfig", "prepare"):
        from .text import pipeline as module

        return getattr(module, name)
    raise AttributeError(name)
