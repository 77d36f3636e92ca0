"""TrainingState: everything a step checkpoint holds, the one statement of its schema and its one validation.

The training loop builds one at every checkpoint (train/loop.py) and the run directory (train/run_dir.py)
writes ``to_dict()``; reading a file back goes through ``TrainingState.load``, which reads it without running
code (``torch.load(weights_only=True)``: a crafted file given as ``checkpoint.init_from`` or dropped into
checkpoints/ cannot run code) and checks every field, its type and its values, before anything uses it. On
disk a checkpoint is the plain dict of the fields below, in this order, with tensors and plain Python values
only; a field that is None is left out. Resuming restores all of it, which makes a resumed run bitwise
identical to an uninterrupted one on CPU (tests/test_train_loop.py).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..errors import UserError, one_line


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
    """The first process's python, numpy and torch generator states (``rng_state``)."""
    rng_per_rank: Optional[List[Dict[str, Any]]] = field(default=None, metadata=_is(list, what="a list"))
    """Every torch process's generator states, by rank: each pipeline stage draws its own dropout."""
    config: Optional[Dict[str, Any]] = field(default=None, metadata=_is(dict, what="a mapping"))
    """The parsed config as a dict (RunConfig.to_dict)."""
    dataset: Optional[Dict[str, Any]] = field(default=None, metadata=_is(dict, what="a mapping"))
    """What the run records about its data and batch (train/fingerprint.py: the recorded fingerprint)."""
    metrics: Optional[Dict[str, Any]] = field(default=None, metadata=_is(dict, what="a mapping"))
    """The checkpointed step's StepRecord, as a dict."""

    RESUMED_FROM = ("optimizer", "scheduler", "data", "rng")
    """Fields a run resumes from, beyond the step and the model (a phase-1 init needs the model only)."""

    def to_dict(self) -> Dict[str, Any]:
        """What is written: every field that is not None, in field order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def load(cls, path: str) -> "TrainingState":
        """The step checkpoint at ``path``, read without running code and checked (``from_dict``)."""
        import os

        from ..model.pretrained import load_tensors

        if not os.path.isfile(path):
            raise UserError("checkpoint not found: %s" % (path,))
        verify_checksums(path)
        try:
            raw = load_tensors(path)
        except Exception as exc:  # a truncated or foreign file, or a pickle that wants to run code
            raise UserError("checkpoint %s is unreadable or not a plain tensor checkpoint (%s: %s)"
                            % (path, type(exc).__name__, one_line(exc)[:160]))
        return cls.from_dict(raw, path)

    @classmethod
    def from_dict(cls, state: Any, path: str) -> "TrainingState":
        """The state a checkpoint file at ``path`` held, checked field by field (UserError, one line, naming the
        file and the field): the types, then the values (generator states that ``set_rng_state`` takes, model
        tensors of numeric dtypes, every model and optimizer tensor finite, a data position of integers >= 0).
        Keys of no field are left out."""
        if not isinstance(state, dict) or "model" not in state or "step" not in state:
            raise UserError("checkpoint %s is not a training checkpoint of this app" % (path,))
        for f in dataclasses.fields(cls):
            value = state.get(f.name)
            if value is None and f.name not in ("step", "model"):
                continue
            if isinstance(value, bool) or not isinstance(value, f.metadata["types"]):
                raise UserError("checkpoint %s: field %r must be %s, got %s"
                                % (path, f.name, f.metadata["what"], type(value).__name__))
        problem = _value_problem(state)
        if problem:
            raise UserError("checkpoint %s: %s" % (path, problem))
        return cls(**{f.name: state.get(f.name) for f in dataclasses.fields(cls)})

    def check_resumable(self, path: str) -> None:
        """Refuse (UserError, one line) a checkpoint that lacks what a resumed run restores."""
        missing = [name for name in self.RESUMED_FROM if getattr(self, name) is None]
        if missing:
            raise UserError("checkpoint %s has no %s: a run cannot resume from it (checkpoint.init_from takes "
                            "its weights)" % (path, ", ".join(missing)))

    @property
    def position(self) -> Tuple[int, int]:
        """(epoch, step_in_epoch): where the next batch comes from."""
        return int(self.data["epoch"]), int(self.data["step_in_epoch"])

    def rng_for(self, rank: int) -> Dict[str, Any]:
        """The generator states process ``rank`` resumes with: its own; the first process's where the
        checkpoint has fewer processes' (a run resumed on more processes than it was saved from)."""
        per_rank = self.rng_per_rank or [self.rng]
        return per_rank[rank] if rank < len(per_rank) else self.rng


# ---- the checksums of a file ---------------------------------------------------------------------------------


def verify_checksums(path: str) -> None:
    """Refuse (UserError, one line naming the file and the damaged record) a checkpoint whose bytes are not those
    written: ``torch.save`` writes a zip archive whose every record (the pickle, each tensor's storage) carries the
    CRC-32 of its bytes, computed as it was written; every record is read back and checked against it, so one
    flipped bit anywhere in the data is refused (CRC-32 detects every error of up to 3 bits). A file that is not
    such an archive (truncated, or saved without the zip format) has no checksums and is refused as unreadable."""
    import zipfile

    from ..fsutil import open_regular

    with open_regular(path, "rb", error=UserError) as f:
        try:
            archive = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, EOFError, OSError) as exc:
            raise UserError("checkpoint %s is unreadable or not a plain tensor checkpoint (not a torch zip archive "
                            "with checksums: %s)" % (path, one_line(exc)[:160]))
        with archive:
            for info in archive.infolist():
                try:
                    with archive.open(info) as member:
                        while member.read(1 << 24):
                            pass
                except (zipfile.BadZipFile, EOFError, OSError, NotImplementedError) as exc:
                    raise UserError("checkpoint %s fails its checksum at record %s (%s): the file is damaged; resume "
                                    "from another checkpoint or restore it" % (path, info.filename,
                                                                               one_line(exc)[:120]))


# ---- the values of a state ----------------------------------------------------------------------------------


def non_finite_tensors(obj: Any, prefix: str = "") -> List[str]:
    """Dotted names of the floating-point tensors in ``obj`` (nested dicts/lists) holding inf or NaN."""
    found = []  # type: List[str]
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() and obj.numel() and not bool(torch.isfinite(obj).all()):
            found.append(prefix or "<tensor>")
    elif isinstance(obj, dict):
        for key, value in obj.items():
            found += non_finite_tensors(value, "%s.%s" % (prefix, key) if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            found += non_finite_tensors(value, "%s[%d]" % (prefix, i))
    return found


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _rng_problem(rng: Any) -> Optional[str]:
    """Why ``rng`` (a checkpoint's generator states) cannot be restored by set_rng_state, or None."""
    if not isinstance(rng, dict):
        return "is %s, not a mapping" % type(rng).__name__
    missing = [key for key in ("python", "numpy", "torch") if key not in rng]
    if missing:
        return "lacks %s (python, numpy and torch generator states)" % ", ".join(missing)
    python, numpy_state, torch_state = rng["python"], rng["numpy"], rng["torch"]
    if not (isinstance(python, (list, tuple)) and len(python) == 3 and python[0] == 3
            and isinstance(python[1], (list, tuple)) and len(python[1]) == 625
            and all(_is_int(v, 0, 1 << 32) for v in python[1]) and (python[2] is None or isinstance(python[2], float))):
        return "python is not a Python generator state (version 3, 625 words, gauss)"
    if not (isinstance(numpy_state, (list, tuple)) and len(numpy_state) == 5 and numpy_state[0] == "MT19937"
            and isinstance(numpy_state[1], (list, tuple)) and len(numpy_state[1]) == 624
            and all(_is_int(v, 0, 1 << 32) for v in numpy_state[1]) and _is_int(numpy_state[2], 0, 625)
            and numpy_state[3] in (0, 1) and isinstance(numpy_state[4], float) and np.isfinite(numpy_state[4])):
        return "numpy is not a numpy MT19937 state (name, 624 words, position <= 624, has_gauss, gauss)"
    size = torch.get_rng_state().numel()
    if not (isinstance(torch_state, torch.Tensor) and torch_state.dtype == torch.uint8
            and tuple(torch_state.shape) == (size,)):
        return "torch is not a torch CPU generator state (a uint8 tensor of %d bytes)" % size
    return None


_MODEL_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool)
"""Non-float dtypes a model tensor may have (buffers)."""


def _value_problem(state: Dict[str, Any]) -> Optional[str]:
    """What is wrong with the values of a type-checked state dict, as "field ... " words, or None."""
    if state["step"] < 0:
        return "field 'step' must be >= 0, got %d" % (state["step"],)
    bad = [k for k, v in state["model"].items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        return "model entry %r is not a tensor" % (bad[0],)
    data = state.get("data")
    if data is not None:
        for key in ("epoch", "step_in_epoch"):
            if isinstance(data.get(key), bool) or not isinstance(data.get(key), int) or data[key] < 0:
                return "field data.%s must be an integer >= 0" % (key,)
    if state.get("rng") is not None:
        problem = _rng_problem(state["rng"])
        if problem:
            return "field rng %s; the file is damaged or not of this app" % (problem,)
    for i, rng in enumerate(state.get("rng_per_rank") or []):
        problem = _rng_problem(rng)
        if problem:
            return "field rng_per_rank[%d] %s" % (i, problem)
    bad = [key for key, value in state["model"].items()
           if not (value.is_floating_point() or value.dtype in _MODEL_DTYPES)]
    if bad:
        return "model tensor %r has dtype %s" % (bad[0], state["model"][bad[0]].dtype)
    bad = non_finite_tensors({"model": state["model"], "optimizer": state.get("optimizer")})
    if bad:
        return "%d tensors hold inf or NaN (first: %s)" % (len(bad), bad[0])
    return None


# ---- generator states -----------------------------------------------------------------------------------------


def rng_state() -> Dict[str, Any]:
    """Python, numpy and torch generator states, as tensors and plain values only (weights_only-safe)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    numpy_state = [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}


def set_rng_state(state: Dict[str, Any]) -> None:
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])


__all__ = ["TrainingState", "non_finite_tensors", "rng_state", "set_rng_state", "verify_checksums"]
