"""Checkpoints: atomic writes, full training state, phase-1 initialisation.

A step checkpoint is one file, run_dir/checkpoints/step_NNNNNNN.pt, written to a temporary file
in the same directory and renamed into place (os.replace is atomic on POSIX), so a kill leaves
either the old set of checkpoints or the new one, never a torn file. It holds a TrainingState
(train/state.py, where each field is described): the model, optimizer and scheduler states, the step,
the data position, every process's RNG states, the config, the dataset's facts and the last metrics.

Safety: a checkpoint holds only tensors and plain Python values (the numpy generator state is stored
as lists), so it is read with ``torch.load(weights_only=True)``: a crafted file given as
``checkpoint.init_from`` or dropped into checkpoints/ cannot run code when loaded. Its fields are
checked for type before use, and ``save_checkpoint`` refuses a state holding a non-finite tensor, so
a diverged run never leaves a poisoned "last good" checkpoint.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from .. import jsonin
from ..errors import one_line
from ..fsutil import atomic_open, fsync_directory, make_temp_dir, remove_stale_temporaries
from ..model.pretrained import load_tensors
from ..model.self_attention import hf_layout
from ..errors import UserError
from .state import TrainingState

_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


def checkpoint_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def list_checkpoints(run_dir: str) -> List[str]:
    """Step checkpoints in run_dir, oldest first."""
    directory = checkpoint_dir(run_dir)
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        match = _STEP_FILE.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(directory, name)))
    return [path for _, path in sorted(found)]


def latest_checkpoint(run_dir: str) -> Optional[str]:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


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


def atomic_torch_save(obj: Any, path: str) -> None:
    with atomic_open(path, "wb") as f:
        torch.save(obj, f)


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


class NonFiniteState(UserError):
    """The state to save holds inf or NaN (the run diverged): it is not written."""


def save_checkpoint(run_dir: str, state: TrainingState, keep: int) -> str:
    """Write ``state`` as step_<step>.pt atomically (fsync of file and directory), then delete all but the
    newest `keep`. Raises NonFiniteState, writing nothing, if a model or optimizer tensor is not finite."""
    bad = non_finite_tensors({"model": state.model, "optimizer": state.optimizer})
    if bad:
        raise NonFiniteState(
            "step %d: %d tensors hold inf or NaN (first: %s)" % (int(state.step), len(bad), bad[0])
        )
    directory = checkpoint_dir(run_dir)
    path = os.path.join(directory, "step_%07d.pt" % int(state.step))
    atomic_torch_save(state.to_dict(), path)
    for old in list_checkpoints(run_dir)[:-keep]:
        os.unlink(old)
    fsync_directory(directory)
    return path


def clean_run_directory(run_dir: str) -> int:
    """Remove the temporary files a killed writer left in run_dir and its checkpoints/ (under the run lock)."""
    return remove_stale_temporaries(run_dir) + remove_stale_temporaries(checkpoint_dir(run_dir))


def load_checkpoint(path: str) -> TrainingState:
    """A step checkpoint, read without running code (weights_only) and checked field by field."""
    if not os.path.isfile(path):
        raise UserError("checkpoint not found: %s" % (path,))
    try:
        state = load_tensors(path)
    except Exception as exc:  # a truncated or foreign file, or a pickle that wants to run code
        raise UserError("checkpoint %s is unreadable or not a plain tensor checkpoint (%s: %s)"
                        % (path, type(exc).__name__, one_line(exc)[:160]))
    loaded = TrainingState.from_dict(state, path)  # the fields and their types
    if loaded.step < 0:
        raise UserError("checkpoint %s: field 'step' must be >= 0, got %d" % (path, loaded.step))
    bad = [k for k, v in loaded.model.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise UserError("checkpoint %s: model entry %r is not a tensor" % (path, bad[0]))
    if isinstance(loaded.data, dict):
        for key in ("epoch", "step_in_epoch"):
            value = loaded.data.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError("checkpoint %s: field data.%s must be an integer >= 0" % (path, key))
    check_loaded_state(path, state)  # the values: generator states, finite tensors, record fields
    return loaded


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


def check_loaded_state(path: str, state: Dict[str, Any]) -> None:
    """The values of a loaded step checkpoint, before any is used: generator states that set_rng_state takes
    (``rng`` and each of ``rng_per_rank``), finite model and optimizer tensors, the record fields (config,
    dataset, metrics) mappings. A problem is one UserError line naming the file and the field."""
    if "rng" in state:
        problem = _rng_problem(state["rng"])
        if problem:
            raise UserError("checkpoint %s: field rng %s; the file is damaged or not of this app" % (path, problem))
    per_rank = state.get("rng_per_rank")
    if per_rank is not None:
        if not isinstance(per_rank, (list, tuple)):
            raise UserError("checkpoint %s: field rng_per_rank is %s, not a list" % (path, type(per_rank).__name__))
        for i, rng in enumerate(per_rank):
            problem = _rng_problem(rng)
            if problem:
                raise UserError("checkpoint %s: field rng_per_rank[%d] %s" % (path, i, problem))
    for name in ("config", "dataset", "metrics"):
        if state.get(name) is not None and not isinstance(state[name], dict):
            raise UserError("checkpoint %s: field %s must be a mapping, got %s"
                            % (path, name, type(state[name]).__name__))
    bad = [key for key, value in state["model"].items() if not (value.is_floating_point() or value.dtype in (
        torch.int64, torch.int32, torch.uint8, torch.bool))]
    if bad:
        raise UserError("checkpoint %s: model tensor %r has dtype %s" % (path, bad[0], state["model"][bad[0]].dtype))
    bad = non_finite_tensors({"model": state["model"], "optimizer": state.get("optimizer")})
    if bad:
        raise UserError("checkpoint %s: %d tensors hold inf or NaN (first: %s)" % (path, len(bad), bad[0]))


def is_hf_dir(path: str) -> bool:
    if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "config.json")):
        return False
    return any(
        os.path.isfile(os.path.join(path, name))
        for name in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                     "pytorch_model.bin.index.json")
    )


def load_phase1_weights(model: torch.nn.Module, source: str, model_cls) -> Optional[str]:
    """Copy phase-1 weights from `source` into `model`. Returns the vocab.txt beside them, if any.

    `source` is a Hugging Face BERT directory (ours from export, or transformers'), one of our
    step checkpoints, or one of our run directories (its latest checkpoint)."""
    if os.path.isdir(source) and is_hf_dir(source):
        try:
            loaded = model_cls.from_pretrained(source)
        except Exception as exc:
            raise UserError("cannot load phase-1 weights from %s (%s: %s)"
                            % (source, type(exc).__name__, one_line(exc)[:300]))
        _check_same_architecture(model, loaded, source)
        model.load_state_dict(loaded.state_dict())
        vocab = os.path.join(source, "vocab.txt")
        return vocab if os.path.isfile(vocab) else None
    path = source
    if os.path.isdir(source):
        path = latest_checkpoint(source)
        if path is None:
            raise UserError("checkpoint.init_from %s holds neither a Hugging Face BERT (config.json + weights) "
                            "nor checkpoints" % (source,))
    state = load_checkpoint(path)
    check_state_shapes(model, state.model, path)
    model.load_state_dict(state.model)
    return None


def _check_same_architecture(model: torch.nn.Module, loaded: torch.nn.Module, source: str) -> None:
    check_state_shapes(model, loaded.state_dict(), source)


def check_state_shapes(model: torch.nn.Module, state: Dict[str, torch.Tensor], source: str) -> None:
    # compared in transformers' layout: the model loads query/key/value or a fused qkv alike (model.fused_qkv)
    own, state = hf_layout(model.state_dict()), hf_layout(state)
    missing = [k for k in own if k not in state]
    if missing:
        raise UserError("weights in %s do not match the model: missing %s" % (source, missing[0]))
    for key, value in own.items():
        if tuple(state[key].shape) != tuple(value.shape):
            raise UserError(
                "weights in %s do not match the model config: %s has shape %s, the model wants %s"
                % (source, key, tuple(state[key].shape), tuple(value.shape))
            )


def export_hf(model, directory: str, vocab_path: Optional[str] = None) -> str:
    """Save the model as a Hugging Face BertForPreTraining directory, atomically (temp dir + rename)."""
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    tmp = make_temp_dir("." + os.path.basename(directory) + ".", parent)  # 0777 & ~umask: an export is shared
    try:
        model.save_pretrained(tmp)
        if vocab_path and os.path.isfile(vocab_path):
            shutil.copyfile(vocab_path, os.path.join(tmp, "vocab.txt"))
            from .data import write_tokenizer_files  # the tokenizer config of the dataset's casing

            write_tokenizer_files(tmp, vocab_path)
        old = None
        if os.path.exists(directory):
            old = directory + ".old"
            if os.path.exists(old):
                shutil.rmtree(old)
            os.replace(directory, old)
        os.replace(tmp, directory)
        fsync_directory(parent)
        if old:
            shutil.rmtree(old)
    except BaseException:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        raise
    return directory


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    if not os.path.isfile(path):
        return []
    out = []
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(jsonin.loads(line))
    return out

