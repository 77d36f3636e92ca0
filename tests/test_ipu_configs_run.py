"""Every shipped IPU config (configs/bert_*pod*.yaml) starts from run_pretraining.py, as a subprocess under the
PopTorch stand-in, with its own DataLoader mode (async_rebatched): PopTorch's AsynchronousDataAccessor starts
its worker with forkserver in DataLoader.__init__, and that child imports run_pretraining.py again (as
__mp_main__) before it unpickles the dataset. Before the entry point kept its work behind its
``if __name__ == "__main__":`` guard, the child ran the whole command again and every run below failed with
"AsynchronousDataAccessor worker thread failed to start" (the old entry point still does:
test_entry_points.py::test_an_unguarded_run_pretraining_fails_under_the_stand_in).

(a) compile-only with a prepared dataset, every config (POD128: one of its two PopRun instances);
(b) two training steps with a checkpoint after each, a SIGKILL as the second host call begins, and a resume
    that finishes the run; no process of the killed run is left behind. By default (b) runs the POD64 BERT-Large
    config (one host, 16 replicas): each run here is a few seconds of CPU, and the suite has a budget.
    IPU_PACKING_ALL_CONFIG_RUNS=1 runs (b) for every one-host config. POD128's two instances agree on their
    start before they train, so (c) runs them at once.
(c) POD128: its two PopRun instances as two run_pretraining.py processes started at once, as poprun starts
    them (PopDist and Horovod stand-ins, one shared run directory, a network directory per job): both are
    killed as their second host call begins (poprun tears the job down), instance 1 on a host whose
    run directory is empty is refused with instance 0 in one line, and both resume and finish.

The model is shrunk (hidden 16, one layer on each IPU that has layers, S=32, vocab 64) and the global batch
set to 9 or 10 micro batches per replica, the least a 4-IPU pipeline takes (PopART's 2G-1, G = 5 groups);
micro batch, replicas, instances, layout, device iterations and DataLoader mode are the config's. (b) runs
in fp32: fp16 matmuls on this CPU cost milliseconds each, and the fp16 trace of every config is checked in
test_execution_poptorch.py. All the module's runs go through one pool, two processes at a time (the machine
has two cores).
"""

from __future__ import annotations

import concurrent.futures
import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import app_fixtures as fx
import poptorch_stand_in as si
import popdist_stand_in as pds
from ipu_packing.train import load_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY = os.path.join(REPO, "run_pretraining.py")
CONFIGS = sorted(os.path.basename(p)[: -len(".yaml")]
                 for p in glob.glob(os.path.join(REPO, "configs", "bert_*pod*.yaml")))
DEFAULT_RUNS = ("bert_large_512_pod64",)
# PopRun instances agree on their start before training (execution/poprun_group.py), so the two instances of POD128
# must run at once: (c) starts them together; (b) starts one process at a time.
TOGETHER = ("bert_large_512_pod128",)
ALL_RUNS = os.environ.get("IPU_PACKING_ALL_CONFIG_RUNS") == "1"
SMALL = ["model.hidden_size=16", "model.num_attention_heads=2", "model.intermediate_size=32", "model.vocab_size=64",
         "data.max_seq_length=32", "logging.progress_bar=false", "logging.tensorboard=false", "checkpoint.export=false"]
WORKER_LOG = "POPTORCH_STAND_IN_WORKER_LOG"
KILL_AT_CALL = "POPTORCH_STAND_IN_SIGKILL_AT_CALL"

def test_the_shipped_ipu_configs_are_the_nine_with_async_rebatched():
    assert CONFIGS == ["bert_base_512_pod16", "bert_base_512_pod16_padded", "bert_base_512_pod64",
                       "bert_base_512_pod64_padded", "bert_large_512_pod128", "bert_large_512_pod16",
                       "bert_large_512_pod16_padded", "bert_large_512_pod64", "bert_large_512_pod64_padded"]
    for name in CONFIGS:
        assert load_config(name).execution_spec.dataloader_mode == "async_rebatched", name


def _poprun_env(instances: int, replicas: int, ipus: int, instance: int):
    path = os.path.join(pds.STAND_IN_DIR, "popdist", "__init__.py")
    spec = importlib.util.spec_from_file_location("_popdist_env", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.poprun_env(instances, replicas, ipus, instance)


class Run:
    """One config as run here: its overrides and the environment of each of its processes."""

    def __init__(self, name: str, data_dir: str, root: str) -> None:
        config = load_config(name)
        e = config.execution_spec
        self.name, self.instances, self.device_iterations = name, e.num_instances, e.device_iterations
        self.layout = config.data.layout
        split = [min(1, n) for n in e.layers_per_ipu]  # one layer on each IPU that has layers
        unpacked = 9 if self.layout == "padded" else 18  # 9 or 10 (18 / 1.80) micro batches per replica
        self.cwd = os.path.join(root, name)
        self.run_dir = os.path.join(self.cwd, "run")
        self.cache = os.path.join(self.cwd, "cache")
        self.log = os.path.join(self.cwd, "workers.jsonl")
        os.makedirs(self.cwd)
        self.overrides = SMALL + [
            "model.num_hidden_layers=%d" % sum(split), "execution.layers_per_ipu=[%s]" % ",".join(map(str, split)),
            "training.global_batch_sequences=%d" % (e.micro_batch_size * e.replication_factor * unpacked),
            "data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % self.run_dir,
            "execution.executable_cache_dir=%s" % self.cache,
        ]
        self.replicas, self.ipus = e.replication_factor, len(e.layers_per_ipu)

    def env(self, instance: int = 0, **extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("POPDIST_", "OMPI_COMM_WORLD")) and k not in (WORKER_LOG, KILL_AT_CALL)}
        path = [si.STAND_IN_DIR] + ([pds.STAND_IN_DIR] if self.instances > 1 else []) + [REPO]
        env.update(PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1")
        env[WORKER_LOG] = self.log
        if self.instances > 1:
            env.update(_poprun_env(self.instances, self.replicas, self.ipus, instance))
        env.update(extra)
        return env

    def start(self, *extra, instance: int = 0, env=None) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, ENTRY, "--config", self.name] + self.overrides + list(extra),
                                cwd=self.cwd, env=env or self.env(instance), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, universal_newlines=True)


def _finish(proc: subprocess.Popen):
    out, err = proc.communicate(timeout=300)
    return {"pid": proc.pid, "returncode": proc.returncode, "stdout": out, "stderr": err}


def _alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid, "r") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _worker_lines(run: Run):
    if not os.path.isfile(run.log):
        return []
    with open(run.log, "r", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _in_pairs(jobs):
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(jobs, pool.map(lambda job: jobs[job](), jobs)))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    # 4055 packs (packing factor 1.80) and 7300 padded rows: two steps of the largest combined batch
    return fx.write_prepared(str(tmp_path_factory.mktemp("prepared")), S=32, K=3, V=64, num_sequences=7300, seed=0)


def _compile_only(run: Run):
    instance = run.instances - 1  # POD128: instance 1, which reads its slice of each step
    return dict(_finish(run.start("execution.compile_only=true", instance=instance)), run=run)


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    """Every run of this module, two processes at a time, the longest sequences first."""
    root = str(tmp_path_factory.mktemp("runs"))
    jobs = {}
    for name in [n for n in (CONFIGS if ALL_RUNS else DEFAULT_RUNS) if n not in TOGETHER]:
        run = Run(name, data_dir, os.path.join(root, "train"))
        jobs["train", name] = lambda run=run: _kill_and_resume(run)
    for name in TOGETHER:
        run = Run(name, data_dir, os.path.join(root, "together"))
        jobs["together", name] = lambda run=run: _together(run)
    for name in CONFIGS:
        run = Run(name, data_dir, os.path.join(root, "compile_only"))
        jobs["compile_only", name] = lambda run=run: _compile_only(run)
    return _in_pairs(jobs)


# ---- (a) compile-only ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.serial
@pytest.mark.slow
def test_compile_only_with_a_prepared_dataset_starts_the_loader_s_worker(runs, data_dir, name):
    done = runs["compile_only", name]
    run = done["run"]
    assert done["returncode"] == 0, done["stderr"][-3000:]
    lines = done["stdout"].splitlines()
    assert "for the first batch of %s" % os.path.join(data_dir, run.layout) in lines[-2]
    assert lines[-1] == "executable cache: %s" % run.cache
    assert len(os.listdir(run.cache)) == 1 and not os.path.exists(run.run_dir)  # nothing but the cache
    (worker,) = _worker_lines(run)  # the first batch came from a worker process, forked by the forkserver
    assert worker["sharing_strategy"] == "ForkServer" and worker["ppid"] != done["pid"] != worker["pid"]
    assert worker["main_name"] == "__mp_main__" and worker["main_file"] == ENTRY  # it imported run_pretraining.py
    assert not _alive(worker["pid"])


# ---- (b) train, checkpoint, SIGKILL, resume -------------------------------------------------------------------


def _steps(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path, "r", encoding="utf-8") as f:
        return [json.loads(line)["step"] for line in f]


def _snapshot(directory):
    return {os.path.relpath(os.path.join(d, n), directory): os.stat(os.path.join(d, n)).st_mtime_ns
            for d, _, names in os.walk(directory) for n in names}


def _kill_and_resume(run: Run):
    """Instance 0 trains, checkpoints step 1 and is killed; every other instance resumes from that checkpoint
    and finishes (writing nothing); instance 0 resumes and finishes."""
    train = ["training.steps=2", "checkpoint.every_steps=1", "execution.precision=fp32"]
    killed = _finish(run.start(*train, env=run.env(0, **{KILL_AT_CALL: "2"})))
    killed["checkpoints"] = [os.path.basename(p) for p in fx.checkpoints(run.run_dir)]
    killed["steps"] = _steps(run.run_dir)
    killed["summary"] = os.path.exists(os.path.join(run.run_dir, "summary.json"))
    killed["workers"] = _worker_lines(run)
    deadline = time.time() + 60  # its worker (and the forkserver) see the closed pipes and exit
    while any(_alive(w["pid"]) or _alive(w["ppid"]) for w in killed["workers"]) and time.time() < deadline:
        time.sleep(0.1)
    killed["left_behind"] = [p for w in killed["workers"] for p in (w["pid"], w["ppid"]) if _alive(p)]
    others = []
    for instance in range(1, run.instances):
        before = _snapshot(run.run_dir)
        # armed at its second host call: a run that resumed at step 1 makes one call and never reaches it
        other = _finish(run.start(*train, env=run.env(instance, **{KILL_AT_CALL: "2"})))
        other["unchanged"] = _snapshot(run.run_dir) == before
        others.append(other)
    seen = len(_worker_lines(run))
    resumed = _finish(run.start(*train))
    resumed["workers"] = _worker_lines(run)[seen:]
    resumed["steps"] = _steps(run.run_dir)
    latest = fx.latest(run.run_dir)
    resumed["latest"] = os.path.basename(latest) if latest else None
    resumed["ipu_step"] = int(fx.load(latest).optimizer["ipu_state"]["step"]) if latest else None
    resumed["summary"] = os.path.exists(os.path.join(run.run_dir, "summary.json"))
    return {"run": run, "killed": killed, "others": others, "resumed": resumed}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.skip(reason="its PopRun instances must run at once: (c) runs them"))
    if n in TOGETHER else n if n in DEFAULT_RUNS else pytest.param(n, marks=pytest.mark.skipif(
        not ALL_RUNS, reason="IPU_PACKING_ALL_CONFIG_RUNS=1 runs every config")) for n in CONFIGS])
@pytest.mark.serial
@pytest.mark.slow
def test_training_checkpoints_is_killed_and_resumes_with_the_loader_s_worker(runs, name):
    done = runs["train", name]
    run, killed, result = done["run"], done["killed"], done["resumed"]
    assert killed["returncode"] == -signal.SIGKILL, killed["stderr"][-3000:]
    assert killed["checkpoints"] == ["step_0000001.pt"] and killed["steps"] == [1] and not killed["summary"]
    (worker,) = killed["workers"]
    assert worker["sharing_strategy"] == "ForkServer" and worker["main_name"] == "__mp_main__"
    assert worker["main_file"] == ENTRY
    assert killed["left_behind"] == []  # the killed run's worker and forkserver ended with it
    # POD128 instance 1: resumed from instance 0's checkpoint (one host call: the kill armed at call 2 never
    # came), logged nothing and wrote nothing
    for other in done["others"]:
        assert other["returncode"] == 0, other["stderr"][-3000:]
        assert other["stdout"] == "" and other["unchanged"]
    assert result["returncode"] == 0, result["stderr"][-3000:]
    first = os.path.join(run.run_dir, "checkpoints", "step_0000001.pt")
    assert "resuming from %s at step 1" % first in result["stdout"]
    assert result["steps"] == [1, 2] and result["latest"] == "step_0000002.pt" and result["summary"]
    assert run.device_iterations == 1 and result["ipu_step"] == 2  # the IPU state read back after the resumed call
    (worker,) = result["workers"]
    assert worker["main_file"] == ENTRY and not _alive(worker["pid"])
    assert len(_worker_lines(run)) == 2 + len(done["others"])


# ---- (c) POD128: both PopRun instances at once ------------------------------------------------------------------

START_LINE = ("error: PopRun instances disagree on where to start: instance 0 resumes step 1, instance 1 starts "
              "at step 0 (is checkpoint.output_dir on storage every host shares?)")


def _job(run: Run, label: str, *extra, kill_at=None, run_dirs=None):
    """One poprun job of ``run``: every instance a run_pretraining.py process, all started at once, each with
    poprun's environment for it and the job's own Horovod network directory; ``run_dirs[i]``, where given, is
    instance i's checkpoint.output_dir (its host's disk). Returns every instance's result, in order."""
    network = os.path.join(run.cwd, "network", label)
    os.makedirs(network)
    procs = []
    for i in range(run.instances):
        env = run.env(i, HOROVOD_STAND_IN_DIR=network, HOROVOD_STAND_IN_TIMEOUT="120",
                      **({KILL_AT_CALL: str(kill_at)} if kill_at else {}))
        own = ["checkpoint.output_dir=%s" % run_dirs[i]] if run_dirs else []
        procs.append(run.start(*(list(extra) + own), instance=i, env=env))
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(procs)) as pool:
        return list(pool.map(_finish, procs))


def _together(run: Run):
    train = ["training.steps=2", "checkpoint.every_steps=1", "execution.precision=fp32"]
    killed = _job(run, "killed", *train, kill_at=2)
    after_kill = {"checkpoints": [os.path.basename(p) for p in fx.checkpoints(run.run_dir)],
                  "steps": _steps(run.run_dir), "workers": _worker_lines(run),
                  "summary": os.path.exists(os.path.join(run.run_dir, "summary.json"))}
    deadline = time.time() + 60
    while any(_alive(w["pid"]) or _alive(w["ppid"]) for w in after_kill["workers"]) and time.time() < deadline:
        time.sleep(0.1)
    after_kill["left_behind"] = [p for w in after_kill["workers"] for p in (w["pid"], w["ppid"]) if _alive(p)]
    before = _snapshot(run.run_dir)
    empty = os.path.join(run.cwd, "host1", "run")  # instance 1's host sees no checkpoint
    refused = _job(run, "refused", *train, run_dirs=[run.run_dir, empty])
    refused_state = {"unchanged": _snapshot(run.run_dir) == before, "empty": os.path.exists(empty)}
    seen = len(_worker_lines(run))
    resumed = _job(run, "resumed", *train)
    latest = fx.latest(run.run_dir)
    return {"run": run, "killed": killed, "after_kill": after_kill, "refused": refused, "refused_state": refused_state,
            "resumed": resumed, "steps": _steps(run.run_dir), "workers": _worker_lines(run)[seen:],
            "latest": os.path.basename(latest) if latest else None,
            "summary": os.path.exists(os.path.join(run.run_dir, "summary.json"))}


@pytest.mark.parametrize("name", TOGETHER)
@pytest.mark.serial
@pytest.mark.slow
def test_pod128_instances_at_once_are_killed_refused_apart_and_resume_together(runs, name):
    done = runs["together", name]
    run, after = done["run"], done["after_kill"]
    assert run.instances == 2
    # killed: both instances as their second host call begins, after instance 0 saved step 1
    assert [r["returncode"] for r in done["killed"]] == [-signal.SIGKILL] * 2, [r["stderr"][-2000:]
                                                                               for r in done["killed"]]
    assert after["checkpoints"] == ["step_0000001.pt"] and after["steps"] == [1] and not after["summary"]
    assert len(after["workers"]) == 2  # one loader worker per instance, each from its own forkserver
    for worker in after["workers"]:
        assert worker["sharing_strategy"] == "ForkServer" and worker["main_name"] == "__mp_main__"
        assert worker["main_file"] == ENTRY
    assert len({w["ppid"] for w in after["workers"]}) == 2
    assert after["left_behind"] == []
    # refused apart: instance 1's run directory is empty, instance 0's holds step 1; neither trains a step
    for r in done["refused"]:
        assert r["returncode"] == 2, r["stderr"][-2000:]
        assert r["stderr"].strip().splitlines() == [START_LINE]
        assert "done:" not in r["stdout"]
    assert done["refused_state"] == {"unchanged": True, "empty": False}
    # resumed together: both from step 1, instance 0 logs and writes, instance 1 prints nothing
    first, second = done["resumed"]
    assert first["returncode"] == 0 and second["returncode"] == 0, (first["stderr"][-2000:], second["stderr"][-2000:])
    assert "resuming from %s at step 1" % os.path.join(run.run_dir, "checkpoints", "step_0000001.pt") in first["stdout"]
    assert second["stdout"] == ""
    assert done["steps"] == [1, 2] and done["latest"] == "step_0000002.pt" and done["summary"]
    assert len(done["workers"]) == 2 and all(w["main_file"] == ENTRY for w in done["workers"])
