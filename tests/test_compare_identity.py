"""compare identifies the runs' datasets by their content digest (data/format.py `dataset_identity`), not by
the text of data.dir: what each run recorded (summary.json, else its newest checkpoint), else the manifests
under data.dir; only where neither identifies a run does it compare the directories.

Each row makes two runs (A, B) over prepared roots: X and Y hold other data (another seed), Z is a copy of X.
`main` must refuse the pair naming the dataset, or compare it without a word about the dataset."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import app_fixtures as fx
from ipu_packing.compare import main
from ipu_packing.data.format import dataset_identity, read_manifest

DATA = {"max_seq_length": 32, "max_sequences_per_pack": 3}


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("roots")
    x = fx.write_prepared(str(base / "x" / "data"), S=32, K=3, V=64, num_sequences=48, seed=0)
    y = fx.write_prepared(str(base / "y" / "data"), S=32, K=3, V=64, num_sequences=48, seed=1)
    z = str(base / "z" / "data")
    shutil.copytree(x, z)
    return {"X": x, "Y": y, "Z": z}


def identity(root, layout="packed"):
    return dataset_identity(read_manifest(os.path.join(root, layout)))


def write_run(path, directory, layout="packed", checkpoint=None, summary=None):
    """A run directory: metrics.jsonl, config.json (data.dir `directory`), and, where given, a step checkpoint
    or summary.json recording {content_sha256, path} as a training run's do."""
    os.makedirs(path)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for i in range(4):
            f.write(json.dumps({"step": i + 1, "sequences": 10, "tokens": 100, "seconds": 1.0, "mlm_loss": 8.0 - i,
                                "mlm_accuracy": 0.1, "nsp_accuracy": 0.5}) + "\n")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"data": dict(DATA, dir=directory, layout=layout)}, f)
    if summary is not None:
        with open(os.path.join(path, "summary.json"), "w") as f:
            json.dump({"dataset": summary}, f)
    if checkpoint is not None:
        import torch

        os.makedirs(os.path.join(path, "checkpoints"))
        torch.save({"step": 4, "model": {}, "dataset": checkpoint},
                   os.path.join(path, "checkpoints", "step_0000004.pt"))
    return path


def record(root, layout="packed", path=None):
    return {"content_sha256": identity(root, layout), "path": path or os.path.join(root, layout)}


def relative_and_absolute(tmp, roots, chdir):
    chdir(os.path.dirname(roots["X"]))
    return write_run(tmp + "/a", "data"), write_run(tmp + "/b", roots["X"])


def copy_elsewhere(tmp, roots, chdir):
    return write_run(tmp + "/a", roots["X"]), write_run(tmp + "/b", roots["Z"])


def packed_against_padded(tmp, roots, chdir):
    chdir(os.path.dirname(os.path.dirname(roots["X"])))
    return (write_run(tmp + "/a", "x/./data/"),
            write_run(tmp + "/b", os.path.join(os.path.dirname(roots["Z"]), "..", "z", "data"), layout="padded"))


def same_name_two_places(tmp, roots, chdir):
    """Both configs say data.dir "data"; each run ran in its own directory, and its checkpoint says so."""
    chdir(os.path.dirname(roots["X"]))
    return (write_run(tmp + "/a", "data", checkpoint=record(roots["X"])),
            write_run(tmp + "/b", "data", checkpoint=record(roots["Y"])))


def reprepared_in_place(tmp, roots, chdir):
    """A ran on X's data at P; P was prepared again (Y's data) before B ran there."""
    place = os.path.join(tmp, "p", "data")
    shutil.copytree(roots["Y"], place)
    return (write_run(tmp + "/a", place, checkpoint=record(roots["X"], path=os.path.join(place, "packed"))),
            write_run(tmp + "/b", place))


def gone_same_content(tmp, roots, chdir):
    """Both datasets are gone; their checkpoints record one content at two places."""
    return (write_run(tmp + "/a", "/gone/a/data", checkpoint=record(roots["X"], path="/gone/a/data/packed")),
            write_run(tmp + "/b", "/gone/b/data", checkpoint=record(roots["X"], path="/gone/b/data/packed")))


def gone_other_content(tmp, roots, chdir):
    """Both datasets are gone, both configs say "data"; their checkpoints record two contents."""
    return (write_run(tmp + "/a", "data", checkpoint=record(roots["X"], path="/gone/a/data/packed")),
            write_run(tmp + "/b", "data", checkpoint=record(roots["Y"], path="/gone/b/data/packed")))


def summary_records_other(tmp, roots, chdir):
    """A's summary.json records X's content at P; P now holds Y's data, which B read."""
    place = os.path.join(tmp, "p", "data")
    shutil.copytree(roots["Y"], place)
    return (write_run(tmp + "/a", place, summary=record(roots["X"], path=os.path.join(place, "packed"))),
            write_run(tmp + "/b", place))


def padded_against_recorded_packed_copy(tmp, roots, chdir):
    """A packed run on X (its checkpoint records it), a padded run on Z, the copy of X."""
    return (write_run(tmp + "/a", roots["X"], checkpoint=record(roots["X"])),
            write_run(tmp + "/b", roots["Z"], layout="padded"))


def two_roots_one_relative_name(tmp, roots, chdir):
    """A's data.dir is relative to where compare runs (Y's parent), B names X absolutely: other data."""
    chdir(os.path.dirname(roots["Y"]))
    return write_run(tmp + "/a", "data"), write_run(tmp + "/b", roots["X"])


ROWS = [
    ("relative-and-absolute", relative_and_absolute, "like"),
    ("a-copy-elsewhere", copy_elsewhere, "like"),
    ("packed-against-padded-spelled-apart", packed_against_padded, "like"),
    ("one-name-two-places", same_name_two_places, "refused"),
    ("prepared-again-in-place", reprepared_in_place, "refused"),
    ("gone-recorded-same-content", gone_same_content, "like"),
    ("gone-recorded-other-content", gone_other_content, "refused"),
    ("summary-records-other-content", summary_records_other, "refused"),
    ("padded-against-a-recorded-copy", padded_against_recorded_packed_copy, "like"),
    ("relative-name-of-other-data", two_roots_one_relative_name, "refused"),
]


@pytest.mark.parametrize("name, make, expected", ROWS, ids=[r[0] for r in ROWS])
def test_compare_identifies_datasets_by_content(name, make, expected, roots, tmp_path, monkeypatch, capsys):
    a, b = make(str(tmp_path), roots, monkeypatch.chdir)
    code = main([a, b, "--json"])
    captured = capsys.readouterr()
    if expected == "refused":
        assert code == 2, captured.out[-400:]
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
        assert "dataset" in captured.err and "--force" in captured.err, captured.err
    else:
        assert code == 0, captured.err
        assert json.loads(captured.out)["warnings"] == [] and captured.err == ""


def test_the_identity_is_the_one_checkpoints_record(roots):
    """format.dataset_identity is the digest train/fingerprint.py records in every checkpoint (its one owner)."""
    from types import SimpleNamespace

    from ipu_packing.train import fingerprint

    assert not hasattr(fingerprint, "dataset_identity")  # one owner: data/format.py
    for root in roots.values():
        for layout in ("packed", "padded"):
            manifest = read_manifest(os.path.join(root, layout))
            data = SimpleNamespace(manifest=manifest, num_sequences=manifest["num_sequences"],
                                   fingerprint=lambda: {})
            accounting = SimpleNamespace(global_batch_packs=8, gradient_accumulation=2)
            recorded = fingerprint.recorded_fingerprint(data, accounting)["content_sha256"]
            assert dataset_identity(manifest) == recorded
    assert identity(roots["X"]) == identity(roots["Z"]) != identity(roots["Y"])
