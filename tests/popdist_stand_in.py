"""Loading the PopDist stand-in (tests/fake_popdist/popdist) and simulating poprun's instances.

Like the PopTorch stand-in it is on sys.path only during the test that installs it: ``install`` loads it from
its files as the package ``popdist`` (with ``popdist.poptorch``, built on the ``poptorch`` already in
sys.modules) for one test, and ``as_instance`` sets the environment poprun gives one instance.
``install_horovod`` loads the Horovod stand-in (tests/fake_popdist/horovod) as ``horovod`` + ``horovod.torch``,
exchanging through a directory the test names; ``without_horovod`` makes ``import horovod.torch`` fail. A
subprocess gets them with ``PYTHONPATH=STAND_IN_DIR``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys

STAND_IN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_popdist")
REPLICAS = 4
"""The replicas of the PopRun tests' runs: divisible by every instance count they test (2 and 4)."""
POPRUN_TINY = [
    "model.vocab_size=64", "model.hidden_size=16", "model.intermediate_size=32", "model.num_hidden_layers=2",
    "model.num_attention_heads=2", "data.max_seq_length=32", "execution.backend=poptorch",
    "execution.layers_per_ipu=[1,1]", "execution.use_ipu_model=true", "execution.micro_batch_size=1",
    "execution.replication_factor=%d" % REPLICAS, "training.global_batch_sequences=40", "logging.progress_bar=false",
    "logging.tensorboard=false", "checkpoint.export=false", "data.num_workers=0",
]
"""Overrides of the demo config for a tiny packed BERT on the shipped pipeline shape (embeddings and heads on IPU 0,
a layer on each IPU), REPLICAS replicas on the PopTorch stand-in: the PopRun tests' (tests/test_popdist.py,
test_popdist_agree.py)."""


def install(monkeypatch):
    """Load the stand-in as ``popdist`` + ``popdist.poptorch`` into sys.modules, and put STAND_IN_DIR on sys.path
    (for the worker processes of an asynchronous DataLoader, which unpickle the popdist Options), both undone
    after the test."""
    monkeypatch.syspath_prepend(STAND_IN_DIR)
    popdist, _ = _load_package(monkeypatch, "popdist", "poptorch")
    return popdist


def _load_package(monkeypatch, name: str, submodule: str):
    """STAND_IN_DIR/name as the package ``name`` and its ``name.submodule`` in sys.modules (undone after the
    test): returns (package, submodule)."""
    package_dir = os.path.join(STAND_IN_DIR, name)
    spec = importlib.util.spec_from_file_location(name, os.path.join(package_dir, "__init__.py"),
                                                  submodule_search_locations=[package_dir])
    package = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, package)
    spec.loader.exec_module(package)
    sub = importlib.util.spec_from_file_location(name + "." + submodule,
                                                 os.path.join(package_dir, submodule + ".py"))
    module = importlib.util.module_from_spec(sub)
    monkeypatch.setitem(sys.modules, name + "." + submodule, module)
    sub.loader.exec_module(module)
    setattr(package, submodule, module)
    return package, module


def install_horovod(monkeypatch, network_dir: str):
    """Load the Horovod stand-in as ``horovod`` + ``horovod.torch`` (undone after the test); its collectives
    travel through ``network_dir`` (HOROVOD_STAND_IN_DIR), which stands for the network between the hosts."""
    _, module = _load_package(monkeypatch, "horovod", "torch")
    monkeypatch.setenv(module.DIR_ENV, network_dir)
    monkeypatch.setenv(module.TIMEOUT_ENV, "30")
    return module


def without_horovod(monkeypatch) -> None:
    """``import horovod.torch`` raises ImportError for the rest of the test."""
    monkeypatch.setitem(sys.modules, "horovod", None)
    monkeypatch.setitem(sys.modules, "horovod.torch", None)


@contextlib.contextmanager
def as_instance(popdist, num_instances: int, num_replicas: int, ipus_per_replica: int, instance: int):
    """The environment of instance ``instance`` of ``poprun --num-instances N --num-replicas R
    --ipus-per-replica I``, inside the block; the previous environment after it."""
    env = popdist.poprun_env(num_instances, num_replicas, ipus_per_replica, instance)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Outcome:
    """What one simulated instance ended with: ``value`` (what the target returned) or ``error`` (the
    exception's class name and one-line message; ``user_error``: a UserError, which the command prints as
    ``error: <message>`` with exit status 2)."""

    def __init__(self, instance: int, value=None, error=None, user_error: bool = False, trace: str = "") -> None:
        self.instance, self.value, self.error, self.user_error, self.trace = instance, value, error, user_error, trace

    @property
    def message(self) -> str:
        return self.error[1] if self.error else ""

    def __repr__(self) -> str:
        return "Outcome(instance %d, %s)" % (self.instance, ("error %s: %s\n%s" % (self.error + (self.trace,)))
                                             if self.error else "ok")


def _forget_the_forkserver() -> None:
    """A poprun instance is a process of its own, not a fork of the test: it has no forkserver yet. A fork
    inherits multiprocessing's record of the test's forkserver, which is not its child (os.waitpid raises
    ChildProcessError when an asynchronous loader asks for a worker), so the instance starts its own."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    for name in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid", "_inherited_fds"):
        if hasattr(server, name):
            setattr(server, name, None)


def poprun(popdist, num_instances: int, num_replicas: int, ipus_per_replica: int, target, timeout: float = 90.0):
    """Run ``target(instance)`` in one process per instance, all at once, as poprun starts them: each is a
    fork of the test's process (with the stand-ins it loaded) in the environment poprun gives that instance,
    sharing nothing with the others but the file system (with the Horovod stand-in installed, each call is
    a job of its own, its collectives in a fresh directory of the stand-in's network). Returns every
    instance's Outcome, in instance order;
    ``target``'s result must pickle. An instance still running after ``timeout`` seconds is killed and the
    test fails."""
    import pickle
    import shutil
    import signal
    import tempfile
    import time
    import traceback

    results = tempfile.mkdtemp(prefix="poprun-")
    network = {}
    if os.environ.get("HOROVOD_STAND_IN_DIR"):  # each poprun a job of its own on the Horovod stand-in's network
        os.makedirs(os.environ["HOROVOD_STAND_IN_DIR"], exist_ok=True)
        network["HOROVOD_STAND_IN_DIR"] = tempfile.mkdtemp(prefix="job-", dir=os.environ["HOROVOD_STAND_IN_DIR"])
    children = {}
    for instance in range(num_instances):
        env = dict(popdist.poprun_env(num_instances, num_replicas, ipus_per_replica, instance), **network)
        pid = os.fork()
        if pid == 0:  # the instance: never returns into the test
            try:
                import torch

                torch.set_num_threads(1)  # as a DataLoader worker does after a fork
                _forget_the_forkserver()
                os.environ.update(env)
                try:
                    outcome = Outcome(instance, value=target(instance))
                except BaseException as exc:  # noqa: B902  (reported to the test)
                    outcome = Outcome(instance, error=(type(exc).__name__, " ".join(str(exc).split())),
                                      user_error=hasattr(exc, "exit_code"), trace=traceback.format_exc())
                path = os.path.join(results, "%d.pickle" % instance)
                with open(path + ".tmp", "wb") as f:
                    pickle.dump(outcome, f)
                os.replace(path + ".tmp", path)
            finally:
                os._exit(0)
        children[pid] = instance
    try:
        deadline = time.monotonic() + timeout
        while children and time.monotonic() < deadline:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid in children:
                del children[pid]
            elif pid == 0:
                time.sleep(0.02)
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        if children:
            raise AssertionError("simulated instances %s still ran after %.0f s (a hang)"
                                 % (sorted(children.values()), timeout))
        outcomes = []
        for instance in range(num_instances):
            with open(os.path.join(results, "%d.pickle" % instance), "rb") as f:
                outcomes.append(pickle.load(f))
        return outcomes
    finally:
        shutil.rmtree(results)  # the instances' results, read: nothing of the launch is left in the temp directory
