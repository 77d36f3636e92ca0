"""Small prepared datasets for the application's tests, written in the data package's on-disk format.

`write_prepared(root, ...)` writes root/packed (K sequences per pack) and root/padded (K = 1) from the
same random NSP/MLM instances: structured .npy shards, manifest.json and vocab.txt, as
`python -m ipu_packing.data prepare` does. Tokens are random; only shapes and bookkeeping matter.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Dict, List

import numpy as np

FIELDS = ("input_ids", "token_type_ids", "position_ids", "sequence_ids", "mlm_positions", "mlm_labels", "cls_positions", "nsp_labels")
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _instances(rng: np.random.Generator, n: int, S: int, V: int, max_predictions: int) -> List[Dict[str, np.ndarray]]:
    out = []
    for _ in range(n):
        length = int(rng.integers(8, S + 1)) if rng.random() < 0.7 else int(rng.integers(8, max(9, S // 3)))
        a = int(rng.integers(1, length - 4))
        b = length - 3 - a
        tokens = rng.integers(len(SPECIAL), V, size=length)
        tokens[0], tokens[1 + a], tokens[length - 1] = 2, 3, 3
        types = np.zeros(length, np.int64)
        types[2 + a :] = 1
        candidates = [i for i in range(1, length) if tokens[i] >= len(SPECIAL)]
        k = max(1, min(max_predictions, int(round(0.15 * len(candidates)))))
        positions = np.sort(rng.choice(candidates, size=k, replace=False))
        labels = tokens[positions].copy()
        masked = tokens.copy()
        masked[positions] = 4
        out.append(dict(tokens=masked, types=types, positions=positions, labels=labels, nsp=int(rng.integers(0, 2)), b=b))
    return out


def _pack(instances, groups, S: int, K: int, M: int) -> np.ndarray:
    dtype = np.dtype([(name, "<i4", (w,)) for name, w in zip(FIELDS, [S] * 4 + [M] * 2 + [K] * 2)])
    packs = np.zeros(len(groups), dtype=dtype)
    packs["mlm_labels"] = -100
    packs["nsp_labels"] = -100
    for p, group in enumerate(groups):
        offset, slot = 0, 0
        for k, idx in enumerate(group):
            inst = instances[idx]
            n = len(inst["tokens"])
            packs[p]["input_ids"][offset : offset + n] = inst["tokens"]
            packs[p]["token_type_ids"][offset : offset + n] = inst["types"]
            packs[p]["position_ids"][offset : offset + n] = np.arange(n)
            packs[p]["sequence_ids"][offset : offset + n] = k + 1
            m = len(inst["positions"])
            packs[p]["mlm_positions"][slot : slot + m] = inst["positions"] + offset
            packs[p]["mlm_labels"][slot : slot + m] = inst["labels"]
            packs[p]["cls_positions"][k] = offset
            packs[p]["nsp_labels"][k] = inst["nsp"]
            offset += n
            slot += m
    return packs


def _first_fit(lengths, S: int, K: int):
    order = np.argsort(-np.asarray(lengths), kind="stable")
    bins = []  # [free, [indices]]
    for i in order:
        for b in bins:
            if b[0] >= lengths[i] and len(b[1]) < K:
                b[0] -= lengths[i]
                b[1].append(int(i))
                break
        else:
            bins.append([S - lengths[i], [int(i)]])
    return [b[1] for b in bins]


def _write(directory: str, packs: np.ndarray, instances, S: int, K: int, M: int, V: int, kind: str, seed: int, vocab_lines) -> None:
    os.makedirs(directory)
    with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in vocab_lines))
    half = (len(packs) + 1) // 2
    shards = []
    for i, part in enumerate((packs[:half], packs[half:])):
        name = "shard-%05d.npy" % i
        np.save(os.path.join(directory, name), part, allow_pickle=False)
        shards.append({"file": name, "num_packs": int(len(part)), "sha256": _sha256(os.path.join(directory, name))})
    lengths = [len(inst["tokens"]) for inst in instances]
    hist = np.bincount(np.asarray(lengths) - 1, minlength=S).tolist()
    per_pack = np.bincount((packs["nsp_labels"] != -100).sum(1) - 1, minlength=K).tolist()
    num_tokens = int(sum(lengths))
    manifest = {
        "format_version": 1,
        "kind": kind,
        "max_seq_length": S,
        "max_sequences_per_pack": K,
        "mlm_slots": M,
        "vocab_file": "vocab.txt",
        "vocab_size": V,
        "vocab_checksum": _sha256(os.path.join(directory, "vocab.txt")),
        "do_lower_case": True,
        "special_token_ids": {t: i for i, t in enumerate(SPECIAL)},
        "num_sequences": len(instances),
        "num_packs": int(len(packs)),
        "num_tokens": num_tokens,
        "num_masked_tokens": int((packs["mlm_labels"] != -100).sum()),
        "packing_algorithm": "first_fit_test_fixture",
        "packing_efficiency": num_tokens / float(len(packs) * S),
        "packing_factor": len(instances) / float(len(packs)),
        "sequence_length_histogram": hist,
        "sequences_per_pack_histogram": per_pack,
        "seed": seed,
        "recipe": {"masked_lm_prob": 0.15, "max_predictions_per_seq": M - K + 1},
        "corpus": {"name": "random test fixture"},
        "shards": shards,
    }
    with open(os.path.join(directory, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)


def write_prepared(root: str, S: int = 32, K: int = 3, V: int = 64, num_sequences: int = 96, seed: int = 0, vocab_tag: str = "") -> str:
    """Write root/packed and root/padded from the same instances; returns root."""
    rng = np.random.default_rng(seed)
    max_predictions = max(1, int(round(0.15 * S)))
    instances = _instances(rng, num_sequences, S, V, max_predictions)
    vocab_lines = SPECIAL + ["tok%s%d" % (vocab_tag, i) for i in range(V - len(SPECIAL))]
    lengths = [len(inst["tokens"]) for inst in instances]
    packed_groups = _first_fit(lengths, S, K)
    M = max_predictions + K - 1
    _write(os.path.join(root, "packed"), _pack(instances, packed_groups, S, K, M), instances, S, K, M, V, "packed", seed, vocab_lines)
    padded_groups = [[i] for i in range(len(instances))]
    _write(os.path.join(root, "padded"), _pack(instances, padded_groups, S, 1, max_predictions), instances, S, 1, max_predictions, V, "padded", seed, vocab_lines)
    return root


class FixtureDataset:
    """Minimal reader of the format (used only while ipu_packing.data.open_dataset is missing)."""

    def __init__(self, directory: str, **unused):
        with open(os.path.join(directory, "manifest.json"), "r", encoding="utf-8") as f:
            self.manifest = json.load(f)
        self.packs = np.concatenate([np.load(os.path.join(directory, s["file"])) for s in self.manifest["shards"]])

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, i: int):
        record = self.packs[int(i)]
        return {name: np.asarray(record[name]) for name in FIELDS}


def open_dataset_or_fixture():
    """ipu_packing.data.open_dataset where it exists, else the fixture reader."""
    try:
        from ipu_packing.data import open_dataset  # noqa: F401

        return open_dataset
    except ImportError:
        return FixtureDataset
