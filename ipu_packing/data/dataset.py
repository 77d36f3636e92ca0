"""A torch Dataset over a prepared dataset directory.

Map-style, so both torch.utils.data.DataLoader and poptorch.DataLoader (which takes a torch Dataset)
can use it, with the DataLoader's own batching and worker processes: the sampler hands each worker
its own indices, and each worker process opens its own memory maps on first use.

Item i is pack i in the order the shards store it; the order of an epoch (and which replica reads
which packs) is the training loop's decision, TrainingData.epoch_order in train/data.py.

Items are dicts with exactly the pack fields of the dataset's task (format.FIELD_SETS: pretraining's eight, a
classification task's input_ids, token_type_ids, position_ids, sequence_ids, cls_positions, labels, example_ids),
in that order, widened as the model takes them: integer fields int32 and float labels float32 (tensors, or numpy
arrays with as_tensors=False), whatever smaller type the shard stores them in, so `model(**batch)` works after
default collation (a task model takes example_ids out first: they say which input row each slot holds).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from .format import FieldLayout, read_manifest, served_dtype, field_layout
from .shards import validate_shards


class Manifest(dict):
    """manifest.json as a dict whose keys can also be read as attributes (manifest.num_packs)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name)


class PackedDataset(torch.utils.data.Dataset):
    """Packs of one dataset directory (packed/ or padded/)."""

    def __init__(self, directory: str, verify: bool = True, as_tensors: bool = True,
                 manifest: Optional[Dict[str, Any]] = None) -> None:
        """``manifest``: the directory's, already read and checked by format.read_manifest (else it is read
        here), so that a split's manifest is read once."""
        self.directory = directory
        self.manifest = Manifest(read_manifest(directory) if manifest is None else manifest)
        self._paths: List[str] = validate_shards(directory, self.manifest, checksums=verify)
        sizes = [shard["num_packs"] for shard in self.manifest["shards"]]
        self._shard_starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.as_tensors = as_tensors
        self.task: FieldLayout = field_layout(self.manifest)
        """The packs' task (format.FieldLayout): its fields, problem type and number of labels."""
        self._maps: Optional[List[np.ndarray]] = None
        self._pid = -1

    # -- properties the training code reads ------------------------------------------------------
    @property
    def num_packs(self) -> int:
        return int(self.manifest["num_packs"])

    @property
    def packing_factor(self) -> float:
        """Sequences per pack (num_sequences / num_packs): 1.0 for the padded baseline."""
        return self.manifest["num_sequences"] / float(self.manifest["num_packs"])

    @property
    def max_seq_length(self) -> int:
        return int(self.manifest["max_seq_length"])

    @property
    def max_sequences_per_pack(self) -> int:
        return int(self.manifest["max_sequences_per_pack"])

    @property
    def mlm_slots(self) -> int:
        """M of a pretraining dataset; 0 for a task dataset (no MLM fields)."""
        return int(self.manifest.get("mlm_slots", 0))

    @property
    def fields(self) -> tuple:
        """The names of an item's fields, in order (format.FIELD_SETS of the dataset's task)."""
        return self.task.names

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def vocab_path(self) -> str:
        return os.path.join(self.directory, self.manifest["vocab_file"])

    # -- access ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_packs

    def _open(self) -> List[np.ndarray]:
        if self._maps is None or self._pid != os.getpid():
            self._maps = [np.load(path, mmap_mode="r") for path in self._paths]
            self._pid = os.getpid()
        return self._maps

    def __getitem__(self, i: int) -> Dict[str, Any]:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        g = int(i) % len(self)
        shard = int(np.searchsorted(self._shard_starts, g, side="right") - 1)
        record = self._open()[shard][g - self._shard_starts[shard]]
        # stored in the smallest types (format.field_dtypes); served as int32 (float labels float32), as the
        # model takes them
        item = {name: np.array(record[name], dtype=served_dtype(record.dtype[name].base)) for name in self.task.names}
        if self.as_tensors:
            return {name: torch.from_numpy(array) for name, array in item.items()}
        return item

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_maps"] = None  # each process maps the shards itself
        return state

