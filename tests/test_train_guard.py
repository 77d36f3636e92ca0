"""The step guard (train/guard.py StepGuard). A training run stopped by SIGTERM or SIGINT: the step in flight
completes, its checkpoint is written, the run exits 143 or 130 with one line naming the step and the checkpoint, and
the resume loses no step: its losses and final weights are bitwise an uninterrupted run's. A shard shrunk or
rewritten under a running job stops it with one line naming the shard and the last checkpoint, not SIGBUS."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import app_fixtures as fx
from ipu_packing.data import open_dataset
from ipu_packing.signals import Stopped
from ipu_packing.train import load_config
from ipu_packing.train.cli import main
from ipu_packing.train.loop import execute, plan_run

from app_fixtures import TINY

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("one_thread")  # the subprocesses run with OMP_NUM_THREADS=1: same sums
STEPS = ["training.steps=10", "checkpoint.every_steps=4", "checkpoint.keep=10"]

# The real command (run_pretraining's main, through errors.run_command), with a pause after each logged step
# (argv[2] seconds) so that a signal from outside lands mid-run; with argv[3] > 0 it signals itself (SIGINT)
# when step argv[3] is logged, and once more while that step's checkpoint is being written.
CHILD = r"""
import os, signal, sys, time
from ipu_packing.train import metrics
from ipu_packing.train.cli import main
from ipu_packing.train.run_dir import RunDirectory
pause, at = float(sys.argv[1]), int(sys.argv[2])
log = metrics.MetricsLogger.log
def slow_log(self, record):
    log(self, record)
    if record.step == at:
        os.kill(os.getpid(), signal.SIGINT)
    time.sleep(pause)
metrics.MetricsLogger.log = slow_log
save = RunDirectory.save
def interrupted_save(self, state, keep):
    if at and state.step == at:
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C while the checkpoint is written
        time.sleep(0.2)
    return save(self, state, keep)
RunDirectory.save = interrupted_save
if __name__ == "__main__":  # a loader worker started by spawn or forkserver re-imports it
    sys.exit(main(sys.argv[3:]))
"""


def overrides(data_dir, run_dir, *extra):
    return TINY + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run_dir] + STEPS + list(extra)


def train(data_dir, run_dir, *extra):
    config = load_config("demo", overrides(data_dir, run_dir, *extra))
    return execute(plan_run(config, open_dataset=open_dataset), log=lambda m: None)


def start(data_dir, run_dir, pause, at=0):
    argv = [sys.executable, "-c", CHILD, str(pause), str(at), "--config", "demo"] + overrides(data_dir, run_dir)
    return subprocess.Popen(argv, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rows(run_dir):
    return fx.metrics(run_dir)


def metrics_lines(run_dir):
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return f.read().count("\n")
    except OSError:
        return 0


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    run = str(tmp_path_factory.mktemp("reference") / "run")
    train(data_dir, run)
    return run


def check_resume_is_bitwise(data_dir, run, reference, stopped_at):
    """The checkpoint of the stopped step is there and whole; resuming trains from it (no step lost or
    recomputed) to bitwise the reference's losses and final weights."""
    state = fx.load(os.path.join(run, "checkpoints", "step_%07d.pt" % stopped_at))
    assert state.step == stopped_at
    assert [r["step"] for r in rows(run)] == list(range(1, stopped_at + 1))  # nothing logged past the checkpoint
    assert not [n for n in os.listdir(os.path.join(run, "checkpoints")) if not n.endswith(".pt")]
    # the same command, through main() in this process (one torch thread: pytestmark), as a user would run it again
    code, out, err = fx.captured(main, ["--config", "demo"] + overrides(data_dir, run))
    assert code == 0, err[-3000:]
    assert "resuming from %s at step %d" % (os.path.join(run, "checkpoints", "step_%07d.pt" % stopped_at),
                                           stopped_at) in out
    assert [(r["step"], r["loss"], r["mlm_loss"]) for r in rows(run)] == [
        (r["step"], r["loss"], r["mlm_loss"]) for r in rows(reference)]  # exact, steps 1..10, each once
    final = fx.load(fx.latest(run))
    expected = fx.load(fx.latest(reference))
    assert final.step == expected.step == 10
    assert final.model.keys() == expected.model.keys()
    for key, value in expected.model.items():
        assert torch.equal(value, final.model[key]), key
    for key, value in expected.optimizer["state"].items():
        for name, tensor in value.items():
            if isinstance(tensor, torch.Tensor):
                assert torch.equal(tensor, final.optimizer["state"][key][name]), (key, name)


@pytest.mark.slow
def test_sigterm_mid_run_checkpoints_the_step_exits_143_and_resumes_bitwise(data_dir, reference, tmp_path):
    run = str(tmp_path / "run")
    proc = start(data_dir, run, pause=0.3)
    deadline = time.time() + 120
    while metrics_lines(run) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    seen = metrics_lines(run)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, (proc.returncode, err[-3000:])
    lines = err.splitlines()
    assert len(lines) == 1, err
    stopped_at = int(lines[0].split(" at step ")[1].split(";")[0])
    assert seen <= stopped_at <= seen + 1  # the step in flight (if any) completes, no further one starts
    path = os.path.join(run, "checkpoints", "step_%07d.pt" % stopped_at)
    assert lines[0] == ("error: stopped by SIGTERM at step %d; checkpoint %s written; resume with the same command"
                        % (stopped_at, path))
    assert stopped_at % 4  # off the cadence (every 4 steps): written because of the signal
    assert not os.path.exists(os.path.join(run, "summary.json"))
    check_resume_is_bitwise(data_dir, run, reference, stopped_at)


@pytest.mark.slow
def test_sigint_with_a_second_one_during_the_save_exits_130_with_a_whole_checkpoint(data_dir, reference, tmp_path):
    run = str(tmp_path / "run")
    proc = start(data_dir, run, pause=0.0, at=3)
    out, err = proc.communicate(timeout=120)
    path = os.path.join(run, "checkpoints", "step_0000003.pt")
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert err == "error: stopped by SIGINT at step 3; checkpoint %s written; resume with the same command\n" % path
    check_resume_is_bitwise(data_dir, run, reference, 3)


def test_a_signal_on_the_poptorch_path_checkpoints_the_host_call(poptorch, data_dir, tmp_path, monkeypatch):
    """The poptorch stand-in (two optimizer steps per host call here): the stop comes after a whole host call."""
    from ipu_packing.train import metrics

    run = str(tmp_path / "run")
    extra = ["execution.backend=poptorch", "execution.layers_per_ipu=[1,1]", "execution.use_ipu_model=true",
             "execution.micro_batch_size=2", "training.global_batch_sequences=24", "checkpoint.export=false",
             "execution.device_iterations=2"]
    log = metrics.MetricsLogger.log

    def signalling_log(self, record):
        log(self, record)
        if record.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    def outside_the_loop(signum, frame):  # what SIGTERM does here unless the loop took it over
        raise RuntimeError("SIGTERM reached the test's own handler")

    monkeypatch.setattr(metrics.MetricsLogger, "log", signalling_log)
    previous = signal.signal(signal.SIGTERM, outside_the_loop)
    try:
        with pytest.raises(Stopped) as stopped:
            train(data_dir, run, *extra)
        assert signal.getsignal(signal.SIGTERM) is outside_the_loop  # the loop's handler is gone again
    finally:
        signal.signal(signal.SIGTERM, previous)
    path = os.path.join(run, "checkpoints", "step_0000002.pt")
    assert stopped.value.exit_code == 143
    assert stopped.value.line == ("stopped by SIGTERM at step 2; checkpoint %s written; resume with the same command"
                                  % path)
    assert int(fx.load(path).optimizer["ipu_state"]["step"]) == 2


def _agree_worker(rank, port, out_dir):
    """Two gloo processes; only rank 1 got the signal. Both must answer True after the same step."""
    import torch.distributed as dist

    from ipu_packing.execution.runner_common import TorchProcessRunner
    from ipu_packing.train.guard import StepGuard

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=2)
    try:
        stop = StepGuard([])

        class Runner(TorchProcessRunner):  # the torch runners' collectives, over the two processes
            world = 2

        answers = [stop.stop_requested(Runner(), 1)]
        if rank == 1:
            stop.signum = signal.SIGTERM  # as the handler does
        answers.append(stop.stop_requested(Runner(), 2))
        with open(os.path.join(out_dir, "rank%d" % rank), "w") as f:
            f.write("%s %d" % (answers, stop.signum))  # %d: an IntEnum's %s is its name on Python 3.8
        dist.barrier()  # both ranks done before either tears gloo down (torch 2.0.1's teardown can spin forever)
    finally:
        dist.destroy_process_group()


@pytest.mark.serial
@pytest.mark.slow
def test_every_torchrun_rank_stops_after_the_same_step_when_one_got_the_signal(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_agree_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        assert open(str(tmp_path / ("rank%d" % rank))).read() == "[False, True] %d" % signal.SIGTERM


def test_poprun_instances_that_exchange_metrics_agree_on_one_instances_signal():
    from ipu_packing.execution.poptorch_backend import PoptorchRunner
    from ipu_packing.train.guard import StepGuard

    class Group:
        reduces_metrics = True
        names = []

        def allgather(self, row, name):
            self.names.append(name)
            return [row, [float(signal.SIGINT)]]  # instance 1 got Ctrl-C

    runner = object.__new__(PoptorchRunner)  # its collectives only: no IPU
    runner.group = Group()
    stop = StepGuard([])
    assert stop.stop_requested(runner, 4) is True and stop.signum == signal.SIGINT
    assert Group.names == ["ipu_packing.stop.1"]  # the instances' first exchange after this start
    runner.group = None  # one instance
    assert StepGuard([]).stop_requested(runner, 4) is False


# ---- a shard changed under a running job: one line naming the shard and the last checkpoint, not SIGBUS ----------

# The real command; after step 2 the child changes a shard as argv[1] says.
SHARD_CHILD = r"""
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
if __name__ == "__main__":  # a loader worker started by spawn or forkserver re-imports it
    sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize("how, what", [("shrink", "changed size"), ("rewrite", "was rewritten")])
@pytest.mark.slow
def test_a_shard_changed_under_a_running_job_is_one_line_not_sigbus(tiny_data, tmp_path, how, what):
    data = str(tmp_path / "data")
    shutil.copytree(tiny_data, data)
    packed = os.path.join(data, "packed")  # data.layout=packed reads DIR/packed
    shard = os.path.join(packed, sorted(n for n in os.listdir(packed) if n.startswith("shard-"))[-1])
    run = str(tmp_path / "run")
    argv = ["--config", "demo"] + TINY + ["data.dir=%s" % data, "checkpoint.output_dir=%s" % run, "training.steps=4",
                                          "checkpoint.every_steps=2", "checkpoint.export=false", "training.steps=12"]
    proc = subprocess.run([sys.executable, "-c", SHARD_CHILD, how, shard] + argv,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO), cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: shard %s %s" % (shard, what)), lines[0]
    assert "it stopped after step 2, before reading it; the last checkpoint is %s" % os.path.join(
        run, "checkpoints", "step_0000002.pt") in lines[0]
    assert [r["step"] for r in fx.metrics(run)] == [1, 2]
