"""PopRun instances that agree, or refuse; the step metrics of the whole run.

Every PopRun instance plans its run alone: it resolves ``checkpoint.resume`` from its own view of the run
directory and builds (or loads) its own weights. Before the first step the instances exchange what they
start from (``agree_on_start``), through the ``InstanceGroup`` of execution/popdist_backend.py:

- the step (a resumed checkpoint's, else 0) and whether it was resumed: instances that would start from
  different steps stop, every one, in one line naming each instance's start. Such a run would mix two
  trainings on one device-wide gradient reduction, or hang when one instance ran out of steps first;
- a sha256 of the weights (``weights_digest``: every tensor of the state dict, by sorted name, with its
  dtype and shape). With horovod.torch, instance 0's weights are then broadcast to the others
  (``hvd.broadcast_parameters``, as Graphcore's app does), so a fresh start agrees even where equal seeds
  did not give equal weights; a resumed start must already agree, since the optimizer state the checkpoint
  restores is not broadcast. Without horovod (the directory fallback) the weights must agree as they are;
- then, once instance 0 tried to take the run directory's lock, whether each instance is ready
  (``agree_ready``): when instance 0 cannot take it, every instance stops.

Every host call the instances then reduce their share of the step (``reduce_step``): losses and accuracies
averaged (each instance holds the same number of replicas), sequences, tokens and packs summed, the step's
seconds and the compile seconds the slowest instance's. Without horovod that exchange would go through the
file system every host call; the fallback does not, and a record says how many instances it covers.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from ..errors import UserError


class InstancesDisagree(UserError):
    """PopRun instances would start from different steps or weights."""


def weights_digest(state_dict: Dict[str, Any]) -> str:
    """sha256 over every tensor of ``state_dict`` in sorted name order: name, dtype, shape, then the bytes."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        value = state_dict[name]
        if not isinstance(value, torch.Tensor):
            h.update(("%s=%r;" % (name, value)).encode())
            continue
        t = value.detach().cpu().contiguous()
        h.update(("%s:%s:%s;" % (name, str(t.dtype), list(t.shape))).encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


_WORDS = 8  # the digest as 8 words of 32 bits: exact in a float64 row


def _digest_words(digest: str) -> List[float]:
    return [float(int(digest[8 * i : 8 * i + 8], 16)) for i in range(_WORDS)]


def _words_digest(words: Sequence[float]) -> str:
    return "".join("%08x" % int(w) for w in words)


def _group(indices: List[int]) -> str:
    return ("instance %d" % indices[0]) if len(indices) == 1 else "instances %s" % ", ".join(str(i) for i in indices)


def _start(resumed: bool, step: int, plural: bool) -> str:
    if resumed:
        return ("resume step %d" if plural else "resumes step %d") % step
    return ("start at step %d" if plural else "starts at step %d") % step


def agree_on_start(group, step: int, resumed: bool, model: torch.nn.Module,
                   log: Callable[[str], None] = lambda m: None) -> None:
    """Exchange (step, resumed, weights digest) with every instance and raise InstancesDisagree (one line
    naming the instances) unless all agree; then, with horovod, broadcast instance 0's weights into
    ``model``. Runs before anything is written."""
    digest = weights_digest(model.state_dict())
    row = [float(step), 1.0 if resumed else 0.0] + _digest_words(digest)
    rows = group.allgather(row, name="ipu_packing.start")
    starts = [(bool(r[1]), int(r[0])) for r in rows]
    if len(set(s for _, s in starts)) > 1:
        parts = []  # type: List[str]
        seen = []  # type: List[Any]
        for start in starts:
            if start not in seen:
                seen.append(start)
                indices = [i for i, s in enumerate(starts) if s == start]
                parts.append("%s %s" % (_group(indices), _start(start[0], start[1], len(indices) > 1)))
        raise InstancesDisagree("PopRun instances disagree on where to start: %s (is checkpoint.output_dir on "
                                "storage every host shares?)" % ", ".join(parts))
    digests = [_words_digest(r[2 : 2 + _WORDS]) for r in rows]
    fresh = not any(resumed for resumed, _ in starts)
    if len(set(digests)) > 1 and not (fresh and group.broadcasts):
        parts = []
        for d in dict.fromkeys(digests):
            parts.append("%s sha256 %s" % (_group([i for i, x in enumerate(digests) if x == d]), d[:12]))
        why = ("each instance resumed its own copy of the checkpoint: is checkpoint.output_dir on storage every "
               "host shares?" if not fresh else
               "equal seeds built different weights, or checkpoint.init_from differs between hosts; with "
               "horovod.torch instance 0's would be broadcast")
        raise InstancesDisagree("PopRun instances disagree on the weights at step %d: %s (%s)"
                                % (step, ", ".join(parts), why))
    if group.broadcasts:
        group.broadcast_parameters(model.state_dict())
        after = weights_digest(model.state_dict())
        log("PopRun: %d instances start at step %d from instance 0's weights (sha256 %s, broadcast through %s)"
            % (group.num_instances, step, after[:12], group.transport))
    else:
        log("PopRun: %d instances start at step %d from the same weights (sha256 %s, checked through %s)"
            % (group.num_instances, step, digest[:12], group.transport))


def agree_ready(group, refused: Optional[UserError]) -> None:
    """After instance 0 tried to take the run directory's lock: raise ``refused`` (this instance's own reason
    not to start), or InstancesDisagree where another instance could not start, so that all stop together."""
    rows = group.allgather([0.0 if refused is not None else 1.0], name="ipu_packing.ready")
    if refused is not None:
        raise refused
    not_ready = [i for i, r in enumerate(rows) if r[0] != 1.0]
    if not_ready:
        raise InstancesDisagree("PopRun %s could not start (%s error line says why): every instance stops"
                                % (_group(not_ready), "its" if len(not_ready) == 1 else "their"))


STEP_FIELDS = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy",
               "sequences", "tokens", "packs", "seconds", "compile_seconds")
_MEAN = 5  # the first five are averaged over instances
_SUM = ("sequences", "tokens", "packs")


def reduce_step(group, values: Dict[str, float], calls: int) -> Dict[str, float]:
    """The whole step from each instance's ``values`` (STEP_FIELDS): means of the losses and accuracies,
    sums of sequences, tokens and packs, the maximum of the seconds; plus ``instances``, how many instances
    the result covers (1 where there is no group, or the group cannot exchange every host call)."""
    if group is None or not group.reduces_metrics:
        out = dict(values)
        out["instances"] = 1
        return out
    rows = group.allgather([float(values[k]) for k in STEP_FIELDS], name="ipu_packing.step.%d" % calls)
    out = {}  # type: Dict[str, float]
    for j, key in enumerate(STEP_FIELDS):
        column = [r[j] for r in rows]
        if j < _MEAN:
            out[key] = sum(column) / len(column)
        elif key in _SUM:
            out[key] = sum(column)
        else:
            out[key] = max(column)
    out["instances"] = len(rows)
    return out


__all__ = ["InstancesDisagree", "STEP_FIELDS", "agree_on_start", "agree_ready", "reduce_step", "weights_digest"]
