"""``horovod.torch``: the collectives of Horovod's PyTorch API that Graphcore's BERT app and this project call,
between processes mpirun started, modelled from Horovod's documentation and sources (horovod/torch/mpi_ops.py,
functions.py; docs/api.rst):

- ``init()`` takes the rank and size mpirun gives the process (``OMPI_COMM_WORLD_RANK`` / ``_SIZE``, which
  PopRun's mpirun sets; 0 and 1 without them); every other call before ``init()`` raises ValueError
  "Horovod has not been initialized; use hvd.init().", as Horovod's ``rank()`` does.
- ``allgather(tensor)`` concatenates every rank's tensor along the first dimension, in rank order; the other
  dimensions and the dtype must agree. ``allreduce(tensor, average=None, op=None)`` averages (the default),
  sums, or takes the min or max. ``broadcast(tensor, root_rank)`` returns the root's value and
  ``broadcast_`` writes it in place; ``broadcast_parameters(state_dict, root_rank)`` broadcasts every
  tensor in place, in sorted name order, as functions.py does.
- Collectives match across ranks in the order each rank calls them; a rank that reaches the n-th collective
  with another operation or name than the others is refused with RuntimeError (Horovod reports "Mismatched
  ... operations"). Horovod would wait for a rank that never arrives (its stall check only warns); the
  stand-in raises RuntimeError after ``HOROVOD_STAND_IN_TIMEOUT`` seconds (60 by default) so that a test
  fails instead of hanging, naming the collective and the ranks missing.

Values go through files ``HOROVOD_STAND_IN_DIR/<n>.<rank>.pt`` (one per rank and collective, written
whole and renamed into place). ``calls`` lists (operation, name) of every collective of this process.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional

import torch

DIR_ENV = "HOROVOD_STAND_IN_DIR"
TIMEOUT_ENV = "HOROVOD_STAND_IN_TIMEOUT"

Average = "Average"
Sum = "Sum"
Min = "Min"
Max = "Max"

_state: Dict[str, Any] = {"rank": None, "size": None, "count": 0}
calls: List[tuple] = []
"""(operation, name) of every collective this process ran (test helper)."""


def init() -> None:
    _state["rank"] = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    _state["size"] = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    if _state["size"] > 1 and not os.environ.get(DIR_ENV):
        raise RuntimeError("horovod stand-in: %d processes need %s, the directory standing for the network"
                           % (_state["size"], DIR_ENV))


def is_initialized() -> bool:
    return _state["rank"] is not None


def shutdown() -> None:
    _state["rank"] = _state["size"] = None


def _need_init() -> None:
    if _state["rank"] is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")


def rank() -> int:
    _need_init()
    return int(_state["rank"])


def size() -> int:
    _need_init()
    return int(_state["size"])


def local_rank() -> int:
    _need_init()
    return int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))


def _exchange(op: str, name: Optional[str], tensor: torch.Tensor,
              senders: Optional[List[int]] = None) -> List[torch.Tensor]:
    """Every rank's tensor of this collective (only ``senders``' are read; all ranks write theirs)."""
    _need_init()
    n = _state["count"]
    _state["count"] += 1
    calls.append((op, name))
    me, world = _state["rank"], _state["size"]
    if world == 1:
        return [tensor.detach().clone()]
    directory = os.environ[DIR_ENV]
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "%06d.%d.pt" % (n, me))
    torch.save({"op": op, "name": name, "tensor": tensor.detach().cpu().clone()}, path + ".tmp")
    os.replace(path + ".tmp", path)
    wanted = list(range(world)) if senders is None else senders
    timeout = float(os.environ.get(TIMEOUT_ENV, "60"))
    deadline = time.monotonic() + timeout
    got: Dict[int, Dict[str, Any]] = {}
    pause = 0.002
    while True:
        for r in wanted:
            if r not in got:
                other = os.path.join(directory, "%06d.%d.pt" % (n, r))
                if os.path.exists(other):
                    got[r] = torch.load(other)
        if len(got) == len(wanted):
            break
        if time.monotonic() > deadline:
            missing = [r for r in wanted if r not in got]
            raise RuntimeError("horovod stand-in: rank %d waited %.0f s at collective #%d (%s %r) for rank(s) %s; "
                               "a real Horovod would hang here" % (me, timeout, n, op, name, missing))
        time.sleep(pause)
        pause = min(0.05, pause * 2)
    for r in wanted:
        if (got[r]["op"], got[r]["name"]) != (op, name):
            raise RuntimeError("horovod stand-in: mismatched operations at collective #%d: rank %d did %s %r, rank %d "
                               "did %s %r" % (n, me, op, name, r, got[r]["op"], got[r]["name"]))
    return [got[r]["tensor"] for r in wanted]


def allgather(tensor: torch.Tensor, name: Optional[str] = None) -> torch.Tensor:
    parts = _exchange("allgather", name, tensor)
    for r, part in enumerate(parts):
        if part.dtype != tensor.dtype or tuple(part.shape[1:]) != tuple(tensor.shape[1:]):
            raise RuntimeError("horovod stand-in: allgather %r: rank %d sent %s %s, rank %d %s %s" % (
                name, rank(), tensor.dtype, tuple(tensor.shape), r, part.dtype, tuple(part.shape)))
    return torch.cat(parts, dim=0)


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              op: Optional[str] = None) -> torch.Tensor:
    if op is None:
        op = Average if average is None or average else Sum
    stacked = torch.stack([p.to(tensor.dtype) for p in _exchange("allreduce", name, tensor)])
    if op == Average:
        return stacked.sum(0) / stacked.shape[0] if stacked.is_floating_point() else stacked.sum(0) // stacked.shape[0]
    if op == Sum:
        return stacked.sum(0)
    if op == Min:
        return stacked.min(0).values
    if op == Max:
        return stacked.max(0).values
    raise ValueError("horovod stand-in: unknown reduction %r" % (op,))


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor:
    (value,) = _exchange("broadcast", name, tensor, senders=[root_rank])
    if value.shape != tensor.shape or value.dtype != tensor.dtype:
        raise RuntimeError("horovod stand-in: broadcast %r: root sent %s %s, rank %d holds %s %s" % (
            name, value.dtype, tuple(value.shape), rank(), tensor.dtype, tuple(tensor.shape)))
    return value


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor:
    value = broadcast(tensor, root_rank, name)
    with torch.no_grad():
        tensor.copy_(value)
    return tensor


def broadcast_parameters(params, root_rank: int) -> None:
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    for name, p in params:
        broadcast_(p, root_rank, name)
