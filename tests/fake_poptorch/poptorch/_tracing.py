"""What compile traces: the supported operations (supported_ops.rst) and the dispatch modes that record each
aten op with its IPU, or run a half op on the host."""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from ._names import SUPPORTED_OPS
from ._ops import _Trace


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
