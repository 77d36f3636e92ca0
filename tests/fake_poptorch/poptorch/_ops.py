"""Blocks and the poptorch ops a model calls (python/ops.py); ``_TRACE`` is the step being traced, set by the
executor's compile."""

from __future__ import annotations

from typing import Optional

import torch

from ._enums import AutoStage, MatMulSerializationMode
from ._names import Error


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
