"""The run directory (train/run_dir.py RunDirectory).

A finished run is immutable, and a run can always be finished. Re-running a finished run changes no file
(bytes and mtimes of every file, the run lock included); a finished run with anything missing is refused in one
line naming what is missing, and nothing is re-created; a forced change or a resume from elsewhere into it is
refused. A run stopped during its export (its last checkpoint written, no summary.json) is completed by the same
command: the export and the summary, nothing trained.

One run per directory (RunDirectory.lock): a second run is refused naming the holder; a killed run's lock is taken
over; the lock never follows a symlink planted in its place. A step checkpoint is never written with an inf or NaN
in it. A torn last line in metrics.jsonl (a kill mid-write) is dropped on resume, in one line; a bad line before it
is refused naming the file and line. What the run writes honours the umask."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap

import pytest
import torch

import app_fixtures as fx
from ipu_packing.errors import UserError
from ipu_packing.train.cli import main
from ipu_packing.train.run_dir import NonFiniteState, RunDirectory
from ipu_packing.train.state import TrainingState

from app_fixtures import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


# (row, what a kill during the export left out of the finished run, the half-made directories it left in it)
UNFINISHED_ROWS = [
    ("killed before the summary", ["summary.json"], []),
    ("killed during the export", ["summary.json", "final"], []),
    ("killed while the export was written", ["summary.json", "final"], [".final.k1ll3d0"]),
    ("killed while the export was swapped", ["summary.json", "final"], [".final.k1ll3d0", "final.old"]),
]


@pytest.mark.parametrize("row, remove, planted", UNFINISHED_ROWS, ids=[r[0] for r in UNFINISHED_ROWS])
def test_a_run_stopped_during_its_export_is_completed_by_the_same_command(ws, tmp_path, capsys, row, remove,
                                                                          planted):
    run = finished_copy(ws, tmp_path, *remove)
    for name in planted:  # publish_directory's temporary, and the earlier export it swaps out
        os.makedirs(os.path.join(run, name))
        shutil.copyfile(os.path.join(ws["run"], "final", "config.json"), os.path.join(run, name, "config.json"))
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
    assert not [n for n in os.listdir(run) if n.startswith(".final") or n == "final.old"]  # nothing half made left
    assert main(args(ws["data"], run)) == 0  # and now it is finished
    assert "already finished at step 4" in capsys.readouterr()[0]


def test_a_run_finished_without_an_export_is_exported_when_asked_for_one(ws, tmp_path, capsys):
    """Trained with checkpoint.export=false, the same run asked for with the export: nothing trained, final/ made
    from its last checkpoint (the weights the run that exported at its end has), the summary written again; then it
    is finished. Asked for again without the export, it is finished as it was."""
    run = str(tmp_path / "run")
    assert main(args(ws["data"], run, "checkpoint.export=false")) == 0
    assert main(args(ws["data"], run, "checkpoint.export=false")) == 0
    assert "already finished at step 4" in capsys.readouterr()[0]
    before = files(run)
    assert "final/" not in before
    assert main(args(ws["data"], run)) == 0
    assert "nothing to train: already at step 4" in capsys.readouterr()[0]
    after = files(run)
    for name in ("metrics.jsonl", "checkpoints/step_0000002.pt", "checkpoints/step_0000004.pt"):
        assert after[name] == before[name], name  # nothing trained, nothing rewritten
    assert open(os.path.join(run, "final", "model.safetensors"), "rb").read() == open(
        os.path.join(ws["run"], "final", "model.safetensors"), "rb").read()
    import json

    summary = json.load(open(os.path.join(run, "summary.json")))
    original = json.load(open(os.path.join(ws["run"], "summary.json")))
    assert summary["export"] == os.path.join(run, "final") and summary["first_steps"] == original["first_steps"]
    assert main(args(ws["data"], run)) == 0
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


# ---- one run per directory (RunDirectory.lock) ------------------------------------------------------------------

def holder(path):
    with open(os.path.join(path, RunDirectory.LOCK)) as f:
        text = f.read()
    return json.loads(text)["pid"] if text else None


def test_second_holder_is_refused_naming_the_first(tmp_path):
    run = str(tmp_path / "run")
    first = RunDirectory(run)
    first.lock()
    try:
        assert first.locked and holder(run) == os.getpid()
        with pytest.raises(UserError, match="in use by pid %d" % os.getpid()):
            RunDirectory(run).lock()
    finally:
        first.unlock()
    assert holder(run) is None  # released: the file reads as nobody
    again = RunDirectory(run)
    again.lock()
    assert again.locked
    again.unlock()


def test_lock_of_a_killed_run_is_taken_over(tmp_path):
    run = str(tmp_path / "run")
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, time
            from ipu_packing.train.run_dir import RunDirectory
            RunDirectory(sys.argv[1]).lock()
            print("held", flush=True)
            time.sleep(600)
        """), run],
        cwd=ROOT, stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout.readline().strip() == b"held"
        with pytest.raises(UserError, match="in use by pid %d" % proc.pid):
            RunDirectory(run).lock()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert holder(run) == proc.pid  # the killed run left its lock file, naming it
    taken = RunDirectory(run)
    taken.lock()
    try:
        assert holder(run) == os.getpid()
    finally:
        taken.unlock()


@pytest.mark.parametrize("content", ["precious\n", '{"pid": "12", "host": "h"}', "[1, 2]"])
def test_a_file_where_the_lock_goes_that_holds_no_holder_record_is_refused_and_kept(tmp_path, content):
    run = tmp_path / "run"
    run.mkdir()
    (run / RunDirectory.LOCK).write_text(content)
    with pytest.raises(UserError, match="holds something other than this program's lock record") as info:
        RunDirectory(str(run)).lock()
    assert str(info.value).count("\n") == 0
    assert (run / RunDirectory.LOCK).read_text() == content


@pytest.mark.parametrize("target", ["a file", "a missing file", "a directory"])
def test_the_lock_never_follows_a_symlink_planted_in_its_place(tmp_path, target):
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim"
    if target == "a file":
        victim.write_text("precious\n")
    elif target == "a directory":
        victim.mkdir()
    os.symlink(str(victim), str(run / RunDirectory.LOCK))
    with pytest.raises(UserError) as info:
        RunDirectory(str(run)).lock()
    assert str(info.value).count("\n") == 0 and "lock" in str(info.value)
    if target == "a file":
        assert victim.read_text() == "precious\n"  # neither truncated nor written
    elif target == "a missing file":
        assert not victim.exists()  # not created through the link


def test_a_second_run_in_the_same_directory_is_refused_and_writes_nothing(tiny_data, tmp_path, capsys):
    run = str(tmp_path / "run")
    with fx.holding(run):
        code = main(["--config", "demo"] + TINY + ["data.dir=%s" % tiny_data, "checkpoint.output_dir=%s" % run,
                                                    "training.steps=2"])
        out, err = capsys.readouterr()
        assert code == 2 and "in use by pid %d" % os.getpid() in err and err.count("\n") == 1
        assert sorted(os.listdir(run)) == ["run.lock"]


# ---- step checkpoints: never one with an inf or NaN in it ------------------------------------------------------------

def test_a_state_with_non_finite_weights_is_never_saved(tmp_path):
    state = TrainingState(step=3, model={"w": torch.tensor([1.0, float("inf")])}, optimizer={"state": {}})
    with pytest.raises(NonFiniteState, match="model.w"):
        fx.save(str(tmp_path), state, keep=2)
    state = TrainingState(step=3, model={"w": torch.ones(2)},
                          optimizer={"state": {0: {"exp_avg": torch.tensor([float("nan")])}}})
    with pytest.raises(NonFiniteState, match="optimizer.state.0.exp_avg"):
        fx.save(str(tmp_path), state, keep=2)
    assert fx.checkpoints(str(tmp_path)) == []


# ---- metrics.jsonl after a kill mid-write ---------------------------------------------------------------------------

def killed_at_step_3(ws, tmp_path, tail):
    """The finished run as a kill while step 4's metrics line was being written leaves it: checkpoint 2, lines
    1..3, then ``tail``."""
    run = str(tmp_path / "run")
    shutil.copytree(ws["run"], run)
    os.unlink(os.path.join(run, "checkpoints", "step_0000004.pt"))
    os.unlink(os.path.join(run, "summary.json"))
    shutil.rmtree(os.path.join(run, "final"))  # exported after step 4: not yet
    path = os.path.join(run, "metrics.jsonl")
    lines = open(path, "rb").read().split(b"\n")
    with open(path, "wb") as f:
        f.write(b"\n".join(lines[:3]) + b"\n" + tail)
    return run, path


@pytest.mark.parametrize("tail", [
    b'{"step": 4, "loss": 3.1',  # cut mid-record
    b'{"step": 4, "loss": 3.1}',  # whole but without its newline
    b'[1, 2]\n',  # JSON, not a record
    b'{"step": 4, "loss": \xff\xfe',  # cut inside bytes that are not UTF-8
], ids=["cut", "no newline", "a list", "not utf-8"])
def test_a_torn_last_metrics_line_is_dropped_on_resume_in_one_line(ws, tmp_path, capsys, tail):
    run, path = killed_at_step_3(ws, tmp_path, tail)
    code = main(args(ws["data"], run, "checkpoint.export=false"))
    out, err = capsys.readouterr()
    assert code == 0, err
    notes = [line for line in out.splitlines() if "torn last line" in line]
    assert notes == ["note: %s: dropped a torn last line (%d bytes, left by a kill while it was written)"
                     % (path, len(tail.rstrip(b"\n")))], out
    assert [r["step"] for r in fx.read_jsonl(path)] == [1, 2, 3, 4]


def test_a_bad_metrics_line_before_the_last_is_refused_naming_it(ws, tmp_path, capsys):
    run, path = killed_at_step_3(ws, tmp_path, b"")
    lines = open(path, "rb").read().split(b"\n")
    lines[1] = b'{"step": 2, "lo'
    with open(path, "wb") as f:
        f.write(b"\n".join(lines))
    before = open(path, "rb").read()
    code = main(args(ws["data"], run, "checkpoint.export=false"))
    err = capsys.readouterr()[1]
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: %s line 2 is not a metrics record" % path), err
    assert open(path, "rb").read() == before


# ---- what a run writes honours the umask ------------------------------------------------------------------------

def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o002, 0o022], ids=["umask002", "umask022"])
@pytest.mark.slow
def test_a_training_run_is_shareable(mask, tiny_data, tmp_path):
    """A real training run in a process started under the umask: its config, summary and checkpoints are
    group-readable (and, under 002, group-writable), as `open` would have made them."""
    data = tiny_data
    run = str(tmp_path / "run")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    command = [sys.executable, os.path.join(ROOT, "run_pretraining.py")] + TINY + [
        "data.dir=%s" % data, "checkpoint.output_dir=%s" % run, "training.steps=2", "checkpoint.export=false"]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: os.umask(mask))
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = [os.path.join(run, "config.json"), os.path.join(run, "summary.json")]
    written += [os.path.join(run, "checkpoints", n) for n in os.listdir(os.path.join(run, "checkpoints"))]
    assert len(written) >= 3
    modes = {os.path.relpath(p, run): oct(_mode(p)) for p in written}
    assert set(modes.values()) == {oct(0o666 & ~mask)}, modes
