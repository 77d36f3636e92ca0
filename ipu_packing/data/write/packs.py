"""Instances -> fixed-shape packs, written shard by shard: the vectorised builder of the pack format.

The format, its fields and M's sizing belong to format.py, whose `pack_sequences` is the plain
reference; `build_packs` here writes the same records (a test holds them equal) with vectorised
scatters. It raises on any pack over S, K or M: a pack is never silently truncated.

Bounded resources. The plan needs only every instance's length; the instances themselves stay on
disk and move in two streaming passes, so that no process ever holds or opens more than a bounded
slice, however large the corpus:

1. scatter (one task per *group* of consecutive input shards, of about a fixed number of tokens):
   load the group's instance files, find each instance's output shard and its key in that shard
   (`DatasetSpec.locate`: the streaming assignment of packing/slots.py needs only the instance's
   length and the count of same-length instances before the group), sort by (output shard, key) and
   write one spill file per group and dataset, output shard by output shard, with an index of where
   each output shard's block starts (`write_spill`). The instance files are then deleted.
2. gather (one task per *output* shard): read that output shard's block from every spill file, one
   file open at a time (`read_spill_blocks`), put the instances in key order, which is pack order,
   check every pack against the plan, build the packs in memory and write the shard with plain
   writes (`write_shard`): a full disk is an OSError, never a SIGBUS from a sparse mapping.

So a process holds one group (scatter) or one output shard and its instances (gather), and has one
data file open at a time; the parent holds only the lengths (2 bytes per instance). The gather reads
(groups x output shards) blocks: the group size keeps that count small (groups and shards of tens of
MB each), though it grows with the square of the corpus.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ...packing.permutation import KeyedPermutation
from ...packing.slots import SlotMap, length_ranks
from ...errors import DataError
from ..format import PRETRAINING, TOKEN_FIELDS, FieldLayout, pack_dtype
from ..shards import check_packs, pack_facts
from ..instance_files import (PER_INSTANCE, Instances, concat_instances, gather_instances, load_instances, ranges,
                              token_dtype)

Column = Tuple[str, str, Tuple[int, ...]]
"""A task's per-sequence (or per-token) column in the instance and spill files: (name, numpy type string, shape per
sequence (or per token))."""


@dataclass
class PackLayout:
    """What a dataset's packs are: S, K, M, V, the task's field set, and what the writer's check needs."""

    max_seq_length: int  # S
    max_sequences_per_pack: int  # K
    mlm_slots: int  # M (0 for a task without MLM fields)
    vocab_size: Optional[int] = None  # V (None: int32 token ids)
    cls_id: Optional[int] = None  # the vocabulary's [CLS] (None: `write_shard` does not check the first tokens)
    task: FieldLayout = PRETRAINING  # the field set (format.FIELD_SETS) and its labels
    num_sequences: Optional[int] = None  # a task dataset's examples: the range of its example ids (writer's check)

    @property
    def dtype(self) -> np.dtype:
        return pack_dtype(self.max_seq_length, self.mlm_slots, self.max_sequences_per_pack, self.vocab_size, self.task)

    @property
    def record_bytes(self) -> int:
        return self.dtype.itemsize

    @property
    def columns(self) -> Tuple[Column, ...]:
        """The task's per-sequence fields the instances carry as extra columns (every (K,) or (K, L) field but
        cls_positions, which the writer computes); none for pretraining, whose nsp_labels are an instance field."""
        if self.task.is_pretraining:
            return ()
        return self._columns("K", ("cls_positions",))

    @property
    def token_columns(self) -> Tuple[Column, ...]:
        """The task's per-token fields the instances carry as token columns (every (S, ...) field but the four
        token fields, which the writer builds): a question-answering task's offsets; none for the others."""
        if self.task.is_pretraining:
            return ()
        return self._columns("S", TOKEN_FIELDS)

    @property
    def relative(self) -> Tuple[str, ...]:
        """The per-sequence columns an instance holds relative to its own first token (answer positions), which
        the writer moves to the sequence's place in the pack."""
        return tuple(f.name for f in self.task.fields if f.values == "answer_position")

    def _columns(self, first: str, built: Tuple[str, ...]) -> Tuple[Column, ...]:
        shapes = self.task.shapes(self.max_seq_length, self.mlm_slots, self.max_sequences_per_pack)
        return tuple((f.name, "<f4" if f.values in ("real", "multi_hot") else "<i4", shapes[f.name][1:])
                     for f in self.task.fields if f.shape[0] == first and f.name not in built)


def build_packs(instances: Instances, member_offsets: np.ndarray, layout: PackLayout, first_pack: int = 0,
                out: Optional[np.ndarray] = None) -> np.ndarray:
    """(P,) pack records; pack p holds instances member_offsets[p]:member_offsets[p+1] of `instances`
    (which are in pack order).

    Raises DataError if a pack has more than K sequences, more than S tokens or more than M
    predictions (`first_pack` only numbers packs in that message).

    Each field is a (P, width) view of the records, filled by one boolean-mask assignment of the
    field's values in member order (much faster than scattering by index). `out`, if given, is a
    zero-filled (P,) record array to fill; the result is it.
    """
    s, k_max, m_max = layout.max_seq_length, layout.max_sequences_per_pack, layout.mlm_slots
    member_offsets = np.asarray(member_offsets, dtype=np.int64)
    n_packs = len(member_offsets) - 1
    records = np.zeros(n_packs, dtype=layout.dtype) if out is None else out
    for f in layout.task.fields:  # an unused slot's value (format.FIELD_TABLE): IGNORE_INDEX, -1
        if f.empty != 0:
            records[f.name] = f.empty
    counts = np.diff(member_offsets)  # (P,) sequences per pack
    n = int(member_offsets[-1] - member_offsets[0])
    if n != len(instances):
        raise ValueError("the packs hold %d sequences, %d given" % (n, len(instances)))
    row = np.repeat(np.arange(n_packs, dtype=np.int64), counts)  # (n,) pack of each member
    slot = np.arange(n) - np.repeat(member_offsets[:-1] - member_offsets[0], counts)  # 0-based
    lengths = instances.lengths.astype(np.int64)
    n_mlm = instances.mlm_counts.astype(np.int64)

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
        records[name][masks[key]] = stream  # (P, size) view of the field

    fill("cls_positions", k_max, counts, offset)
    if layout.task.is_pretraining:
        fill("nsp_labels", k_max, counts, instances.nsp_labels)
    relative = layout.relative
    for name, kind, shape in layout.columns:  # a task's per-sequence fields, (K,) or (K, L): slot k - 1 for sequence k
        values = instances.extra[name] if n else np.zeros((0,) + tuple(shape), kind)
        fill(name, k_max, counts, values + offset if name in relative else values)  # answers: to the pack position
    for name, kind, shape in layout.token_columns:  # a task's per-token fields, (S,) or (S, w)
        fill(name, s, tokens_used, instances.token_extra[name] if n else np.zeros((0,) + tuple(shape), kind))
    within = ranges(np.zeros(n, dtype=np.int64), lengths)  # (t,) position in its sequence
    fill("position_ids", s, tokens_used, within)
    fill("token_type_ids", s, tokens_used, within >= np.repeat(instances.a_lengths, lengths))
    fill("sequence_ids", s, tokens_used, np.repeat(slot + 1, lengths))
    fill("input_ids", s, tokens_used, instances.tokens)
    if layout.task.is_pretraining:
        fill("mlm_positions", m_max, mlm_used, instances.mlm_positions + np.repeat(offset, n_mlm))
        fill("mlm_labels", m_max, mlm_used, instances.mlm_labels)
    return records


@dataclass
class ShardTask:
    """One output shard: how many sequences each of its packs holds, and where it is written."""

    path: str
    offsets: np.ndarray  # (P + 1,) int64: pack p holds members offsets[p]:offsets[p+1] of the shard's stream
    first_pack: int  # number of its first pack in the dataset (for error messages)

    @property
    def num_sequences(self) -> int:
        return int(self.offsets[-1])


@dataclass
class DatasetPlan:
    """Where every sequence of one dataset goes: output shard tasks and, per sequence, its shard and
    its place in that shard's member stream (the packs' members back to back, in pack order)."""

    tasks: List[ShardTask]
    shard_of: np.ndarray  # (N,) int32, by sequence index
    place: np.ndarray  # (N,) int32, by sequence index


def plan_dataset(members: np.ndarray, member_offsets: np.ndarray, pack_order: np.ndarray, layout: PackLayout,
                 directory: str, shard_bytes: int) -> DatasetPlan:
    """Split the packs, in `pack_order`, into shards of about `shard_bytes` each, and place every
    sequence (members[member_offsets[p]:member_offsets[p+1]] are pack p's) in its shard's stream."""
    members = np.asarray(members, dtype=np.int64)
    member_offsets = np.asarray(member_offsets, dtype=np.int64)
    pack_order = np.asarray(pack_order, dtype=np.int64)
    per_shard = max(1, shard_bytes // layout.record_bytes)
    n_packs = len(pack_order)
    counts_by_rank = np.diff(member_offsets)[pack_order]  # (P,) sequences of the r-th written pack
    shard_by_rank = np.arange(n_packs, dtype=np.int64) // per_shard
    stream_start = np.cumsum(counts_by_rank) - counts_by_rank  # (P,) in the whole dataset's stream
    shard_first = np.arange(0, n_packs, per_shard)
    start_in_shard = stream_start - stream_start[shard_first][shard_by_rank]
    tasks = []
    for index, p0 in enumerate(shard_first.tolist()):
        counts = counts_by_rank[p0:p0 + per_shard]
        tasks.append(ShardTask(os.path.join(directory, "shard-%05d.npy" % index),
                               np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), p0))
    rank = np.empty(n_packs, dtype=np.int64)
    rank[pack_order] = np.arange(n_packs)
    pack_of_member = np.repeat(np.arange(n_packs, dtype=np.int64), np.diff(member_offsets))
    slot = np.arange(len(members)) - member_offsets[pack_of_member]
    member_rank = rank[pack_of_member]
    shard_of = np.empty(len(members), dtype=np.int32)
    place = np.empty(len(members), dtype=np.int32)
    shard_of[members] = shard_by_rank[member_rank]
    place[members] = start_in_shard[member_rank] + slot
    return DatasetPlan(tasks, shard_of, place)


@dataclass
class DatasetSpec:
    """Where the streaming passes put each sequence of one dataset: output shard `pack // per_shard`,
    key `(pack % per_shard) * K + slot` in it (so key order is pack order, longest first). Small and
    picklable: it travels with every task."""

    kind: str
    max_sequences_per_pack: int  # K
    per_shard: int  # packs per output shard
    num_packs: int  # P
    slot_map: Optional[SlotMap]  # packed: packing/slots.py's map of the plan
    order: Optional[KeyedPermutation]  # padded (K = 1): sequence i is pack order(i)
    columns: Tuple[Column, ...] = ()  # a task's per-sequence columns, carried through the spill files
    token_columns: Tuple[Column, ...] = ()  # a task's per-token columns, likewise

    def __post_init__(self) -> None:
        if self.per_shard * self.max_sequences_per_pack >= 1 << 31:
            raise DataError("--shard-mb too large for %d sequences per pack" % self.max_sequences_per_pack)

    @property
    def num_shards(self) -> int:
        return -(-self.num_packs // self.per_shard)

    def locate(self, lengths: np.ndarray, first: int, before: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(shard, key) of the sequences first, first + 1, ... with `lengths`; `before` (S,) counts
        the sequences of each length before `first`."""
        if self.slot_map is not None:
            pack, slot = self.slot_map.place(lengths, length_ranks(lengths, before))
        else:
            pack, slot = self.order(np.arange(first, first + len(lengths))), np.zeros(len(lengths), np.int64)
        return pack // self.per_shard, (pack % self.per_shard) * self.max_sequences_per_pack + slot

    def shard_packs(self, shard: int) -> Tuple[int, np.ndarray]:
        """(first pack, (n,) sequences in each of its packs) of output shard `shard`."""
        first = shard * self.per_shard
        packs = np.arange(first, min(first + self.per_shard, self.num_packs))
        sizes = self.slot_map.pack_sizes(packs) if self.slot_map is not None else np.ones(len(packs), np.int64)
        return first, sizes


def dataset_spec(kind: str, layout: PackLayout, shard_bytes: int, num_packs: int, slot_map: Optional[SlotMap],
                 order: Optional[KeyedPermutation]) -> DatasetSpec:
    return DatasetSpec(kind, layout.max_sequences_per_pack, max(1, shard_bytes // layout.record_bytes), num_packs,
                       slot_map, order, layout.columns, layout.token_columns)


def gather_shard(spills: Sequence[str], shard: int, spec: DatasetSpec, layout: PackLayout, path: str) -> dict:
    """Output shard `shard` of a dataset from its blocks of the spill files: check that they hold
    exactly the plan's packs, then write it (`write_shard`); returns its manifest entry."""
    keys, instances = read_spill_blocks(spills, shard, spec.num_shards, layout.vocab_size, spec.columns,
                                        spec.token_columns)
    first, sizes = spec.shard_packs(shard)
    counts = np.bincount(keys // spec.max_sequences_per_pack, minlength=len(sizes))
    if len(counts) != len(sizes) or not np.array_equal(counts, sizes):
        raise RuntimeError("spill files do not hold output shard %d's packs as planned" % shard)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return write_shard(instances, ShardTask(path, offsets, first), layout)


# ---------------------------------------------------------------------------------------------------
# spill files: one per (group of input shards, dataset), holding the group's sequences sorted by
# (output shard, key); each array is stored whole, so writing one is a few large writes however many output
# shards there are, and reading output shard j's block is one small read of the index plus one read
# per array:
#
#   (J + 1, 3) int64   cumulative (sequences, tokens, predictions) before output shard j's block
#   key, lengths, a_lengths, nsp_labels, mlm_counts   int32 (n each)
#   tokens (t), mlm_positions uint16 (q), mlm_labels (q)
#   a task's columns, each in its type (n times its shape per sequence; none for pretraining)
#   a task's token columns, each in its type (t times its shape per token; only question answering has one)

_HEAD = np.dtype("<i8")
_PER_SEQUENCE = ("key",) + PER_INSTANCE


def _spill_arrays(n: int, t: int, q: int, tokens: np.dtype, columns: Sequence[Column] = (),
                  token_columns: Sequence[Column] = ()):
    """(name, dtype, count) of the arrays after the index, in file order."""
    return ([(name, np.dtype("<i4"), n) for name in _PER_SEQUENCE]
            + [("tokens", tokens, t), ("mlm_positions", np.dtype("<u2"), q), ("mlm_labels", tokens, q)]
            + [(name, np.dtype(kind), n * int(np.prod(shape, dtype=np.int64))) for name, kind, shape in columns]
            + [(name, np.dtype(kind), t * int(np.prod(shape, dtype=np.int64))) for name, kind, shape in token_columns])


def write_spill(path: str, instances: Instances, shard_of: np.ndarray, key: np.ndarray, num_shards: int,
                vocab_size: Optional[int], columns: Sequence[Column] = (), token_columns: Sequence[Column] = ()
                ) -> None:
    """Write `instances` (one group) grouped by output shard, in the order of their key."""
    tokens = token_dtype(vocab_size)
    order = np.lexsort((key, shard_of))
    bounds = np.searchsorted(shard_of[order], np.arange(num_shards + 1))  # (J + 1,)
    ordered = gather_instances(instances, order)
    token_end = np.concatenate([[0], np.cumsum(ordered.lengths, dtype=np.int64)])
    mlm_end = np.concatenate([[0], np.cumsum(ordered.mlm_counts, dtype=np.int64)])
    index = np.stack([bounds, token_end[bounds], mlm_end[bounds]], axis=1).astype(_HEAD)  # (J + 1, 3)
    values = {"key": key[order], "tokens": ordered.tokens, "mlm_positions": ordered.mlm_positions,
              "mlm_labels": ordered.mlm_labels}
    values.update({name: getattr(ordered, name) for name in PER_INSTANCE})
    values.update(ordered.extra)
    values.update(ordered.token_extra)
    with open(path, "wb") as f:
        f.write(index.tobytes())
        for name, dtype, _ in _spill_arrays(0, 0, 0, tokens, columns, token_columns):
            f.write(np.ascontiguousarray(values[name], dtype=dtype).tobytes())


def read_spill_block(path: str, shard: int, num_shards: int, vocab_size: Optional[int],
                     columns: Sequence[Column] = (), token_columns: Sequence[Column] = ()
                     ) -> Tuple[np.ndarray, Instances]:
    """(key, instances) of output shard `shard` in one spill file (opened, read and closed)."""
    tokens = token_dtype(vocab_size)
    row = 3 * _HEAD.itemsize
    fd = os.open(path, os.O_RDONLY)
    try:
        (n0, t0, q0), (n1, t1, q1) = np.frombuffer(os.pread(fd, 2 * row, shard * row), dtype=_HEAD).reshape(2, 3)
        (n, t, q) = np.frombuffer(os.pread(fd, row, num_shards * row), dtype=_HEAD).tolist()  # totals
        at = (num_shards + 1) * row
        starts = {"n": int(n0), "t": int(t0), "q": int(q0)}
        counts = {"n": int(n1 - n0), "t": int(t1 - t0), "q": int(q1 - q0)}
        kind = {name: "n" for name in _PER_SEQUENCE}
        kind.update(tokens="t", mlm_positions="q", mlm_labels="q")
        shapes = {name: ("n", shape) for name, _, shape in columns}
        shapes.update({name: ("t", shape) for name, _, shape in token_columns})
        out, extra, token_extra = {}, {}, {}
        for name, dtype, total in _spill_arrays(n, t, q, tokens, columns, token_columns):
            if name in shapes:  # a task's column: its own type and shape, n (or t) rows of it
                k, shape = shapes[name]
                width = int(np.prod(shape, dtype=np.int64))
                size = counts[k] * width * dtype.itemsize
                data = os.pread(fd, size, at + starts[k] * width * dtype.itemsize) if size else b""
                (extra if k == "n" else token_extra)[name] = np.frombuffer(
                    data, dtype=dtype, count=counts[k] * width).reshape((counts[k],) + tuple(shape)).copy()
                at += total * dtype.itemsize
                continue
            k = kind[name]
            size = counts[k] * dtype.itemsize
            data = os.pread(fd, size, at + starts[k] * dtype.itemsize) if size else b""
            out[name] = np.frombuffer(data, dtype=dtype, count=counts[k]).astype(np.int32)
            at += total * dtype.itemsize
    finally:
        os.close(fd)
    key = out.pop("key")
    return key, Instances(**out, extra=extra, token_extra=token_extra)


def read_spill_blocks(paths: Sequence[str], shard: int, num_shards: int, vocab_size: Optional[int],
                      columns: Sequence[Column] = (), token_columns: Sequence[Column] = ()
                      ) -> Tuple[np.ndarray, Instances]:
    """(keys, instances) of output shard `shard` from every spill file, one file open at a time, in
    key order (each key exactly once, else RuntimeError)."""
    keys, parts = [], []
    for path in paths:
        key, part = read_spill_block(path, shard, num_shards, vocab_size, columns, token_columns)
        if len(key):
            keys.append(key)
            parts.append(part)
    instances = concat_instances(parts)
    if not parts:
        return np.zeros(0, np.int64), instances
    key = np.concatenate(keys).astype(np.int64)
    order = np.argsort(key, kind="stable")
    key = key[order]
    if np.any(key[1:] == key[:-1]):
        raise RuntimeError("spill files hold a place of output shard %d twice" % shard)
    return key, gather_instances(instances, order)


def scatter(paths: List[str], first: int, before: np.ndarray, spills: List[tuple], vocab_size: int) -> None:
    """Worker: one group of input shards (their instance files, in order; `first` is the index of
    their first instance and `before` (S,) counts the instances of each length before it) -> one
    spill file per dataset; the instance files are removed. `spills`: (spill path, DatasetSpec)."""
    instances = concat_instances([load_instances(path) for path in paths])
    for spill, spec in spills:
        shard, key = spec.locate(instances.lengths, first, before)
        write_spill(spill, instances, shard, key, spec.num_shards, vocab_size, spec.columns, spec.token_columns)
    for path in paths:
        os.remove(path)


def write_shard(instances: Instances, task: ShardTask, layout: PackLayout) -> dict:
    """Build one shard from its instances (in pack order) and write it; returns its manifest entry
    {file, num_packs, sha256}.

    The packs are built in memory (one shard, bounded by the shard size), checked as a reader checks them
    (data/shards.py `check_packs`: every value's range and the format's invariants), and written with plain
    writes, so a full disk raises OSError (ENOSPC) at the write instead of killing the process with
    SIGBUS, as filling a sparse memory-mapped file would. The bytes are hashed as they are written.
    """
    n_packs = len(task.offsets) - 1
    dtype = layout.dtype
    records = build_packs(instances, task.offsets, layout, first_pack=task.first_pack)
    if layout.vocab_size is not None:  # the format's values and invariants, as every reader checks them
        check_packs("pack of %s being written" % task.path, records, task.first_pack,
                    pack_facts(layout.max_seq_length, layout.max_sequences_per_pack, layout.vocab_size, layout.cls_id,
                               layout.task, layout.num_sequences))
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                  "fortran_order": False, "shape": (n_packs,)})
    head = header.getvalue()
    body = memoryview(records.view(np.uint8)) if n_packs else b""
    digest = hashlib.sha256(head)
    digest.update(body)
    with open(task.path, "wb") as f:
        f.write(head)
        f.write(body)
    return {"file": os.path.basename(task.path), "num_packs": int(n_packs), "sha256": digest.hexdigest()}


def write_dataset_in_memory(instances: Instances, members: np.ndarray, member_offsets: np.ndarray,
                            pack_order: np.ndarray, layout: PackLayout, directory: str,
                            shard_bytes: int) -> List[dict]:
    """Every shard of one dataset from instances held in memory (small datasets: tests, fixtures);
    the same plan and writer as the pipeline's streaming passes."""
    plan = plan_dataset(members, member_offsets, pack_order, layout, directory, shard_bytes)
    entries = []
    for j, task in enumerate(plan.tasks):
        chosen = np.flatnonzero(plan.shard_of == j)
        ordered = chosen[np.argsort(plan.place[chosen], kind="stable")]
        entries.append(write_shard(gather_instances(instances, ordered), task, layout))
    return entries
