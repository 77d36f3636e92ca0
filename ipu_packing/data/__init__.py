"""Pretraining data: raw text -> NSP/MLM instances -> fixed-shape packs -> memory-mapped shards.

Contract (other packages code against this; keep it stable)
------------------------------------------------------------

Command line::

    python -m ipu_packing.data prepare --input PATH|default --output DIR \\
        --max-seq-length S --max-sequences-per-pack K [--vocab PATH] [--seed N] [--workers N] [...]
    python -m ipu_packing.data inspect DIR/packed

`prepare` writes DIR/packed/ (K sequences per pack) and DIR/padded/ (the same instances, one per
row: K = 1, the padded baseline), each a dataset directory: manifest.json, shard-*.npy and a copy of
the vocabulary as vocab.txt (so a tokenizer can be exported from the data directory alone). It refuses
to write into an existing non-empty DIR, and leaves nothing behind on failure. Same input, options
and seed give byte-identical files, whatever --workers is.

Pack fields, int32, fixed shapes (S = max_seq_length, M = mlm_slots, K = max_sequences_per_pack)::

    input_ids, token_type_ids, position_ids, sequence_ids   (S,)
    mlm_positions, mlm_labels                               (M,)
    cls_positions, nsp_labels                               (K,)

position_ids restart at 0 at each sequence's [CLS]; sequence_ids is k (1-based) for the k-th
sequence and 0 on padding, so the attention mask is (sequence_ids[q] == sequence_ids[k]) &
(sequence_ids[q] != 0). Unused label slots hold -100 (mlm_labels, nsp_labels); unused position slots
hold 0 (mlm_positions, cls_positions). nsp_labels: 0 = B follows A, 1 = B is random. mlm_labels are the
original token ids at mlm_positions (positions within the pack).

Python::

    from ipu_packing.data import open_dataset, DataError
    ds = open_dataset("DIR/packed", shuffle=True, seed=None, rank=0, num_replicas=1, drop_last=False)
    len(ds); ds[0]            # dict with exactly the eight fields above, int32 torch tensors
    ds.set_epoch(epoch)       # seeded reshuffle (seed defaults to the manifest's)
    ds.manifest               # manifest.json as a dict (also attribute access): max_seq_length,
                              # max_sequences_per_pack, mlm_slots, vocab_size, vocab_checksum,
                              # num_sequences, num_packs, num_tokens, packing_algorithm,
                              # packing_efficiency, packing_factor, seed, shards, special_token_ids, ...
    ds.packing_factor         # num_sequences / num_packs (1.0 for padded/)
    ds.vocab_path             # DIR/packed/vocab.txt

It is a map-style torch Dataset: use it with torch.utils.data.DataLoader or poptorch.DataLoader; the
default collation gives a dict of (B, ...) int32 tensors for `model(**batch)`. DataLoader workers
each get their own indices from the sampler and open their own memory maps.

Errors caused by the user (missing input, bad UTF-8 naming file and line, bad vocabulary, corrupt
shard or manifest naming the shard and the field, non-empty output) raise `DataError`, whose message
is one line; the command line prints it and exits with status 2.

Modules: corpus (text -> documents), vocab (tokenizers), instances (the recipe), packs (M and pack
writing), pipeline (prepare: orchestration), format (on-disk format, numpy only), dataset (torch Dataset), cli.
"""

from .errors import DataError
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
        from . import pipeline as module

        return getattr(module, name)
    raise AttributeError(name)
