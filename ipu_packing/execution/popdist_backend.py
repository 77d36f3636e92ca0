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
- Agreement: nothing in PopDist itself checks that the instances start alike, so the poptorch runner exchanges
  a few numbers between them as its host collectives (poprun_group.py: what is exchanged, how, and when an
  instance refuses). Graphcore's app runs Horovod beside PopDist
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

from dataclasses import dataclass
from typing import Any, List, Optional

from ..errors import ConfigError
from .config import ExecutionConfig
from ..errors import BackendUnavailable, LaunchError
from .runner_common import step_slices

POPDIST_MESSAGE = (
    "execution.num_instances %d needs popdist (PopRun's library), which ships only with Graphcore's Poplar SDK "
    "(not on PyPI): enable the SDK, install its popdist wheel and launch with poprun, or set execution.num_instances=1"
)


def poprun_command(config: ExecutionConfig, script: str = "run_pretraining.py") -> str:
    """The poprun line that launches ``config`` with ``script`` (host and V-IPU partition options left to the
    reader)."""
    return "poprun --num-instances %d --num-replicas %d --ipus-per-replica %d python %s ..." % (
        config.num_instances, config.replication_factor, config.ipus_per_replica, script)


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


def describe_launch(config: ExecutionConfig, script: str = "run_pretraining.py") -> List[str]:
    """The dry run's launch lines: instances, replicas per instance, the poprun line of ``script``."""
    e = config
    if e.num_instances == 1:
        how = "one host instance (poprun --num-instances 1 or no poprun): %d replicas" % e.replication_factor
    else:
        how = "%d host instances x %d replicas each = %d replicas (PopRun + PopDist, popdist.poptorch.Options)" % (
            e.num_instances, e.local_replicas, e.replication_factor)
    return ["Launch: %s" % how, "  %s" % poprun_command(e, script)]


__all__ = [
    "Launch",
    "POPDIST_MESSAGE",
    "describe_launch",
    "import_popdist",
    "instance_indices",
    "popdist_options",
    "poprun_command",
    "resolve_launch",
]
