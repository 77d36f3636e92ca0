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

The package's modules, by concern (each name is re-exported here, where PopTorch users find it, with
``__module__`` "poptorch", so that pickles name ``poptorch.X`` as before):

- ``_names``: the name tables read from tests/assets (API, SUPPORTED_OPS, POPART_*) and ``Error``;
- ``_enums``: the enums of python/enums.py;
- ``_options``: ``Options`` and its groups, ``PipelinedExecution``, ``ShardedExecution``;
- ``_ops``: blocks and the ops a model calls (``BeginBlock``, ``identity_loss``, ``serializedMatMul``, ...);
- ``_tracing``: the supported operations and the dispatch modes compile traces with;
- ``_optim``: ``optim`` and its optimizers;
- ``_executor``: ``trainingModel``, ``inferenceModel`` and ``PoplarExecutor`` (compile, run, the device's optimizer state);
- ``_dataloader``: ``DataLoader``, ``AsynchronousDataAccessor`` and the worker process.
"""

from __future__ import annotations

# ruff: noqa: F401  (every name is imported to be re-exported)
from ._names import (_ASSETS, API, POPART_ENUMS, POPART_OPTIONS, POPART_PATTERNS, SUPPORTED_OPS, Error, _kwargs_of,
                     _read_list, _read_table)
from ._enums import (AutoStage, ConnectionType, DataLoaderMode, MatMulSerializationMode, MeanReductionStrategy,
                     OutputMode, ReductionType, SharingStrategy)
from ._options import (_GROUP_CLASSES, Options, PipelinedExecution, ShardedExecution, TensorLocationSettings,
                       _DistributedGroup, _Group, _PopartGroup, _value_fits)
from ._ops import (Block, BeginBlock, BlockFunction, _BlockHook, _record_poptorch_op, _Trace, identity_loss,
                   recomputationCheckpoint, removeBlocks, serialized, serializedMatMul, set_available_memory)
from ._tracing import (_ATEN_TO_DOCUMENTED, _TENSOR_OPERATIONS, _HostOps, _IpuOps, _run_op, _storage, _tensors,
                       documented_name)
from ._optim import Optimizer, _optimizer, optim
from ._executor import SIGKILL_AT_CALL, PoplarExecutor, executors, inferenceModel, trainingModel
from ._dataloader import (WORKER_LOG, AsynchronousDataAccessor, DataLoader, _AsynchronousWorker,
                          _AsynchronousWorkerProcess, _flat, _HostCommand, _log_worker, _poison, _py_error,
                          _rebatched, accessors)

__version__ = "3.4.0+stand-in"
__stand_in__ = True

for _value in list(globals().values()) + [getattr(optim, _n) for _n in vars(optim) if not _n.startswith("__")]:
    if str(getattr(_value, "__module__", None) or "").startswith(__name__ + "."):
        _value.__module__ = __name__  # poptorch.X, as when the stand-in was one module
del _value
