"""run_pretraining.py on bad input: one line naming the cause, exit status 2, nothing written or
overwritten. One case runs the real command in a subprocess (the exit status and stderr a shell sees); the rest
call the same main() in this process (the same code path, run_command included, without a Python start each)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

import app_fixtures as fx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO_STEPS_OF_8 = [
    "model.vocab_size=64", "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=2",
    "model.num_attention_heads=2", "data.max_seq_length=32", "execution.micro_batch_size=4",
    "training.global_batch_sequences=8", "training.steps=2", "logging.progress_bar=false", "logging.tensorboard=false",
]
"""The finished run these tests must leave alone: the tiny model (app_fixtures.TINY's sizes, without dropout) for two
steps of 8 sequences on this module's 48-sequence dataset."""


def snapshot(root):
    """{relative path: sha256} of every file under root (empty when root does not exist)."""
    out = {}
    for base, _, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run_app(*args, in_process=True):
    if not in_process:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
        return subprocess.run([sys.executable, os.path.join(REPO, "run_pretraining.py")] + list(args), cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=300)
    import contextlib
    import io

    import torch

    from ipu_packing.train.cli import main

    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        torch.set_num_threads(threads)
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A prepared dataset (S=32, vocab A), one with another vocabulary, and a run directory that
    already holds a finished run (checkpoint, export, logs) which no failing command may touch."""
    root = tmp_path_factory.mktemp("cli")
    good = fx.write_prepared(str(root / "good"), S=32, K=3, V=64, num_sequences=48, seed=1)
    other_vocab = fx.write_prepared(str(root / "other_vocab"), S=32, K=3, V=64, num_sequences=48, seed=1, vocab_tag="x")
    run = str(root / "run")
    proc = run_app("--config", "demo", "data.dir=%s" % good, "checkpoint.output_dir=%s" % run,
                   *TWO_STEPS_OF_8)  # in process
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"root": str(root), "good": good, "other_vocab": other_vocab, "run": run}


def expect_user_error(workspace, args, *fragments, in_process=True):
    before = snapshot(workspace["root"])
    proc = run_app(*args, in_process=in_process)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert proc.stdout == ""
    assert snapshot(workspace["root"]) == before  # nothing written, nothing overwritten
    return lines[0]


def base(workspace, data=None):
    return ["--config", "demo", "data.dir=%s" % (data or workspace["good"]),
            "checkpoint.output_dir=%s" % workspace["run"]] + TWO_STEPS_OF_8


def test_missing_dataset(workspace):
    """The one row through a real process: its exit status, stdout and stderr as a shell sees them."""
    missing = os.path.join(workspace["root"], "nowhere")
    expect_user_error(workspace, base(workspace, missing), "dataset not found", os.path.join(missing, "packed"),
                      in_process=False)


def test_corrupt_shard(workspace, tmp_path):
    bad = str(tmp_path / "bad")
    shutil.copytree(workspace["good"], bad)
    shard = os.path.join(bad, "packed", "shard-00001.npy")
    with open(shard, "r+b") as f:
        f.seek(-7, 2)
        f.write(b"garbage")
    workspace = dict(workspace, root=str(tmp_path))
    expect_user_error(workspace, base(workspace, bad), "corrupt", "shard-00001.npy")


def test_corrupt_manifest(workspace, tmp_path):
    bad = str(tmp_path / "bad")
    shutil.copytree(workspace["good"], bad)
    with open(os.path.join(bad, "packed", "manifest.json"), "w") as f:
        f.write("{not json")
    workspace = dict(workspace, root=str(tmp_path))
    expect_user_error(workspace, base(workspace, bad), "corrupt", "manifest.json")


def test_config_error(workspace):
    expect_user_error(workspace, base(workspace) + ["training.stepz=3"], "training.stepz")
    expect_user_error(workspace, base(workspace) + ["optimizer.lr=fast"], "optimizer.lr")
    expect_user_error(workspace, ["--config", "no_such_config"], "no_such_config")


def test_pipeline_split_not_summing_to_layers(workspace):
    expect_user_error(workspace, base(workspace) + ["execution.layers_per_ipu=[1, 2]"],
                      "execution.layers_per_ipu [1, 2] sums to 3, but model.num_hidden_layers is 2")


def test_dataset_with_another_sequence_length(workspace):
    expect_user_error(workspace, base(workspace) + ["data.max_seq_length=64"], "max_seq_length 32", "64")


def test_dataset_with_another_vocabulary(workspace):
    expect_user_error(workspace, base(workspace) + ["model.vocab_size=100"], "vocabulary of 64 tokens",
                      "model.vocab_size is 100")
    # same size, other tokens: the phase-1 model's vocab.txt differs from the dataset's
    export = os.path.join(workspace["run"], "final")
    expect_user_error(workspace, base(workspace, workspace["other_vocab"]) + [
        "checkpoint.output_dir=%s" % os.path.join(workspace["root"], "phase2"), "checkpoint.init_from=%s" % export],
        "another vocabulary")
    # resuming a run on a dataset with another vocabulary
    expect_user_error(workspace, base(workspace, workspace["other_vocab"]), "vocab_sha256")


def test_finished_run_resumes_to_nothing_and_reports(workspace):
    summary = json.load(open(os.path.join(workspace["run"], "summary.json")))
    assert summary["steps"] == 2 and summary["steps_this_run"] == 2
    rows = [json.loads(line) for line in open(os.path.join(workspace["run"], "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2]


def test_rerunning_a_finished_run_trains_nothing_and_overwrites_nothing(workspace):
    before = {k: v for k, v in snapshot(workspace["run"]).items() if k != "run.lock"}
    assert json.load(open(os.path.join(workspace["run"], "summary.json")))["steps_this_run"] == 2
    proc = run_app(*base(workspace))
    assert proc.returncode == 0, proc.stderr
    assert "already finished" in proc.stdout
    after = {k: v for k, v in snapshot(workspace["run"]).items() if k != "run.lock"}
    assert after == before  # summary, metrics, config, checkpoints and export, byte for byte
