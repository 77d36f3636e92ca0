"""Small prepared datasets for the application's tests, written by the data package's own writers.

`write_prepared(root, ...)` writes root/packed (K sequences per pack) and root/padded (K = 1) from the
same random NSP/MLM instances, as `python -m ipu_packing.data prepare` does: the packing engine plans
and assigns the packs, data/write/packs.py writes the shards, data/format.py the manifest. Tokens are random;
only shapes and bookkeeping matter.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from ipu_packing.data.format import (FIRST_WORD_ID, FORMAT_VERSION, MASK_ID, SPECIAL_TOKENS, VOCAB, field_dtypes,
                                     max_predictions, mlm_slots, pack_statistics, sha256_file, write_manifest)
from ipu_packing.data.instance_files import Instances, load_instances, save_instances
from ipu_packing.data.write.packs import PackLayout, write_dataset_in_memory
from ipu_packing.packing import assign_sequences, histogram_from_lengths, plan_packing


def _instances(rng: np.random.Generator, n: int, S: int, V: int, cap: int) -> Instances:
    """`n` random instances [CLS] A [SEP] B [SEP] of 8..S tokens, masked (all [MASK]) as the recipe counts."""
    tokens, lengths, a_lengths, nsp, counts, positions, labels = [], [], [], [], [], [], []
    for _ in range(n):
        length = int(rng.integers(8, S + 1)) if rng.random() < 0.7 else int(rng.integers(8, max(9, S // 3)))
        a = int(rng.integers(1, length - 4))
        ids = rng.integers(FIRST_WORD_ID, V, size=length)
        ids[0], ids[1 + a], ids[length - 1] = SPECIAL_TOKENS.index("[CLS]"), SPECIAL_TOKENS.index("[SEP]"), \
            SPECIAL_TOKENS.index("[SEP]")
        candidates = [i for i in range(1, length) if ids[i] >= FIRST_WORD_ID]
        k = max(1, min(cap, int(round(0.15 * len(candidates)))))
        chosen = np.sort(rng.choice(candidates, size=k, replace=False))
        labels.append(ids[chosen].copy())
        ids[chosen] = MASK_ID
        nsp.append(int(rng.integers(0, 2)))
        tokens.append(ids)
        lengths.append(length)
        a_lengths.append(2 + a)
        counts.append(k)
        positions.append(chosen)
    def as32(values):
        return np.asarray(values, dtype=np.int32)

    return Instances(as32(np.concatenate(tokens)), as32(lengths), as32(a_lengths), as32(nsp), as32(counts),
                     as32(np.concatenate(positions)), as32(np.concatenate(labels)))


def _write(directory: str, store: Instances, members, offsets, S: int, K: int, kind: str, algorithm: str,
           seed: int, vocab_lines, cap: int) -> None:
    """One dataset directory: two shards, vocab.txt and manifest.json."""
    os.makedirs(directory)
    with open(os.path.join(directory, VOCAB), "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in vocab_lines))
    layout = PackLayout(S, K, mlm_slots(S, K), len(vocab_lines))
    num_packs = len(offsets) - 1
    half = layout.record_bytes * ((num_packs + 1) // 2)
    manifest = {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "max_seq_length": S,
        "max_sequences_per_pack": K,
        "mlm_slots": layout.mlm_slots,
        "vocab_file": VOCAB,
        "vocab_size": len(vocab_lines),
        "vocab_checksum": sha256_file(os.path.join(directory, VOCAB)),
        "do_lower_case": True,
        "special_token_ids": {t: i for i, t in enumerate(SPECIAL_TOKENS)},
        "packing_algorithm": algorithm,
        "seed": seed,
        "recipe": {"masked_lm_prob": 0.15, "max_predictions_per_seq": cap},
        "corpus": {"name": "random test fixture"},
        "shards": write_dataset_in_memory(store, members, offsets, np.arange(num_packs), layout, directory, half),
        "field_dtypes": {name: dtype.str for name, dtype in field_dtypes(S, K, len(vocab_lines)).items()},
    }
    manifest.update(pack_statistics(store.lengths, store.mlm_counts, np.diff(offsets), S, K))
    write_manifest(directory, manifest)


def write_prepared(root: str, S: int = 32, K: int = 3, V: int = 64, num_sequences: int = 96, seed: int = 0,
                   vocab_tag: str = "") -> str:
    """Write root/packed and root/padded from the same instances; returns root."""
    rng = np.random.default_rng(seed)
    cap = max_predictions(S)
    vocab_lines = list(SPECIAL_TOKENS) + ["tok%s%d" % (vocab_tag, i) for i in range(V - len(SPECIAL_TOKENS))]
    with tempfile.TemporaryDirectory() as work:
        save_instances(os.path.join(work, "instances.npz"), _instances(rng, num_sequences, S, V, cap), V)
        store = load_instances(os.path.join(work, "instances.npz"))
        plan = plan_packing(histogram_from_lengths(store.lengths, S), S, K, "optimal")
        assignment = assign_sequences(plan, store.lengths, seed)
        _write(os.path.join(root, "packed"), store, np.asarray(assignment.indices, dtype=np.int64),
               np.asarray(assignment.offsets, dtype=np.int64), S, K, "packed", plan.algorithm, seed, vocab_lines, cap)
        single = np.arange(num_sequences + 1, dtype=np.int64)
        _write(os.path.join(root, "padded"), store, single[:-1], single, S, 1, "padded", "none (one sequence per row)",
               seed, vocab_lines, cap)
    return root
