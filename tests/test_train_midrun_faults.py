"""Rule 7 (issue 24, part): faults around a running or resumed job get one line and a consistent state.
A torn last line in metrics.jsonl (a kill mid-write) is dropped on resume, in one line; a bad line before
it is refused naming the file and line. A shard shrunk or rewritten under a running job stops it with one
line naming the shard and the last checkpoint, not SIGBUS."""

import os
import shutil
import subprocess
import sys

import pytest

import app_fixtures as fx
from ipu_packing.train.cli import main

from app_fixtures import TINY

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("one_thread")
BASE = ["training.steps=4", "checkpoint.every_steps=2", "checkpoint.export=false"]


@pytest.fixture
def ws(tiny_data, tiny_run):
    """The session's dataset and its finished run (steps 4, a checkpoint every 2): tests copy them before they write."""
    return {"data": tiny_data, "run": tiny_run}


def args(data, run, *extra):
    return ["--config", "demo"] + TINY + ["data.dir=%s" % data, "checkpoint.output_dir=%s" % run] + BASE + list(extra)


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
    code = main(args(ws["data"], run))
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
    code = main(args(ws["data"], run))
    err = capsys.readouterr()[1]
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: %s line 2 is not a metrics record" % path), err
    assert open(path, "rb").read() == before


# The real command, with a pause after each step; after step 2 the child changes a shard as argv[1] says.
CHILD = r"""
import os, sys
from ipu_packing.train import metrics
from ipu_packing.train.cli import main
how, shard = sys.argv[1], sys.argv[2]
log = metrics.MetricsLogger.log
def changing_log(self, record):
    log(self, record)
    if record.step == 2:
        if how == "shrink":
            os.truncate(shard, 128)  # in place, under the memory map
        else:
            with open(shard, "r+b") as f:  # same size, other bytes
                f.seek(-16, 2)
                f.write(b"\x00" * 16)
metrics.MetricsLogger.log = changing_log
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize("how, what", [("shrink", "changed size"), ("rewrite", "was rewritten")])
def test_a_shard_changed_under_a_running_job_is_one_line_not_sigbus(ws, tmp_path, how, what):
    data = str(tmp_path / "data")
    shutil.copytree(ws["data"], data)
    packed = os.path.join(data, "packed")  # data.layout=packed reads DIR/packed
    shard = os.path.join(packed, sorted(n for n in os.listdir(packed) if n.startswith("shard-"))[-1])
    run = str(tmp_path / "run")
    proc = subprocess.run([sys.executable, "-c", CHILD, how, shard] + args(data, run, "training.steps=12"),
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO), cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: shard %s %s" % (shard, what)), lines[0]
    assert "it stopped after step 2, before reading it; the last checkpoint is %s" % os.path.join(
        run, "checkpoints", "step_0000002.pt") in lines[0]
    assert [r["step"] for r in fx.metrics(run)] == [1, 2]
