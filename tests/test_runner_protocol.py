"""Every runner implements the declared Runner interface (execution/runner.py), and the training loop reaches a
runner through that interface only: no ``getattr``/``hasattr`` probe of a runner in train/, and no collective of
its own (torch.distributed, the PopRun group): the host collectives are runner methods, one per backend."""

from __future__ import annotations

import ast
import inspect
import os

import pytest

from ipu_packing.execution import ExecutionConfig, make_runner
from ipu_packing.execution.poptorch_backend import PoptorchRunner
from ipu_packing.execution.runner import Runner
from ipu_packing.execution.runner_ddp import TorchRunner
from ipu_packing.execution.runner_pipeline import PipelineRunner
from ipu_packing.train.optim import LAMB

import poptorch_stand_in as si

RUNNERS = [TorchRunner, PipelineRunner, PoptorchRunner]
TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ipu_packing", "train")


def protocol_members():
    """Runner's declared attributes, properties and methods."""
    names = set(Runner.__annotations__)
    names |= {n for n, v in vars(Runner).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return names


def declared(cls):
    """What ``cls`` defines or annotates, itself or through its bases."""
    names = set()
    for klass in cls.__mro__:
        names |= set(vars(klass)) | set(vars(klass).get("__annotations__", {}))
    return names


def test_the_protocol_declares_what_the_loop_uses():
    assert protocol_members() == {
        "model", "rank", "world", "metrics", "is_writer", "dataloader", "is_compiled", "compile", "train_step",
        "sync_model", "optimizer_state_dict", "load_optimizer_state_dict",
        "agree_on_start", "agree_ready", "agree", "gather_rng_states", "reduce_metrics",
    }


@pytest.mark.parametrize("cls", RUNNERS, ids=lambda c: c.__name__)
def test_every_runner_class_has_every_member_with_its_parameters(cls):
    assert sorted(protocol_members() - declared(cls)) == []
    for name, member in vars(Runner).items():
        if name.startswith("_") or not inspect.isfunction(member):
            continue
        ours = list(inspect.signature(getattr(cls, name)).parameters)
        assert ours == list(inspect.signature(member).parameters), (cls.__name__, name)


def test_a_torch_runner_instance_is_a_runner():
    from ipu_packing.model import PackedBertForPreTraining

    model = si.tiny_model(2, seed=0)
    assert isinstance(model, PackedBertForPreTraining)
    runner = make_runner(model, LAMB(model.parameters(), lr=1e-3), ExecutionConfig(micro_batch_size=2))
    assert isinstance(runner, TorchRunner) and isinstance(runner, Runner)
    assert (runner.rank, runner.world, runner.is_writer, runner.is_compiled()) == (0, 1, True, True)
    assert runner.metrics == model.METRICS and runner.agree(15) == 15 and runner.gather_rng_states("s") == ["s"]
    assert runner.reduce_metrics({"loss": 2.0, "packs": 4}) == {"loss": 2.0, "packs": 4, "instances": 1}


def test_a_poptorch_runner_instance_is_a_runner(poptorch):
    config = ExecutionConfig(backend="poptorch", micro_batch_size=2, gradient_accumulation=5, layers_per_ipu=[1, 1],
                             use_ipu_model=True)
    model = si.tiny_model(2, seed=0)
    runner = make_runner(model, LAMB(model.parameters(), lr=1e-3), config)
    assert isinstance(runner, PoptorchRunner) and isinstance(runner, Runner)
    assert (runner.rank, runner.world, runner.is_writer, runner.is_compiled()) == (0, 1, True, False)
    assert (runner.launch.num_instances, runner.launch.instance) == (1, 0)
    runner.compile(si.host_call_batch(config.combined_batch_packs))
    assert runner.is_compiled() is True


def _dotted(node) -> str:
    """``a.b.c`` of a name or attribute chain, else ''."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    return ""


def runner_probes(source: str):
    """(line, probe, object) of every getattr/hasattr whose object's dotted name mentions a runner."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and node.args and "runner" in _dotted(node.args[0])):
            found.append((node.lineno, node.func.id, _dotted(node.args[0])))
    return found


def test_the_probe_finder_finds_probes():
    source = ("def f(runner):\n    a = getattr(runner, 'rank', 0)\n"
              "    return hasattr(self.runner, 'x'), getattr(m, 'k')\n")
    assert runner_probes(source) == [(2, "getattr", "runner"), (3, "hasattr", "self.runner")]


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(TRAIN) if n.endswith(".py")))
def test_the_training_package_never_probes_a_runner(name):
    with open(os.path.join(TRAIN, name), "r", encoding="utf-8") as f:
        assert runner_probes(f.read()) == []


def test_the_metrics_the_loop_reads_are_the_models_step_metrics():
    from ipu_packing.execution.runner_common import StepMetrics
    from ipu_packing.model import PackedBertForPreTraining, PackedBertOutput
    from ipu_packing.train.task import PRETRAINING

    assert PRETRAINING.metrics == PackedBertForPreTraining.METRICS
    assert set(PRETRAINING.metrics) <= set(PackedBertOutput._fields)
    metrics = StepMetrics({"loss": 1.5, "mlm_loss": 1.0}, sequences=3, tokens=40)
    assert (metrics.loss, metrics.mlm_loss, metrics.sequences) == (1.5, 1.0, 3)
    metrics.loss = 2.5
    assert metrics.values["loss"] == 2.5


COLLECTIVE_MODULES = ("torch.distributed", "horovod", "popdist")
COLLECTIVE_CALLS = ("all_reduce", "all_gather", "all_gather_object", "allgather", "broadcast", "barrier")


def collectives(source: str):
    """Imports of a process-group library and calls of a collective in ``source`` (its code, not its words)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith(COLLECTIVE_MODULES)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(COLLECTIVE_MODULES):
            found.append(node.module)
        elif isinstance(node, ast.Attribute) and node.attr in COLLECTIVE_CALLS:
            found.append(node.attr)
    return found


def test_the_collective_finder_finds_collectives():
    source = 'import torch.distributed as dist\nfrom horovod import torch\ndist.all_reduce(x)\n"all_gather"\n'
    assert collectives(source) == ["torch.distributed", "horovod", "all_reduce"]


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(TRAIN) if n.endswith(".py")))
def test_the_training_package_runs_no_collective_of_its_own(name):
    with open(os.path.join(TRAIN, name), "r", encoding="utf-8") as f:
        assert collectives(f.read()) == []
