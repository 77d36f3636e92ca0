"""A torch Dataset over a prepared dataset directory.

Map-style, so both torch.utils.data.DataLoader and poptorch.DataLoader (which takes a torch Dataset)
can use it, with the DataLoader's own batching and worker processes: the sampler hands each worker
its own indices, and each worker process opens its own memory maps on first use.

Order: `set_epoch(e)` draws a permutation of all packs from (seed, e), so every epoch has a
different, reproducible order; with num_replicas R, replica `rank` takes every R-th pack of that
permutation (the same scheme as torch's DistributedSampler, so replicas never share a pack within an
epoch). The permutation is padded by wrapping around so every replica has the same length, or
trimmed with drop_last=True. Call set_epoch before each epoch's DataLoader iteration (not effective in
persistent DataLoader workers, which keep the copy they were started with).

Items are dicts with exactly the eight pack fields (int32 tensors, or numpy arrays with
as_tensors=False), so `model(**batch)` works after default collation.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from .format import FIELDS, read_manifest, validate_shards


class Manifest(dict):
    """manifest.json as a dict whose keys can also be read as attributes (manifest.num_packs)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name)


class PackedDataset(torch.utils.data.Dataset):
    """Packs of one dataset directory (packed/ or padded/)."""

    def __init__(self, directory: str, shuffle: bool = True, seed: Optional[int] = None, rank: int = 0,
                 num_replicas: int = 1, drop_last: bool = False, verify: bool = True,
                 as_tensors: bool = True) -> None:
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError("need 0 <= rank < num_replicas, got rank=%d num_replicas=%d" % (rank, num_replicas))
        self.directory = directory
        self.manifest = Manifest(read_manifest(directory))
        self._paths: List[str] = validate_shards(directory, self.manifest, checksums=verify)
        sizes = [shard["num_packs"] for shard in self.manifest["shards"]]
        self._shard_starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.shuffle = shuffle
        self.seed = self.manifest["seed"] if seed is None else int(seed)
        self.rank = rank
        self.num_replicas = num_replicas
        self.drop_last = drop_last
        self.as_tensors = as_tensors
        self._maps: Optional[List[np.ndarray]] = None
        self._pid = -1
        self.epoch = 0
        self.set_epoch(0)

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
        return int(self.manifest["mlm_slots"])

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def vocab_path(self) -> str:
        return os.path.join(self.directory, self.manifest["vocab_file"])

    # -- order -----------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Reorder for `epoch` (deterministic in seed and epoch)."""
        self.epoch = int(epoch)
        n = self.num_packs
        if self.shuffle:
            rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(self.epoch,)))
            order = rng.permutation(n)
        else:
            order = np.arange(n)
        r = self.num_replicas
        if self.drop_last:
            order = order[: (n // r) * r]
        elif n % r:
            order = np.concatenate([order, np.resize(order, r - n % r)])
        self._indices = order[self.rank::r]

    def pack_index(self, i: int) -> int:
        """Global pack number of item i in the current epoch's order."""
        return int(self._indices[i])

    # -- access ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._indices)

    def _open(self) -> List[np.ndarray]:
        if self._maps is None or self._pid != os.getpid():
            self._maps = [np.load(path, mmap_mode="r") for path in self._paths]
            self._pid = os.getpid()
        return self._maps

    def __getitem__(self, i: int) -> Dict[str, Any]:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        g = int(self._indices[i])
        shard = int(np.searchsorted(self._shard_starts, g, side="right") - 1)
        record = self._open()[shard][g - self._shard_starts[shard]]
        if self.as_tensors:
            return {name: torch.from_numpy(np.array(record[name])) for name in FIELDS}
        return {name: np.array(record[name]) for name in FIELDS}

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_maps"] = None  # each process maps the shards itself
        return state


def open_dataset(directory: str, **kwargs) -> PackedDataset:
    """Open and validate a dataset directory (see PackedDataset for the keyword arguments)."""
    return PackedDataset(directory, **kwargs)
