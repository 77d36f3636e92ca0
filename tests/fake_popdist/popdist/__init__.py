"""A semantic stand-in for PopDist (the Poplar Distributed Configuration Library), for tests only: never
installed; tests load it under the name ``popdist`` (tests/popdist_stand_in.py) or put tests/fake_popdist on
PYTHONPATH of a subprocess. It answers the calls Graphcore's BERT app makes (graphcore/examples
nlp/bert/pytorch args.py:44-52, 331-336; pretraining_data.py:119-124; run_pretraining.py:157-159; utils.py:36)
and those of the PopRun tutorial: ``isPopdistEnvSet``, ``init``, ``getNumTotalReplicas``,
``getNumIpusPerReplica``, ``getNumInstances``, ``getInstanceIndex``, ``getNumLocalReplicas``,
``getReplicaIndexOffset``, ``execute_on_instances``; ``popdist.poptorch.Options`` is in poptorch.py.

What it models, from what PopRun documents (PopRun user guide, 3.1 "Configuration"): ``poprun --num-replicas R
--num-instances N --ipus-per-replica I`` launches N instances (through mpirun) and divides the R replicas
evenly among them, so instance i runs R/N local replicas, the global replicas [i*R/N, (i+1)*R/N).

How poprun tells an instance its part: through its environment. The real variable names are internal to
PopRun and PopDist and could not be read in the sources available here, so the names below are the
stand-in's own (``poprun_env`` writes them); the application never reads them, it only calls the functions.
mpirun's own ``OMPI_COMM_WORLD_RANK`` / ``OMPI_COMM_WORLD_SIZE`` are set too: PopTorch reads those by
default (poptorch python/options.py:466).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterable

__version__ = "3.4.0+stand-in"
__stand_in__ = True

ENV = {
    "num_total_replicas": "POPDIST_NUM_TOTAL_REPLICAS",
    "num_ipus_per_replica": "POPDIST_NUM_IPUS_PER_REPLICA",
    "num_instances": "POPDIST_NUM_INSTANCES",
    "instance_index": "POPDIST_INSTANCE_INDEX",
}
"""What poprun exports to every instance, in the stand-in's names."""


def poprun_env(num_instances: int, num_replicas: int, ipus_per_replica: int, instance: int) -> Dict[str, str]:
    """The environment ``poprun --num-instances N --num-replicas R --ipus-per-replica I`` gives instance
    ``instance`` (test helper, not PopDist API). Refuses what poprun refuses: replicas not divisible by
    instances, an instance index outside [0, N)."""
    for value in (num_instances, num_replicas, ipus_per_replica):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("poprun: counts must be integers >= 1, got %r" % (value,))
    if num_replicas % num_instances:
        raise ValueError("poprun: --num-replicas %d must be divisible by --num-instances %d"
                         % (num_replicas, num_instances))
    if not 0 <= instance < num_instances:
        raise ValueError("poprun: instance %d of %d" % (instance, num_instances))
    return {
        ENV["num_total_replicas"]: str(num_replicas),
        ENV["num_ipus_per_replica"]: str(ipus_per_replica),
        ENV["num_instances"]: str(num_instances),
        ENV["instance_index"]: str(instance),
        "OMPI_COMM_WORLD_SIZE": str(num_instances),
        "OMPI_COMM_WORLD_RANK": str(instance),
    }


def isPopdistEnvSet() -> bool:
    """True in a process poprun launched."""
    return all(name in os.environ for name in ENV.values())


def _get(key: str, default: int) -> int:
    if not isPopdistEnvSet():
        return default
    return int(os.environ[ENV[key]])


def init() -> None:
    """Graphcore's app calls it first under poprun (args.py:45); nothing to set up in the stand-in."""


def getNumTotalReplicas() -> int:
    """poprun --num-replicas (1 outside poprun)."""
    return _get("num_total_replicas", 1)


def getNumIpusPerReplica() -> int:
    """poprun --ipus-per-replica (1 outside poprun)."""
    return _get("num_ipus_per_replica", 1)


def getNumInstances() -> int:
    """poprun --num-instances (1 outside poprun)."""
    return _get("num_instances", 1)


def getInstanceIndex() -> int:
    """This instance, in [0, getNumInstances()) (0 outside poprun)."""
    return _get("instance_index", 0)


def getNumLocalReplicas() -> int:
    """Replicas this instance runs: the total divided evenly among the instances."""
    return getNumTotalReplicas() // getNumInstances()


def getReplicaIndexOffset() -> int:
    """Global index of this instance's first replica."""
    return getInstanceIndex() * getNumLocalReplicas()


calls = []  # type: list
"""(function name, instances) of every execute_on_instances call (test helper)."""


def execute_on_instances(instances: Iterable[int], func: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run ``func(*args, **kwargs)`` on the listed instances only (Graphcore saves its checkpoints with
    ``execute_on_instances({0}, save_checkpoint, ...)``, run_pretraining.py:157-159); elsewhere returns None."""
    instances = set(instances)
    calls.append((getattr(func, "__name__", repr(func)), instances))
    if getInstanceIndex() in instances:
        return func(*args, **kwargs)
    return None
