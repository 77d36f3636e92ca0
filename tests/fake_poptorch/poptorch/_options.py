"""``Options`` and its groups (python/options.py): only the methods PopTorch defines, every call recorded."""

from __future__ import annotations

import os
from typing import Any, Dict, List

from ._enums import AutoStage
from ._names import API, POPART_OPTIONS, POPART_PATTERNS, Error


# ---- options ------------------------------------------------------------------------------------------


# The attribute a user writes (opts.Training) -> the class python/options.py defines for it.
_GROUP_CLASSES = {"Options": "Options", "Training": "_TrainingOptions", "Precision": "_PrecisionOptions",
                  "TensorLocations": "_TensorLocationOptions", "Distributed": "_DistributedOptions",
                  "Jit": "_JitOptions", "_Popart": "_PopartOptions", "TensorLocationSettings": "TensorLocationSettings"}


class _Group:
    """One option group; records ``(group.method, args, kwargs)`` in a log shared with its Options, and
    accepts only the methods python/options.py defines on the group's class."""

    def __init__(self, log: list, group: str) -> None:
        self._log, self._group = log, group

    def __repr__(self) -> str:
        return "%s%r" % (self._group, [(n, a, k) for n, a, k in self._log])

    def __getattr__(self, name: str):
        # self.__dict__, not self._group: pickle and copy look attributes up on an instance not yet filled
        qualified = "%s.%s" % (self.__dict__.get("_group", type(self).__name__), name)
        if name.startswith("_") or "%s.%s" % (_GROUP_CLASSES[self._group], name) not in API["method"]:
            raise AttributeError("poptorch has no %s (python/options.py)" % qualified)

        def call(*args, **kwargs):
            self._log.append((qualified, args, kwargs))
            return self

        return call


def _value_fits(kind: str, value: Any) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "uint64":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if kind == "double":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "container":  # a list of strings, or a dict of strings to strings
        if isinstance(value, dict):
            return all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    raise AssertionError(kind)


class _PopartGroup(_Group):
    """opts._Popart: PopTorch stores ``set(key, value)`` and PopART's SessionOptions refuses an unknown key
    or a value of the wrong kind when the session is built (popart_compiler/source/SessionOptions.cpp); the
    stand-in refuses at the call, so building the options is enough to check them."""

    def set(self, key: str, value: Any) -> "_PopartGroup":
        if key not in POPART_OPTIONS:
            raise Error("PopTorch forwards no PopART option %r" % (key,))
        if not _value_fits(POPART_OPTIONS[key], value):
            raise Error("PopART option %r takes a %s, got %r" % (key, POPART_OPTIONS[key], value))
        self._log.append(("_Popart.set", (key, value), {}))
        return self

    def setPatterns(self, patterns: Dict[str, bool], level: int = 2) -> "_PopartGroup":
        assert isinstance(level, int) and isinstance(patterns, dict)  # python/options.py:437-438
        if not all(isinstance(v, bool) for v in patterns.values()):
            raise Error("PopART patterns map names to bools, got %r" % (patterns,))
        unknown = sorted(set(patterns) - POPART_PATTERNS)
        if unknown:
            raise Error("PopART has no pattern(s) %s" % unknown)
        self._log.append(("_Popart.setPatterns", (patterns,), {"level": level}))
        return self


class _DistributedGroup(_Group):
    """opts.Distributed (python/options.py:449-512): the process id and count, read at construction from
    OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (setEnvVarNames' defaults, :466, 488-490; 0 and 1 when unset),
    then set by configureProcessId / setEnvVarNames / disable; ``processId`` and ``numProcesses`` are
    properties. Each call is recorded like any other."""

    def __init__(self, log: list) -> None:
        super().__init__(log, "Distributed")
        self._process = (int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")),
                         int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))

    def configureProcessId(self, process_id: int, num_processes: int) -> "_DistributedGroup":
        self._log.append(("Distributed.configureProcessId", (process_id, num_processes), {}))
        self._process = (int(process_id), int(num_processes))
        return self

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str) -> "_DistributedGroup":
        self._log.append(("Distributed.setEnvVarNames", (var_num_processes, var_process_id), {}))
        self._process = (int(os.environ.get(var_process_id, "0")), int(os.environ.get(var_num_processes, "1")))
        return self

    def disable(self) -> "_DistributedGroup":
        self._log.append(("Distributed.disable", (), {}))
        self._process = (0, 1)
        return self

    @property
    def processId(self) -> int:
        return self._process[0]

    @property
    def numProcesses(self) -> int:
        return self._process[1]


class Options(_Group):
    def __init__(self) -> None:
        super().__init__([], "Options")
        self.calls = self._log
        self.Training = _Group(self._log, "Training")
        self.Precision = _Group(self._log, "Precision")
        self.TensorLocations = _Group(self._log, "TensorLocations")
        self.Distributed = _DistributedGroup(self._log)
        self.Jit = _Group(self._log, "Jit")
        self._Popart = _PopartGroup(self._log, "_Popart")

    def args(self, name: str) -> List[tuple]:
        """The positional arguments of every call of ``name`` ("Options.outputMode", "Precision.setPartialsType"),
        in order (test helper)."""
        return [a for n, a, _ in self.calls if n == name]

    def value(self, name: str, default: Any = None) -> Any:
        """The first argument of the last call of ``name`` ("replicationFactor", "Training.gradientAccumulation"):
        a test helper, not PopTorch API. A call without arguments reads as ()."""
        if "." not in name:
            name = "Options." + name
        found = [a for n, a, _ in self.calls if n == name]
        if not found:
            return default
        return found[-1][0] if found[-1] else ()

    def popart(self) -> Dict[str, Any]:
        """Every ``_Popart.set(key, value)`` (test helper)."""
        return {a[0]: a[1] for n, a, _ in self.calls if n == "_Popart.set"}

    def _int(self, name: str) -> int:
        return int(self.value(name, 1))


def TensorLocationSettings() -> _Group:
    return _Group([], "TensorLocationSettings")


class PipelinedExecution:
    def __init__(self, *args) -> None:
        self.args = args
        self.auto_stage = args[0] if args and isinstance(args[0], AutoStage) else AutoStage.SameAsIpu

    def __repr__(self) -> str:
        return "%s%r" % (type(self).__name__, self.args)


class ShardedExecution(PipelinedExecution):
    pass
