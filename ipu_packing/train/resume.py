"""Resuming a run: which checkpoint to continue from, and what a resume may not change.

A run continues from its directory's latest checkpoint (``checkpoint.resume=auto``) only if every
fingerprint the checkpoint records matches (train/fingerprints.py: the dataset's identity, the vocabulary,
every model.* key, the seed, the optimizer, the schedule, the step count and the batch): anything else
would silently mix two runs (resuming with a new lr used to train at the old schedule's lr while
config.json showed the new one). ``checkpoint.resume=force`` continues anyway, with the new values, and
records what it changed in RUN/forced_changes.jsonl. S, K, the vocabulary and the qkv layout cannot change
even so (`check_resume_matches`).
"""

from __future__ import annotations

import os
import warnings
from typing import Optional

from . import checkpoint as ckpt
from .config import PretrainingConfig
from .data import TrainingData
from ..errors import UserError
from .state import TrainingState

def load_with_new_hyperparameters(optimizer, scheduler, state: TrainingState) -> None:
    """A forced resume: the moments and step counts come from the checkpoint, every hyperparameter (lr,
    betas, eps, weight decay) and the schedule from the new config, fast-forwarded to the checkpoint's step."""
    fresh = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(state.optimizer)
    for group, values in zip(optimizer.param_groups, fresh):
        group.update(values)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler")
        for _ in range(int(state.step)):
            scheduler.step()


def resolve_resume(config: PretrainingConfig) -> Optional[str]:
    mode = config.checkpoint.resume
    latest = ckpt.latest_checkpoint(config.run_dir)
    if mode in ("auto", "force"):
        return latest
    if mode == "never":
        if latest is not None:
            raise UserError(
                "run directory %s already has checkpoints (%s); use checkpoint.resume=auto or another "
                "checkpoint.output_dir" % (config.run_dir, os.path.basename(latest))
            )
        return None
    if os.path.isdir(mode):
        found = ckpt.latest_checkpoint(mode)
        if found is None:
            raise UserError("checkpoint.resume: %s holds no checkpoints" % (mode,))
        return found
    if not os.path.isfile(mode):
        raise UserError("checkpoint.resume: %s is neither auto, never, nor an existing checkpoint" % (mode,))
    return mode


def check_resume_matches(config: PretrainingConfig, data: TrainingData, state: TrainingState, path: str) -> None:
    old = state.dataset or {}
    for key in ("max_seq_length", "max_sequences_per_pack", "vocab_size", "vocab_sha256"):
        if key in old and old[key] != data.fingerprint()[key]:
            raise UserError(
                "checkpoint %s was trained on a dataset with %s=%r, this dataset has %r"
                % (path, key, old[key], data.fingerprint()[key])
            )
    fused = bool(((state.config or {}).get("model") or {}).get("fused_qkv", False))
    if fused != bool(config.model.get("fused_qkv", False)):
        # the weights would load in either layout, but the optimizer's moments are per tensor: one fused
        # qkv tensor per layer against three
        raise UserError(
            "checkpoint %s was trained with model.fused_qkv=%s, this config has %s: the optimizer state does not "
            "carry over; start a new run with checkpoint.init_from=%s (its weights load in either layout)"
            % (path, str(fused).lower(), str(not fused).lower(), path)
        )
    if int(state.step) > config.training.steps:
        raise UserError("checkpoint %s is at step %d, beyond training.steps=%d: it is an earlier, longer run's "
                        "(%s); set checkpoint.output_dir to train this one in a directory of its own"
                        % (path, state.step, config.training.steps, config.run_dir))
