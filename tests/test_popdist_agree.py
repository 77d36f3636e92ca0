"""PopRun instances agree on their start, or every one refuses; the metrics are the whole run's.

Each simulated instance is a process of its own (popdist_stand_in.poprun forks one per instance, all at
once), so the instances share nothing but the file system: with the Horovod stand-in they exchange through
its network directory, never through the run directory, and "unshared" run directories are one path per
instance (each host's local disk). Cases: 2 and 4 instances; a shared run directory (all resume the same
checkpoint, broadcast weights, reduced metrics, compile time apart), unshared ones (instance 0 would resume,
the others start afresh: every instance stops in one line naming each start); the same step from copies
of the checkpoint that differ; a fresh start whose weights differ (broadcast with Horovod, refused without);
without Horovod, the meeting through a shared run directory and the refusal where it is not shared; the
POD128 config. The commands' lines come through run_pretraining.py's main (run_command), in the forked
instance."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import time

import pytest
import torch

import app_fixtures as fx
from ipu_packing.train.state import rng_state
import popdist_stand_in as pds
from ipu_packing.data import open_dataset
from ipu_packing.data.format import IGNORE_INDEX
from ipu_packing.execution import make_runner as real_make_runner
from ipu_packing.train import load_config
from ipu_packing.train.loop import execute, plan_run
from ipu_packing.train.state import TrainingState
from popdist_stand_in import POPRUN_TINY, REPLICAS  # poptorch, popdist and horovod: fixtures of conftest.py

START_LINE = ("error: PopRun instances disagree on where to start: %s "
              "(is checkpoint.output_dir on storage every host shares?)\n")


@pytest.fixture
def data_dir(poprun_data):
    """This module's dataset: conftest.py's poprun_data (240 sequences), not the tiny one."""
    return poprun_data


def _overrides(data_dir, run_dir, n, *extra, base=POPRUN_TINY):
    return base + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run_dir, "execution.num_instances=%d" % n,
                   "training.steps=4", "checkpoint.every_steps=2"] + list(extra)


def _fabricate_checkpoint(popdist, config, step, n, perturb=0.0):
    """A checkpoint at ``step`` as instance 0 of ``config``'s run would have saved it (its weights plus
    ``perturb``: another copy of "the same" checkpoint)."""
    with pds.as_instance(popdist, n, config.execution_spec.replication_factor, config.execution_spec.ipus_per_replica,
                         0):
        plan = plan_run(config, open_dataset=open_dataset)
    model = {k: v + perturb if v.is_floating_point() else v for k, v in plan.model.state_dict().items()}
    state = TrainingState(step=step, model=model, optimizer=plan.optimizer.state_dict(),
                          scheduler=plan.scheduler.state_dict(), data={"epoch": 0, "step_in_epoch": step},
                          rng=rng_state(), rng_per_rank=[rng_state()], config=config.to_dict(),
                          dataset=plan.data.fingerprint(), metrics={})
    return fx.save(config.run_dir, state, keep=2)


def _digest(model):
    """The test's own digest of a model's weights (every tensor, by name)."""
    h = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        h.update(name.encode() + value.detach().float().numpy().tobytes())
    return h.hexdigest()


def _command(argv):
    """run_pretraining.py's main in this (forked) instance: (exit status, stdout, stderr)."""
    from ipu_packing.train.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _stopped(outcomes, line):
    """Every instance's command stopped with ``line`` (one line, exit status 2, nothing on stdout but what the
    run printed before the check)."""
    for o in outcomes:
        assert o.error is None, o
        code, out, err = o.value
        assert (code, err) == (2, line), (o.instance, code, err)
        assert "training " not in out and "done:" not in out  # not one step


def _starts(n, resumed_step):
    rest = ("instances %s start at step 0" % ", ".join(str(i) for i in range(1, n)) if n > 2
            else "instance 1 starts at step 0")
    return "instance 0 resumes step %d, %s" % (resumed_step, rest)


# ---- where to start ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.serial
def test_unshared_run_directories_stop_every_instance_in_one_line_naming_their_starts(popdist, horovod, data_dir,
                                                                                     tmp_path, n):
    """Instance 0's host holds the run's checkpoint at step 2, the others' local disks nothing: instance 0
    would resume, the others start afresh. Every instance stops before a step, naming each start."""
    runs = [str(tmp_path / ("host%d" % i) / "run") for i in range(n)]
    saved = _fabricate_checkpoint(popdist, load_config("demo", _overrides(data_dir, runs[0], n)), 2, n)
    before = sorted(os.listdir(runs[0]))
    outcomes = pds.poprun(popdist, n, REPLICAS, 2, lambda i: _command(
        ["--config", "demo"] + _overrides(data_dir, runs[i], n)))
    _stopped(outcomes, START_LINE % _starts(n, 2))
    assert sorted(os.listdir(runs[0])) == before and fx.checkpoints(runs[0]) == [saved]  # nothing written
    assert not any(os.path.exists(r) for r in runs[1:])


@pytest.mark.serial
def test_pod128_refuses_an_instance_that_would_resume_from_another_step(popdist, horovod, data_dir, tmp_path):
    """configs/bert_large_512_pod128.yaml (2 instances, 4 IPUs per replica, fp16, LAMB, the tied decoder
    serialized), shrunk: 4 layers at one per IPU, 2 replicas per instance, a global batch the tiny dataset
    holds. Instance 1's host has a checkpoint at step 2 the run's directory on instance 0 does not."""
    shrink = ["model.vocab_size=64", "model.hidden_size=16", "model.intermediate_size=32", "model.num_hidden_layers=4",
              "model.num_attention_heads=2", "data.max_seq_length=32", "execution.layers_per_ipu=[1,1,1,1]",
              "execution.replication_factor=4", "execution.use_ipu_model=true", "execution.executable_cache_dir=",
              "execution.micro_batch_size=1", "training.global_batch_sequences=72", "logging.progress_bar=false",
              "logging.tensorboard=false", "checkpoint.export=false", "data.num_workers=0"]
    runs = [str(tmp_path / ("host%d" % i) / "run") for i in range(2)]
    config = load_config("bert_large_512_pod128", _overrides(data_dir, runs[1], 2, base=shrink))
    assert (config.execution_spec.num_instances, config.execution_spec.ipus_per_replica,
            config.execution_spec.precision) == (2, 4, "fp16")
    _fabricate_checkpoint(popdist, config, 2, 2)
    outcomes = pds.poprun(popdist, 2, 4, 4, lambda i: _command(
        ["--config", "bert_large_512_pod128"] + _overrides(data_dir, runs[i], 2, base=shrink)))
    _stopped(outcomes, START_LINE % "instance 0 starts at step 0, instance 1 resumes step 2")
    assert not os.path.exists(runs[0])


# ---- one shared run directory: agreement, broadcast, the whole step's metrics --------------------------


def _recording_instance(data_dir, run, n, perturb_instance=None):
    """Train one instance, recording its own (unreduced) step metrics, whether its step was compiled before
    its first call, the collectives it ran and its weights as training began."""
    import sys

    import popdist

    config = load_config("demo", _overrides(data_dir, run, n))
    plan = plan_run(config, open_dataset=open_dataset)
    if popdist.getInstanceIndex() == perturb_instance:  # a host whose torch initialised other weights
        with torch.no_grad():
            next(plan.model.parameters()).add_(0.25)
    own, compiled_first, started = [], [], []

    def make_runner(model, optimizer, execution, scheduler=None, metrics=None):
        runner = real_make_runner(model, optimizer, execution, scheduler=scheduler, metrics=metrics)
        step = runner.train_step

        def train_step(batch):
            if not own:
                compiled_first.append(runner.executor.isCompiled())
                started.append(_digest(runner.model))
            metrics = step(batch)
            own.append({"loss": metrics.loss, "mlm_accuracy": metrics.mlm_accuracy, "sequences": metrics.sequences,
                        "tokens": metrics.tokens})
            return metrics

        runner.train_step = train_step
        return runner

    lines = []
    execute(plan, log=lines.append, make_runner=make_runner)
    return {"start_step": plan.start_step, "own": own, "compiled_first": compiled_first, "started": started,
            "collectives": list(getattr(sys.modules.get("horovod.torch"), "calls", [])), "lines": lines}


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.serial
@pytest.mark.slow
def test_a_shared_run_directory_resumes_every_instance_and_logs_the_whole_step(popdist, horovod, data_dir, tmp_path, n):
    run = str(tmp_path / "run")
    config = load_config("demo", _overrides(data_dir, run, n))
    _fabricate_checkpoint(popdist, config, 2, n)
    names, data, G = _state_names_and_data(popdist, config, n)
    outcomes = pds.poprun(popdist, n, REPLICAS, 2, lambda i: _recording_instance(data_dir, run, n))
    assert all(o.error is None for o in outcomes), outcomes
    results = [o.value for o in outcomes]
    assert [r["start_step"] for r in results] == [2] * n
    # Graphcore's broadcast of the initial weights: every tensor of the state dict, from instance 0
    for r in results:
        assert [name for op, name in r["collectives"] if op == "broadcast"] == sorted(names)
        assert r["compiled_first"] == [True]  # compiled ahead of the first step, outside its timing
    assert len({r["started"][0] for r in results}) == 1
    assert any(line.startswith("PopRun: %d instances start at step 2 from instance 0's weights" % n)
               for line in results[0]["lines"])
    # metrics.jsonl (instance 0 writes it) holds the whole step: every instance's share reduced
    rows = fx.metrics(run)
    assert [r["step"] for r in rows] == [3, 4]
    order = data.epoch_order(config.training.seed, 0).tolist()
    for k, row in enumerate(rows):
        shares = [r["own"][k] for r in results]
        assert row["instances"] == n and row["packs"] == G
        assert row["sequences"] == sum(s["sequences"] for s in shares) == _sequences(
            data, order[(2 + k) * G:(3 + k) * G])
        assert row["tokens"] == sum(s["tokens"] for s in shares)
        assert row["loss"] == pytest.approx(sum(s["loss"] for s in shares) / n, rel=1e-9)
        assert row["mlm_accuracy"] == pytest.approx(sum(s["mlm_accuracy"] for s in shares) / n, rel=1e-9)
        assert row["sequences_per_second"] == pytest.approx(row["sequences"] / row["seconds"], rel=1e-9)
    assert rows[0]["compile_seconds"] > 0 and rows[1]["compile_seconds"] == 0.0
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["instances"] == n and summary["compile_seconds"] == rows[0]["compile_seconds"]
    assert summary["sequences_per_second"] == pytest.approx(sum(r["sequences"] for r in rows)
                                                            / sum(r["seconds"] for r in rows))


def _state_names_and_data(popdist, config, n):
    with pds.as_instance(popdist, n, REPLICAS, 2, 0):
        plan = plan_run(config, open_dataset=open_dataset)
    return list(plan.model.state_dict()), plan.data, plan.accounting.global_batch_packs


def _sequences(data, indices):
    return sum(int((torch.as_tensor(data.dataset[i]["nsp_labels"]) != IGNORE_INDEX).sum()) for i in indices)


@pytest.mark.serial
def test_a_run_directory_in_use_stops_every_instance(popdist, horovod, data_dir, tmp_path):
    """Another live run holds the run directory's lock: instance 0 is refused it, and the others stop too
    instead of training alone."""

    run = str(tmp_path / "run")
    with fx.holding(run):
        outcomes = pds.poprun(popdist, 2, REPLICAS, 2, lambda i: _command(
            ["--config", "demo"] + _overrides(data_dir, run, 2)))
    (code0, _, err0), (code1, out1, err1) = (o.value for o in outcomes)
    assert code0 == 2 and err0.startswith("error: run directory %s is in use by pid %d" % (run, os.getpid())), err0
    assert (code1, err1) == (
        2, "error: PopRun instance 0 could not start (its error line says why): every instance stops\n")
    assert not fx.checkpoints(run)


# ---- the weights ---------------------------------------------------------------------------------------


@pytest.mark.serial
def test_copies_of_a_checkpoint_that_differ_at_the_same_step_are_refused(popdist, horovod, data_dir, tmp_path):
    runs = [str(tmp_path / ("host%d" % i) / "run") for i in range(2)]
    for i, run in enumerate(runs):
        _fabricate_checkpoint(popdist, load_config("demo", _overrides(data_dir, run, 2)), 2, 2, perturb=0.5 * i)
    outcomes = pds.poprun(popdist, 2, REPLICAS, 2, lambda i: _command(
        ["--config", "demo"] + _overrides(data_dir, runs[i], 2)))
    for o in outcomes:
        code, _, err = o.value
        assert code == 2 and err.count("\n") == 1, err
        assert re.fullmatch(r"error: PopRun instances disagree on the weights at step 2: "
                            r"instance 0 sha256 [0-9a-f]{12}, instance 1 sha256 [0-9a-f]{12} "
                            r"\(each instance resumed its own copy of the checkpoint: is "
                            r"checkpoint\.output_dir on storage every host shares\?\)\n", err), err
    assert outcomes[0].value[2] == outcomes[1].value[2]  # the same line on both


@pytest.mark.serial
@pytest.mark.slow
def test_a_fresh_start_takes_instance_0_s_weights_through_horovod(popdist, horovod, data_dir, tmp_path):
    """Equal seeds, but instance 1's host built other weights: Horovod broadcasts instance 0's (Graphcore's
    optimization.py:89), so both train from them."""
    outcomes = pds.poprun(popdist, 2, REPLICAS, 2, lambda i: _recording_instance(data_dir, str(tmp_path / "run"), 2,
                                                                                 perturb_instance=1))
    assert all(o.error is None for o in outcomes), outcomes
    first, second = (o.value for o in outcomes)
    assert (first["start_step"], second["start_step"]) == (0, 0)
    assert first["started"] == second["started"]


# ---- without Horovod: meeting through the run directory ---------------------------------------------------


@pytest.fixture
def no_horovod(popdist, monkeypatch):
    """Without horovod.torch; the instances wait for each other up to 60 s (a busy machine starts them seconds
    apart), a test of the wait running out sets its own."""
    pds.without_horovod(monkeypatch)
    monkeypatch.setenv("IPU_PACKING_RENDEZVOUS_TIMEOUT", "60")


@pytest.mark.serial
@pytest.mark.slow
def test_without_horovod_a_shared_run_directory_checks_the_start_and_logs_instance_0_s_share(popdist, no_horovod,
                                                                                              data_dir, tmp_path):
    run = str(tmp_path / "run")
    config = load_config("demo", _overrides(data_dir, run, 2))
    _fabricate_checkpoint(popdist, config, 2, 2)
    G = _state_names_and_data(popdist, config, 2)[2]
    outcomes = pds.poprun(popdist, 2, REPLICAS, 2, lambda i: _command(
        ["--config", "demo"] + _overrides(data_dir, run, 2)))
    for o in outcomes:
        assert o.error is None and o.value[0] == 0, o
    out = outcomes[0].value[1]
    assert re.search(r"^PopRun: 2 instances start at step 2 from the same weights "
                     r"\(sha256 [0-9a-f]{12}, checked through files in %s "
                     % re.escape(os.path.join(run, ".instances")), out, re.M), out
    assert "note: no horovod.torch: each step's metrics are instance 0's share (1 of 2 instances" in out
    rows = fx.metrics(run)
    assert [(r["step"], r["instances"], r["packs"]) for r in rows] == [
        (3, 1, G // 2), (4, 1, G // 2)]  # one of two shares


@pytest.mark.serial
@pytest.mark.slow
def test_without_horovod_unshared_run_directories_stop_every_instance(popdist, no_horovod, data_dir, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("IPU_PACKING_RENDEZVOUS_TIMEOUT", "2")  # each instance waits for one that never comes
    runs = [str(tmp_path / ("host%d" % i) / "run") for i in range(2)]
    outcomes = pds.poprun(popdist, 2, REPLICAS, 2, lambda i: _command(
        ["--config", "demo"] + _overrides(data_dir, runs[i], 2)))
    tail = ("within 2 s: the run has no horovod.torch, so the instances meet through files in the run directory; is "
            "checkpoint.output_dir on storage every host shares? (or install the Poplar SDK's horovod wheel, as "
            "Graphcore's app does)\n")
    expected = ["error: PopRun instance 0 heard nothing from instance 1 in %s " % os.path.join(runs[0], ".instances"),
                "error: PopRun instance 1 saw no answer of instance 0 in %s " % os.path.join(runs[1], ".instances")]
    for o, head in zip(outcomes, expected):
        code, out, err = o.value
        assert (code, err) == (2, head + tail), err
        assert "training " not in out
    assert not fx.checkpoints(runs[0]) and not os.path.exists(os.path.join(runs[0], "metrics.jsonl"))


@pytest.mark.serial
def test_without_horovod_weights_that_differ_are_refused(popdist, no_horovod, data_dir, tmp_path):
    outcomes = pds.poprun(popdist, 2, REPLICAS, 2, lambda i: _recording_instance(data_dir, str(tmp_path / "run"), 2,
                                                                                 perturb_instance=1))
    for o in outcomes:
        assert o.error is not None and o.user_error, o
        assert re.fullmatch(r"PopRun instances disagree on the weights at step 0: "
                            r"instance 0 sha256 [0-9a-f]{12}, instance 1 sha256 [0-9a-f]{12} "
                            r"\(equal seeds built different weights, or checkpoint\.init_from differs between hosts; "
                            r"with horovod\.torch instance 0's would be broadcast\)", o.message), o.message


# ---- compile time apart from the step, on every backend -------------------------------------------------


TORCH_TINY = ["model.vocab_size=64", "model.hidden_size=16", "model.intermediate_size=32", "model.num_hidden_layers=2",
              "model.num_attention_heads=2", "data.max_seq_length=32", "execution.micro_batch_size=4",
              "training.global_batch_sequences=16", "logging.progress_bar=false", "logging.tensorboard=false",
              "checkpoint.export=false", "data.num_workers=0"]


def test_compile_time_is_reported_apart_on_both_backends(poptorch, data_dir, tmp_path):
    """poptorch (one host): the step is compiled ahead of its first call, the seconds reported as
    compile_seconds on that step only, outside its seconds and sequences/s; torch compiles nothing ahead: 0."""
    lines = []
    run = str(tmp_path / "ipu")
    config = load_config("demo", [o for o in _overrides(data_dir, run, 1) if "num_instances" not in o])
    compiled_first = []

    def make_runner(model, optimizer, execution, scheduler=None, metrics=None):
        runner = real_make_runner(model, optimizer, execution, scheduler=scheduler, metrics=metrics)
        step = runner.train_step
        runner.train_step = lambda batch: (compiled_first.append(runner.executor.isCompiled()), step(batch))[1]
        return runner

    summary = execute(plan_run(config, open_dataset=open_dataset), log=lines.append, make_runner=make_runner)
    rows = fx.metrics(run)
    assert compiled_first == [True] * 4 and len(rows) == 4
    assert rows[0]["compile_seconds"] > 0 and [r["compile_seconds"] for r in rows[1:]] == [0.0] * 3
    assert [r["instances"] for r in rows] == [1] * 4
    assert summary["compile_seconds"] == rows[0]["compile_seconds"]
    assert re.match(r"done: 4 steps in [0-9.]+ s \(and [0-9.]+ s compiling\); loss", lines[-1]), lines[-1]

    run = str(tmp_path / "torch")
    config = load_config("demo", TORCH_TINY + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run,
                                               "training.steps=2"])
    assert config.execution_spec.backend == "torch"
    lines = []
    summary = execute(plan_run(config, open_dataset=open_dataset), log=lines.append)
    rows = fx.metrics(run)
    assert [(r["compile_seconds"], r["instances"]) for r in rows] == [(0.0, 1), (0.0, 1)]
    assert summary["compile_seconds"] == 0.0 and re.match(r"done: 2 steps in [0-9.]+ s; loss", lines[-1]), lines[-1]


@pytest.mark.serial
def test_without_horovod_files_an_earlier_run_left_are_not_taken_for_this_one(popdist, no_horovod, tmp_path):
    """A killed run left its meeting's files (instance 0's table, instance 1's hello and acknowledgement):
    the instances of the next run exchange their own rows all the same."""
    from ipu_packing.execution.popdist_backend import Launch
    from ipu_packing.execution.poprun_group import DirectoryGroup

    meeting = tmp_path / "run" / ".instances"
    meeting.mkdir(parents=True)
    (meeting / "x.rows").write_text(json.dumps({"nonce": "old0", "nonces": ["old0", "old1"], "rows": [[7.0], [7.0]]}))
    (meeting / "x.hello.1").write_text(json.dumps({"nonce": "old1", "row": [7.0]}))
    (meeting / "x.ack.1").write_text(json.dumps("old0"))

    def meet(i):
        if i == 1:
            time.sleep(0.5)  # instance 0 meets the stale hello first
        return DirectoryGroup(str(meeting), Launch(2, i, 2), timeout=20.0).allgather([float(i)], name="x")

    outcomes = pds.poprun(popdist, 2, REPLICAS, 2, meet)
    assert [o.value for o in outcomes] == [[[0.0], [1.0]], [[0.0], [1.0]]], outcomes


def test_a_horovod_that_cannot_start_under_poprun_stops_in_one_line(popdist, horovod, monkeypatch):
    """horovod.torch imports but hvd.init() fails (a wheel built without MPI under poprun's mpirun), or
    reports another process than popdist's instance: one line each, a launch error."""
    from ipu_packing.errors import UserError
    from ipu_packing.execution.popdist_backend import Launch
    from ipu_packing.execution.poprun_group import HorovodGroup

    def broken():
        raise RuntimeError("Horovod has not been built with MPI support.\nRebuild it")

    with monkeypatch.context() as m, pytest.raises(UserError) as err:
        m.setattr(horovod, "init", broken)
        HorovodGroup(horovod, Launch(2, 0, 2))
    assert str(err.value) == ("horovod.torch imports but hvd.init() failed under poprun (RuntimeError: Horovod has not "
                              "been built with MPI support. Rebuild it): install the Poplar SDK's horovod wheel (built "
                              "with MPI), or uninstall horovod to meet through the run directory")
    with pds.as_instance(popdist, 2, REPLICAS, 2, 1), pytest.raises(UserError, match=r"^horovod reports process 1 of 2 "
                                                                                       r"but popdist instance 0 of 2"):
        HorovodGroup(horovod, Launch(2, 0, 2))
