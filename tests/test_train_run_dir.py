"""A finished run is immutable, and a run can always be finished. Re-running a finished run changes no file
(bytes and mtimes of every file, the run lock included); a finished run with anything missing is refused in one
line naming what is missing, and nothing is re-created; a forced change or a resume from elsewhere into it is
refused. A run stopped during its export (its last checkpoint written, no summary.json) is completed by the same
command: the export and the summary, nothing trained."""

import os
import shutil

import pytest

import app_fixtures as fx
from ipu_packing.train.cli import main

from app_fixtures import TINY

pytestmark = pytest.mark.usefixtures("one_thread")
BASE = ["training.steps=4", "checkpoint.every_steps=2"]


@pytest.fixture
def ws(tiny_data, tiny_run, tmp_path):
    """The session's dataset and its finished run (BASE: steps 4, a checkpoint every 2, the export), and the same
    run again elsewhere (a copy). Tests copy the run before they write into it."""
    other = str(tmp_path / "other")
    shutil.copytree(tiny_run, other)
    return {"data": tiny_data, "run": tiny_run, "other": other}


def args(data, run, *extra):
    return ["--config", "demo"] + TINY + ["data.dir=%s" % data, "checkpoint.output_dir=%s" % run] + BASE + list(extra)


def files(directory):
    out = {}
    for root, dirs, names in os.walk(directory):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), directory) + "/"] = None
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = (os.stat(path).st_mtime_ns, f.read())
    return out


def finished_copy(ws, tmp_path, *remove):
    run = str(tmp_path / "run")
    shutil.copytree(ws["run"], run)
    for name in remove:
        path = os.path.join(run, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
    return run


def test_rerunning_a_complete_finished_run_changes_no_file(ws, tmp_path, capsys):
    run = finished_copy(ws, tmp_path)
    before = files(run)
    assert "run.lock" in before
    assert main(args(ws["data"], run)) == 0
    out = capsys.readouterr()[0]
    assert out == "run %s already finished at step 4: nothing to do, nothing written\n" % run
    assert files(run) == before  # every file's bytes and mtime, run.lock included


# (row, what is removed from the finished run, what the line names)
MISSING_ROWS = [
    ("the export", ["final"], ["final/"]),
    ("the export's weights", ["final/model.safetensors"], ["final/'s config.json or weights"]),
    ("metrics.jsonl", ["metrics.jsonl"], ["metrics.jsonl"]),
    ("config.json", ["config.json"], ["config.json"]),
    ("every checkpoint", ["checkpoints"], ["its last checkpoint (checkpoints/step_0000004.pt)"]),
    ("the last checkpoint", ["checkpoints/step_0000004.pt"], ["its last checkpoint"]),
    ("all but the summary", ["final", "checkpoints", "metrics.jsonl", "config.json"],
     ["config.json", "its last checkpoint", "metrics.jsonl", "final/"]),
    ("all but the export", ["summary.json", "checkpoints", "metrics.jsonl", "config.json"],
     ["summary.json", "config.json", "its checkpoints", "metrics.jsonl"]),
]


@pytest.mark.parametrize("row, remove, named", MISSING_ROWS, ids=[r[0] for r in MISSING_ROWS])
def test_a_finished_run_with_files_missing_is_refused_and_not_recreated(ws, tmp_path, capsys, row, remove, named):
    run = finished_copy(ws, tmp_path, *remove)
    before = files(run)
    code = main(args(ws["data"], run))
    out, err = capsys.readouterr()
    assert code == 2, (row, out[-1500:], err)
    assert err.startswith("error: run %s finished" % run) and err.count("\n") == 1, err
    assert "lacks " in err and "a finished run is not rewritten" in err, err
    for fragment in named:
        assert fragment in err, (fragment, err)
    assert files(run) == before  # nothing re-created, nothing touched


# (row, what a kill during the export left out of the finished run)
UNFINISHED_ROWS = [
    ("killed before the summary", ["summary.json"]),
    ("killed during the export", ["summary.json", "final"]),
]


@pytest.mark.parametrize("row, remove", UNFINISHED_ROWS, ids=[r[0] for r in UNFINISHED_ROWS])
def test_a_run_stopped_during_its_export_is_completed_by_the_same_command(ws, tmp_path, capsys, row, remove):
    run = finished_copy(ws, tmp_path, *remove)
    before = files(run)
    code = main(args(ws["data"], run))
    out, err = capsys.readouterr()
    assert code == 0, (row, err)
    assert "nothing to train: already at step 4" in out, out
    after = files(run)
    for name in ("metrics.jsonl", "checkpoints/step_0000002.pt", "checkpoints/step_0000004.pt"):
        assert after[name] == before[name], name  # nothing trained, nothing rewritten
    import json

    summary = json.load(open(os.path.join(run, "summary.json")))
    original = json.load(open(os.path.join(ws["run"], "summary.json")))
    assert summary["last_steps"] == original["last_steps"] and summary["first_steps"] == original["first_steps"]
    assert summary["steps_this_run"] == 0 and summary["export"] == os.path.join(run, "final")
    assert open(os.path.join(run, "final", "model.safetensors"), "rb").read() == open(
        os.path.join(ws["run"], "final", "model.safetensors"), "rb").read()
    assert main(args(ws["data"], run)) == 0  # and now it is finished
    assert "already finished at step 4" in capsys.readouterr()[0]


def test_a_full_disk_during_the_export_leaves_a_run_the_same_command_finishes(ws, tmp_path, capsys, monkeypatch):
    from ipu_packing.model import PackedBertForPreTraining

    run = str(tmp_path / "run")
    real = PackedBertForPreTraining.save_pretrained

    def full(self, directory, **kwargs):
        real(self, directory, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PackedBertForPreTraining, "save_pretrained", full)
    assert main(args(ws["data"], run)) == 2
    err = capsys.readouterr()[1]
    assert err.startswith("error: ") and err.count("\n") == 1 and "space" in err, err
    assert not os.path.exists(os.path.join(run, "final")) and not os.path.exists(os.path.join(run, "summary.json"))
    assert [os.path.basename(p) for p in fx.checkpoints(run)] == ["step_0000002.pt", "step_0000004.pt"]
    assert not [n for n in os.listdir(run) if n.startswith(".final")]  # no half export left behind
    monkeypatch.setattr(PackedBertForPreTraining, "save_pretrained", real)
    assert main(args(ws["data"], run)) == 0, capsys.readouterr()[1]
    assert os.path.isfile(os.path.join(run, "final", "model.safetensors"))
    assert os.path.isfile(os.path.join(run, "summary.json"))


@pytest.mark.parametrize("extra, named", [
    (["optimizer.lr=0.5", "checkpoint.resume=force"], "checkpoint.resume=force would change optimizer.lr"),
    (["training.steps=6", "checkpoint.resume=force"], "checkpoint.resume=force would change training.steps"),
], ids=["another lr", "more steps"])
def test_a_forced_change_to_a_finished_run_is_refused(ws, tmp_path, capsys, extra, named):
    run = finished_copy(ws, tmp_path)
    before = files(run)
    code = main(args(ws["data"], run, *extra))
    err = capsys.readouterr()[1]
    assert code == 2 and err.count("\n") == 1 and named in err, err
    assert "another checkpoint.output_dir (checkpoint.init_from=%s starts from its weights)" % run in err
    assert files(run) == before


def test_resuming_another_runs_checkpoint_into_a_finished_run_is_refused(ws, tmp_path, capsys):
    run = finished_copy(ws, tmp_path)
    before = files(run)
    other = fx.checkpoints(ws["other"])[0]  # its step 2: the same config, so only the finished-run rule refuses
    code = main(args(ws["data"], run, "checkpoint.resume=%s" % other))
    err = capsys.readouterr()[1]
    assert code == 2 and err.count("\n") == 1 and "checkpoint.resume names another checkpoint" in err, err
    assert files(run) == before


def test_the_way_out_starts_from_a_finished_run_in_another_directory(ws, tmp_path, capsys):
    run = str(tmp_path / "phase2")
    before = files(ws["run"])
    code = main(args(ws["data"], run, "checkpoint.init_from=%s" % ws["run"], "training.steps=2"))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "phase-1 weights: " in out and "from step 4 of %s" % fx.latest(ws["run"]) in out
    assert [r["step"] for r in fx.metrics(run)] == [1, 2]
    assert files(ws["run"]) == before
