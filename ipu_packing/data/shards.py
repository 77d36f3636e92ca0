"""The shards of a dataset directory, checked against its manifest before any pack is used.

`validate_shards` checks each shard's header (record type and pack count against the manifest), its sha256,
and, with the checksums, every value it holds, vectorised, a block of packs at a time (`check_packs`):

    input_ids        [0, V)                     mlm_positions  [0, S), on a token of a sequence where used
    token_type_ids   {0, 1}                     mlm_labels     [0, V) or IGNORE_INDEX
    position_ids     [0, S)                     cls_positions  [0, S)
    sequence_ids     [0, K]                     nsp_labels     {0, 1} or IGNORE_INDEX

and that the packs add up to the manifest's counts: sequences (used NSP slots), real tokens (sequence id
not 0), masked tokens (used MLM slots), the sequence-length histogram and the sequences-per-pack histogram.
The first value out of range is one DataError line naming the shard, the field and the pack and slot:

    shard DIR/shard-00000.npy: field 'position_ids' pack 3 slot 17 is 700, outside [0, 512)

A manifest and shards that agree in their checksums but not in their values (a hand-edited manifest, a
shard written by another tool) are refused here, when the dataset is opened, not at step 1000.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

import numpy as np

from ..fsutil import contained_path, sha256_file
from ..errors import DataError
from .format import FIELDS, IGNORE_INDEX, pack_dtype

BLOCK_TOKENS = 1 << 22
"""Token slots (packs x S) checked at a time: memory is a few times this, whatever the shard size."""


def field_ranges(manifest: Dict[str, Any]) -> Dict[str, Tuple[int, int, Tuple[int, ...]]]:
    """{field: (low, high, also allowed)}: a value is valid when low <= value < high or in the tuple."""
    s, k, v = manifest["max_seq_length"], manifest["max_sequences_per_pack"], manifest["vocab_size"]
    return {"input_ids": (0, v, ()), "token_type_ids": (0, 2, ()), "position_ids": (0, s, ()),
            "sequence_ids": (0, k + 1, ()), "mlm_positions": (0, s, ()), "mlm_labels": (0, v, (IGNORE_INDEX,)),
            "cls_positions": (0, s, ()), "nsp_labels": (0, 2, (IGNORE_INDEX,))}


class PackCounts:
    """What the packs of a dataset hold, summed over its blocks (compared with the manifest at the end)."""

    def __init__(self, max_seq_length: int, max_sequences_per_pack: int) -> None:
        self.lengths = np.zeros(max_seq_length + 1, dtype=np.int64)  # [l]: sequences of l tokens
        self.per_pack = np.zeros(max_sequences_per_pack + 1, dtype=np.int64)  # [k]: packs of k sequences
        self.masked = 0


def _out_of_range(where: str, name: str, values: np.ndarray, low: int, high: int, allowed: Tuple[int, ...],
                  first_pack: int) -> None:
    """DataError at the first value of `values` (P, width) outside [low, high) and not in `allowed`. The values
    stay in their stored type: the min and max decide, and only a block that fails is searched."""
    if values.size == 0:
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
        pack, slot = divmod(flat, values.shape[1])
        also = " or %s" % ", ".join(str(a) for a in allowed) if allowed else ""
        raise DataError("%s: field %r pack %d slot %d is %d, outside [%d, %d)%s"
                        % (where, name, first_pack + pack, slot, int(wide[pack, slot]), low, high, also))


def check_packs(where: str, packs: np.ndarray, first_pack: int, manifest: Dict[str, Any], counts: PackCounts) -> None:
    """Every value of `packs` ((P,) records, packs first_pack ...) in its field's range, and their counts added
    to `counts`. DataError naming `where`, the field, the pack and the slot of the first bad value."""
    ranges = field_ranges(manifest)
    arrays = {name: np.asarray(packs[name]) for name in FIELDS}  # (P, width) each, in the stored types
    for name in FIELDS:
        low, high, allowed = ranges[name]
        _out_of_range(where, name, arrays[name], low, high, allowed, first_pack)
    k = manifest["max_sequences_per_pack"]
    sequence_ids = arrays["sequence_ids"]
    used = arrays["mlm_labels"] != IGNORE_INDEX  # (P, M)
    rows = np.arange(len(packs))[:, None]
    on_padding = used & (sequence_ids[rows, arrays["mlm_positions"]] == 0)
    if on_padding.any():
        pack, slot = np.argwhere(on_padding)[0]
        raise DataError("%s: field 'mlm_positions' pack %d slot %d is %d, a padding position (sequence id 0)"
                        % (where, first_pack + pack, slot, arrays["mlm_positions"][pack, slot]))
    # tokens of each (pack, sequence id): K comparisons for a small K, else one bincount over the block
    if k <= 16:
        per_sequence = np.stack([(sequence_ids == j).sum(axis=1) for j in range(1, k + 1)], axis=1)  # (P, K)
    else:
        keys = (rows * (k + 1) + sequence_ids.astype(np.int64)).reshape(-1)
        per_sequence = np.bincount(keys, minlength=len(packs) * (k + 1)).reshape(len(packs), k + 1)[:, 1:]
    sequences = (arrays["nsp_labels"] != IGNORE_INDEX).sum(axis=1)  # (P,)
    present = (per_sequence > 0).sum(axis=1)
    wrong = np.flatnonzero(present != sequences)
    if len(wrong):
        p = int(wrong[0])
        raise DataError("%s: pack %d holds %d sequences by field 'sequence_ids' but %d by field 'nsp_labels'"
                        % (where, first_pack + p, int(present[p]), int(sequences[p])))
    counts.lengths += np.bincount(per_sequence[per_sequence > 0], minlength=len(counts.lengths))[:len(counts.lengths)]
    counts.per_pack += np.bincount(sequences, minlength=k + 1)
    counts.masked += int(used.sum())


def compare_counts(path: str, manifest: Dict[str, Any], counts: PackCounts) -> None:
    """The manifest's counts against what its packs hold (`check_packs` over all of them)."""
    lengths = np.asarray(manifest["sequence_length_histogram"], dtype=np.int64)
    per_pack = np.asarray(manifest["sequences_per_pack_histogram"], dtype=np.int64)
    if counts.per_pack[0]:
        raise DataError("%s: %d packs hold no sequence (the format has none)" % (path, int(counts.per_pack[0])))
    facts = (("num_sequences", manifest["num_sequences"], int(counts.lengths.sum())),
             ("num_tokens", manifest["num_tokens"], int(np.dot(counts.lengths, np.arange(len(counts.lengths))))),
             ("num_masked_tokens", manifest["num_masked_tokens"], counts.masked))
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
    expected = pack_dtype(manifest["max_seq_length"], manifest["mlm_slots"], manifest["max_sequences_per_pack"],
                          manifest["vocab_size"])
    vocab_path = contained_path(directory, manifest["vocab_file"])  # read_manifest has checked the name
    if not os.path.isfile(vocab_path):
        raise DataError("%s: missing (named by manifest field 'vocab_file')" % vocab_path)
    if checksums and sha256_file(vocab_path) != manifest["vocab_checksum"]:
        raise DataError("%s: sha256 does not match manifest field 'vocab_checksum'" % vocab_path)
    counts = PackCounts(manifest["max_seq_length"], manifest["max_sequences_per_pack"])
    block = max(1, BLOCK_TOKENS // manifest["max_seq_length"])
    paths = []
    for shard in manifest["shards"]:
        path = contained_path(directory, shard["file"], "shard %r in %s" % (shard["file"], directory))
        if not os.path.isfile(path):
            raise DataError("shard %s: file is missing" % path)
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except Exception as error:  # numpy raises ValueError/OSError/EOFError... for a broken header
            reason = (str(error).splitlines() or [type(error).__name__])[0]
            raise DataError("shard %s: not a readable .npy file (%s)" % (path, reason[:80]))
        if array.dtype != expected:
            names = array.dtype.names or ()
            for name in FIELDS:
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
