"""`pack` of NVIDIA BERT HDF5: next_sentence_labels holds one label per record, [N] or [N, 1]
(data/existing/read.py). Any other second dimension is refused in one line naming the key and its shape,
before anything is written: reshaped, its values would be spread over the records, and about half of them
would train on another record's label."""

from __future__ import annotations

import os

import numpy as np
import pytest

from existing_datasets import make_instances, run_pack, write_hdf5

h5py = pytest.importorskip("h5py")

N = 40


def labels(shape_of):
    """A file whose next_sentence_labels (N,) is replaced by shape_of(labels)."""
    return lambda path, good: write_hdf5(path, good, shapes={"next_sentence_labels": shape_of})


ROWS = [
    ("each-label-twice", labels(lambda a: np.stack([a, a], axis=1)), "[%d, 2]" % N),
    ("label-and-a-weight", labels(lambda a: np.stack([a, np.ones_like(a)], axis=1)), "[%d, 2]" % N),
    ("three-columns", labels(lambda a: np.stack([a, 1 - a, a], axis=1)), "[%d, 3]" % N),
    ("one-hot", labels(lambda a: np.stack([1 - a, a], axis=1)), "[%d, 2]" % N),
    ("no-column", labels(lambda a: a[:, None][:, :0]), "[%d, 0]" % N),
    ("four-columns-int64", labels(lambda a: np.repeat(a[:, None], 4, axis=1).astype(np.int64)), "[%d, 4]" % N),
]


@pytest.mark.parametrize("name, build, shape", ROWS, ids=[r[0] for r in ROWS])
def test_next_sentence_labels_of_more_than_one_column_are_refused(name, build, shape, tmp_path, capsys):
    good = make_instances(N, seed=3)
    path = str(tmp_path / "bad.hdf5")
    build(path, good)
    code, out = run_pack(tmp_path, path)
    captured = capsys.readouterr()
    assert code == 2, captured.err[-300:]
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert "'next_sentence_labels'" in captured.err and shape in captured.err and "bad.hdf5" in captured.err
    assert not os.path.exists(out)


@pytest.mark.parametrize("shape_of", [lambda a: a, lambda a: a[:, None]], ids=["N", "N-by-1"])
def test_one_label_per_record_is_read(shape_of, tmp_path, capsys):
    good = make_instances(N, seed=3)
    path = str(tmp_path / "good.hdf5")
    labels(shape_of)(path, good)
    code, out = run_pack(tmp_path, path)
    assert code == 0, capsys.readouterr().err
