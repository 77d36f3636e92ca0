"""The executor (python/_poplar_executor.py): compile traces and checks the step, the device keeps an optimizer
step counter and the weights, each call runs the host model and returns the outputs as the output mode says."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import signal
from typing import List, Optional, Tuple

import torch

from . import _ops
from ._enums import AutoStage, OutputMode
from ._names import Error
from ._ops import _Trace
from ._optim import Optimizer
from ._options import Options, PipelinedExecution, ShardedExecution
from ._tracing import _HostOps, _IpuOps, _storage, documented_name


SIGKILL_AT_CALL = "POPTORCH_STAND_IN_SIGKILL_AT_CALL"
"""Test helper: with this variable set to N, the process SIGKILLs itself when an executor's host call N
begins (after call N-1 and whatever the application did after it, such as a checkpoint)."""


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
        strategy = self._options.value("setExecutionStrategy")
        pipelined = isinstance(strategy, PipelinedExecution) and not isinstance(strategy, ShardedExecution)
        trace = _Trace(strategy.auto_stage if isinstance(strategy, PipelinedExecution) else AutoStage.SameAsIpu)
        params = {}  # type: Dict[int, str]
        for name, p in self._user_model.named_parameters():
            params.setdefault(_storage(p), name)
        streams = {_storage(a): "input %d" % i for i, a in enumerate(args)}
        mode = _IpuOps(trace, params, streams)
        _ops._TRACE = trace
        try:
            with mode:
                outputs = self._user_model(*args)
        finally:
            _ops._TRACE = None
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
            if self._training:
                accumulation = self._options._int("Training.gradientAccumulation")
                if accumulation < stages:
                    raise Error("For pipelining, depth (gradient accumulation factor) must equal at least the number "
                                "of pipeline stages (%d)" % stages)
            elif self._options._int("deviceIterations") < stages:  # inference: PopART's batches per step
                raise Error("For pipelining, depth (batchesPerStep) must equal at least the number of pipeline "
                            "stages (%d)" % stages)
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
        if not self._training:  # an inference model: every output of every micro batch, in batch order
            self.calls += 1
            return self._inference_outputs(per_micro)
        self._device_state["ipu_state"]["step"] = self._device_state["ipu_state"]["step"] + steps
        self.calls += 1
        if isinstance(self._optimizer, Optimizer):
            self._optimizer.host_state_is_dirty = True  # used on the IPU: the host copy is out of date
        return tuple(self._returned([torch.as_tensor(o[k]).reshape(()) for o in per_micro])
                     for k in range(len(per_micro[0])))

    def _inference_outputs(self, per_micro):
        """What inferenceModel's host call returns under its default output mode (All for inference,
        _poplar_executor.py): each output with the micro batches' rows back to back, in the combined batch's
        order. A tuple of outputs stays a tuple."""
        mode = self._options.value("outputMode", OutputMode.Default)
        if mode not in (OutputMode.All, OutputMode.Default):
            raise Error("the stand-in models inference with output mode All only, got %s" % (mode,))
        if isinstance(per_micro[0], torch.Tensor):
            return torch.cat(per_micro)
        return tuple(torch.cat([o[k] for o in per_micro]) for k in range(len(per_micro[0])))

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


def inferenceModel(model: torch.nn.Module, options: Optional[Options] = None) -> PoplarExecutor:
    """python/__init__.py inferenceModel: the forward pass only, compiled as trainingModel is (placement, supported
    ops, pipelining rules without autodiff's extra stages); no optimizer, no loss to mark."""
    executor = PoplarExecutor(model, options, training=False)
    executors.append(executor)
    return executor
