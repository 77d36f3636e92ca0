"""Past one host: the poptorch backend under PopRun, with the PopDist stand-in (tests/fake_popdist) on the
PopTorch stand-in, instances simulated by setting the environment poprun gives each one.

With 2 and 4 instances: the options are built through popdist.poptorch.Options with the instance's share of
the replicas; a config whose replication (or instances, or IPUs per replica) differs from poprun's is
refused in one line naming both numbers; the instances together read every pack of an epoch exactly once,
each step's packs being those one host would read; only instance 0 writes. Without popdist a config asking
for several instances stops in one line naming the Poplar SDK. The POD128 config's dry run shows instances,
replicas per instance and the per-instance batch."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections import Counter

import pytest
import torch
from torch.optim import AdamW

import app_fixtures as fx
import popdist_stand_in as pds
from popdist_stand_in import POPRUN_TINY, REPLICAS
import poptorch_stand_in as si
from ipu_packing.data import open_dataset
from ipu_packing.errors import UserError
from ipu_packing.execution import ExecutionConfig, make_runner
from ipu_packing.train import ConfigError, load_config
from ipu_packing.train.loop import execute, plan_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTANCES = [2, 4]


@pytest.fixture
def data_dir(poprun_data):
    """This module's dataset: conftest.py's poprun_data (240 sequences), not the tiny one."""
    return poprun_data


def _execution(num_instances, replicas=REPLICAS, **kw):
    fields = dict(backend="poptorch", micro_batch_size=2, gradient_accumulation=5, layers_per_ipu=[1, 1],
                  use_ipu_model=True, device_iterations=2, replication_factor=replicas, num_instances=num_instances)
    fields.update(kw)
    return ExecutionConfig(**fields)


def _runner(config):
    model = si.tiny_model(2)
    return make_runner(model, AdamW(model.parameters(), lr=1e-3), config)


# ---- the stand-in itself ------------------------------------------------------------------------------


def test_the_stand_in_answers_and_refuses_as_popdist_documents(popdist):
    assert not popdist.isPopdistEnvSet()
    outside = popdist.poptorch.Options(ipus_per_replica=2)  # poptorch tests/popdist_test.py:45-55
    assert (outside.Distributed.processId, outside.Distributed.numProcesses) == (0, 1)
    with pds.as_instance(popdist, 4, 8, 2, 3):
        assert popdist.isPopdistEnvSet()
        assert (popdist.getNumTotalReplicas(), popdist.getNumInstances(), popdist.getInstanceIndex()) == (8, 4, 3)
        got = (popdist.getNumLocalReplicas(), popdist.getReplicaIndexOffset(), popdist.getNumIpusPerReplica())
        assert got == (2, 6, 2)
        opts = popdist.poptorch.Options(ipus_per_replica=2)
        assert opts.value("replicationFactor") == 2  # the local replicas
        assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (3, 4)
        # the calls that would undo it (poptorch tests/popdist_test.py:9-41)
        for call, name in [(lambda: opts.replicationFactor(8), "replicationFactor"),
                           (lambda: opts.useIpuId(1), "useIpuId"),
                           (lambda: opts.Distributed.disable(), "Distributed.disable"),
                           (lambda: opts.Distributed.setEnvVarNames("A", "B"), "Distributed.setEnvVarNames"),
                           (lambda: opts.Distributed.configureProcessId(1, 2), "Distributed.configureProcessId")]:
            refused = r"Cannot call `%s` with popdist\.poptorch\.Options" % re.escape(name)
            with pytest.raises(RuntimeError, match=refused):
                call()
        assert popdist.execute_on_instances({0}, lambda: "saved") is None
    with pds.as_instance(popdist, 4, 8, 2, 0):
        assert popdist.execute_on_instances({0}, lambda: "saved") == "saved"
    with pytest.raises(ValueError, match="divisible"):
        popdist.poprun_env(2, 3, 1, 0)  # poprun divides the replicas evenly


def test_poptorch_stand_in_partitions_a_distributed_dataloader_unless_told_not_to(poptorch, monkeypatch):
    """PopTorch's DataLoader cuts a map-style dataset into one contiguous block per process (_SubDataset),
    the process taken from OMPI_COMM_WORLD_* unless configured; the runner turns that off."""
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    opts = poptorch.Options()
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (1, 2)
    cut = [int(x) for b in poptorch.DataLoader(opts, list(range(10)), batch_size=2) for x in b]
    assert cut == [4, 5, 6, 7]  # per process 2 * (10 // (2 * 2)) = 4 items, process 1 from item 4
    whole = [int(x) for b in poptorch.DataLoader(opts, list(range(10)), batch_size=2,
                                                 auto_distributed_partitioning=False) for x in b]
    assert whole == list(range(10))


# ---- options and the replication check --------------------------------------------------------------


@pytest.mark.parametrize("n", INSTANCES)
def test_options_are_built_through_popdist_with_the_instance_s_replicas(popdist, n):
    config = _execution(n)
    for instance in range(n):
        with pds.as_instance(popdist, n, REPLICAS, 2, instance):
            runner = _runner(config)
        opts = runner.options
        assert isinstance(opts, popdist.poptorch.Options) and opts.ipus_per_replica == 2
        assert opts.value("replicationFactor") == REPLICAS // n == config.local_replicas
        assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (instance, n)
        # everything else build_options sets, as on one host
        assert opts.value("Training.gradientAccumulation") == 5 and opts.value("deviceIterations") == 2
        assert opts.value("randomSeed") == config.seed and opts.value("autoRoundNumIPUs") is True
        assert runner.is_writer is (instance == 0)
        # one host call of this instance: its share of device iterations x global batch
        assert config.combined_batch_packs == 2 * 2 * 5 * REPLICAS // n


def test_one_host_keeps_plain_poptorch_options(poptorch):
    runner = _runner(_execution(1))
    assert type(runner.options) is poptorch.Options and runner.options.value("replicationFactor") == REPLICAS
    assert runner.is_writer is True


@pytest.mark.parametrize("n", INSTANCES)
@pytest.mark.parametrize("poprun, key, ours", [
    ((None, 2 * REPLICAS, 2), "replication_factor", REPLICAS),  # --num-replicas differs
    ((None, REPLICAS, 4), "ipus_per_replica", 2),  # --ipus-per-replica differs
    ("other", None, None),  # --num-instances differs
])
def test_a_config_poprun_does_not_match_is_refused_naming_both_numbers(popdist, n, poprun, key, ours):
    if poprun == "other":
        other = 4 if n == 2 else 2
        poprun, key, ours = (other, REPLICAS, 2), "num_instances", n
    instances, replicas, ipus = poprun
    instances = instances or n
    theirs = {"replication_factor": replicas, "ipus_per_replica": ipus, "num_instances": instances}[key]
    with pds.as_instance(popdist, instances, replicas, ipus, 0):
        with pytest.raises(ConfigError) as err:
            _runner(_execution(n))
    message = str(err.value)
    assert "\n" not in message and message.startswith("execution.%s" % key)
    assert re.search(r"is %d but poprun --[a-z-]+ is %d" % (ours, theirs), message), message


# ---- data and outputs, through the training loop -------------------------------------------------------


class Recorder(torch.utils.data.Dataset):
    """The prepared dataset, recording every pack index read."""

    def __init__(self, base):
        self.base, self.read = base, []

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        self.read.append(int(i))
        return self.base[i]


def _config(data_dir, run_dir, n, *extra):
    # The Recorder sees the reads made in this process: a Sync loader's. An asynchronous one (the shipped
    # mode) reads in its worker process, from a pickled copy of the dataset.
    return load_config("demo", POPRUN_TINY + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run_dir,
                                       "execution.num_instances=%d" % n, "execution.dataloader_mode=sync"]
                       + list(extra))


def _train_instance(data_dir, run_dir, n, *extra):
    """One instance's training (in the instance's own process): its plan's numbers, the packs it read, what
    its executor wrote to its replicas."""
    import poptorch  # the stand-in the test loaded

    plan = plan_run(_config(data_dir, run_dir, n, *extra), open_dataset=open_dataset)
    plan.data.dataset = recorder = Recorder(plan.data.dataset)
    before = len(poptorch.executors)
    execute(plan, log=lambda m: None)
    (executor,) = poptorch.executors[before:]
    return {"start_step": plan.start_step, "read": recorder.read, "written_states": executor.written_states,
            "steps_per_epoch": plan.steps_per_epoch, "G": plan.accounting.global_batch_packs,
            "accumulation": plan.accounting.gradient_accumulation,
            "order": [plan.data.epoch_order(plan.config.training.seed, e).tolist() for e in range(2)]}


def _poprun_train(popdist, data_dir, run_dirs, n, *extra):
    """Every instance at once (``run_dirs``: one path for all, or one per instance); their results."""
    outcomes = pds.poprun(popdist, n, REPLICAS, 2, lambda i: _train_instance(
        data_dir, run_dirs if isinstance(run_dirs, str) else run_dirs[i], n, *extra))
    assert all(o.error is None for o in outcomes), outcomes
    return [o.value for o in outcomes]


@pytest.mark.parametrize("n", INSTANCES)
@pytest.mark.serial
def test_instances_read_every_pack_once_per_epoch_and_only_instance_0_writes(popdist, horovod, data_dir, tmp_path, n):
    config = load_config("demo", POPRUN_TINY + ["data.dir=%s" % data_dir,
                                                "checkpoint.output_dir=%s" % (tmp_path / "x")])
    steps = plan_run(config, open_dataset=open_dataset).steps_per_epoch
    assert steps >= 3, steps  # a real epoch of several steps
    (single,) = _poprun_train(popdist, data_dir, str(tmp_path / "one_host"), 1, "training.steps=%d" % steps)
    extra = ["training.steps=%d" % (2 * steps), "checkpoint.every_steps=%d" % steps]
    # each instance on a host of its own: instance 0's run directory is the run's; the others write nothing
    runs = [str(tmp_path / ("host%d" % i) / "run") for i in range(n)]
    results = _poprun_train(popdist, data_dir, runs, n, *extra)
    assert [os.path.exists(r) for r in runs] == [True] + [False] * (n - 1)
    run = runs[0]
    reads = {i: r["read"] for i, r in enumerate(results)}
    # the global batch and the packing-aware accumulation do not depend on the instance count
    assert results[0]["accumulation"] == single["accumulation"] and results[0]["G"] == single["G"]
    assert results[0]["steps_per_epoch"] == steps
    G = results[0]["G"]
    share = G // n
    for epoch in range(2):
        order = results[0]["order"][epoch][: steps * G]
        per_instance = {i: reads[i][epoch * steps * share : (epoch + 1) * steps * share] for i in range(n)}
        everything = Counter(p for r in per_instance.values() for p in r)
        assert everything == Counter(order) and set(everything.values()) == {1}  # each pack exactly once
        for s in range(steps):  # step s: the instances' slices together are what one host reads at step s
            together = sorted(p for i in range(n) for p in per_instance[i][s * share : (s + 1) * share])
            assert together == sorted(order[s * G : (s + 1) * G])
    # the one host read, in total, the same packs in the same steps
    assert Counter(single["read"][: steps * G]) == Counter(single["order"][0][: steps * G])
    # instance 0 wrote the run: two checkpoints with the IPU optimizer state it read back, metrics, summary
    saved = fx.checkpoints(run)
    assert len(saved) == 2
    assert int(fx.load(saved[-1]).optimizer["ipu_state"]["step"]) == 2 * steps
    assert os.path.isfile(os.path.join(run, "summary.json")) and os.path.isfile(os.path.join(run, "metrics.jsonl"))


@pytest.mark.serial
def test_every_instance_resumes_from_instance_0_s_checkpoint_and_hands_its_state_to_the_device(popdist, horovod,
                                                                                              data_dir, tmp_path):
    """Instance 0 saved the optimizer state it read back (PopTorch shards it over an instance's own replicas,
    so it is whole); on resume each instance loads that checkpoint, PopTorch writes the state to its replicas
    before the first step, and each instance reads on where it stopped."""
    run = str(tmp_path / "run")
    extra = ["training.steps=4", "checkpoint.every_steps=2"]
    full = _poprun_train(popdist, data_dir, run, 2, *extra)
    first, last = fx.checkpoints(run)
    saved = fx.load(first).optimizer
    assert int(saved["ipu_state"]["step"]) == 2 and saved["ipu_param"]
    os.unlink(last)  # as if the run had been killed after step 2
    os.unlink(os.path.join(run, "summary.json"))
    resumed = _poprun_train(popdist, data_dir, run, 2, *extra)
    for instance, result in enumerate(resumed):
        assert result["start_step"] == 2
        (written,) = result["written_states"]  # the checkpoint's state, on this instance's replicas
        assert int(written["ipu_state"]["step"]) == 2
        for name, value in saved["ipu_param"].items():
            assert torch.equal(written["ipu_param"][name], value)
        read = full[instance]["read"]
        assert result["read"] == read[len(read) // 2:]  # steps 3 and 4, as the first run read them
    assert int(fx.load(fx.latest(run)).optimizer["ipu_state"]["step"]) == 4


@pytest.mark.parametrize("n", INSTANCES)
@pytest.mark.serial
def test_the_instance_s_dataloader_workers_read_disjoint_parts(popdist, n):
    """Instance and worker together: each instance's DataLoader (2 worker processes) deals its own slice of
    each step to its workers; over all instances and workers every item comes once. (A Sync loader: an
    asynchronous one deals the same way inside its accessor's worker, whose torch workers forkserver starts,
    a few seconds each here; test_poptorch_dataloader.py runs that once.)"""
    config = _execution(n, device_iterations=1, dataloader_mode="sync")
    G = config.global_batch_packs
    items = list(range(3 * G + 7))  # three whole steps and a remainder nobody reads
    seen = Counter()
    for instance in range(n):
        with pds.as_instance(popdist, n, REPLICAS, 2, instance):
            runner = _runner(config)
        batches = [b.tolist() for b in runner.dataloader(items, num_workers=2)]
        assert [len(b) for b in batches] == [config.combined_batch_packs] * 3
        for s, b in enumerate(batches):
            assert b == items[s * G + instance * config.instance_batch_packs:][: config.instance_batch_packs]
        seen.update(x for b in batches for x in b)
    assert seen == Counter(items[: 3 * G])


# ---- launch errors, through the command's main() ---------------------------------------------------------


def _run_cli(tmp_path, capsys, monkeypatch, env_extra, *overrides):
    """run_pretraining.py's main() in this process, on the stand-ins the test installed, in no PopRun environment
    but ``env_extra``: (exit status, stdout, stderr). It must write no run."""
    from ipu_packing.train.cli import main

    for name in list(os.environ):
        if name.startswith("POPDIST_") or name.startswith("OMPI_COMM_WORLD"):
            monkeypatch.delenv(name)
    for name, value in env_extra.items():
        monkeypatch.setenv(name, value)
    code = main(["--config", "demo"] + POPRUN_TINY + [
        "data.dir=%s" % (tmp_path / "no_data"), "checkpoint.output_dir=%s" % (tmp_path / "run")] + list(overrides))
    out, err = capsys.readouterr()
    assert not (tmp_path / "run").exists()
    return code, out, err


def test_without_popdist_several_instances_stop_in_one_line_naming_the_poplar_sdk(poptorch, one_thread, tmp_path,
                                                                                  capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "popdist", None)  # import popdist -> ImportError
    code, out, err = _run_cli(tmp_path, capsys, monkeypatch, {}, "execution.num_instances=2")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: execution.num_instances 2 needs popdist")
    assert "Poplar SDK" in err


def test_several_instances_outside_poprun_and_a_poprun_mismatch_stop_in_one_line(popdist, one_thread, tmp_path,
                                                                                 capsys, monkeypatch):
    code, out, err = _run_cli(tmp_path, capsys, monkeypatch, {}, "execution.num_instances=2")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "launch the run with `poprun --num-instances 2 --num-replicas 4 --ipus-per-replica 2" in err
    instance_1_of_8_replicas = popdist.poprun_env(2, 8, 2, 1)
    code, out, err = _run_cli(tmp_path, capsys, monkeypatch, instance_1_of_8_replicas, "execution.num_instances=2")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "error: execution.replication_factor is 4 but poprun --num-replicas is 8" in err


def test_without_popdist_one_instance_runs_on_plain_poptorch(poptorch, monkeypatch):
    from ipu_packing.execution import popdist_backend

    monkeypatch.setitem(sys.modules, "popdist", None)  # import popdist -> ImportError
    launch = popdist_backend.resolve_launch(_execution(1))
    assert (launch.num_instances, launch.instance, launch.local_replicas, launch.popdist) == (1, 0, REPLICAS, None)
    with pytest.raises(UserError, match="Poplar SDK"):
        popdist_backend.resolve_launch(_execution(2))


# ---- the POD128 config ---------------------------------------------------------------------------------


def _dry_run(config, monkeypatch):
    """The report of both dry-run commands (run_pretraining.py --dry-run, python -m ipu_packing.execution
    dry-run), in this process, without poptorch or popdist."""
    from app_fixtures import both_dry_runs as both

    monkeypatch.setitem(sys.modules, "poptorch", None)
    monkeypatch.setitem(sys.modules, "popdist", None)
    (code_e, out_e, err_e), (code_t, out_t, err_t) = both(config)
    assert (code_e, code_t) == (0, 0), (err_e, err_t)
    assert out_e == out_t
    return out_t


def _section(report, title):
    block = report.split(title, 1)[1]
    return block.split("\n\n", 1)[0]


def test_pod128_dry_run_shows_instances_replicas_and_the_per_instance_batch(monkeypatch):
    report = _dry_run("bert_large_512_pod128", monkeypatch)
    assert "Launch: 2 host instances x 16 replicas each = 32 replicas (PopRun + PopDist" in report
    assert "poprun --num-instances 2 --num-replicas 32 --ipus-per-replica 4 python run_pretraining.py" in report
    rows = dict(re.findall(r"\n  (.+?)\s{2,}(\d+) packs", report))
    assert rows["global batch per optimizer step (x 32 replicas)"] == "8192"  # POD64's: 16,384 sequences
    assert rows["per instance per step (x 16 replicas, 2 instances)"] == "4096"
    assert rows["per host call of an instance (x 1 device iterations)"] == "4096"
    assert rows["per replica per optimizer step (x 128 accumulation)"] == "256"  # POD64: x 256
    assert re.search(r"replicationFactor \(per instance\)\s+16\n", report)
    # each IPU holds what it holds on the POD64: the optimizer state is sharded over the instance's 16 replicas
    pod64 = _dry_run("bert_large_512_pod64", monkeypatch)
    assert _section(report, "Memory per IPU") == _section(pod64, "Memory per IPU").replace(
        "this config has 256", "this config has 128")


def test_pod128_keeps_the_global_batch_for_any_instance_count():
    base = load_config("bert_large_512_pod64").batch_accounting(2.0)
    for n in (1, 2, 4, 8):
        accounting = load_config("bert_large_512_pod128", ["execution.num_instances=%d" % n]).batch_accounting(2.0)
        e = accounting.execution
        assert (accounting.gradient_accumulation, accounting.global_batch_packs) == (128, base.global_batch_packs)
        assert e.replication_factor == 32 and e.local_replicas == 32 // n and e.instance_batch_packs == 8192 // n
    with pytest.raises(ConfigError, match="not a multiple of execution.num_instances 3"):
        load_config("bert_large_512_pod128", ["execution.num_instances=3"])


@pytest.mark.parametrize("instance", [0, 1])
def test_pod128_compiles_on_each_instance_as_popart_would(popdist, instance):
    from shipped_configs import MULTI_HOST

    config = MULTI_HOST["bert_large_512_pod128.yaml"]
    model = si.tiny_model(24)
    with pds.as_instance(popdist, 2, 32, 4, instance):
        runner = make_runner(model, AdamW(model.parameters(), lr=1e-3), config)
    assert runner.options.value("replicationFactor") == 16
    assert runner.options.Distributed.processId == instance
    runner.compile(si.host_call_batch(config.combined_batch_packs))
    (executor,) = [e for e in runner.poptorch.executors if e is runner.executor]
    assert {ipu for _, ipu, _ in executor.trace.ops} == {0, 1, 2, 3}


@pytest.mark.serial
def test_a_launch_leaves_nothing_in_the_temporary_directory(popdist, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    outcomes = pds.poprun(popdist, 2, 2, 1, lambda i: i * 10)
    assert [o.value for o in outcomes] == [0, 10]
    assert os.listdir(str(tmp_path)) == []
