"""TrainingState: everything a step checkpoint holds, the one statement of its schema.

The training loop builds one at every checkpoint (train/loop.py) and ``checkpoint.save_checkpoint`` writes
``to_dict()``; ``checkpoint.load_checkpoint`` reads the file back through ``from_dict``, which checks every
field's type before anything uses it. On disk a checkpoint is the plain dict of the fields below, in this
order, with tensors and plain Python values only (read with ``torch.load(weights_only=True)``); a field that
is None is left out. Resuming restores all of it, which makes a resumed run bitwise identical to an
uninterrupted one on CPU (tests/test_train_loop.py::test_resume_after_kill_gives_bitwise_the_same_losses).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..errors import UserError


def _is(*types: type, what: str) -> Dict[str, Any]:
    """A field's check: the types its value may have on disk, and how a refusal describes them."""
    return {"types": types, "what": what}


@dataclass
class TrainingState:
    step: int = field(metadata=_is(int, what="an integer"))
    """Optimizer steps done."""
    model: Dict[str, torch.Tensor] = field(metadata=_is(dict, what="a state dict"))
    """The model's state dict (every weight: the runner syncs them first)."""
    optimizer: Optional[Dict[str, Any]] = field(default=None, metadata=_is(dict, what="a state dict"))
    """The optimizer's state dict as the runner keeps it: on IPUs poptorch's, read back from the device."""
    scheduler: Optional[Dict[str, Any]] = field(default=None, metadata=_is(dict, what="a state dict"))
    data: Optional[Dict[str, int]] = field(default=None, metadata=_is(dict, what="a mapping"))
    """{"epoch", "step_in_epoch"}: where the next batch comes from."""
    rng: Optional[Dict[str, Any]] = field(default=None, metadata=_is(dict, what="a mapping"))
    """The first process's python, numpy and torch generator states (checkpoint.rng_state)."""
    rng_per_rank: Optional[List[Dict[str, Any]]] = field(default=None, metadata=_is(list, what="a list"))
    """Every torch process's generator states, by rank: each pipeline stage draws its own dropout."""
    config: Optional[Dict[str, Any]] = field(default=None, metadata=_is(dict, what="a mapping"))
    """The parsed config as a dict (PretrainingConfig.to_dict)."""
    dataset: Optional[Dict[str, Any]] = field(default=None, metadata=_is(dict, what="a mapping"))
    """The dataset facts the run was trained on (TrainingData.fingerprint: S, K, vocabulary)."""
    metrics: Optional[Dict[str, Any]] = field(default=None, metadata=_is(dict, what="a mapping"))
    """The checkpointed step's StepRecord, as a dict."""

    RESUMED_FROM = ("optimizer", "scheduler", "data", "rng")
    """Fields a run resumes from, beyond the step and the model (a phase-1 init needs the model only)."""

    def to_dict(self) -> Dict[str, Any]:
        """What is written: every field that is not None, in field order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, state: Any, path: str) -> "TrainingState":
        """The state a checkpoint file at ``path`` held, checked field by field (UserError, one line, naming
        the field); keys of no field are left out."""
        if not isinstance(state, dict) or "model" not in state or "step" not in state:
            raise UserError("checkpoint %s is not a training checkpoint of this app" % (path,))
        for f in dataclasses.fields(cls):
            value = state.get(f.name)
            if value is None and f.name not in ("step", "model"):
                continue
            if isinstance(value, bool) or not isinstance(value, f.metadata["types"]):
                raise UserError("checkpoint %s: field %r must be %s, got %s"
                                % (path, f.name, f.metadata["what"], type(value).__name__))
        if state["step"] < 0:
            raise UserError("checkpoint %s: field 'step' must be >= 0, got %d" % (path, state["step"]))
        bad = [k for k, v in state["model"].items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
        if bad:
            raise UserError("checkpoint %s: model entry %r is not a tensor" % (path, bad[0]))
        data = state.get("data")
        if data is not None:
            for key in ("epoch", "step_in_epoch"):
                if isinstance(data.get(key), bool) or not isinstance(data.get(key), int) or data[key] < 0:
                    raise UserError("checkpoint %s: field data.%s must be an integer >= 0" % (path, key))
        return cls(**{f.name: state.get(f.name) for f in dataclasses.fields(cls)})

    def check_resumable(self, path: str) -> None:
        """Refuse (UserError, one line) a checkpoint that lacks what a resumed run restores."""
        missing = [name for name in self.RESUMED_FROM if getattr(self, name) is None]
        if missing:
            raise UserError("checkpoint %s has no %s: a run cannot resume from it (checkpoint.init_from takes "
                            "its weights)" % (path, ", ".join(missing)))

    @property
    def position(self) -> Tuple[int, int]:
        """(epoch, batch of the epoch) where the next batch comes from."""
        return int(self.data["epoch"]), int(self.data["step_in_epoch"])

    def rng_for(self, rank: int) -> Dict[str, Any]:
        """The generator states process ``rank`` resumes with: its own; the first process's where the
        checkpoint has fewer processes' (a run resumed on more processes than it was saved from)."""
        per_rank = self.rng_per_rank or [self.rng]
        return per_rank[rank] if rank < len(per_rank) else self.rng


__all__ = ["TrainingState"]
