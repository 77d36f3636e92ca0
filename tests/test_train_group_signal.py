"""A signal sent to the whole process group, as ``timeout`` and Slurm's ``scancel`` send it, while the data
loader has worker processes (data.num_workers > 0): the workers ignore it (signals.ignore_stop_signals), the
training process stops after the step in flight with its checkpoint and one line, exit 128 + the signal, and the
same command resumes. Without that, the workers died first and the run ended with a DataLoader traceback,
exit 1, and no checkpoint of the step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import app_fixtures as fx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.usefixtures("one_thread")]

# run_pretraining.py's command, pausing after each logged step so that the signal lands mid-run
CHILD = r"""
import sys, time
from ipu_packing.train import metrics
from ipu_packing.train.cli import main
log = metrics.MetricsLogger.log
def slow_log(self, record):
    log(self, record)
    print("logged %d" % record.step, file=sys.stderr, flush=True)
    time.sleep(0.3)
metrics.MetricsLogger.log = slow_log
if __name__ == "__main__":  # a loader worker started by spawn or forkserver re-imports it
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_process_group_stops_at_a_step_with_loader_workers(tmp_path, signum):
    data = fx.write_prepared(str(tmp_path / "data"), S=32, K=3, V=64, num_sequences=96, seed=0)
    run = str(tmp_path / "run")
    args = ["--config", "demo"] + fx.TINY + ["data.dir=%s" % data, "checkpoint.output_dir=%s" % run,
                                             "training.steps=40", "checkpoint.every_steps=100", "data.num_workers=2"]
    proc = subprocess.Popen([sys.executable, "-c", CHILD] + args, cwd=REPO, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        seen = ""
        while "logged 2" not in seen and time.monotonic() < deadline:  # the workers are up, steps are running
            seen += proc.stderr.readline()
        assert "logged 2" in seen, seen
        os.killpg(proc.pid, signum)  # the whole group: the training process and its loader workers
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = [line for line in err.splitlines() if not line.startswith("logged ")]
    assert proc.returncode == 128 + signum, (proc.returncode, err[-3000:])
    assert len(lines) == 1, err[-3000:]  # one line, no traceback
    name = signal.Signals(signum).name
    assert lines[0].startswith("error: stopped by %s at step " % name), lines[0]
    step = int(lines[0].split(" at step ")[1].split(";")[0])
    checkpoint = os.path.join(run, "checkpoints", "step_%07d.pt" % step)
    assert "checkpoint %s written" % checkpoint in lines[0] and os.path.isfile(checkpoint)
    assert fx.load(checkpoint).step == step
    assert fx.train(fx.tiny(data, run, "training.steps=%d" % (step + 2), "checkpoint.every_steps=100",
                            "data.num_workers=2", "checkpoint.resume=force"))["steps"] == step + 2
