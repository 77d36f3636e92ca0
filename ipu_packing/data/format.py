"""On-disk format of a prepared dataset directory (numpy only, no torch).

A dataset directory holds

    manifest.json          what is in the directory, with a checksum for every file
    vocab.txt              the vocabulary the token ids refer to (one token a line, id = line number)
    shard-00000.npy ...    fixed-shape packs, one numpy structured array per shard

Each shard is a 1-D numpy array of records, one record per pack, written with `numpy.save`, so a user
can open it with numpy alone and memory-map it:

    packs = numpy.load("shard-00000.npy", mmap_mode="r")
    packs["input_ids"]          # (P, S) int32

Record fields (legend: S = max_seq_length, M = mlm_slots, K = max_sequences_per_pack), all int32:

    input_ids       (S,)  token ids after masking; 0 ([PAD]) after the last sequence
    token_type_ids  (S,)  0 for [CLS] A [SEP], 1 for B [SEP], 0 on padding
    position_ids    (S,)  restart at 0 at each sequence's [CLS]; 0 on padding
    sequence_ids    (S,)  k for the k-th sequence of the pack (1-based), 0 on padding;
                          attention mask = (sequence_ids[q] == sequence_ids[k]) & (sequence_ids[q] != 0)
    mlm_positions   (M,)  positions (in the pack) of the masked tokens, ascending per sequence; 0 if unused
    mlm_labels      (M,)  original token id at that position; -100 if unused
    cls_positions   (K,)  position of each sequence's [CLS]; 0 if unused
    nsp_labels      (K,)  0 = B follows A in the document, 1 = B is a random segment; -100 if unused

A record is contiguous on disk, so reading one pack is one small sequential read.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Tuple

import numpy as np

from .errors import DataError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
VOCAB = "vocab.txt"
IGNORE_INDEX = -100

TOKEN_FIELDS = ("input_ids", "token_type_ids", "position_ids", "sequence_ids")  # (S,)
MLM_FIELDS = ("mlm_positions", "mlm_labels")  # (M,)
SEQUENCE_FIELDS = ("cls_positions", "nsp_labels")  # (K,)
FIELDS = TOKEN_FIELDS + MLM_FIELDS + SEQUENCE_FIELDS


def pack_dtype(max_seq_length: int, mlm_slots: int, max_sequences_per_pack: int) -> np.dtype:
    """The numpy record type of one pack."""
    widths = [max_seq_length] * 4 + [mlm_slots] * 2 + [max_sequences_per_pack] * 2
    return np.dtype([(name, "<i4", (width,)) for name, width in zip(FIELDS, widths)])


def empty_packs(num_packs: int, max_seq_length: int, mlm_slots: int, max_sequences_per_pack: int) -> np.ndarray:
    """(P,) records with every slot unused: zeros, and -100 in the label slots."""
    packs = np.zeros(num_packs, dtype=pack_dtype(max_seq_length, mlm_slots, max_sequences_per_pack))
    packs["mlm_labels"] = IGNORE_INDEX
    packs["nsp_labels"] = IGNORE_INDEX
    return packs


def sha256_file(path: str, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return digest.hexdigest()
            digest.update(block)


# ---------------------------------------------------------------------------------------------------
# manifest

# key -> (type(s), description); loading checks every key is present with the right type, and that
# there are no unknown keys.
MANIFEST_KEYS: Dict[str, Tuple[Any, str]] = {
    "format_version": (int, "version of this format"),
    "kind": (str, '"packed" or "padded"'),
    "max_seq_length": (int, "S: tokens per pack"),
    "max_sequences_per_pack": (int, "K: sequence slots per pack (1 for the padded baseline)"),
    "mlm_slots": (int, "M: masked-token slots per pack"),
    "vocab_file": (str, "vocabulary file in this directory"),
    "vocab_size": (int, "lines of vocab_file"),
    "vocab_checksum": (str, "sha256 of vocab_file"),
    "do_lower_case": (bool, "whether the tokenizer lower-cased the text"),
    "special_token_ids": (dict, "ids of [PAD] [UNK] [CLS] [SEP] [MASK]"),
    "num_sequences": (int, "NSP/MLM instances (= rows of the padded baseline)"),
    "num_packs": (int, "packs in all shards"),
    "num_tokens": (int, "real (non-padding) tokens in all packs"),
    "num_masked_tokens": (int, "MLM predictions in all packs"),
    "packing_algorithm": (str, "packing algorithm that made the plan"),
    "packing_efficiency": (float, "num_tokens / (num_packs * max_seq_length)"),
    "packing_factor": (float, "num_sequences / num_packs"),
    "sequence_length_histogram": (list, "bin i counts sequences of length i + 1"),
    "sequences_per_pack_histogram": (list, "bin k counts packs holding k + 1 sequences"),
    "seed": (int, "seed of the whole preparation"),
    "recipe": (dict, "instance recipe: masked_lm_prob, max_predictions_per_seq, ..."),
    "corpus": (dict, "where the text came from, and its checksum"),
    "shards": (list, "[{file, num_packs, sha256}] in order"),
}


def write_manifest(directory: str, manifest: Dict[str, Any]) -> None:
    unknown = sorted(set(manifest) - set(MANIFEST_KEYS))
    missing = sorted(set(MANIFEST_KEYS) - set(manifest))
    assert not unknown and not missing, (unknown, missing)
    with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


def read_manifest(directory: str) -> Dict[str, Any]:
    """Read and type-check manifest.json (the shards are checked by `validate_shards`)."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isdir(directory):
        raise DataError("%s: not a dataset directory (no such directory)" % directory)
    if not os.path.isfile(path):
        if os.path.isfile(os.path.join(directory, "packed", MANIFEST)):
            raise DataError("%s: holds packed/ and padded/; name one of them" % directory)
        raise DataError("%s: missing (not a prepared dataset directory)" % path)
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise DataError("%s: not valid JSON: %s" % (path, str(error).splitlines()[0]))
    if not isinstance(manifest, dict):
        raise DataError("%s: not a JSON object" % path)
    for key, (kind, _) in MANIFEST_KEYS.items():
        if key not in manifest:
            raise DataError("%s: field %r is missing" % (path, key))
        value = manifest[key]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else isinstance(value, kind)
        if kind is int and isinstance(value, bool):
            ok = False
        if not ok:
            raise DataError("%s: field %r should be %s, got %r" % (path, key, kind.__name__, value))
    unknown = sorted(set(manifest) - set(MANIFEST_KEYS))
    if unknown:
        raise DataError("%s: unknown field %r" % (path, unknown[0]))
    if manifest["format_version"] != FORMAT_VERSION:
        raise DataError("%s: field 'format_version' is %r, this code reads %d"
                        % (path, manifest["format_version"], FORMAT_VERSION))
    for key in ("max_seq_length", "max_sequences_per_pack", "mlm_slots", "vocab_size"):
        if manifest[key] < 1:
            raise DataError("%s: field %r must be >= 1, got %r" % (path, key, manifest[key]))
    total = 0
    for i, shard in enumerate(manifest["shards"]):
        if not (isinstance(shard, dict) and isinstance(shard.get("file"), str)
                and isinstance(shard.get("num_packs"), int) and isinstance(shard.get("sha256"), str)
                and os.path.basename(shard["file"]) == shard["file"]):
            raise DataError("%s: field 'shards' entry %d should be {file, num_packs, sha256}" % (path, i))
        total += shard["num_packs"]
    if total != manifest["num_packs"]:
        raise DataError("%s: field 'num_packs' is %d but the shards hold %d packs" % (path, manifest["num_packs"], total))
    if len(manifest["sequence_length_histogram"]) != manifest["max_seq_length"]:
        raise DataError("%s: field 'sequence_length_histogram' should have max_seq_length bins" % path)
    if sum(manifest["sequence_length_histogram"]) != manifest["num_sequences"]:
        raise DataError("%s: field 'sequence_length_histogram' does not sum to num_sequences" % path)
    return manifest


def validate_shards(directory: str, manifest: Dict[str, Any], checksums: bool = True) -> List[str]:
    """Check every shard's header against the manifest (and its sha256 unless checksums=False).

    Returns the shard paths. Raises DataError naming the shard and the field on any mismatch.
    """
    expected = pack_dtype(manifest["max_seq_length"], manifest["mlm_slots"], manifest["max_sequences_per_pack"])
    vocab_path = os.path.join(directory, manifest["vocab_file"])
    if not os.path.isfile(vocab_path):
        raise DataError("%s: missing (named by manifest field 'vocab_file')" % vocab_path)
    if checksums and sha256_file(vocab_path) != manifest["vocab_checksum"]:
        raise DataError("%s: sha256 does not match manifest field 'vocab_checksum'" % vocab_path)
    paths = []
    for shard in manifest["shards"]:
        path = os.path.join(directory, shard["file"])
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
        del array
        if checksums and sha256_file(path) != shard["sha256"]:
            raise DataError("shard %s: sha256 does not match the manifest (field 'sha256'): the file is corrupt" % path)
        paths.append(path)
    return paths
