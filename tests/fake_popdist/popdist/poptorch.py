"""``popdist.poptorch.Options``: the poptorch.Options an instance launched by poprun compiles with.

Modelled on what PopTorch documents and tests of it (graphcore/poptorch):
- it sets the instance's *local* replicas as the replication factor ("replicationFactor should be used to set
  the number of local replicas (per host) not the total (global) number", docs/user_guide/experimental.rst)
  and the process id and count (``Distributed.configureProcessId``), from which PopTorch derives PopART's
  globalReplicationFactor = processes x local replicas and globalReplicaOffset = process id x local
  replicas (popart_compiler/source/Compiler.cpp:655-666);
- it refuses the calls that would undo that: ``useIpuId``, ``replicationFactor``, ``Distributed.disable``,
  ``Distributed.setEnvVarNames``, ``Distributed.configureProcessId`` raise RuntimeError "Cannot call `NAME`
  with popdist.poptorch.Options" (tests/popdist_test.py:9-41);
- ``Distributed.processId`` / ``numProcesses`` read back the instance index and count (0 and 1 outside
  poprun, tests/popdist_test.py:45-55).
It is built on whatever ``poptorch`` is imported (the tests' PopTorch stand-in).
"""

from __future__ import annotations

from typing import Optional

import poptorch

import popdist

_BLOCKED = ("useIpuId", "replicationFactor")
_BLOCKED_DISTRIBUTED = ("disable", "setEnvVarNames", "configureProcessId")


def _refuse(name: str):
    def call(*args, **kwargs):
        raise RuntimeError("Cannot call `%s` with popdist.poptorch.Options" % (name,))

    return call


class _BlockedDistributed:
    """opts.Distributed of a popdist Options: the getters work, the setters are refused."""

    def __init__(self, inner) -> None:
        self._inner = inner

    @property
    def processId(self) -> int:
        return self._inner.processId

    @property
    def numProcesses(self) -> int:
        return self._inner.numProcesses

    def __getattr__(self, name: str):
        if name.startswith("_"):  # pickle looks attributes up before _inner is set
            raise AttributeError(name)
        if name in _BLOCKED_DISTRIBUTED:
            return _refuse("Distributed." + name)
        return getattr(self._inner, name)


class Options(poptorch.Options):
    def __init__(self, ipus_per_replica: Optional[int] = None) -> None:
        super().__init__()
        self.ipus_per_replica = ipus_per_replica
        # the base class's method, before this class refuses it (the stand-in's Options resolve methods in
        # _Group.__getattr__)
        poptorch._Group.__getattr__(self, "replicationFactor")(popdist.getNumLocalReplicas())
        self.Distributed.configureProcessId(popdist.getInstanceIndex(), popdist.getNumInstances())
        self.Distributed = _BlockedDistributed(self.Distributed)

    def __getattribute__(self, name: str):
        if name in _BLOCKED:
            return _refuse(name)
        return super().__getattribute__(name)
