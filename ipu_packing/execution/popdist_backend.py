"""PopRun and PopDist: the poptorch backend as one of several host instances of an IPU-POD.

``poprun --num-instances N --num-replicas R --ipus-per-replica I python run_pretraining.py ...`` starts N
copies of the application; PopRun divides the R replicas evenly among them (PopRun user guide, 3.1) and
PopDist tells each copy its part. What this module does with it, following Graphcore's BERT app
(graphcore/examples nlp/bert/pytorch, commit 3cc8f81f):

- Options: under PopRun (``popdist.isPopdistEnvSet()``, args.py:332) the options are
  ``popdist.poptorch.Options(ipus_per_replica=I)`` (ipu_options.py:36-41), which set the instance's *local*
  replicas as ``replicationFactor`` and its process id and count; PopTorch then compiles for a global
  replication of instances x local replicas (poptorch popart_compiler/source/Compiler.cpp:655-666), and
  ``accumulationAndReplicationReductionType(Mean)`` averages the gradients over all of them.
- Replication: ``ExecutionConfig.replication_factor`` is the global count, so the global batch, the
  packing-aware accumulation and the schedule are the same for any number of instances. Graphcore's app
  warns and takes PopRun's count when they differ (args.py:48-50); here a mismatch is refused, naming both
  numbers, since it would silently change the global batch the config states.
- Data: every instance computes the same epoch order (TrainingData.epoch_order: seeded, no communication)
  and takes its own slice of every optimizer step, as a torch replica does (runner_common.step_slices). The
  slices of one step are disjoint and cover it, so the instances together read every pack of the epoch
  exactly once. Graphcore's loader gives worker w of instance i the shard ``w + workers * i`` of
  ``workers * instances`` (pretraining_data.py:119-124) because its TFRecord dataset is iterable; the pack
  dataset is map-style, so an instance's DataLoader deals whole batches of the instance's indices to its
  workers, and the pair (instance, worker) reads a disjoint part in the same way. PopTorch's own
  partitioning (contiguous blocks per process, python/__init__.py _SubDataset) is turned off
  (``auto_distributed_partitioning=False``): it would cut the instance's slice a second time.
- Outputs: instance 0 writes (checkpoints, exports, metrics, TensorBoard), as Graphcore saves through
  ``popdist.execute_on_instances({0}, save_checkpoint, ...)`` (run_pretraining.py:157-159) and logs on
  instance 0 only (utils.py:36). Every instance reads its optimizer state back; under several instances
  PopTorch shards replicated tensors over the instance's own replicas only (Compiler.cpp:751-760), so each
  instance holds the whole state and instance 0's is complete. On resume every instance loads the same
  checkpoint (run_pretraining.py:118-120), so the run directory must be on storage all hosts see.
- Agreement: nothing in PopDist itself checks that the instances start alike, so ``instance_group`` gives
  the training loop a way to exchange a few numbers between them (ipu_packing/train/instances.py decides
  what is exchanged and when an instance refuses). Graphcore's app runs Horovod beside PopDist
  (args.py:46 ``hvd.init()``) to broadcast the initial weights (optimization.py:89
  ``hvd.broadcast_parameters(model.state_dict(), root_rank=0)``) and to reduce the logged metrics over the
  instances (utils.py:41-45 ``hvd.allreduce``); ``HorovodGroup`` does the same with the SDK's
  ``horovod.torch``, through its own network transport, so it needs no shared storage. Without Horovod,
  ``DirectoryGroup`` meets once, at the start, through files in the run directory: that works only where
  the run directory is on storage every host shares, and where it is not, every instance stops with one line
  saying so after ``rendezvous_timeout()`` seconds; the metrics are then instance 0's share, labelled as such.

popdist and horovod ship only with the Poplar SDK: they are imported here, when the poptorch backend is chosen.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..errors import ConfigError, UserError, one_line
from .config import ExecutionConfig
from ..errors import BackendUnavailable, LaunchError
from .runner_common import step_slices

POPDIST_MESSAGE = (
    "execution.num_instances %d needs popdist (PopRun's library), which ships only with Graphcore's Poplar SDK "
    "(not on PyPI): enable the SDK, install its popdist wheel and launch with poprun, or set execution.num_instances=1"
)


def poprun_command(config: ExecutionConfig) -> str:
    """The poprun line that launches ``config`` (host and V-IPU partition options left to the reader)."""
    return "poprun --num-instances %d --num-replicas %d --ipus-per-replica %d python run_pretraining.py ..." % (
        config.num_instances, config.replication_factor, config.ipus_per_replica)


@dataclass(frozen=True)
class Launch:
    """This process's part of the run."""

    num_instances: int
    instance: int
    local_replicas: int
    popdist: Any = None
    """The popdist module under PopRun, else None (one host, plain poptorch.Options)."""

    @property
    def is_writer(self) -> bool:
        """Whether this instance writes the run's files (instance 0)."""
        return self.instance == 0


def import_popdist() -> Optional[Any]:
    """popdist with its poptorch part, or None when it is not installed."""
    try:
        import popdist  # noqa: F401  (Poplar SDK only)
        import popdist.poptorch  # noqa: F401
    except ImportError:
        return None
    return popdist


def resolve_launch(config: ExecutionConfig) -> Launch:
    """This instance's Launch, after checking that PopRun started what ``config`` asks for. Raises
    BackendUnavailable (no popdist, several instances asked for), LaunchError (several instances, not under
    poprun) or ConfigError (poprun's replicas, instances or IPUs per replica differ from the config's): one
    line each."""
    popdist = import_popdist()
    if popdist is None or not popdist.isPopdistEnvSet():
        if config.num_instances > 1:
            if popdist is None:
                raise BackendUnavailable(POPDIST_MESSAGE % (config.num_instances,))
            raise LaunchError("execution.num_instances is %d: launch the run with `%s`"
                              % (config.num_instances, poprun_command(config)))
        return Launch(1, 0, config.replication_factor)
    for what, ours, theirs in (
        ("replication_factor", config.replication_factor, ("--num-replicas", popdist.getNumTotalReplicas())),
        ("num_instances", config.num_instances, ("--num-instances", popdist.getNumInstances())),
        ("ipus_per_replica (len(layers_per_ipu))", config.ipus_per_replica,
         ("--ipus-per-replica", popdist.getNumIpusPerReplica())),
    ):
        if ours != theirs[1]:
            raise ConfigError(
                "execution.%s is %d but poprun %s is %d: launch with `%s`, or set the config to match"
                % (what, ours, theirs[0], theirs[1], poprun_command(config))
            )
    local = popdist.getNumLocalReplicas()
    if local != config.local_replicas:  # PopRun divides the replicas evenly: a broken environment
        raise LaunchError("popdist reports %d local replicas, expected %d of %d over %d instances"
                          % (local, config.local_replicas, config.replication_factor, config.num_instances))
    return Launch(popdist.getNumInstances(), popdist.getInstanceIndex(), local, popdist)


def popdist_options(config: ExecutionConfig, launch: Launch) -> Optional[Any]:
    """``popdist.poptorch.Options(ipus_per_replica=...)`` under PopRun (Graphcore's ipu_options.py:41), to
    which build_options adds everything but the replication factor; None on one host without PopRun."""
    if launch.popdist is None:
        return None
    launch.popdist.init()  # args.py:45
    return launch.popdist.poptorch.Options(ipus_per_replica=config.ipus_per_replica)


def instance_indices(num_items: int, config: ExecutionConfig, instance: int) -> List[int]:
    """Indices of a step-ordered dataset (the training loop's epoch order) that ``instance`` reads: its
    ``instance_batch_packs`` slice of every whole optimizer step, in step order, so ``device_iterations``
    consecutive slices make one of its host calls."""
    out = []  # type: List[int]
    for part in step_slices(num_items, config.global_batch_packs, config.instance_batch_packs, instance):
        out.extend(part)
    return out


def describe_launch(config: ExecutionConfig) -> List[str]:
    """The dry run's launch lines: instances, replicas per instance, the poprun line."""
    e = config
    if e.num_instances == 1:
        how = "one host instance (poprun --num-instances 1 or no poprun): %d replicas" % e.replication_factor
    else:
        how = "%d host instances x %d replicas each = %d replicas (PopRun + PopDist, popdist.poptorch.Options)" % (
            e.num_instances, e.local_replicas, e.replication_factor)
    return ["Launch: %s" % how, "  %s" % poprun_command(e)]


# ---- exchanging between instances ------------------------------------------------------------------------


class InstancesUnreachable(UserError):
    """The instances of a PopRun run could not meet to agree on their start."""


RENDEZVOUS_DIR = ".instances"
"""Where ``DirectoryGroup`` meets, inside the run directory."""
RENDEZVOUS_TIMEOUT_ENV = "IPU_PACKING_RENDEZVOUS_TIMEOUT"
RENDEZVOUS_TIMEOUT_S = 300.0


def rendezvous_timeout() -> float:
    """Seconds an instance waits for the others in ``DirectoryGroup`` (``$IPU_PACKING_RENDEZVOUS_TIMEOUT``,
    else 300: long enough for the slowest host to load the checkpoint and for a network file system to show
    a new file)."""
    value = os.environ.get(RENDEZVOUS_TIMEOUT_ENV)
    if not value:
        return RENDEZVOUS_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError("%s must be a number of seconds, got %r" % (RENDEZVOUS_TIMEOUT_ENV, value))
    if not seconds > 0:
        raise ConfigError("%s must be above 0, got %r" % (RENDEZVOUS_TIMEOUT_ENV, value))
    return seconds


class InstanceGroup:
    """The instances of one PopRun run and how they exchange a few numbers."""

    num_instances = 1
    instance = 0
    transport = ""
    """How the instances exchange, in words (logged at the start)."""
    reduces_metrics = False
    """Whether ``allgather`` is cheap enough to run every host call (a network collective)."""
    broadcasts = False
    """Whether ``broadcast_parameters`` can send instance 0's weights to the others."""

    def allgather(self, row: Sequence[float], name: str) -> List[List[float]]:
        """Every instance's ``row`` (the same length on all), in instance order; a collective: every
        instance calls it with the same ``name``, in the same order."""
        raise NotImplementedError

    def broadcast_parameters(self, state_dict: Dict[str, Any]) -> bool:
        """Overwrite ``state_dict``'s tensors in place with instance 0's; False where the transport cannot."""
        return False


class HorovodGroup(InstanceGroup):
    """The SDK's ``horovod.torch``, initialised as Graphcore's app does (args.py:44-46)."""

    reduces_metrics = True
    broadcasts = True

    def __init__(self, hvd, launch: "Launch") -> None:
        self.hvd = hvd
        try:
            hvd.init()
        except Exception as exc:  # e.g. a wheel built without MPI, under poprun's mpirun
            raise LaunchError(
                "horovod.torch imports but hvd.init() failed under poprun (%s: %s): install the Poplar SDK's "
                "horovod wheel (built with MPI), or uninstall horovod to meet through the run directory"
                % (type(exc).__name__, one_line(exc)[:160]))
        if (hvd.size(), hvd.rank()) != (launch.num_instances, launch.instance):
            raise LaunchError(
                "horovod reports process %d of %d but popdist instance %d of %d: launch the run with poprun, "
                "which starts one process per instance"
                % (hvd.rank(), hvd.size(), launch.instance, launch.num_instances))
        self.num_instances, self.instance = launch.num_instances, launch.instance
        self.transport = "horovod.torch (collectives over the network)"

    def allgather(self, row: Sequence[float], name: str) -> List[List[float]]:
        import torch

        tensor = torch.tensor([[float(v) for v in row]], dtype=torch.float64)
        gathered = self.hvd.allgather(tensor, name=name)
        return [[float(v) for v in part] for part in gathered.tolist()]

    def broadcast_parameters(self, state_dict: Dict[str, Any]) -> bool:
        self.hvd.broadcast_parameters(state_dict, root_rank=0)
        return True


class DirectoryGroup(InstanceGroup):
    """Meeting through files in ``directory`` (without Horovod): each ``allgather`` is one handshake, so it
    is for the start only. Files left by an earlier run of the same directory are never taken for this one's:

    1. instance i > 0 writes ``<name>.hello.<i>`` = (a fresh nonce, its row);
    2. instance 0, once it has a hello from everyone, writes ``<name>.rows`` = (its own fresh nonce, the
       nonce and row of every instance), and rewrites it while any hello changes;
    3. instance i accepts a ``<name>.rows`` that carries its own nonce, and answers ``<name>.ack.<i>`` =
       instance 0's nonce; instance 0 returns once every instance acknowledged its nonce.

    Each file is written whole and renamed into place. An instance that waits longer than ``timeout``
    seconds raises InstancesUnreachable naming what it did not see."""

    def __init__(self, directory: str, launch: "Launch", timeout: float,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.directory = directory
        self.num_instances, self.instance = launch.num_instances, launch.instance
        self.timeout = timeout
        self.transport = "files in %s (no horovod.torch: needs storage every host shares)" % (directory,)
        self._sleep = sleep

    def _path(self, name: str, kind: str, instance: Optional[int] = None) -> str:
        return os.path.join(self.directory, "%s.%s" % (name, kind) + ("" if instance is None else ".%d" % instance))

    def _write(self, path: str, value: Any) -> None:
        tmp = "%s.tmp.%s" % (path, uuid.uuid4().hex[:8])
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(value, f)
        os.replace(tmp, path)

    @staticmethod
    def _read(path: str, kind: type = dict) -> Any:
        """The JSON value at ``path`` if it is a ``kind``, else None (absent, partial, or foreign)."""
        try:
            with open(path, "r", encoding="utf-8") as f:
                value = json.load(f)
        except (OSError, ValueError):
            return None
        return value if isinstance(value, kind) else None

    def _unreachable(self, missing: List[int], what: str) -> InstancesUnreachable:
        return InstancesUnreachable(
            "PopRun instance %d %s %s in %s within %.0f s: the run has no horovod.torch, so the instances meet "
            "through files in the run directory; is checkpoint.output_dir on storage every host shares? (or "
            "install the Poplar SDK's horovod wheel, as Graphcore's app does)"
            % (self.instance, what, _instances(missing), self.directory, self.timeout))

    def allgather(self, row: Sequence[float], name: str) -> List[List[float]]:
        os.makedirs(self.directory, exist_ok=True)
        row = [float(v) for v in row]
        nonce = uuid.uuid4().hex
        deadline = time.monotonic() + self.timeout
        pause = 0.005
        others = range(1, self.num_instances)
        if self.instance:
            self._write(self._path(name, "hello", self.instance), {"nonce": nonce, "row": row})
            while True:
                rows = self._read(self._path(name, "rows"))
                if (rows and isinstance(rows.get("nonces"), list) and len(rows["nonces"]) == self.num_instances
                        and rows["nonces"][self.instance] == nonce and isinstance(rows.get("rows"), list)):
                    self._write(self._path(name, "ack", self.instance), rows["nonce"])
                    return rows["rows"]
                if time.monotonic() > deadline:
                    raise self._unreachable([0], "saw no answer of")
                self._sleep(pause)
                pause = min(0.25, pause * 2)
        written = None
        while True:
            hellos = {i: self._read(self._path(name, "hello", i)) for i in others}
            if all(h and "nonce" in h and isinstance(h.get("row"), list) and len(h["row"]) == len(row)
                   for h in hellos.values()):
                table = {"nonce": nonce, "nonces": [nonce] + [hellos[i]["nonce"] for i in others],
                         "rows": [row] + [hellos[i]["row"] for i in others]}
                if table != written:
                    self._write(self._path(name, "rows"), table)
                    written = table
                acked = [i for i in others if self._read(self._path(name, "ack", i), str) == nonce]
                if len(acked) == len(others):
                    return table["rows"]
                missing = [i for i in others if i not in acked]
            else:
                missing = [i for i in others if not hellos[i]]
            if time.monotonic() > deadline:
                raise self._unreachable(missing, "heard nothing from")
            self._sleep(pause)
            pause = min(0.25, pause * 2)


def _instances(indices: List[int]) -> str:
    return ("instance %d" if len(indices) == 1 else "instances %s") % (
        indices[0] if len(indices) == 1 else ", ".join(str(i) for i in indices),)


def import_horovod() -> Optional[Any]:
    """``horovod.torch`` (the Poplar SDK ships a wheel; Graphcore's app requires it), or None."""
    try:
        import horovod.torch as hvd  # noqa: F401  (Poplar SDK / horovod[pytorch])
    except ImportError:
        return None
    return hvd


def instance_group(launch: Optional["Launch"], run_dir: str) -> Optional[InstanceGroup]:
    """How this run's PopRun instances exchange (HorovodGroup where horovod.torch imports, else a
    DirectoryGroup in ``run_dir``), or None for one instance (and for the torch backend: ``launch`` None)."""
    if launch is None or launch.num_instances <= 1:
        return None
    hvd = import_horovod()
    if hvd is not None:
        return HorovodGroup(hvd, launch)
    return DirectoryGroup(os.path.join(run_dir, RENDEZVOUS_DIR), launch, rendezvous_timeout())


__all__ = [
    "DirectoryGroup",
    "HorovodGroup",
    "InstanceGroup",
    "InstancesUnreachable",
    "Launch",
    "POPDIST_MESSAGE",
    "RENDEZVOUS_DIR",
    "describe_launch",
    "import_horovod",
    "import_popdist",
    "instance_group",
    "instance_indices",
    "popdist_options",
    "poprun_command",
    "rendezvous_timeout",
    "resolve_launch",
]
