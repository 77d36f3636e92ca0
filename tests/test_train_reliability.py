"""Training under faults and misuse: divergence never poisons a checkpoint, checkpoints load without
running code, one run per directory, and a resume that would mix two configs is refused."""

import json
import os
import pickle
import shutil

import pytest
import torch

import app_fixtures as fx
from ipu_packing.train.state import non_finite_tensors
from ipu_packing.train.run_dir import NonFiniteState
from ipu_packing.train import UserError
from ipu_packing.train.state import TrainingState
from ipu_packing.train.cli import main

from app_fixtures import TINY

pytestmark = pytest.mark.usefixtures("one_thread")  # as the loop tests (conftest.py)


def args(data_dir, run, *extra):
    return ["--config", "demo"] + TINY + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run] + list(extra)


def run_main(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_real_divergence_stops_with_exit_2_naming_a_finite_checkpoint(data_dir, tmp_path, capsys):
    run = str(tmp_path / "run")
    code, out, err = run_main(args(data_dir, run, "optimizer.lr=1000", "schedule.warmup_fraction=0",
                                   "training.steps=30", "checkpoint.every_steps=1", "checkpoint.keep=100"), capsys)
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and "diverged" in err
    named = err.split("finite throughout is ")[1].strip()
    assert os.path.isfile(named)
    saved = fx.checkpoints(run)
    assert saved and saved[-1] == named
    for path in saved:
        assert non_finite_tensors(fx.load(path).to_dict()) == [], path
    assert not os.path.exists(os.path.join(run, "final"))


def test_a_state_with_non_finite_weights_is_never_saved(tmp_path):
    state = TrainingState(step=3, model={"w": torch.tensor([1.0, float("inf")])}, optimizer={"state": {}})
    with pytest.raises(NonFiniteState, match="model.w"):
        fx.save(str(tmp_path), state, keep=2)
    state = TrainingState(step=3, model={"w": torch.ones(2)},
                          optimizer={"state": {0: {"exp_avg": torch.tensor([float("nan")])}}})
    with pytest.raises(NonFiniteState, match="optimizer.state.0.exp_avg"):
        fx.save(str(tmp_path), state, keep=2)
    assert fx.checkpoints(str(tmp_path)) == []


class _Payload:
    """Unpickling this runs code: it creates a marker file (what an attacker's checkpoint would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _crafted(path, marker):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump({"step": 1, "model": {}, "payload": _Payload(marker)}, f)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("where", ["init_from", "run_checkpoints", "resume_path"])
def test_a_crafted_pickle_runs_no_code(where, data_dir, tmp_path, capsys):
    run = str(tmp_path / "run")
    marker = str(tmp_path / "pwned")
    evil = (os.path.join(run, "checkpoints", "step_0000001.pt") if where == "run_checkpoints"
            else str(tmp_path / "evil.pt"))
    _crafted(evil, marker)
    extra = {"init_from": ["checkpoint.init_from=%s" % evil], "run_checkpoints": [],
             "resume_path": ["checkpoint.resume=%s" % evil]}[where]
    code, out, err = run_main(args(data_dir, run, "training.steps=2", *extra), capsys)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert evil in err
    assert not os.path.exists(marker)


def test_a_checkpoint_with_wrong_field_types_is_refused_naming_the_field(tmp_path):
    path = str(tmp_path / "step_0000002.pt")
    torch.save({"step": "2", "model": {}}, path)
    with pytest.raises(UserError, match="'step' must be an integer"):
        fx.load(path)
    torch.save({"step": 2, "model": {"w": [1.0]}}, path)
    with pytest.raises(UserError, match="model entry 'w' is not a tensor"):
        fx.load(path)
    torch.save({"step": 2, "model": {}, "data": {"epoch": -1, "step_in_epoch": 0}}, path)
    with pytest.raises(UserError, match="data.epoch"):
        fx.load(path)


def test_a_second_run_in_the_same_directory_is_refused_and_writes_nothing(data_dir, tmp_path, capsys):
    run = str(tmp_path / "run")
    with fx.holding(run):
        code, out, err = run_main(args(data_dir, run, "training.steps=2"), capsys)
        assert code == 2 and "in use by pid %d" % os.getpid() in err and err.count("\n") == 1
        assert sorted(os.listdir(run)) == ["run.lock"]


def test_resume_with_changed_hyperparameters_is_refused_unless_forced(data_dir, tiny_run, tmp_path, capsys):
    run = str(tmp_path / "run")
    common = ["training.steps=4", "checkpoint.every_steps=2"]
    shutil.copytree(tiny_run, run)  # the session's run, trained with TINY + common
    os.unlink(fx.latest(run))  # as if killed after step 2: no step 4, no export, no summary
    os.unlink(os.path.join(run, "summary.json"))
    shutil.rmtree(os.path.join(run, "final"))
    before = open(os.path.join(run, "config.json")).read()

    changed = ["optimizer.lr=0.5", "schedule.decay=constant", "schedule.warmup_fraction=0"]
    code, out, err = run_main(args(data_dir, run, *(common + changed)), capsys)
    assert code == 2 and err.count("\n") == 1
    assert "optimizer.lr" in err and "schedule.decay" in err and "schedule.warmup_fraction" in err
    assert open(os.path.join(run, "config.json")).read() == before  # nothing written

    code, out, err = run_main(args(data_dir, run, *(common + changed + ["checkpoint.resume=force"])), capsys)
    assert code == 0, err
    rows = fx.metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["lr"] for r in rows[2:]] == [0.5, 0.5]  # the new schedule, not the checkpoint's
    old = json.load(open(os.path.join(run, "config.before_step_0000002.json")))
    new = json.load(open(os.path.join(run, "config.json")))
    assert old["optimizer"]["lr"] == 0.01 and new["optimizer"]["lr"] == 0.5
