"""Absurd sizes answer at once (data/limits.py): every size `prepare` and `pack` take (S, K, K * S**2, workers, dupe
factor, vocabulary) is checked in one place before any work, and the refusal is one line naming the limit."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from ipu_packing.data.cli import main as data_main

FAST_SECONDS = 20  # a refusal comes before any work


def _long_hdf5(root, s=70000):
    """One record of S = 70,000 tokens with a prediction at position 69,000 (past a uint16 position's range)."""
    n = 1
    ids = np.full((n, s), 10, np.int32)
    ids[0, 0], ids[0, -1] = 2, 3
    path = str(root / "long.hdf5")
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("input_ids", data=ids)
        f.create_dataset("input_mask", data=np.ones((n, s), np.int8))
        f.create_dataset("segment_ids", data=np.zeros((n, s), np.int8))
        f.create_dataset("masked_lm_positions", data=np.array([[5, 69000]], np.int32))
        f.create_dataset("masked_lm_ids", data=np.array([[10, 10]], np.int32))
        f.create_dataset("next_sentence_labels", data=np.zeros(n, np.int8))
    return path


SIZE_ROWS = [
    ("seq-length-10**9", ["prepare", "--max-seq-length", str(10 ** 9)], "the sequence length S is 1000000000"),
    ("seq-length-70000", ["prepare", "--max-seq-length", "70000"], "limit of 65536"),
    ("k-10**6", ["prepare", "--max-sequences-per-pack", str(10 ** 6)], "limit of 255"),
    ("k-256", ["prepare", "--max-sequences-per-pack", "256"], "limit of 255"),
    ("k-times-s-squared", ["prepare", "--max-seq-length", "65536", "--max-sequences-per-pack", "255"], "K * S**2"),
    ("workers-10**6", ["prepare", "--workers", str(10 ** 6)], "limit of 1024"),
    ("dupe-factor-10**9", ["prepare", "--dupe-factor", str(10 ** 9)], "limit of 1000"),
    ("train-vocab-10**12", ["prepare", "--train-vocab", str(10 ** 12)], "limit of 2147483647"),
    ("pack-k-10**6", ["pack", "--max-sequences-per-pack", str(10 ** 6)], "limit of 255"),
    ("pack-seq-length-70000", ["pack", "LONG"], "long.hdf5: the sequence length S is 70000"),
]


@pytest.mark.parametrize("name, argv, words", SIZE_ROWS, ids=[r[0] for r in SIZE_ROWS])
def test_an_absurd_size_is_refused_at_once_naming_the_limit(name, argv, words, pack_inputs, tmp_path, capsys):
    output = str(tmp_path / "out")
    if argv[0] == "prepare":
        argv = argv[:1] + ["--input", "default", "--output", output, "--quiet"] + argv[1:]
    else:
        source = _long_hdf5(tmp_path) if "LONG" in argv else pack_inputs["hdf5"]
        argv = ["pack", "--input", source, "--vocab", pack_inputs["vocab"], "--output", output, "--quiet",
                "--workers", "1"] + [a for a in argv[1:] if a != "LONG"]
    start = time.time()
    code = data_main(argv)
    seconds = time.time() - start
    err = capsys.readouterr().err
    assert code == 2, (code, err[-500:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "data/limits.py" in lines[0], lines
    assert seconds < FAST_SECONDS
    assert not os.path.exists(output)
