"""Instances -> fixed-shape packs, written shard by shard: the vectorised builder of the pack format.

The format, its fields and M's sizing belong to format.py, whose `pack_sequences` is the plain
reference; `build_packs` here writes the same records (a test holds them equal) with vectorised
scatters. The per-shard instance files (written by the workers) are memory-mapped; the only
corpus-sized arrays held in memory are a few integers per sequence (length, counts, where it lives).
Each output shard file is sized, memory-mapped and filled in place (see `write_shard`), then hashed
from the mapping. The writer checks every pack against S, K and M and raises on overflow: a pack is
never silently truncated.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from .errors import DataError
from .format import IGNORE_INDEX, pack_dtype
from .instances import _ranges

INSTANCE_FILES = ("tokens", "lengths", "a_lengths", "nsp_labels", "mlm_counts", "mlm_positions", "mlm_labels")


def save_instances(directory: str, instances) -> None:
    os.makedirs(directory)
    for name in INSTANCE_FILES:
        np.save(os.path.join(directory, name + ".npy"), getattr(instances, name))


class InstanceStore:
    """Every instance of every shard, addressed by a global index (shard order, then instance order)."""

    def __init__(self, directories: List[str]) -> None:
        self.directories = directories
        per = {name: [] for name in ("lengths", "a_lengths", "nsp_labels", "mlm_counts")}
        shard_of, tok_start, mlm_start = [], [], []
        for j, directory in enumerate(directories):
            arrays = {name: np.load(os.path.join(directory, name + ".npy")) for name in per}
            for name in per:
                per[name].append(arrays[name])
            n = len(arrays["lengths"])
            shard_of.append(np.full(n, j, dtype=np.int32))
            tok_start.append(np.cumsum(arrays["lengths"], dtype=np.int64) - arrays["lengths"])
            mlm_start.append(np.cumsum(arrays["mlm_counts"], dtype=np.int64) - arrays["mlm_counts"])
        cat = lambda parts, dtype: np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
        self.lengths = cat(per["lengths"], np.int64)  # (N,)
        self.a_lengths = cat(per["a_lengths"], np.int64)
        self.nsp_labels = cat(per["nsp_labels"], np.int32)
        self.mlm_counts = cat(per["mlm_counts"], np.int64)
        self.shard_of = cat(shard_of, np.int64)
        self.token_start = cat(tok_start, np.int64)  # within the shard's token file
        self.mlm_start = cat(mlm_start, np.int64)
        self._maps: Dict[int, Dict[str, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self.lengths)

    def arrays(self, shard: int) -> Dict[str, np.ndarray]:
        if shard not in self._maps:
            directory = self.directories[shard]
            self._maps[shard] = {name: np.load(os.path.join(directory, name + ".npy"), mmap_mode="r")
                                 for name in ("tokens", "mlm_positions", "mlm_labels")}
        return self._maps[shard]


@dataclass
class PackLayout:
    max_seq_length: int  # S
    max_sequences_per_pack: int  # K
    mlm_slots: int  # M

    @property
    def record_bytes(self) -> int:
        return pack_dtype(self.max_seq_length, self.mlm_slots, self.max_sequences_per_pack).itemsize


def _field_offsets(layout: PackLayout) -> Dict[str, int]:
    """Offset of each field inside a record, in int32 units (fields are stored back to back)."""
    dtype = pack_dtype(layout.max_seq_length, layout.mlm_slots, layout.max_sequences_per_pack)
    return {name: dtype.fields[name][1] // 4 for name in dtype.names}


def build_packs(store: InstanceStore, members: np.ndarray, member_offsets: np.ndarray, layout: PackLayout,
                first_pack: int = 0, out: Optional[np.ndarray] = None) -> np.ndarray:
    """(P,) pack records; pack p holds the sequences members[member_offsets[p]:member_offsets[p+1]].

    Raises DataError if a pack has more than K sequences, more than S tokens or more than M
    predictions (`first_pack` only numbers packs in that message).

    The records are filled through a plain (P, W) int32 buffer (W = int32s per record) viewed as the
    record type at the end; each field is a (P, width) slice of it, filled by one boolean-mask
    assignment of the field's values in member order (much faster than scattering by index). `out`,
    if given, is that buffer, flat and zero-filled (e.g. a memory-mapped file); the result is a view
    of it.
    """
    s, k_max, m_max = layout.max_seq_length, layout.max_sequences_per_pack, layout.mlm_slots
    dtype = pack_dtype(s, m_max, k_max)
    width = dtype.itemsize // 4
    at = _field_offsets(layout)
    n_packs = len(member_offsets) - 1
    if out is None:
        buffer = np.zeros((n_packs, width), dtype=np.int32)  # (P, W)
    else:
        buffer = out.reshape(n_packs, width)  # (P, W), zeros
    buffer[:, at["mlm_labels"]:at["mlm_labels"] + m_max] = IGNORE_INDEX
    buffer[:, at["nsp_labels"]:at["nsp_labels"] + k_max] = IGNORE_INDEX
    counts = np.diff(member_offsets)  # (P,) sequences per pack
    row = np.repeat(np.arange(n_packs, dtype=np.int64), counts)  # (n,) pack of each member
    slot = np.arange(len(members)) - np.repeat(member_offsets[:-1] - member_offsets[0], counts)  # 0-based
    lengths = store.lengths[members]
    n_mlm = store.mlm_counts[members]

    def exclusive_cumsum_in_pack(values):
        total = np.cumsum(values)
        before_pack = np.repeat(np.concatenate([[0], total])[member_offsets[:-1] - member_offsets[0]], counts)
        return total - values - before_pack

    offset = exclusive_cumsum_in_pack(lengths)  # (n,) first position of each sequence in its pack
    tokens_used = np.bincount(row, lengths, minlength=n_packs).astype(np.int64)  # (P,)
    mlm_used = np.bincount(row, n_mlm, minlength=n_packs).astype(np.int64)  # (P,)
    for name, used, limit in (("sequences", counts, k_max), ("tokens", tokens_used, s),
                              ("MLM predictions", mlm_used, m_max)):
        over = np.flatnonzero(used > limit)
        if len(over):
            raise DataError("pack %d would hold %d %s, more than the %d it has room for (refusing to truncate)"
                            % (first_pack + over[0], int(used[over[0]]), name, limit))

    # Pack p holds its sequences back to back from position 0 (and their predictions from slot 0), in
    # member order. So every field is one boolean-mask assignment of a stream in member order: the mask
    # of the first `used` slots of each pack, taken row-major, visits the slots in that same order.
    masks = {}  # (size, id of used) -> (P, size) bool, each built once

    def fill(name: str, size: int, used: np.ndarray, stream: np.ndarray) -> None:
        key = (size, id(used))
        if key not in masks:
            masks[key] = np.arange(size)[None, :] < used[:, None]
        buffer[:, at[name]:at[name] + size][masks[key]] = stream  # (P, size) view of the field

    fill("cls_positions", k_max, counts, offset)
    fill("nsp_labels", k_max, counts, store.nsp_labels[members])
    within = _ranges(np.zeros(len(members), dtype=np.int64), lengths)  # (t,) position in its sequence
    fill("position_ids", s, tokens_used, within)
    fill("token_type_ids", s, tokens_used, within >= np.repeat(store.a_lengths[members], lengths))
    fill("sequence_ids", s, tokens_used, np.repeat(slot + 1, lengths))

    # Token ids and predictions are read shard by shard (each reads one instance file's pages).
    token_stream = np.empty(len(within), dtype=np.int32)  # (t,) input_ids in member order
    token_stream_start = np.cumsum(lengths) - lengths  # (n,)
    mlm_positions = np.empty(int(n_mlm.sum()), dtype=np.int32)  # (q,) in member order
    mlm_labels = np.empty(len(mlm_positions), dtype=np.int32)
    mlm_stream_start = np.cumsum(n_mlm) - n_mlm  # (n,)
    order = np.argsort(store.shard_of[members], kind="stable")
    shard_sorted = store.shard_of[members][order]
    bounds = np.searchsorted(shard_sorted, np.arange(len(store.directories) + 1))
    for j in range(len(store.directories)):
        sel = order[bounds[j]:bounds[j + 1]]
        if len(sel) == 0:
            continue
        arrays = store.arrays(j)
        seq = members[sel]
        seq_len = lengths[sel]
        source = _ranges(store.token_start[seq], seq_len)
        token_stream[_ranges(token_stream_start[sel], seq_len)] = arrays["tokens"][source]
        q = n_mlm[sel]
        at_stream = _ranges(mlm_stream_start[sel], q)
        source = _ranges(store.mlm_start[seq], q)
        mlm_positions[at_stream] = arrays["mlm_positions"][source] + np.repeat(offset[sel], q)
        mlm_labels[at_stream] = arrays["mlm_labels"][source]
    fill("input_ids", s, tokens_used, token_stream)
    fill("mlm_positions", m_max, mlm_used, mlm_positions)
    fill("mlm_labels", m_max, mlm_used, mlm_labels)
    return buffer.view(dtype).reshape(n_packs)


@dataclass
class ShardTask:
    """One output shard: which sequences go into which of its packs, and where it is written."""

    path: str
    members: np.ndarray  # (n,) int64 global sequence indices, pack by pack
    offsets: np.ndarray  # (P + 1,) int64 into members
    first_pack: int  # number of its first pack in the dataset (for error messages)


def shard_tasks(members: np.ndarray, member_offsets: np.ndarray, pack_order: np.ndarray, layout: PackLayout,
                directory: str, shard_bytes: int) -> List[ShardTask]:
    """Split the packs, in `pack_order`, into shards of about `shard_bytes` each."""
    per_shard = max(1, shard_bytes // layout.record_bytes)
    tasks = []
    for index, p0 in enumerate(range(0, len(pack_order), per_shard)):
        chosen = pack_order[p0:p0 + per_shard]
        starts, ends = member_offsets[chosen], member_offsets[chosen + 1]
        tasks.append(ShardTask(os.path.join(directory, "shard-%05d.npy" % index),
                               members[_ranges(starts, ends - starts)],
                               np.concatenate([[0], np.cumsum(ends - starts)]), p0))
    return tasks


def write_shard(store: InstanceStore, task: ShardTask, layout: PackLayout) -> dict:
    """Build and write one shard; returns its manifest entry {file, num_packs, sha256}.

    The file (the .npy header, then the records) is sized first and memory-mapped with the pages
    populated in one go (MAP_POPULATE where there is one), and the packs are built straight into the
    mapping: no buffer to allocate and copy, and no page fault per 4 kB page. The bytes are then
    hashed from the mapping, never read back from disk.
    """
    n_packs = len(task.offsets) - 1
    dtype = pack_dtype(layout.max_seq_length, layout.mlm_slots, layout.max_sequences_per_pack)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                  "fortran_order": False, "shape": (n_packs,)})
    head = header.getvalue()
    size = len(head) + n_packs * dtype.itemsize
    digest = hashlib.sha256()
    with open(task.path, "w+b") as f:
        f.write(head)
        f.truncate(size)  # zero-filled, as build_packs expects
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapped = mmap.mmap(f.fileno(), size, flags=flags) if n_packs else None
        try:
            if mapped is not None:
                out = np.frombuffer(mapped, dtype=np.int32, count=n_packs * dtype.itemsize // 4, offset=len(head))
                build_packs(store, task.members, task.offsets, layout, first_pack=task.first_pack, out=out)
                del out
                digest.update(mapped)
            else:
                digest.update(head)
        finally:
            if mapped is not None:
                try:
                    mapped.close()
                except BufferError:  # an error's traceback still holds a view; the mapping closes with it
                    pass
    return {"file": os.path.basename(task.path), "num_packs": int(n_packs), "sha256": digest.hexdigest()}
