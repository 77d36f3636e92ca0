"""A semantic stand-in for PopTorch 3.x, for tests only (never installed; tests put it in
``sys.modules['poptorch']`` or on PYTHONPATH). It models what PopTorch and PopART do with a training model,
as read in graphcore/poptorch and graphcore/popart (PopTorch 3.4 sources):

- ``BeginBlock(module, id, ipu_id)`` registers a forward *pre*-hook that begins a block and never ends it;
  ``Block`` is a context manager whose exit ends the block (no block is current afterwards);
  ``BlockFunction`` wraps a function in a ``Block`` (python/ops.py). Blocks act only while the model is traced.
- While ``compile`` traces the training step, a ``TorchDispatchMode`` records every aten op with the IPU
  current at that moment. Like PopART it then refuses:
  * a weight (parameter) consumed on two IPUs while pipelining ("Can not copy variable tensor ... between
    virtual graphs when pipelining", willow/src/transforms/pipeline.cpp);
  * a mix of ops with and without an IPU ("Either all Ops must have their virtual graph ids set, or none
    must", willow/src/ir.cpp);
  * an input (stream) tensor consumed on two IPUs while pipelining (pipeline.cpp check 4);
  * fewer micro batches than pipeline stages (pipeline.cpp check 5): consecutive stages on one IPU merged,
    in training 2G-1 for G forward groups, as autodiff adds the backward stages (ir.cpp getNumPipelineStages);
  * an op outside PopTorch's supported-ops list (tests/assets/poptorch_supported_ops.txt);
  * a training step whose loss did not pass through ``identity_loss``.
- Every name is a real one (tests/assets/*.txt name their repository, commit and file): ``Options`` and its
  groups accept only the methods python/options.py defines and record every call; ``_Popart.set`` only the
  keys PopTorch forwards to PopART, with a value of the key's kind, and ``setPatterns`` only PopART's
  pattern names; the enums have python/enums.py's members; each ``optim`` class takes exactly its
  python/optim.py arguments. ``serializedMatMul`` computes its slices one after another.
- The executor returns each output as the output mode says (All, Sum per replica, Final per replica).
- ``trainingModel`` returns an executor with compile / __call__ / copyWeightsToHost / setOptimizer /
  detachFromDevice, and the optimizer state semantics of python/_poplar_executor.py and python/optim.py:
  a poptorch optimizer's ``state_dict()`` reads the IPU state back once the executor has run; a
  ``load_state_dict()`` of an IPU state before the first run is written to the device on attach.
  Compiling writes (or, when present, loads) a file in the executable cache directory.
- ``DataLoader`` and ``AsynchronousDataAccessor`` model the loader's processes as python/__init__.py and
  python/_dataloader.py run them: the item is the combined batch (micro x device iterations x replicas x
  accumulation); ``Sync`` iterates in this process; ``Async`` and ``AsyncRebatched`` pickle the loader, its
  dataset included, into a worker process started in ``DataLoader.__init__`` by the sharing strategy's
  multiprocessing context (forkserver by default, a real one: the child re-imports the parent's __main__),
  which rebatches for AsyncRebatched and sends the elements back through a pipe. A worker that dies first
  raises "AsynchronousDataAccessor worker thread failed to start"; a returned element is overwritten once
  the next one is asked for. Two environment variables are test hooks (WORKER_LOG, SIGKILL_AT_CALL).

It does not model Poplar's memory, tile mapping, numerics or the LAMB arithmetic on the device: the
"device" keeps an optimizer step counter and the weights it was given, and the host model computes the
outputs. Only the ``ipu``-marked tests (IPU Model) and hardware check the rest.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import enum
import hashlib
import itertools
import os
import pickle
import signal
import tempfile
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.multiprocessing
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

__version__ = "3.4.0+stand-in"
__stand_in__ = True

_ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "assets")


def _read_list(name: str) -> List[str]:
    with open(os.path.join(_ASSETS, name), encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def _read_table(name: str) -> List[List[str]]:
    return [line.split() for line in _read_list(name)]


API = {}  # type: Dict[str, frozenset]
"""kind -> names, from tests/assets/poptorch_api_names.txt: "top" (module-level names), "method"
("CLASS.NAME" of python/options.py), "enum" ("ENUM.MEMBER"), "optim" / "param" ("CLASS.KWARG")."""
for _kind, _name in _read_table("poptorch_api_names.txt"):
    API[_kind] = API.get(_kind, frozenset()) | {_name}
SUPPORTED_OPS = tuple(_read_list("poptorch_supported_ops.txt"))
POPART_OPTIONS = dict(_read_table("popart_session_options.txt"))  # type: Dict[str, str]
"""key -> value kind (bool, uint64, double, string, container) of every key _Popart.set forwards to PopART."""
POPART_PATTERNS = frozenset(n for (n,) in _read_table("popart_patterns.txt"))
POPART_ENUMS = {n: int(v) for n, v in _read_table("popart_enums.txt")}  # "Enum.Member" -> integer value


def _kwargs_of(kind: str, cls: str) -> Tuple[str, ...]:
    return tuple(sorted(n.split(".", 1)[1] for n in API[kind] if n.split(".", 1)[0] == cls))


class Error(RuntimeError):
    """What PopTorch / PopART raise at compile time (poptorch.Error)."""


# ---- enums (python/enums.py) --------------------------------------------------------------------------


class ReductionType(enum.IntEnum):
    Sum = 0
    Mean = 1
    NoReduction = 2


class MeanReductionStrategy(enum.IntEnum):
    Running = 0
    Post = 1
    PostAndLoss = 2


class OutputMode(enum.IntEnum):
    Final = 0
    EveryN = 1
    All = 2
    Sum = 3
    Default = 4


class AutoStage(enum.IntEnum):
    SameAsIpu = 0
    AutoIncrement = 1


class DataLoaderMode(enum.IntEnum):
    Sync = 0
    Async = 1
    AsyncRebatched = 2


class SharingStrategy(enum.IntEnum):
    SharedMemory = 0
    FileSystem = 1
    Fork = 2
    ForkServer = 3


class MatMulSerializationMode(enum.Enum):
    InputChannels = "input_channels"
    ReducingDim = "reducing_dim"
    OutputChannels = "output_channels"
    Disabled = "none"


class ConnectionType(enum.IntEnum):
    Always = 0
    OnDemand = 1
    Never = 2


for _enum in (ReductionType, MeanReductionStrategy, OutputMode, AutoStage, DataLoaderMode, SharingStrategy,
              MatMulSerializationMode, ConnectionType):
    # python/enums.py's members, in its order (the values are the stand-in's)
    assert list(_enum.__members__) == sorted(
        (m.split(".", 1)[1] for m in API["enum"] if m.split(".", 1)[0] == _enum.__name__),
        key=list(_enum.__members__).index,
    ), _enum


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


# ---- blocks (python/ops.py) -----------------------------------------------------------------------------


class _Trace:
    """The state of one traced training step."""

    def __init__(self, auto_stage: AutoStage) -> None:
        self.auto_stage = auto_stage
        self.current = None  # type: Optional[Tuple[str, int]]  (block id, ipu)
        self.stages = {}  # type: Dict[str, int]
        self.ops = []  # type: List[Tuple[str, Optional[int], Optional[str]]]
        self.losses = []  # type: List[torch.Tensor]
        self.checkpoints = 0
        self.block_order = []  # type: List[Tuple[str, int]]

    def begin(self, user_id: Optional[str], ipu: Optional[int]) -> None:
        user_id = user_id if user_id is not None else str(len(self.stages))
        if user_id not in self.stages:
            self.stages[user_id] = len(self.stages) if self.auto_stage == AutoStage.AutoIncrement else int(ipu or 0)
        self.current = (user_id, int(ipu if ipu is not None else self.stages[user_id]))
        self.block_order.append(self.current)

    def end(self) -> None:
        self.current = None


_TRACE = None  # type: Optional[_Trace]


class Block:
    """Context manager: ops inside run in block ``user_id`` on ``ipu_id``; leaving it ends the block."""

    def __init__(self, user_id: Optional[str] = None, ipu_id: Optional[int] = None) -> None:
        self._user_id, self._ipu_id = user_id, ipu_id

    def __enter__(self):
        if _TRACE is not None:
            _TRACE.begin(self._user_id, self._ipu_id)
        return self

    def __exit__(self, *exc) -> None:
        if _TRACE is not None:
            _TRACE.end()

    @staticmethod
    def useAutoId() -> None:
        pass

    @staticmethod
    def start(user_id: Optional[str] = None, ipu_id: Optional[int] = None) -> None:
        if _TRACE is not None:
            _TRACE.begin(user_id, ipu_id)


class _BlockHook:
    def __init__(self, user_id, ipu_id) -> None:
        self.user_id, self.ipu_id = user_id, ipu_id

    def __call__(self, module, inputs) -> None:
        if _TRACE is not None:
            _TRACE.begin(self.user_id, self.ipu_id)


def BeginBlock(layer_to_call, user_id: Optional[str] = None, ipu_id: Optional[int] = None):
    if not isinstance(layer_to_call, torch.nn.Module):
        raise Error("module is not an instance of torch.nn.Module or function.")
    if any(isinstance(h, _BlockHook) for h in layer_to_call._forward_pre_hooks.values()):
        raise Error("module has already been assigned to a block.")
    layer_to_call.register_forward_pre_hook(_BlockHook(user_id, ipu_id))
    return layer_to_call


def BlockFunction(user_id: Optional[str] = None, ipu_id: Optional[int] = None):
    def decorator(func):
        def wrapper(*args, **kwargs):
            with Block(user_id, ipu_id):
                return func(*args, **kwargs)

        return wrapper

    return decorator


def removeBlocks(module: torch.nn.Module) -> None:
    for m in module.modules():
        for key in [k for k, h in m._forward_pre_hooks.items() if isinstance(h, _BlockHook)]:
            del m._forward_pre_hooks[key]


def _record_poptorch_op(name: str) -> None:
    if _TRACE is not None:
        current = _TRACE.current
        _TRACE.ops.append((name, current[1] if current else None, current[0] if current else None))


def recomputationCheckpoint(*tensors):
    if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)):
        return type(tensors[0])(recomputationCheckpoint(*tensors[0]))
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise ValueError("All inputs must be tensors")
    _record_poptorch_op("poptorch.recomputation_checkpoint")
    if _TRACE is not None:
        _TRACE.checkpoints += len(tensors)
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


serialized = []  # type: List[Tuple[Tuple[int, ...], Tuple[int, ...], int]]
"""(lhs shape, rhs shape, factor) of every serializedMatMul call (test helper)."""


def serializedMatMul(lhs: torch.Tensor, rhs: torch.Tensor, mode: MatMulSerializationMode, factor: int = 0,
                     keep_precision: bool = False) -> torch.Tensor:
    """python/ops.py:388-421. OutputChannels: ``factor`` matmuls over column slices of ``rhs``, whose count
    of columns it must divide; each slice's product in float32 for half inputs (the CPU has no half matmul
    before torch 2.1), then cast back."""
    assert isinstance(keep_precision, bool) and isinstance(factor, int)
    if not isinstance(mode, MatMulSerializationMode):
        raise ValueError("mode must be a poptorch.MatMulSerializationMode")
    _record_poptorch_op("poptorch.serialized_matmul")
    serialized.append((tuple(lhs.shape), tuple(rhs.shape), factor))
    if mode is not MatMulSerializationMode.OutputChannels or factor <= 1:
        return torch.matmul(lhs, rhs)
    if rhs.shape[-1] % factor:
        raise Error("serializedMatMul: factor %d is not a factor of the output channels %d" % (factor, rhs.shape[-1]))
    return torch.cat([(lhs.float() @ part.float()).to(lhs.dtype) for part in rhs.chunk(factor, dim=-1)], dim=-1)


def set_available_memory(tensor: torch.Tensor, available_memory_proportion: float) -> torch.Tensor:
    if not 0.0 < available_memory_proportion <= 1.0:
        raise ValueError("available_memory_proportion must be in (0, 1]")
    _record_poptorch_op("poptorch.set_available_memory")
    return tensor


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    assert reduction in ("sum", "mean", "none"), "Unsupported reduction type!"
    _record_poptorch_op("poptorch.identity_loss")
    out = x.sum() if reduction == "sum" else x.mean() if reduction == "mean" else x
    if _TRACE is not None:
        _TRACE.losses.append(out)
    return out


# ---- supported operations ------------------------------------------------------------------------------

# aten ops (what the dispatcher sees) that implement a documented operation under another name.
_ATEN_TO_DOCUMENTED = {
    "embedding": "torch.nn.Embedding",
    "layer_norm": "torch.nn.LayerNorm",
    "native_layer_norm": "torch.nn.LayerNorm",
    "dropout": "torch.nn.dropout",
    "native_dropout": "torch.nn.dropout",
    "linear": "torch.nn.Linear",
    "mm": "torch.matmul",
    "gelu": "torch.nn.GELU",
    "relu": "torch.nn.ReLU",
    "silu": "torch.nn.SiLU",
    "_softmax": "torch.nn.Softmax",
    "softmax": "torch.nn.Softmax",
    "_log_softmax": "torch.nn.LogSoftmax",
    "log_softmax": "torch.nn.LogSoftmax",
    "nll_loss_forward": "torch.nn.NLLLoss",
    "nll_loss": "torch.nn.NLLLoss",
    "cross_entropy_loss": "torch.nn.CrossEntropyLoss",
    "clamp_min": "torch.clamp_min",
    "rsub": "torch.sub",  # scalar - tensor
    "where": "torch.where",
    "scalar_tensor": "torch.full",
}
# Views, copies and casts: "executed before even reaching the IPU ... We will also create tensor views"
# (supported_ops.rst, Tensor operations); casts are the `.float()` / `.half()` / `.long()` every model uses.
_TENSOR_OPERATIONS = frozenset(
    "view _unsafe_view reshape permute expand slice select alias detach clone t transpose unsqueeze squeeze "
    "_to_copy to lift_fresh lift_fresh_copy contiguous copy_ empty_like zeros_like ones_like".split()
)


def documented_name(aten_name: str) -> Optional[str]:
    """The supported_ops.rst entry an aten op stands for, or None when PopTorch does not list it."""
    base = aten_name[:-1] if aten_name.endswith("_") and not aten_name.startswith("_") else aten_name
    if base in _TENSOR_OPERATIONS:
        return "Tensor operations"
    if base in _ATEN_TO_DOCUMENTED:
        return _ATEN_TO_DOCUMENTED[base]
    for prefix in ("torch.", "tensor.", "torch.Tensor.", "torch.nn.functional."):
        if prefix + base in SUPPORTED_OPS:
            return prefix + base
    return None


# ---- tracing ----------------------------------------------------------------------------------------------


def _run_op(func, args, kwargs):
    """Run an aten op on the host. PopTorch captures ops for the IPU without running them on the CPU, but the
    stand-in runs them, and torch < 2.1 has no CPU kernel for many half ops (layer norm, matmul): such an op,
    when it fails, runs on float32 copies of its half inputs and its float32 outputs are cast back. The
    stand-in does not model numerics. An in-place op writes its float32 result back into its half argument."""
    try:
        return func(*args, **kwargs)
    except RuntimeError:
        if not any(t.dtype == torch.half for t in _tensors(list(args) + list(kwargs.values()))):
            raise

    def up(v):
        return v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.half else v

    def down(v):
        return v.half() if isinstance(v, torch.Tensor) and v.dtype == torch.float32 else v

    up_args, up_kwargs = tree_map(up, list(args)), tree_map(up, kwargs)
    out = func(*up_args, **up_kwargs)
    written = {}  # the tensors this op writes in place, by their float32 copies
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            if i < len(args):
                original, copy_ = args[i], up_args[i]
            else:
                original, copy_ = kwargs.get(arg.name), up_kwargs.get(arg.name)
            if isinstance(original, torch.Tensor) and original is not copy_:
                original.copy_(copy_)
                written[id(copy_)] = original
    return tree_map(lambda v: written.get(id(v), down(v)) if isinstance(v, torch.Tensor) else v, out)


class _HostOps(TorchDispatchMode):
    """Runs a host forward's ops through _run_op (half ops on a CPU without half kernels)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run_op(func, args, kwargs or {})


class _IpuOps(TorchDispatchMode):
    """Records every aten op with the current IPU, and which parameters / inputs each IPU consumes."""

    def __init__(self, trace: _Trace, params: Dict[int, str], streams: Dict[int, str]) -> None:
        super().__init__()
        self.trace, self.params, self.streams = trace, params, streams
        self.param_ipus = {}  # type: Dict[str, Dict[int, str]]
        self.stream_ipus = {}  # type: Dict[str, Dict[int, str]]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        current = self.trace.current
        ipu = current[1] if current else None
        self.trace.ops.append((name, ipu, current[0] if current else None))
        for t in _tensors(args) + _tensors(list(kwargs.values())):
            key = _storage(t)
            for table, seen in ((self.params, self.param_ipus), (self.streams, self.stream_ipus)):
                if key in table and ipu is not None:
                    seen.setdefault(table[key], {}).setdefault(ipu, "%s in block %s" % (name, current[0]))
        return _run_op(func, args, kwargs)


def _tensors(values) -> List[torch.Tensor]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_tensors(v))
    return out


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, AttributeError):  # pragma: no cover - torch < 2.0
        return t.storage().data_ptr()


# ---- optimizers (python/optim.py) ---------------------------------------------------------------------


class Optimizer(torch.optim.Optimizer):
    """poptorch.optim.Optimizer: torch's param groups plus an IPU state ("ipu_state", "ipu_param")."""

    _hyper = ()  # type: Tuple[str, ...]

    def __init__(self, params, **kwargs) -> None:
        unknown = set(kwargs) - set(self._hyper)
        if unknown:
            raise TypeError("poptorch.optim.%s got unexpected arguments %s" % (type(self).__name__, sorted(unknown)))
        self.kwargs = kwargs
        super().__init__(params, {k: v for k, v in kwargs.items() if v is not None})
        self._state_dict = {"ipu_state": None, "ipu_param": None}  # type: Dict[str, Any]
        self.ipu_state_is_dirty = False
        self.host_state_is_dirty = False

    def step(self, closure=None):  # pragma: no cover - the IPU steps, never the host
        raise Error("poptorch optimizers step on the IPU")

    def state_dict(self):
        return self.get_state_dict()

    def load_state_dict(self, state):
        torch.optim.Optimizer.load_state_dict(self, state)
        self.set_state_dict(state)

    def get_state_dict(self):
        return dict(self._state_dict, **torch.optim.Optimizer.state_dict(self))

    def set_state_dict(self, state):
        if not state:
            raise RuntimeError("Cannot load optimizer state dictionary because it is empty.")
        if not ("ipu_state" in state and "ipu_param" in state):
            raise RuntimeError("Only IPU optimizer states can be loaded onto the IPU.")
        self._state_dict = state
        self.ipu_state_is_dirty = True
        self.host_state_is_dirty = False

    def has_state(self) -> bool:
        return self._state_dict.get("ipu_state") is not None and self._state_dict.get("ipu_param") is not None


def _optimizer(name: str):
    """poptorch.optim.``name``, taking exactly the keyword arguments of its python/optim.py __init__."""
    return type(name, (Optimizer,), {"_hyper": tuple(k for k in _kwargs_of("optim", name) if k != "params")})


class optim:  # noqa: N801  (poptorch.optim is a module; a namespace class serves here)
    SGD = _optimizer("SGD")
    Adam = _optimizer("Adam")
    AdamW = _optimizer("AdamW")
    RMSprop = _optimizer("RMSprop")
    LAMB = _optimizer("LAMB")
    Optimizer = Optimizer


# ---- the executor (python/_poplar_executor.py) ----------------------------------------------------------


class PoplarExecutor:
    def __init__(self, model: torch.nn.Module, options: Options, optimizer=None, training: bool = True) -> None:
        self._user_model = model
        self._options = options or Options()
        self._training = training
        self._optimizer = None
        self._compiled = False
        self._attached = False
        self._device_state = None  # type: Optional[Dict[str, Any]]
        self.trace = None  # type: Optional[_Trace]
        self.loaded_from_cache = False
        self.cache_file = None  # type: Optional[str]
        self.calls = 0
        self.written_states = []  # type: List[Dict[str, Any]]  (what writeOptimizerState put on the device)
        self.set_optimizer_lrs = []  # type: List[List[float]]
        self.copies_to_host = 0
        self.attaches = 0  # attachToDevice calls after the first attach (test helper)
        if optimizer is not None:
            self.setOptimizer(optimizer)

    # -- what PopTorch keeps on the device -----------------------------------------------------------

    @property
    def _offline(self) -> bool:
        return self._options.value("useOfflineIpuTarget") is not None

    def isCompiled(self) -> bool:
        return self._compiled

    def isAttachedToDevice(self) -> bool:
        return self._attached

    def _read_optim_state_dict_if_needed(self) -> None:
        opt = self._optimizer
        if not isinstance(opt, Optimizer) or not opt.host_state_is_dirty:
            return
        if not self._compiled:
            raise Error("Model has not been compiled or has been destroyed.")
        state = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self._device_state.items()}
        opt.set_state_dict(dict(state, **torch.optim.Optimizer.state_dict(opt)))
        opt.ipu_state_is_dirty = False

    def _write_optim_state_dict_if_needed(self) -> None:
        opt = self._optimizer
        if isinstance(opt, Optimizer) and opt.ipu_state_is_dirty:
            if opt.has_state():
                self._device_state = {"ipu_state": dict(opt._state_dict["ipu_state"]),
                                      "ipu_param": dict(opt._state_dict["ipu_param"])}
                self.written_states.append(copy.deepcopy(self._device_state))
            opt.ipu_state_is_dirty = False

    def _get_optim_state_dict(self):
        self._read_optim_state_dict_if_needed()
        return self._optimizer.get_state_dict()

    def _on_device_attach(self) -> None:
        self._attached = True
        self._device_state = {
            "ipu_state": {"step": torch.tensor(0)},
            "ipu_param": {n: p.detach().clone() for n, p in self._user_model.named_parameters()},
        }
        opt = self._optimizer
        if isinstance(opt, Optimizer):
            if opt.has_state():
                opt.ipu_state_is_dirty = True
                self._write_optim_state_dict_if_needed()
            else:
                opt.host_state_is_dirty = True
                opt.ipu_state_is_dirty = False

    # -- compile ------------------------------------------------------------------------------------

    def _micro_batch(self, args) -> Tuple[torch.Tensor, ...]:
        opts = self._options
        per_call = (opts._int("deviceIterations") * opts._int("replicationFactor")
                    * opts._int("Training.gradientAccumulation"))
        n = int(args[0].shape[0])
        if n % per_call:
            raise Error("the batch dimension (%d) is not a multiple of device iterations x replicas x accumulation (%d)"
                        % (n, per_call))
        return tuple(a[: n // per_call] for a in args)

    def _trace(self, args) -> _Trace:
        global _TRACE
        strategy = self._options.value("setExecutionStrategy")
        pipelined = isinstance(strategy, PipelinedExecution) and not isinstance(strategy, ShardedExecution)
        trace = _Trace(strategy.auto_stage if isinstance(strategy, PipelinedExecution) else AutoStage.SameAsIpu)
        params = {}  # type: Dict[int, str]
        for name, p in self._user_model.named_parameters():
            params.setdefault(_storage(p), name)
        streams = {_storage(a): "input %d" % i for i, a in enumerate(args)}
        mode = _IpuOps(trace, params, streams)
        _TRACE = trace
        try:
            with mode:
                outputs = self._user_model(*args)
        finally:
            _TRACE = None
        self._check(trace, mode, outputs, pipelined)
        return trace

    def _check(self, trace: _Trace, mode: _IpuOps, outputs, pipelined: bool) -> None:
        with_ipu = [op for op in trace.ops if op[1] is not None]
        without = [op[0] for op in trace.ops if op[1] is None]
        if with_ipu and without:
            raise Error("Either all Ops must have their virtual graph ids set, or none must. Ops with no virtual "
                        "graph id: %s" % ", ".join(sorted(set(without))))
        if pipelined:
            for name, ipus in mode.param_ipus.items():
                if len(ipus) > 1:
                    raise Error("Can not copy variable tensor %s between virtual graphs when pipelining. All pipeline "
                                "stages using this tensor should be on the same graph. (used on IPUs %s: %s)"
                                % (name, sorted(ipus), "; ".join("%d: %s" % kv for kv in sorted(ipus.items()))))
            for name, ipus in mode.stream_ipus.items():
                if len(ipus) > 1:
                    raise Error("For pipelining, stream tensors can only be streamed directly onto a single IPU "
                                "(%s used on IPUs %s)" % (name, sorted(ipus)))
            groups = 0
            previous = None
            for _, ipu in trace.block_order:  # consecutive stages on one IPU are merged
                if ipu != previous:
                    groups += 1
                previous = ipu
            # Training: autodiff adds a backward stage for every forward group but the last, whose forward and
            # backward are one stage (Ir::getNumPipelineStages counts them all).
            stages = 2 * groups - 1 if self._training else groups
            accumulation = self._options._int("Training.gradientAccumulation")
            if accumulation < stages:
                raise Error("For pipelining, depth (gradient accumulation factor) must equal at least the number of "
                            "pipeline stages (%d)" % stages)
        unsupported = sorted({op[0] for op in trace.ops
                              if not op[0].startswith("poptorch.") and documented_name(op[0]) is None})
        if unsupported:
            raise Error("unsupported operation(s) (not in PopTorch's supported_ops.rst): %s" % ", ".join(unsupported))
        if self._training:
            first = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
            if not trace.losses or not any(first is loss for loss in trace.losses):
                raise Error("a training model's loss must be marked with poptorch.identity_loss and returned")

    def _cache_key(self, trace: _Trace) -> str:
        text = repr([op[:2] for op in trace.ops]) + repr(sorted((n, repr(a)) for n, a, _ in self._options.calls))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def compile(self, *args) -> None:
        self.trace = self._trace(self._micro_batch(args))
        cache = self._options.value("enableExecutableCaching")
        if cache:
            os.makedirs(cache, exist_ok=True)
            self.cache_file = os.path.join(cache, "%s.popef" % self._cache_key(self.trace))
            self.loaded_from_cache = os.path.isfile(self.cache_file)
            if not self.loaded_from_cache:
                with open(self.cache_file, "w") as f:
                    f.write("stand-in executable\n")
        self._compiled = True
        if not self._offline:
            self._on_device_attach()

    def loadExecutable(self, filename: str) -> None:
        if not os.path.isfile(filename):
            raise Error("no executable at %s" % filename)
        self._compiled = True
        if not self._offline:
            self._on_device_attach()

    # -- run ------------------------------------------------------------------------------------------

    def __call__(self, *args):
        if os.environ.get(SIGKILL_AT_CALL) == str(self.calls + 1):
            os.kill(os.getpid(), signal.SIGKILL)  # a fault for the tests: no cleanup, no atexit
        if not self._compiled:
            self.compile(*args)
        if self._offline:
            raise Error("Trying to attach to an offline device (ConnectionType.Never)")
        if not self._attached:  # a detached executable attaches again (_poplar_executor.py __call__)
            self.attachToDevice()
        self._write_optim_state_dict_if_needed()
        steps = self._options._int("deviceIterations")
        micro = self._micro_batch(args)[0].shape[0]
        n = int(args[0].shape[0]) // micro
        # _HostOps only stands in for CPU kernels that half tensors lack: an fp32 model runs without it (faster)
        half = any(p.dtype == torch.half for p in self._user_model.parameters())
        with torch.no_grad(), (_HostOps() if half else contextlib.nullcontext()):
            per_micro = [self._user_model(*(a[i * micro : (i + 1) * micro] for a in args)) for i in range(n)]
        self._device_state["ipu_state"]["step"] = self._device_state["ipu_state"]["step"] + steps
        self.calls += 1
        if isinstance(self._optimizer, Optimizer):
            self._optimizer.host_state_is_dirty = True  # used on the IPU: the host copy is out of date
        return tuple(self._returned([torch.as_tensor(o[k]).reshape(()) for o in per_micro])
                     for k in range(len(per_micro[0])))

    def _returned(self, values: List[torch.Tensor]) -> torch.Tensor:
        """What the host gets of one scalar output under the Options' outputMode (python/options.py:1698-1704;
        a training model's default is Final, _poplar_executor.py:167-170): All, a value per micro batch; Sum,
        per replica the sum of its micro batches; Final, per replica its last one. The stand-in deals micro
        batch i to replica i % replicas: which replica got which micro batch is not modelled."""
        mode = self._options.value("outputMode", OutputMode.Default)
        if mode == OutputMode.All:
            return torch.stack(values)
        replicas = self._options._int("replicationFactor")
        per_replica = [torch.stack(values[r::replicas]) for r in range(replicas)]
        if mode == OutputMode.Sum:
            return torch.stack([v.sum() for v in per_replica])
        if mode in (OutputMode.Final, OutputMode.Default):
            return torch.stack([v[-1] for v in per_replica])
        raise Error("the stand-in does not model output mode %s" % (mode,))

    def copyWeightsToHost(self) -> None:
        if not self._compiled:
            raise Error("Model has not been compiled or has been destroyed.")
        self.copies_to_host += 1

    def setOptimizer(self, optimizer) -> None:
        if self._compiled and optimizer is not self._optimizer:
            if isinstance(self._optimizer, Optimizer):
                self._read_optim_state_dict_if_needed()
                self._optimizer.state_dict = self._optimizer.get_state_dict
            if isinstance(optimizer, Optimizer):
                optimizer.ipu_state_is_dirty = True
        if isinstance(optimizer, Optimizer):
            executor = self
            optimizer.state_dict = lambda: executor._get_optim_state_dict()
        self._optimizer = optimizer
        self.set_optimizer_lrs.append([g["lr"] for g in optimizer.param_groups])
        if self._attached:
            self._write_optim_state_dict_if_needed()

    def attachToDevice(self) -> None:
        """python/_poplar_executor.py attachToDevice: compiled, detached, online; the weights and any optimizer
        state the host holds go to the device (_on_device_attach)."""
        if not self._compiled:
            raise Error("Model has not been compiled or has been destroyed.")
        if self._offline:
            raise Error("Trying to attach to an offline device (ConnectionType.Never)")
        if self._attached:
            raise Error("Device is already attached")
        self.attaches += 1
        self._on_device_attach()

    def detachFromDevice(self) -> None:
        if not self._compiled:
            raise Error("Model has not been compiled or has been destroyed.")
        if not self._attached:
            raise Error("Device is not attached")
        if self._training:
            self._read_optim_state_dict_if_needed()
        self._attached = False


executors = []  # type: List[PoplarExecutor]
"""Every executor trainingModel made (test helper)."""


def trainingModel(model: torch.nn.Module, options: Optional[Options] = None, optimizer=None) -> PoplarExecutor:
    executor = PoplarExecutor(model, options, optimizer=optimizer, training=True)
    executors.append(executor)
    return executor


# ---- the data loader (python/__init__.py: DataLoader, AsynchronousDataAccessor; python/_dataloader.py) ---------


WORKER_LOG = "POPTORCH_STAND_IN_WORKER_LOG"
"""Test helper: with this variable naming a file, each AsynchronousDataAccessor worker appends a JSON line
about itself once it has its first element: pid, parent pid, sharing strategy, and the __main__ module it
imported (name and file)."""
SIGKILL_AT_CALL = "POPTORCH_STAND_IN_SIGKILL_AT_CALL"
"""Test helper: with this variable set to N, the process SIGKILLs itself when an executor's host call N
begins (after call N-1 and whatever the application did after it, such as a checkpoint)."""


def _log_worker(strategy: "SharingStrategy") -> None:
    import json
    import sys

    main = sys.modules.get("__main__")
    line = {"pid": os.getpid(), "ppid": os.getppid(), "sharing_strategy": strategy.name,
            "main_name": getattr(main, "__name__", None), "main_file": getattr(main, "__file__", None)}
    with open(os.environ[WORKER_LOG], "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def _py_error(message: str) -> Error:
    """python/_impl.py createPoptorchError: a poptorch.Error whose text is "'poptorch_py_error': MESSAGE"."""
    error = Error("'poptorch_py_error': %s" % (message,))
    error.type, error.message, error.location = "poptorch_py_error", message, ""
    return error


class DataLoader(torch.utils.data.DataLoader):
    """poptorch.DataLoader (python/__init__.py:229-523): a torch DataLoader whose item is the combined batch of
    one host call, ``batch_size`` (the micro batch) x device iterations x replicas x gradient accumulation
    (:324-330).

    - A distributed run (more than one process) cuts a map-style dataset, unless
      ``auto_distributed_partitioning=False``, into one contiguous block per process of a whole number of
      combined batches, the same count for every process (_SubDataset, :126-158, with drop_last).
    - ``mode``: ``Sync`` iterates in this process. ``AsyncRebatched`` (and ``Async`` with drop_last=False)
      becomes ``Async`` with ``rebatched_size`` = the combined batch: the torch side batches
      ``rebatched_worker_size`` (default the combined batch) with drop_last=False, and the accessor's worker
      cuts the rows into combined batches, dropping a short last one when drop_last (:424-457). ``Async``
      starts an AsynchronousDataAccessor on ``self`` here, in ``__init__`` (:459-466): the worker process
      gets this loader, its dataset included, pickled, and iterating the loader iterates the accessor.
    - ``poptorch_mode`` (the mode as asked) and ``micro_batch_size`` are test helpers, not PopTorch API.
    """

    def __init__(self, options: Options, dataset, batch_size: int = 1, shuffle: Optional[bool] = None,
                 num_workers: int = 0, drop_last: bool = True, persistent_workers: Optional[bool] = None,
                 auto_distributed_partitioning: bool = True, mode: DataLoaderMode = DataLoaderMode.Sync,
                 async_options: Optional[Dict[str, Any]] = None, rebatched_worker_size: Optional[int] = None,
                 batch_sampler=None, **kwargs) -> None:
        if batch_sampler is not None:
            raise Error("the stand-in does not model batch_sampler")
        if shuffle is None:
            shuffle = False
        assert isinstance(options, Options)
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        self.poptorch_mode = mode
        self.micro_batch_size = batch_size
        if batch_size is None:
            self._combined_batch_size = None  # type: Optional[int]
        else:
            self._combined_batch_size = batch_size * options._int("deviceIterations") * options._int(
                "replicationFactor") * options._int("Training.gradientAccumulation")
        self._options = options
        self._accessor = None  # type: Optional[AsynchronousDataAccessor]
        processes = options.Distributed.numProcesses
        if (processes > 1 and auto_distributed_partitioning
                and not isinstance(dataset, torch.utils.data.IterableDataset)):
            assert drop_last, "the stand-in models _SubDataset with drop_last only"
            assert self._combined_batch_size is not None, (
                "batch_size=None not allowed when using auto_distributed_partitioning.")
            per_process = self._combined_batch_size * (len(dataset) // (self._combined_batch_size * processes))
            offset = options.Distributed.processId * per_process
            dataset = torch.utils.data.Subset(dataset, range(offset, offset + per_process))
        rebatched_size = None
        dataset_batch_size = self._combined_batch_size
        remainder = (mode == DataLoaderMode.Async and not drop_last and self._combined_batch_size is not None
                     and self._combined_batch_size > 1)
        if mode == DataLoaderMode.AsyncRebatched or remainder:
            mode = DataLoaderMode.Async
            rebatched_size = self._combined_batch_size
            self.rebatched_drop_last = drop_last  # read by the worker (python/_dataloader.py:305)
            drop_last = False
            if rebatched_worker_size is not None:
                assert rebatched_worker_size <= self._combined_batch_size, (
                    "The rebatched_worker_size (%d) must be <= to the combined batch size (%d)"
                    % (rebatched_worker_size, self._combined_batch_size))
                dataset_batch_size = rebatched_worker_size
        super().__init__(dataset, batch_size=dataset_batch_size, shuffle=shuffle, num_workers=num_workers,
                         drop_last=drop_last, persistent_workers=persistent_workers, **kwargs)
        if mode == DataLoaderMode.Async:
            async_options = dict(async_options or {})
            assert "rebatched_size" not in async_options, (
                "You cannot use DataLoaderMode.AsyncRebatched and manually specify the rebatched_size in "
                "async_options")
            self._accessor = AsynchronousDataAccessor(self, rebatched_size=rebatched_size, **async_options)

    def __len__(self) -> int:
        if self._accessor is not None and self._accessor.rebatched_size:
            elements = len(self.dataset)
            length = elements // self._accessor.rebatched_size
            if not self.rebatched_drop_last and elements % self._accessor.rebatched_size:
                length += 1
            return length
        return super().__len__()

    @property
    def combinedBatchSize(self) -> Optional[int]:
        return self._combined_batch_size

    @property
    def options(self) -> Options:
        return self._options

    def terminate(self) -> None:
        if getattr(self, "_accessor", None) is not None:
            self._accessor.terminate()

    def __del__(self) -> None:
        self.terminate()

    def __iter__(self):
        if self._accessor is not None:
            return self._accessor.__iter__()
        return super().__iter__()


accessors = []  # type: List[AsynchronousDataAccessor]
"""Every AsynchronousDataAccessor made (test helper: a fixture ends their workers after its test)."""


class AsynchronousDataAccessor:
    """python/__init__.py:526-662. Its worker process (python/_dataloader.py) starts here, in ``__init__``,
    with the multiprocessing start method of ``sharing_strategy``: ``Fork`` forks; ``ForkServer`` (the
    default) has the forkserver fork it; ``SharedMemory`` and ``FileSystem`` spawn it (FileSystem passes the
    dataset through a pickle file). Under forkserver and spawn the child re-imports the parent's ``__main__``
    (as ``__mp_main__``) before it unpickles the dataset, so a script without an
    ``if __name__ == "__main__":`` guard runs again there; a worker that dies before it has sent its first
    element gives PopTorch's "AsynchronousDataAccessor worker thread failed to start", one that dies later
    "An error occurred in the data fetcher".

    The worker iterates the dataset (the loader: a torch DataLoader of its own, with its own workers if
    ``num_workers``), rebatches when ``rebatched_size`` is set, and fills at most ``buffer_size`` slots the
    host has not released. PopTorch hands out the slot's shared memory itself, so an element is valid only
    until the next ``__next__`` (or a new iterator): the worker may refill the slot as soon as it is released.
    The stand-in sends each element through a pipe and, when the host releases it, fills the tensors it
    returned with NaN / the integer minimum, the earliest moment PopTorch's worker may overwrite them.
    Iterating again starts the dataset from its beginning (a reset when the last iteration stopped early);
    ``load_indefinitely`` is PopTorch's default. ``miss_sleep_time_in_ms`` and ``early_preload`` are
    accepted and not modelled (the stand-in's worker waits for the host's start, and blocks instead of
    polling)."""

    def __init__(self, dataset, buffer_size: int = 3, miss_sleep_time_in_ms: float = 0.1,
                 load_indefinitely: bool = True, early_preload: bool = False,
                 sharing_strategy: SharingStrategy = SharingStrategy.ForkServer,
                 rebatched_size: Optional[int] = None) -> None:
        self._worker = None  # type: Optional[_AsynchronousWorker]
        if isinstance(dataset, DataLoader) and dataset._accessor is not None:
            raise _py_error("The DataLoader already uses an AsynchronousDataAccessor internally. Either use the "
                            "existing one or set mode='poptorch.DataLoaderMode.Sync' in the DataLoader.")
        if isinstance(dataset, DataLoader) and not dataset.drop_last and rebatched_size is None:
            assert dataset.combinedBatchSize is None or dataset.combinedBatchSize == 1, (
                "The 'drop_last=False' option from the DataLoader only works if 'rebatched_size' is specified too.")
        if rebatched_size is not None:
            assert rebatched_size > 1, "rebatched_size must be None or greater than 1"
        self._dataset = dataset
        atexit.register(self.terminate)
        accessors.append(self)
        self.rebatched_size = rebatched_size
        self._worker = _AsynchronousWorker(buffer_size, dataset, load_indefinitely, SharingStrategy(sharing_strategy),
                                           rebatched_size)

    def terminate(self) -> None:
        if self._worker is not None:
            self._worker.terminate()
            self._worker = None

    def __del__(self) -> None:
        if getattr(self, "_worker", None) is not None:
            self.terminate()

    def __len__(self) -> int:
        length = len(self._dataset)
        if self.rebatched_size and getattr(self._dataset, "_accessor", None) is not self:
            length = length * self._dataset.batch_size // self.rebatched_size
        return length

    def __iter__(self) -> "AsynchronousDataAccessor":
        assert self._worker is not None
        self._worker.resetIterator()
        return self

    def __next__(self):
        assert self._worker is not None
        self._worker.releaseElement()
        data = self._worker.acquireElement()
        if data is None:
            raise StopIteration
        return data

    @property
    def worker_pid(self) -> Optional[int]:
        """The worker process's pid (test helper)."""
        return self._worker.pid if self._worker is not None else None


class _HostCommand(enum.IntEnum):
    """python/_dataloader.py:556-560, and Release: the stand-in's message for a slot the host released
    (PopTorch flips the slot's flag in shared memory)."""
    SetupComplete = 0
    Shutdown = 1
    ResetIterator = 2
    StartIterating = 3
    Release = 4


def _flat(data, keys: List[str]) -> Tuple[torch.Tensor, ...]:
    """One element as the worker sends it: a tuple of tensors (python/_dataloader.py:282-299, 343-356)."""
    if isinstance(data, torch.Tensor):
        data = (data,)
    elif isinstance(data, dict):
        assert len(data) == len(keys)
        data = tuple(data[k] for k in keys)
    elif not isinstance(data, (list, tuple)):
        raise Error("the stand-in models elements that are tensors, dicts or lists of tensors, not %s" % type(data))
    for index, tensor in enumerate(data):
        assert isinstance(tensor, torch.Tensor), (
            "Tensor at index %d is not a torch tensor (%s). AsynchronousDataAccessor expects data to be organised "
            "as a flat 1D container of tensors." % (index, type(tensor)))
    return tuple(data)


def _rebatched(elements, size: Optional[int], drop_last: bool):
    """The rows of ``elements`` cut into elements of ``size`` rows (python/_dataloader.py:513-541, 478-489): a
    short last one is dropped when ``drop_last``."""
    if not size:
        for fields in elements:
            yield fields
        return
    parts, rows = [], 0  # type: List[Tuple[torch.Tensor, ...]], int
    for fields in elements:
        parts.append(fields)
        rows += int(fields[0].shape[0])
        while rows >= size:
            whole = [torch.cat([p[i] for p in parts]) for i in range(len(fields))]
            yield tuple(w[:size] for w in whole)
            rows -= size
            parts = [tuple(w[size:] for w in whole)] if rows else []
    if rows and not drop_last:
        yield tuple(torch.cat([p[i] for p in parts]) for i in range(len(parts[0])))


def _poison(tensor: torch.Tensor) -> None:
    if tensor.dtype == torch.bool:
        tensor.fill_(True)
    elif tensor.is_floating_point() or tensor.is_complex():
        tensor.fill_(float("nan"))
    else:
        info = torch.iinfo(tensor.dtype)
        tensor.fill_(info.min if info.min < 0 else info.max)


class _AsynchronousWorker:
    """The host's side (python/_dataloader.py AsynchronousWorker)."""

    def __init__(self, buffer_size: int, dataset, load_indefinitely: bool, sharing_strategy: SharingStrategy,
                 rebatched_size: Optional[int]) -> None:
        self._process = _AsynchronousWorkerProcess(buffer_size, dataset, load_indefinitely, sharing_strategy,
                                                   rebatched_size)
        self._load_indefinitely = load_indefinitely
        self._was_used = False
        self._worker_started = False
        self._eof = False
        self._locked = None  # type: Optional[Tuple[torch.Tensor, ...]]
        self._command_pipe, self._data_pipe, (self._is_single_tensor, self._dict_keys) = self._process.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def terminate(self) -> None:
        if self._process.isAlive():
            try:
                self._command_pipe.send(_HostCommand.Shutdown)
            except (BrokenPipeError, OSError):
                pass
        # PopTorch's worker writes to shared memory and polls its commands; the stand-in's may be blocked
        # sending an element through a full pipe: closing the host's end ends that send
        self._data_pipe.close()
        self._process.join()
        self._command_pipe.close()

    def _receive(self):
        try:
            return pickle.loads(self._data_pipe.recv_bytes())
        except (EOFError, OSError):
            self._process.join()
            raise AssertionError("An error occurred in the data fetcher")

    def resetIterator(self) -> None:
        if self._worker_started and not self._was_used:
            return
        if self._was_used and (not self._eof or not self._load_indefinitely):
            self._command_pipe.send(_HostCommand.ResetIterator)
            self.releaseElement()
            while self._receive()[0] != "reset":  # elements and an end of file sent before the reset
                pass
        self._eof = False
        self._command_pipe.send(_HostCommand.StartIterating)
        self._was_used = False
        self._worker_started = True

    def acquireElement(self):
        """The next element, or None at the end of the dataset (blocks while the worker loads it)."""
        if self._eof:
            return None
        message = self._receive()
        if message[0] == "eof":
            self._eof = True
            return None
        data = message[1]
        self._was_used = True
        self._locked = data
        if self._is_single_tensor:
            return data[0]
        if self._dict_keys:
            return dict(zip(self._dict_keys, data))
        return list(data)

    def releaseElement(self) -> None:
        if self._locked is None:
            return
        for tensor in self._locked:
            _poison(tensor)
        self._locked = None
        try:
            self._command_pipe.send(_HostCommand.Release)
        except (BrokenPipeError, OSError):
            pass


class _AsynchronousWorkerProcess:
    """The worker process (python/_dataloader.py _AsynchronousWorkerProcess): started by ``start`` with the
    sharing strategy's multiprocessing context; ``_mainLoop`` runs in the child."""

    _METHODS = {SharingStrategy.Fork: "fork", SharingStrategy.ForkServer: "forkserver"}  # else spawn

    def __init__(self, buffer_size: int, dataset, load_indefinitely: bool, sharing_strategy: SharingStrategy,
                 rebatched_size: Optional[int]) -> None:
        self._buffer_size = buffer_size
        self._dataset = dataset
        self.load_indefinitely = load_indefinitely
        self._sharing_strategy = sharing_strategy
        self._rebatched_size = rebatched_size
        self._process = None

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_process"] = None  # the child gets the dataset, not its own Process object
        return state

    @property
    def pid(self) -> int:
        return self._process.pid

    def isAlive(self) -> bool:
        return self._process.exitcode is None

    def join(self) -> None:
        self._process.join(timeout=10)
        if self.isAlive():
            os.kill(self._process.pid, signal.SIGINT)
            self._process.join(timeout=10)
        if self.isAlive():
            self._process.terminate()
            self._process.join()

    def start(self):
        if self._sharing_strategy != SharingStrategy.FileSystem:
            return self._start()
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "dataset.pkl")
            dataset = self._dataset
            with open(path, "wb") as f:
                pickle.dump(dataset, f, protocol=4)
            self._dataset = path
            try:
                return self._start()
            finally:
                self._dataset = dataset

    def _start(self):
        assert self._process is None, "Worker already started"
        ctx = torch.multiprocessing.get_context(self._METHODS.get(self._sharing_strategy, "spawn"))
        read_data_pipe, write_data_pipe = ctx.Pipe(duplex=False)
        read_command_pipe, write_command_pipe = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=self._mainLoop, args=(write_data_pipe, read_command_pipe))
        self._process.start()
        write_data_pipe.close()
        read_command_pipe.close()
        try:
            setup = pickle.loads(read_data_pipe.recv_bytes())
        except EOFError:
            pass
        else:
            write_command_pipe.send(_HostCommand.SetupComplete)
            return write_command_pipe, read_data_pipe, setup
        self._process.join()
        raise _py_error("AsynchronousDataAccessor worker thread failed to start (Check above for details)")

    # -- in the worker process ---------------------------------------------------------------------------

    def _mainLoop(self, conn, command_pipe) -> None:
        try:
            self._mainLoopNoInterrupt(conn, command_pipe)
        except KeyboardInterrupt:
            pass
        except (EOFError, BrokenPipeError, ConnectionResetError):  # the host is gone, or shut the worker down
            pass

    def _mainLoopNoInterrupt(self, conn, command_pipe) -> None:
        if isinstance(self._dataset, str):
            with open(self._dataset, "rb") as f:
                self._dataset = pickle.load(f)
        iterator = iter(self._dataset)
        drop_last = getattr(self._dataset, "rebatched_drop_last", True)
        try:
            first = next(iterator)
        except StopIteration:
            first = None
        if first is None:
            raise _py_error("The Dataset is empty")
        keys = list(first) if isinstance(first, dict) else []
        if os.environ.get(WORKER_LOG):
            _log_worker(self._sharing_strategy)
        pending = [_flat(first, keys)]  # the first element is the first iteration's
        conn.send_bytes(pickle.dumps((isinstance(first, torch.Tensor), keys), protocol=4))
        while True:  # stopped: wait for the host
            command = command_pipe.recv()
            if command == _HostCommand.Shutdown:
                return
            if command == _HostCommand.ResetIterator:
                iterator, pending = iter(self._dataset), []
                conn.send_bytes(pickle.dumps(("reset",), protocol=4))
            elif command == _HostCommand.StartIterating:
                elements = _rebatched(itertools.chain(pending, (_flat(d, keys) for d in iterator)),
                                      self._rebatched_size, drop_last)
                outcome = self._load(conn, command_pipe, elements)
                if outcome == _HostCommand.Shutdown:
                    return
                iterator, pending = iter(self._dataset), []  # a new iterator after the end of file, or a reset
                if outcome == _HostCommand.ResetIterator:
                    conn.send_bytes(pickle.dumps(("reset",), protocol=4))
                elif not self.load_indefinitely:
                    iterator = None  # created again when the host asks for a reset
            # SetupComplete and Release while stopped: nothing to do

    def _load(self, conn, command_pipe, elements) -> Optional[_HostCommand]:
        """Send elements while the host has free slots; the end of file, or the command that stopped it."""
        free = self._buffer_size
        for fields in elements:
            while free == 0 or command_pipe.poll():
                command = command_pipe.recv()
                if command == _HostCommand.Release:
                    free += 1
                elif command in (_HostCommand.Shutdown, _HostCommand.ResetIterator):
                    return command
            conn.send_bytes(pickle.dumps(("element", fields), protocol=4))
            free -= 1
        conn.send_bytes(pickle.dumps(("eof",), protocol=4))
        return None
