"""Every fingerprint a checkpoint records is compared (train/fingerprint.py), on resume and on a phase-1 init
from one of our checkpoints or runs. A difference is refused in one line naming each key, old -> new, and
writes nothing; checkpoint.resume=force continues and records what it changed in RUN/forced_changes.jsonl (and the
config it replaced beside the run)."""

import json
import os
import shutil

import pytest

import app_fixtures as fx
from ipu_packing.train.cli import main

from app_fixtures import TINY

pytestmark = pytest.mark.usefixtures("one_thread")
BASE = ["training.steps=4", "checkpoint.every_steps=2", "checkpoint.export=false"]


@pytest.fixture(scope="module")
def ws(tiny_data, tiny_run, tmp_path_factory):
    """A dataset (the session's), a second one with the same S, K and vocabulary but other data, a copy of the first
    in another directory, another vocabulary of the same size, and a run stopped after step 2 of 4."""
    root = tmp_path_factory.mktemp("fp")
    data = tiny_data
    other = fx.write_prepared(str(root / "other"), S=32, K=3, V=64, num_sequences=96, seed=5)
    copy = os.path.join(str(root), "copy", "data")
    shutil.copytree(data, copy)
    other_vocab = fx.write_prepared(str(root / "vocab"), S=32, K=3, V=64, num_sequences=96, seed=0, vocab_tag="x")
    run = str(root / "run")
    shutil.copytree(tiny_run, run)  # the session's run (BASE, but for its export), as a kill after step 2 leaves it:
    os.unlink(fx.latest(run))  # no step 4, no summary, no export
    os.unlink(os.path.join(run, "summary.json"))
    shutil.rmtree(os.path.join(run, "final"))
    return {"root": str(root), "data": data, "other": other, "copy": copy, "other_vocab": other_vocab, "run": run}


def args(data, run, *extra):
    return ["--config", "demo"] + TINY + ["data.dir=%s" % data, "checkpoint.output_dir=%s" % run] + BASE + list(extra)


def files(directory):
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = (os.stat(path).st_mtime_ns, f.read())
    return out


def stopped_copy(ws, tmp_path):
    run = str(tmp_path / "run")
    shutil.copytree(ws["run"], run)
    return run


# (row, data key, overrides, what the one line names)
RESUME_ROWS = [
    ("another dataset, same S, K and vocabulary", "other", [], ["dataset.content_sha256 "]),
    ("model.hidden_act", "data", ["model.hidden_act=relu"], ["model.hidden_act 'gelu' -> 'relu'"]),
    ("model.layer_norm_eps", "data", ["model.layer_norm_eps=1e-5"], ["model.layer_norm_eps 0.001 -> 1e-05"]),
    ("a dropout", "data", ["model.hidden_dropout_prob=0.2"], ["model.hidden_dropout_prob 0.1 -> 0.2"]),
    ("a key the first run left at its default", "data", ["model.initializer_range=0.05"],
     ["model.initializer_range 0.02 -> 0.05"]),
    ("the seed", "data", ["training.seed=7"], ["training.seed 42 -> 7"]),
    ("the micro batch (the padded layout's; the packed step keeps its packs)", "data", ["execution.micro_batch_size=2"],
     ["execution.micro_batch_size 4 -> 2"]),
    ("the global batch, and so the packs a step", "data", ["training.global_batch_sequences=8"],
     ["training.global_batch_sequences 16 -> 8", "batch.global_batch_packs "]),
    ("two at once", "data", ["model.hidden_act=relu", "training.seed=3"],
     ["model.hidden_act 'gelu' -> 'relu'", "training.seed 42 -> 3"]),
]


@pytest.mark.parametrize("row, data, extra, named", RESUME_ROWS, ids=[r[0] for r in RESUME_ROWS])
def test_a_resume_that_changes_a_recorded_fingerprint_is_refused_naming_it(ws, tmp_path, capsys, row, data, extra,
                                                                          named):
    run = stopped_copy(ws, tmp_path)
    before = files(run)
    code = main(args(ws[data], run, *extra))
    out, err = capsys.readouterr()
    assert code == 2, (row, out[-2000:], err)
    assert err.startswith("error: checkpoint ") and err.count("\n") == 1, err
    for fragment in named:
        assert fragment in err, (fragment, err)
    assert "checkpoint.resume=force" in err
    assert files(run) == before  # nothing written


def test_a_copy_of_the_same_dataset_elsewhere_resumes(ws, tmp_path, capsys):
    run = stopped_copy(ws, tmp_path)
    assert main(args(ws["copy"], run)) == 0, capsys.readouterr()
    assert [r["step"] for r in fx.metrics(run)] == [1, 2, 3, 4]
    assert not os.path.exists(os.path.join(run, "forced_changes.jsonl"))


def test_a_forced_resume_records_what_it_changed_beside_the_run(ws, tmp_path, capsys):
    run = stopped_copy(ws, tmp_path)
    code = main(args(ws["other"], run, "model.hidden_act=relu", "training.seed=7", "checkpoint.resume=force"))
    out, err = capsys.readouterr()
    assert code == 0, err
    (record,) = [json.loads(line) for line in open(os.path.join(run, "forced_changes.jsonl"))]
    assert record["step"] == 2 and record["checkpoint"] == os.path.join(run, "checkpoints", "step_0000002.pt")
    changes = record["changes"]
    assert changes["model.hidden_act"] == {"old": "gelu", "new": "relu"}
    assert changes["training.seed"] == {"old": 42, "new": 7}
    # the other dataset's packs may or may not number the same (both built by tests/app_fixtures)
    assert {"model.hidden_act", "training.seed", "dataset.content_sha256"} <= set(changes) <= {
        "model.hidden_act", "training.seed", "dataset.content_sha256", "dataset.num_packs"}
    assert changes["dataset.content_sha256"]["old"] != changes["dataset.content_sha256"]["new"]
    assert record["time"].endswith("+00:00")
    assert "checkpoint.resume=force: continuing from step 2 with " in out
    old = json.load(open(os.path.join(run, "config.before_step_0000002.json")))
    assert old["training"]["seed"] == 42 and json.load(open(os.path.join(run, "config.json")))["training"]["seed"] == 7


# checkpoint.init_from one of our runs (trained with gelu, eps 0.001): (row, overrides, named or None: accepted)
INIT_ROWS = [
    ("another activation", ["model.hidden_act=relu"], "model.hidden_act 'gelu' -> 'relu'"),
    ("another LayerNorm eps", ["model.layer_norm_eps=1e-12"], "model.layer_norm_eps 0.001 -> 1e-12"),
    ("overridden explicitly", ["model.hidden_act=relu", "checkpoint.init_override=[model.hidden_act]"], None),
    ("a dropout may change", ["model.hidden_dropout_prob=0.0"], None),
]


@pytest.mark.parametrize("row, extra, named", INIT_ROWS, ids=[r[0] for r in INIT_ROWS])
def test_init_from_a_run_compares_its_recorded_architecture(ws, tmp_path, capsys, row, extra, named):
    run = str(tmp_path / "phase2")
    code = main(args(ws["other"], run, "checkpoint.init_from=%s" % ws["run"], "training.steps=1", *extra))
    out, err = capsys.readouterr()
    if named is None:
        assert code == 0, err
        assert "phase-1 weights: " in out
        return
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: checkpoint.init_from ") and named in err, err
    assert not os.path.exists(run)


def test_init_from_a_run_on_another_vocabulary_is_refused(ws, tmp_path, capsys):
    run = str(tmp_path / "phase2")
    code = main(args(ws["other_vocab"], run, "checkpoint.init_from=%s" % ws["run"], "training.steps=1"))
    err = capsys.readouterr()[1]
    assert code == 2 and "another vocabulary" in err and err.count("\n") == 1, err


# -- hyperparameters: a resume that would mix two configs is refused unless forced ----------------------------------

def test_resume_with_changed_hyperparameters_is_refused_unless_forced(data_dir, tiny_run, tmp_path, capsys):
    run = str(tmp_path / "run")
    common = ["training.steps=4", "checkpoint.every_steps=2"]
    shutil.copytree(tiny_run, run)  # the session's run, trained with TINY + common
    os.unlink(fx.latest(run))  # as if killed after step 2: no step 4, no export, no summary
    os.unlink(os.path.join(run, "summary.json"))
    shutil.rmtree(os.path.join(run, "final"))
    before = open(os.path.join(run, "config.json")).read()

    changed = ["optimizer.lr=0.5", "schedule.decay=constant", "schedule.warmup_fraction=0"]
    code = main(fx.tiny_run_args(data_dir, run, *(common + changed)))
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1
    assert "optimizer.lr" in err and "schedule.decay" in err and "schedule.warmup_fraction" in err
    assert open(os.path.join(run, "config.json")).read() == before  # nothing written

    code = main(fx.tiny_run_args(data_dir, run, *(common + changed + ["checkpoint.resume=force"])))
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = fx.metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["lr"] for r in rows[2:]] == [0.5, 0.5]  # the new schedule, not the checkpoint's
    old = json.load(open(os.path.join(run, "config.before_step_0000002.json")))
    new = json.load(open(os.path.join(run, "config.json")))
    assert old["optimizer"]["lr"] == 0.01 and new["optimizer"]["lr"] == 0.5
