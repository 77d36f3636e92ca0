"""The shards of a dataset directory, checked against its manifest before any pack is used.

`validate_shards` checks each shard's header (record type and pack count against the manifest), its sha256,
and, with the checksums, every value it holds, vectorised, a block of packs at a time (`check_packs`):

    input_ids        [0, V)                     mlm_positions  [0, S), on a token of a sequence where used
    token_type_ids   {0, 1}                     mlm_labels     [0, V) or IGNORE_INDEX
    position_ids     [0, S)                     cls_positions  [0, S)
    sequence_ids     [0, K]                     nsp_labels     {0, 1} or IGNORE_INDEX

then that every pack holds the format's structural invariants (format.py: sequence ids in contiguous runs
1..k, positions restarting at each [CLS], token types, [CLS], NSP and MLM slots where the sequences are),
and that the packs add up to the manifest's counts: sequences (used NSP slots), real tokens (sequence id
not 0), masked tokens (used MLM slots), the sequence-length histogram and the sequences-per-pack histogram.
The first value out of range, or the first pack that breaks an invariant, is one DataError line naming the
shard, the pack and the field and slot:

    shard DIR/shard-00000.npy: field 'position_ids' pack 3 slot 17 is 700, outside [0, 512)
    shard DIR/shard-00000.npy: pack 3: field 'position_ids' slot 40 is 0, expected 12 (inside sequence 2, ...)

The writer (data/write/packs.py `write_shard`) runs the same `check_packs` on every shard it builds, before
writing it.

A manifest and shards that agree in their checksums but not in their values (a hand-edited manifest, a
shard written by another tool) are refused here, when the dataset is opened, not at step 1000. So is a
vocab.txt that is not the vocabulary the manifest describes (data/vocab.py `check_dataset_vocab`: its size,
its special tokens at the recorded ids, no token twice), with or without the checksums.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..fsutil import check_regular, contained_path, sha256_file
from ..errors import DataError
from .format import IGNORE_INDEX, PRETRAINING, FieldLayout, pack_dtype, field_layout
from .vocab import check_dataset_vocab

BLOCK_TOKENS = 1 << 22
"""Token slots (packs x S) checked at a time: memory is a few times this, whatever the shard size."""


def field_ranges(manifest: Dict[str, Any]) -> Dict[str, Tuple[Any, Any, Tuple[int, ...]]]:
    """{field: (low, high, also allowed)} of the manifest's task's fields (format.FIELD_TABLE's value kinds): an
    integer value is valid when low <= value < high or in the tuple. A float field has (None, None, ()) for
    "finite" (real) or (0, 2, ()) with only 0 and 1 valid (multi-hot); `_out_of_range` checks those."""
    s, k, v = manifest["max_seq_length"], manifest["max_sequences_per_pack"], manifest["vocab_size"]
    task = field_layout(manifest)
    kinds = {"token": (0, v, ()), "token_type": (0, 2, ()), "position": (0, s, ()), "sequence": (0, k + 1, ()),
             "token_label": (0, v, (IGNORE_INDEX,)), "binary_label": (0, 2, (IGNORE_INDEX,)),
             "class": (0, task.num_labels, (IGNORE_INDEX,)), "real": (None, None, ()), "multi_hot": (0, 2, ()),
             "example": (0, manifest.get("num_sequences", 1 << 31), (-1,)), "question": (0, task.num_examples, (-1,)),
             "answer_position": (0, s, (IGNORE_INDEX,)), "offset": (0, (1 << 31) - 1, (-1,))}
    return {f.name: kinds[f.values] for f in task.fields}


class PackCounts:
    """What the packs of a dataset hold, summed over its blocks (compared with the manifest at the end)."""

    def __init__(self, max_seq_length: int, max_sequences_per_pack: int, num_examples: int = 0) -> None:
        self.lengths = np.zeros(max_seq_length + 1, dtype=np.int64)  # [l]: sequences of l tokens
        self.per_pack = np.zeros(max_sequences_per_pack + 1, dtype=np.int64)  # [k]: packs of k sequences
        self.masked = 0
        # a task dataset: where each example id was first seen (pack * K + slot), -1 not yet
        self.example_seen = np.full(num_examples, -1, dtype=np.int64)


def _out_of_range(where: str, name: str, values: np.ndarray, low: int, high: int, allowed: Tuple[int, ...],
                  first_pack: int) -> None:
    """DataError at the first value of `values` (P, width) outside [low, high) and not in `allowed`. The values
    stay in their stored type: the min and max decide, and only a block that fails is searched."""
    if values.size == 0:
        return
    if values.dtype.kind == "f":  # float labels: finite (real), or 0 and 1 only (multi-hot)
        bad = ~np.isfinite(values) if low is None else (values != 0) & (values != 1)
        if bad.any():
            flat = int(np.flatnonzero(bad.reshape(-1))[0])
            pack, slot = _where_flat(values, flat)
            value = float(values.reshape(-1)[flat])
            raise DataError("%s: field %r pack %d slot %s is %r, %s" % (where, name, first_pack + pack, slot, value,
                                                                         "not a finite number" if low is None
                                                                         else "not 0 or 1 (multi-hot)"))
        return
    lowest, highest = int(values.min()), int(values.max())
    if lowest >= low and highest < high:
        return
    wide = values.astype(np.int64)
    bad = (wide < low) | (wide >= high)
    for extra in allowed:
        bad &= wide != extra
    if bad.any():
        flat = int(np.flatnonzero(bad.reshape(-1))[0])
        pack, slot = _where_flat(values, flat)
        also = " or %s" % ", ".join(str(a) for a in allowed) if allowed else ""
        raise DataError("%s: field %r pack %d slot %s is %d, outside [%d, %d)%s"
                        % (where, name, first_pack + pack, slot, int(wide.reshape(-1)[flat]), low, high, also))


def _where_flat(values: np.ndarray, flat: int) -> Tuple[int, str]:
    """(pack, slot) of flat index `flat` into (P, width) or (P, K, L) values; the slot of a (K, L) field reads
    "j label l"."""
    per_pack = int(np.prod(values.shape[1:]))
    pack, rest = divmod(flat, per_pack)
    if values.ndim == 3:
        return pack, "%d label %d" % divmod(rest, values.shape[2])
    return pack, str(rest)


_COPIED = ("token_type_ids", "position_ids", "sequence_ids", "mlm_positions", "mlm_labels", "cls_positions")


def pack_facts(max_seq_length: int, max_sequences_per_pack: int, vocab_size: int,
               cls_id: Optional[int], task: FieldLayout = PRETRAINING,
               num_sequences: Optional[int] = None) -> Dict[str, Any]:
    """What `check_packs` reads of a manifest, for packs that have none yet (the writer's own check). cls_id
    None leaves out the one check that needs the vocabulary: that each sequence's first token is [CLS]. A task
    dataset's packs also need the task and, for the range of its example ids, the split's num_sequences."""
    ids = {} if cls_id is None else {"[CLS]": int(cls_id)}
    facts = {"max_seq_length": max_seq_length, "max_sequences_per_pack": max_sequences_per_pack,
             "vocab_size": vocab_size, "special_token_ids": ids}
    if not task.is_pretraining:
        facts["task"] = {"name": task.name, "problem_type": task.problem_type, "num_labels": task.num_labels,
                         "has_labels": task.has_labels, "num_examples": task.num_examples}
        if num_sequences is not None:
            facts["num_sequences"] = int(num_sequences)
    return facts


def check_packs(where: str, packs: np.ndarray, first_pack: int, manifest: Dict[str, Any],
                counts: Optional[PackCounts] = None) -> None:
    """Every value of `packs` ((P,) records, packs first_pack ...) in its field's range, every pack holding
    the format's structural invariants (format.py), and, when `counts` is given, their counts added to it.
    DataError naming `where`, the pack and the field (and slot) or invariant of the first bad value: the
    ranges first, then the first pack that breaks an invariant. `manifest` needs max_seq_length,
    max_sequences_per_pack, vocab_size and special_token_ids (`pack_facts` makes one)."""
    ranges = field_ranges(manifest)
    task = field_layout(manifest)
    # (P, width) each, in the stored types; the fields the invariants pass over several times as contiguous
    # copies (numpy's passes over a field of the records, strided, are several times slower)
    arrays = {name: np.ascontiguousarray(packs[name]) if name in _COPIED else np.asarray(packs[name])
              for name in task.names}
    for name in task.names:
        low, high, allowed = ranges[name]
        _out_of_range(where, name, arrays[name], low, high, allowed, first_pack)
    cls_id = manifest["special_token_ids"].get("[CLS]")
    bad = _broken_packs(arrays, cls_id, task)
    if bad.any():
        p = int(np.flatnonzero(bad)[0])
        broken = _first_broken_invariant({n: a[p] for n, a in arrays.items()}, cls_id, task)
        if broken is None:  # the two passes disagree: a bug, not the data's fault
            raise AssertionError("pack %d of %s flagged as broken, but it breaks no invariant" % (p, where))
        raise DataError("%s: pack %d: %s" % (where, first_pack + p, broken))
    if not task.is_pretraining:
        _repeated_example(where, arrays[task.unique_ids], first_pack,
                          counts.example_seen if counts is not None else None, task.unique_ids)
    if counts is None:
        return
    k = manifest["max_sequences_per_pack"]
    sequence_ids = arrays["sequence_ids"]
    rows = np.arange(len(packs))[:, None]
    # tokens of each (pack, sequence id): K comparisons for a small K, else one bincount over the block
    if k <= 16:
        per_sequence = np.stack([(sequence_ids == j).sum(axis=1) for j in range(1, k + 1)], axis=1)  # (P, K)
    else:
        keys = (rows * (k + 1) + sequence_ids.astype(np.int64)).reshape(-1)
        per_sequence = np.bincount(keys, minlength=len(packs) * (k + 1)).reshape(len(packs), k + 1)[:, 1:]
    presence = arrays[task.presence]
    sequences = (presence != (IGNORE_INDEX if task.is_pretraining else -1)).sum(axis=1)  # (P,): the invariants
    counts.lengths += np.bincount(per_sequence[per_sequence > 0], minlength=len(counts.lengths))[:len(counts.lengths)]
    counts.per_pack += np.bincount(sequences, minlength=k + 1)
    if "mlm_labels" in arrays:
        counts.masked += int((arrays["mlm_labels"] != IGNORE_INDEX).sum())


def _repeated_example(where: str, example_ids: np.ndarray, first_pack: int, seen: Optional[np.ndarray],
                      name: str = "example_ids") -> None:
    """DataError at the first id of field `name` (example_ids; a question-answering task's feature_ids), in pack
    and slot order, of this block that an earlier slot of the block or, with `seen` ((N,) flat place of each id's
    first use in the dataset, -1 none; updated), of the dataset already holds. The ids are in range (checked
    before)."""
    k = example_ids.shape[1]
    flat = example_ids.reshape(-1).astype(np.int64)
    places = np.flatnonzero(flat != -1)  # (n,) flat index in the block of each used slot, ascending
    ids = flat[places]
    order = np.argsort(ids, kind="stable")  # equal ids stay in place order: the first of each is its first use
    ordered = ids[order]
    again = np.zeros(len(ids), dtype=bool)
    again[order[1:][ordered[1:] == ordered[:-1]]] = True  # a later use of an id within the block
    before = np.full(len(ids), -1, dtype=np.int64)  # the earlier use's place in the dataset
    if seen is not None and len(ids):
        before = seen[ids]
        again |= before != -1
    if again.any():
        i = int(np.flatnonzero(again)[0])
        if before[i] == -1:  # first used earlier in this block
            before[i] = first_pack * k + int(places[order[np.searchsorted(ordered, ids[i])]])
        pack, slot = divmod(first_pack * k + int(places[i]), k)
        raise DataError("%s: pack %d: field %r slot %d is %d, already used by pack %d slot %d (each %s of a split "
                        "appears exactly once)" % (where, pack, name, slot, int(ids[i]), *divmod(int(before[i]), k),
                                                   "window" if name == "feature_ids" else "example"))
    if seen is not None:
        seen[ids] = first_pack * k + places


def _broken_packs(a: Dict[str, np.ndarray], cls_id: Optional[int], task: FieldLayout = PRETRAINING) -> np.ndarray:
    """(P,) bool: the packs that break a structural invariant of format.py (only the first one flagged is
    certain to be the first broken pack; `_first_broken_invariant` then says which invariant, and where).

    The token fields are read once into flat contiguous arrays: the sequence ids, and v = position * 4 +
    token type, so that one unsigned difference checks both. Inside a sequence v grows by 4 (same segment)
    or 5 (A to B), and by nothing else: 4 * (position step) + (type step) is 4 or 5 only for a position step
    of 1 and a type step of 0 or 1 (with v = position * 2 + type, a position step of 2 and a type step of -1
    would pass as 3). A sequence's first token and padding have v = 0, a sequence's first token has the id
    before it plus one (and a sequence before it), padding has id 0. Every test is a whole-block pass of
    numpy; the heads' slots are gathered from the same flat arrays."""
    sid = a["sequence_ids"]
    n, s = sid.shape
    sid = sid.reshape(-1)
    v = a["position_ids"].astype(np.uint16 if s <= 1 << 14 else np.uint32).reshape(-1)  # position, 2 bits more
    v <<= 2
    np.bitwise_or(v, a["token_type_ids"].reshape(-1), out=v, casting="unsafe")  # types are 0 or 1 (ranges)
    nxt, prev = sid[1:], sid[:-1]  # token t + 1 of the block against token t
    grow = v[1:] - v[:-1]  # unsigned: a decrease is huge
    grow -= 4
    inside = v[1:] != 0
    real = nxt != 0
    # a real token's id is the one before it (inside a sequence) or one more (a sequence's first token), and
    # a real token never follows padding; a token inside a sequence (v > 0) is real and grows v by 4 or 5
    step = nxt - prev  # unsigned
    wrong = real & ((step != ~inside) | (prev == 0))
    wrong |= inside & ((grow > 1) | ~real)
    wrong[s - 1::s] = False  # the last token of one pack against the first of the next: slot 0 is checked below
    bad = (sid[::s] != 1) | (v[::s] != 0)
    if wrong.any():
        bad[(int(np.flatnonzero(wrong)[0]) + 1) // s] = True
    # [CLS] and NSP slots: slot j is used exactly for sequence j + 1, at its first token (v = 0)
    count = sid.reshape(n, s).max(axis=1)  # (P,) sequences, given the runs above
    cls = a["cls_positions"]
    k = cls.shape[1]
    slots = np.arange(1, k + 1, dtype=np.int64)[None, :]
    used = slots <= count[:, None]  # (P, K)
    base = np.arange(0, n * s, s, dtype=np.int64)[:, None]
    at = cls + base  # (P, K) flat index
    ok_cls = (np.take(sid, at) == slots) & (np.take(v, at) == 0)
    if cls_id is not None:
        ok_cls &= a["input_ids"][np.arange(n)[:, None], cls] == cls_id
    bad |= (used & ~ok_cls).any(axis=1) | (~used & (cls != 0)).any(axis=1)
    return bad | task.recipe.hook("broken_slots")(a, used, task)  # the task's own slots (tasks/)


def broken_mlm_slots(a: Dict[str, np.ndarray], used: np.ndarray, task: FieldLayout = PRETRAINING) -> np.ndarray:
    """(P,) bool: the pretraining packs whose NSP or MLM slots break format.py's invariants, given `used` (P, K)."""
    n, s = a["sequence_ids"].shape
    sid = a["sequence_ids"].reshape(-1)
    v = a["position_ids"].reshape(-1).astype(np.int64) * 4 + a["token_type_ids"].reshape(-1)  # 0: first or padding
    base = np.arange(0, n * s, s, dtype=np.int64)[:, None]
    bad = ((a["nsp_labels"] != IGNORE_INDEX) != used).any(axis=1)
    # MLM slots: used ones first, strictly increasing positions on real tokens that are no sequence's first
    # (v != 0 on a real token); an unused slot at position 0
    mlm_used = a["mlm_labels"] != IGNORE_INDEX
    positions = a["mlm_positions"]
    at = positions + base
    bad |= (mlm_used & ((np.take(sid, at) == 0) | (np.take(v, at) == 0))).any(axis=1)
    bad |= (~mlm_used & (positions != 0)).any(axis=1)
    bad |= (mlm_used[:, 1:] & (~mlm_used[:, :-1] | (positions[:, 1:] <= positions[:, :-1]))).any(axis=1)
    return bad


def broken_label_slots(a: Dict[str, np.ndarray], used: np.ndarray, task: FieldLayout) -> np.ndarray:
    """(P,) bool: the packs of a classification dataset whose example or label slots break format.py's
    invariants, given `used` (P, K): the slots that hold a sequence."""
    bad = ((a["example_ids"] != -1) != used).any(axis=1)
    labels = a["labels"]
    if labels.dtype.kind == "f":  # an empty slot's float labels are 0
        empty = labels != 0 if labels.ndim == 2 else (labels != 0).any(axis=2)
        return bad | (empty & ~used).any(axis=1)
    labelled = labels != IGNORE_INDEX
    return bad | (labelled != (used if task.has_labels else False)).any(axis=1)


def context_tokens(sequence_ids: np.ndarray, token_type_ids: np.ndarray) -> np.ndarray:
    """(..., S) bool: a question-answering pack's context tokens: token type 1, a real token, not the last of its
    sequence (the final [SEP])."""
    last = np.ones(sequence_ids.shape, dtype=bool)
    last[..., :-1] = sequence_ids[..., 1:] != sequence_ids[..., :-1]
    return (token_type_ids == 1) & (sequence_ids != 0) & ~last


def broken_answer_slots(a: Dict[str, np.ndarray], used: np.ndarray, task: Optional[FieldLayout] = None) -> np.ndarray:
    """(P,) bool: the question-answering packs whose example or feature slots, offsets or answer slots break
    format.py's invariants, given `used` (P, K)."""
    sid = a["sequence_ids"]  # (P, S)
    context = context_tokens(sid, a["token_type_ids"])  # (P, S)
    offsets = a["offsets"]  # (P, S, 2)
    bad = ((a["example_ids"] != -1) != used).any(axis=1) | ((a["feature_ids"] != -1) != used).any(axis=1)
    bad |= ((offsets[..., 0] != -1) != context).any(axis=1) | ((offsets[..., 1] != -1) != context).any(axis=1)
    bad |= (context & (offsets[..., 1] < offsets[..., 0])).any(axis=1)
    start, end, cls = a["start_positions"], a["end_positions"], a["cls_positions"]  # (P, K)
    bad |= ((start != IGNORE_INDEX) != used).any(axis=1) | ((end != IGNORE_INDEX) != used).any(axis=1)
    n, s = sid.shape
    rows = np.arange(n)[:, None]
    own = np.arange(1, used.shape[1] + 1)[None, :]  # (1, K) each slot's sequence id
    first, last = np.clip(start, 0, s - 1), np.clip(end, 0, s - 1)  # an unused slot's is checked above
    inside = (context[rows, first] & context[rows, last] & (sid[rows, first] == own) & (sid[rows, last] == own)
              & (start <= end))
    at_cls = (start == cls) & (end == cls)
    return bad | (used & ~(inside | at_cls)).any(axis=1)


def _first_broken_invariant(pack: Dict[str, np.ndarray], cls_id: Optional[int],
                            task: FieldLayout = PRETRAINING) -> Optional[str]:
    """The first invariant (format.py's order) one pack breaks, in words, naming the field and slot; None when
    it breaks none. A plain loop over one pack's slots: the statement `_broken_packs` vectorises."""
    sid = pack["sequence_ids"].astype(np.int64)
    pos = pack["position_ids"].astype(np.int64)
    types = pack["token_type_ids"].astype(np.int64)
    ids = pack["input_ids"].astype(np.int64)
    if sid[0] != 1:
        return ("field 'sequence_ids' slot 0 is %d: a pack's first token belongs to sequence 1 (a pack holds no "
                "sequence otherwise)" % sid[0])
    for t in range(1, len(sid)):
        if sid[t] != 0 and (sid[t - 1] == 0 or not 0 <= sid[t] - sid[t - 1] <= 1):
            after = "padding (0)" if sid[t - 1] == 0 else "sequence %d" % sid[t - 1]
            return ("field 'sequence_ids' slot %d is %d after %s: sequence ids must run 1, 2, ... in contiguous runs "
                    "from slot 0, then padding" % (t, sid[t], after))
    first = np.zeros(len(sid), dtype=bool)
    first[0] = True
    first[1:] = (sid[1:] != sid[:-1]) & (sid[1:] != 0)
    for t in range(len(sid)):
        if sid[t] == 0 or first[t]:
            want = 0
        else:
            want = pos[t - 1] + 1
        if pos[t] != want:
            what = "padding" if sid[t] == 0 else "sequence %d's first token" % sid[t] if first[t] else \
                "inside sequence %d, after position %d" % (sid[t], pos[t - 1])
            return "field 'position_ids' slot %d is %d, expected %d (%s)" % (t, pos[t], want, what)
    for t in range(len(sid)):
        if (sid[t] == 0 or first[t]) and types[t] != 0:
            what = "padding" if sid[t] == 0 else "sequence %d's first token ([CLS] A [SEP])" % sid[t]
            return "field 'token_type_ids' slot %d is %d, expected 0 on %s" % (t, types[t], what)
        if sid[t] != 0 and not first[t] and types[t] < types[t - 1]:
            return ("field 'token_type_ids' slot %d is %d after %d inside sequence %d: segment A (0), then B (1)"
                    % (t, types[t], types[t - 1], sid[t]))
    count = int(sid.max())
    starts = np.flatnonzero(first)
    cls = pack["cls_positions"].astype(np.int64)
    for j in range(len(cls)):
        if j < count and cls[j] != starts[j]:
            return ("field 'cls_positions' slot %d is %d, but sequence %d starts at slot %d (at %d: %s)"
                    % (j, cls[j], j + 1, starts[j], cls[j], "padding" if sid[cls[j]] == 0 else
                       "a token of sequence %d" % sid[cls[j]]))
        if j < count and cls_id is not None and ids[cls[j]] != cls_id:
            return ("field 'cls_positions' slot %d points at sequence %d's first token, id %d, not [CLS] (id %d)"
                    % (j, j + 1, ids[cls[j]], cls_id))
        if j >= count and cls[j] != 0:
            return ("field 'cls_positions' slot %d is %d, but sequences in the pack: %d (an unused slot is 0)"
                    % (j, cls[j], count))
    return task.recipe.hook("first_broken_slot")(pack, count, task)  # the task's own slots (tasks/)


def first_broken_mlm_slot(pack: Dict[str, np.ndarray], count: int, task: FieldLayout = PRETRAINING) -> Optional[str]:
    """The first NSP or MLM slot of a pretraining pack of `count` sequences that breaks an invariant, in words."""
    sid = pack["sequence_ids"].astype(np.int64)
    first = np.zeros(len(sid), dtype=bool)
    first[0] = True
    first[1:] = (sid[1:] != sid[:-1]) & (sid[1:] != 0)
    nsp = pack["nsp_labels"].astype(np.int64)
    for j in range(len(nsp)):
        if (nsp[j] != IGNORE_INDEX) != (j < count):
            state = "unused (%d)" % IGNORE_INDEX if nsp[j] == IGNORE_INDEX else "used (label %d)" % nsp[j]
            return ("field 'nsp_labels' slot %d is %s, but sequences in the pack: %d (slot k - 1 holds sequence k's "
                    "label, and only it: slots 0 .. %d used, the rest %d)" % (j, state, count, count - 1, IGNORE_INDEX))
    labels, mpos = pack["mlm_labels"].astype(np.int64), pack["mlm_positions"].astype(np.int64)
    used = labels != IGNORE_INDEX
    for j in range(len(labels)):
        if used[j] and j and not used[j - 1]:
            return "field 'mlm_labels' slot %d is used after the unused slot %d (the used MLM slots come first)" % (
                j, j - 1)
        if not used[j] and mpos[j] != 0:
            return "field 'mlm_positions' slot %d is %d, but the slot is unused (its position must be 0)" % (j, mpos[j])
        if used[j] and sid[mpos[j]] == 0:
            return "field 'mlm_positions' slot %d is %d, a padding position (sequence id 0)" % (j, mpos[j])
        if used[j] and first[mpos[j]]:
            return ("field 'mlm_positions' slot %d is %d, sequence %d's [CLS] (never a prediction)"
                    % (j, mpos[j], sid[mpos[j]]))
        if used[j] and j and mpos[j] <= mpos[j - 1]:
            return ("field 'mlm_positions' slot %d is %d, not after slot %d's %d: positions %s (each sequence's "
                    "predictions in order, after the previous sequence's)"
                    % (j, mpos[j], j - 1, mpos[j - 1], "appear twice" if mpos[j] == mpos[j - 1] else
                       "out of order"))
    return None


def first_broken_example_slot(pack: Dict[str, np.ndarray], count: int) -> Optional[str]:
    """The first example slot of a task pack of `count` sequences that is used without a sequence or the other way
    round, in words."""
    ids = pack["example_ids"].astype(np.int64)
    for j in range(len(ids)):
        if (ids[j] != -1) != (j < count):
            state = "unused (-1)" if ids[j] == -1 else "used (example %d)" % ids[j]
            return ("field 'example_ids' slot %d is %s, but sequences in the pack: %d (slot k - 1 holds sequence k's "
                    "example, and only it: slots 0 .. %d used, the rest -1)" % (j, state, count, count - 1))
    return None


def first_broken_label_slot(pack: Dict[str, np.ndarray], count: int, task: FieldLayout) -> Optional[str]:
    """The first example or label slot of a classification pack of `count` sequences that breaks an invariant, in
    words."""
    broken = first_broken_example_slot(pack, count)
    if broken is not None:
        return broken
    labels = pack["labels"]
    for j in range(len(labels)):
        if labels.dtype.kind == "f":
            if j >= count and np.any(labels[j] != 0):
                return ("field 'labels' slot %d is %s, but the slot is empty (sequences in the pack: %d; an empty "
                        "slot's labels are 0)" % (j, labels[j].tolist(), count))
            continue
        value = int(labels[j])
        if task.has_labels and (value != IGNORE_INDEX) != (j < count):
            return ("field 'labels' slot %d is %d, but sequences in the pack: %d (slots 0 .. %d hold their sequences' "
                    "labels, the rest %d)" % (j, value, count, count - 1, IGNORE_INDEX))
        if not task.has_labels and value != IGNORE_INDEX:
            return ("field 'labels' slot %d is %d in a split without labels (every slot %d)"
                    % (j, value, IGNORE_INDEX))
    return None


def first_broken_answer_slot(pack: Dict[str, np.ndarray], count: int,
                             task: Optional[FieldLayout] = None) -> Optional[str]:
    """The first example or feature slot, offset or answer slot of a question-answering pack of `count` sequences
    that breaks an invariant, in words."""
    broken = first_broken_example_slot(pack, count)
    if broken is not None:
        return broken
    ids = pack["feature_ids"].astype(np.int64)
    for j in range(len(ids)):
        if (ids[j] != -1) != (j < count):
            state = "unused (-1)" if ids[j] == -1 else "used (window %d)" % ids[j]
            return ("field 'feature_ids' slot %d is %s, but sequences in the pack: %d (slots 0 .. %d used, the rest "
                    "-1)" % (j, state, count, count - 1))
    sid = pack["sequence_ids"].astype(np.int64)
    context = context_tokens(sid, pack["token_type_ids"].astype(np.int64))
    offsets = pack["offsets"].astype(np.int64)
    for t in range(len(sid)):
        used = bool(offsets[t, 0] != -1 or offsets[t, 1] != -1)
        if used != context[t] or (used and (offsets[t, 0] == -1 or offsets[t, 1] == -1)):
            what = ("a context token of sequence %d" % sid[t] if context[t] else "padding" if sid[t] == 0 else
                    "not a context token of sequence %d (a question token, [CLS] or [SEP])" % sid[t])
            return ("field 'offsets' slot %d is %s, but the token is %s (a context token has both offsets, every "
                    "other token -1)" % (t, offsets[t].tolist(), what))
        if used and offsets[t, 1] < offsets[t, 0]:
            return "field 'offsets' slot %d is %s: its end is before its start" % (t, offsets[t].tolist())
    cls = pack["cls_positions"].astype(np.int64)
    for name in ("start_positions", "end_positions"):
        values = pack[name].astype(np.int64)
        for j in range(len(values)):
            if (values[j] != IGNORE_INDEX) != (j < count):
                state = "unused (%d)" % IGNORE_INDEX if values[j] == IGNORE_INDEX else "used (%d)" % values[j]
                return ("field %r slot %d is %s, but sequences in the pack: %d (slots 0 .. %d used, the rest %d)"
                        % (name, j, state, count, count - 1, IGNORE_INDEX))
    start, end = pack["start_positions"].astype(np.int64), pack["end_positions"].astype(np.int64)
    for j in range(count):
        if start[j] == cls[j] and end[j] == cls[j]:
            continue
        for name, at in (("start_positions", start[j]), ("end_positions", end[j])):
            if not (context[at] and sid[at] == j + 1):
                where = ("sequence %d's [CLS] without the other position" % (j + 1) if at == cls[j] else
                         "padding" if sid[at] == 0 else "a token of sequence %d" % sid[at] if sid[at] != j + 1
                         else "sequence %d's question, [CLS] or [SEP]" % (j + 1))
                return ("field %r slot %d is %d, %s: an answer is both positions on sequence %d's [CLS] (%d) or both "
                        "on its context tokens" % (name, j, at, where, j + 1, cls[j]))
        if start[j] > end[j]:
            return ("field 'start_positions' slot %d is %d, after field 'end_positions' %d" % (j, start[j], end[j]))
    return None


def compare_counts(path: str, manifest: Dict[str, Any], counts: PackCounts) -> None:
    """The manifest's counts against what its packs hold (`check_packs` over all of them)."""
    lengths = np.asarray(manifest["sequence_length_histogram"], dtype=np.int64)
    per_pack = np.asarray(manifest["sequences_per_pack_histogram"], dtype=np.int64)
    if counts.per_pack[0]:
        raise DataError("%s: %d packs hold no sequence (the format has none)" % (path, int(counts.per_pack[0])))
    facts = [("num_sequences", manifest["num_sequences"], int(counts.lengths.sum())),
             ("num_tokens", manifest["num_tokens"], int(np.dot(counts.lengths, np.arange(len(counts.lengths)))))]
    if "num_masked_tokens" in manifest:
        facts.append(("num_masked_tokens", manifest["num_masked_tokens"], counts.masked))
    for key, stated, held in facts:
        if stated != held:
            raise DataError("%s: field %r is %d but the shards hold %d" % (path, key, stated, held))
    for key, stated, held in (("sequence_length_histogram", lengths, counts.lengths[1:]),
                              ("sequences_per_pack_histogram", per_pack, counts.per_pack[1:])):
        differ = np.flatnonzero(stated != held)
        if len(differ):
            i = int(differ[0])
            raise DataError("%s: field %r entry %d is %d but the shards hold %d" % (path, key, i, stated[i], held[i]))


def validate_shards(directory: str, manifest: Dict[str, Any], checksums: bool = True) -> List[str]:
    """Check every shard's header against the manifest, and unless checksums=False its sha256 and every value
    it holds (`check_packs`, then `compare_counts`). Returns the shard paths. Raises DataError naming the shard
    and the field on any mismatch."""
    task = field_layout(manifest)
    expected = pack_dtype(manifest["max_seq_length"], manifest.get("mlm_slots", 0), manifest["max_sequences_per_pack"],
                          manifest["vocab_size"], task)
    vocab_path = contained_path(directory, manifest["vocab_file"])  # read_manifest has checked the name
    if not os.path.lexists(vocab_path):
        raise DataError("%s: missing (named by manifest field 'vocab_file')" % vocab_path)
    check_regular(vocab_path, DataError)
    if checksums and sha256_file(vocab_path) != manifest["vocab_checksum"]:
        raise DataError("%s: sha256 does not match manifest field 'vocab_checksum'" % vocab_path)
    check_dataset_vocab(directory, manifest)  # its size, special tokens and no token twice (cheap: always)
    for name, sha256, key, sha_key in task.recipe.companion_files(manifest.get("task") or {}):  # QA's questions
        path = contained_path(directory, name)
        if not os.path.lexists(path):
            raise DataError("%s: missing (named by manifest field 'task' entry %r)" % (path, key))
        check_regular(path, DataError)
        if checksums and sha256_file(path) != sha256:
            raise DataError("%s: sha256 does not match manifest field 'task' entry %r" % (path, sha_key))
    counts = PackCounts(manifest["max_seq_length"], manifest["max_sequences_per_pack"],
                        0 if task.is_pretraining else manifest["num_sequences"])
    block = max(1, BLOCK_TOKENS // manifest["max_seq_length"])
    paths = []
    for shard in manifest["shards"]:
        path = contained_path(directory, shard["file"], "shard %r in %s" % (shard["file"], directory))
        if not os.path.lexists(path):
            raise DataError("shard %s: file is missing" % path)
        check_regular(path, DataError)  # a FIFO or a device: one line, never a hang (a memory map takes a path)
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except Exception as error:  # numpy raises ValueError/OSError/EOFError... for a broken header
            reason = (str(error).splitlines() or [type(error).__name__])[0]
            raise DataError("shard %s: not a readable .npy file (%s)" % (path, reason[:80]))
        if array.dtype != expected:
            names = array.dtype.names or ()
            for name in task.names:
                if name not in names:
                    raise DataError("shard %s: field %r is missing" % (path, name))
                if array.dtype[name] != expected[name]:
                    raise DataError("shard %s: field %r has type %s, manifest implies %s"
                                    % (path, name, array.dtype[name], expected[name]))
            raise DataError("shard %s: record type %s does not match the manifest" % (path, array.dtype))
        if array.shape != (shard["num_packs"],):
            raise DataError("shard %s: holds %s packs, manifest field 'num_packs' says %d"
                            % (path, array.shape, shard["num_packs"]))
        if checksums:
            if sha256_file(path) != shard["sha256"]:
                raise DataError("shard %s: sha256 does not match the manifest (field 'sha256'): the file is corrupt"
                                % path)
            for start in range(0, len(array), block):
                check_packs("shard %s" % path, array[start:start + block], start, manifest, counts)
        del array
        paths.append(path)
    if checksums:
        compare_counts(os.path.join(directory, "manifest.json"), manifest, counts)
    return paths
