"""Planning a run: every check that can fail on user input, and the objects training starts from.

`plan_run(config)` checks the backend, the config, the dataset, the phase-1 weights and the resume
checkpoint, builds the model, optimizer and schedule (restored from the checkpoint when resuming), and
writes nothing. The training loop (train/loop.py) then runs the RunPlan.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from . import checkpoint as ckpt
from .config import BatchAccounting, PretrainingConfig
from .data import TrainingData, check_data_matches, open_shards, read_training_data
from ..errors import one_line
from ..errors import ConfigError, UserError
from .optim import build_optimizer, build_scheduler
from .phase1 import check_init_from, load_init_from
from .finished import check_finished
from .fingerprints import Difference, recorded_fingerprint, refuse_or_force, resume_differences
from .resume import check_resume_matches, load_with_new_hyperparameters, resolve_resume
from .state import TrainingState


@dataclass
class RunPlan:
    """A checked run, ready to train (train/loop.py:execute)."""

    config: PretrainingConfig
    data: TrainingData
    accounting: BatchAccounting
    """The batch as run for the dataset's packing factor (accounting.execution: the ExecutionConfig)."""
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    resume_state: Optional[TrainingState]
    """The checkpoint the run resumes from (its model, optimizer and scheduler already loaded), or None."""
    resume_path: Optional[str]
    steps_per_epoch: int
    """Optimizer steps in an epoch: whole host calls of whole global batches."""
    changed_on_resume: List[str] = dataclasses.field(default_factory=list)
    """Keys a forced resume changed (checkpoint.resume=force); empty otherwise."""
    forced: List[Difference] = dataclasses.field(default_factory=list)
    """What a forced resume changed: (key, the checkpoint's value, this run's), as changed_on_resume."""
    fingerprint: Dict[str, Any] = dataclasses.field(default_factory=dict)
    """What every checkpoint of this run records about its data and batch (fingerprints.recorded_fingerprint)."""
    finished: Optional[Dict[str, Any]] = None
    """The summary of the finished run the run directory holds, asked for again as it was (finished.py):
    then nothing is trained or written."""

    @property
    def run_dir(self) -> str:
        return self.config.run_dir

    @property
    def start_step(self) -> int:
        return int(self.resume_state.step) if self.resume_state else 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def model_defaults() -> Dict[str, Any]:
    """Every model.* key's default (the loader's): a key a config leaves out has this value."""
    from .model_section import BERT_CONFIG_FIELDS, MODEL_OPTION_FIELDS

    return dict(BERT_CONFIG_FIELDS + MODEL_OPTION_FIELDS)


def model_class():
    from ipu_packing.model import PackedBertForPreTraining

    return PackedBertForPreTraining


def check_backend(config: PretrainingConfig) -> None:
    """Refuse, before any model is built, a backend this machine or this model cannot run (poptorch
    without the Poplar SDK, or with an attention PopTorch cannot trace; CUDA that is not there; a
    multi-process config started without torchrun): one-line UserError."""
    if config.execution_spec.backend != "poptorch":
        from ipu_packing.execution.runner_common import check_launch

        check_launch(config.execution_spec)
        return
    from ipu_packing.execution.poptorch_backend import check_backend as check_poptorch
    from ipu_packing.model.attention import resolve_attention

    try:
        attention = resolve_attention(config.bert_config())
    except ValueError as exc:
        raise ConfigError("model: %s" % (exc,))
    check_poptorch(attention, config.execution_spec)  # ConfigError, BackendUnavailable, LaunchError: one line


def plan_run(config: PretrainingConfig, open_dataset: Optional[Callable] = None) -> RunPlan:
    """Check inputs and build model, optimizer and schedule. Writes nothing."""
    check_backend(config)
    data = read_training_data(config.data.path)
    check_data_matches(config, data)
    accounting = config.batch_accounting(data.packing_factor)
    per_step = accounting.global_batch_packs
    calls = accounting.execution.optimizer_steps_per_call
    steps_per_epoch = (data.num_packs // per_step) // calls * calls
    if steps_per_epoch < 1:
        raise UserError(
            "dataset %s has %d packs, fewer than one step's %d (micro batch %d x accumulation %d x replicas %d)"
            % (
                data.path,
                data.num_packs,
                per_step,
                accounting.execution.micro_batch_size,
                accounting.gradient_accumulation,
                accounting.execution.replication_factor,
            )
        )

    resume_path = resolve_resume(config)
    resume_state = ckpt.load_checkpoint(resume_path) if resume_path else None
    fingerprint = recorded_fingerprint(data, accounting)
    forced = []  # type: List[Difference]
    if resume_state is not None:
        resume_state.check_resumable(resume_path)
        check_resume_matches(config, data, resume_state, resume_path)
        forced = resume_differences(resume_state, config.to_dict(), fingerprint, model_defaults())
        refuse_or_force(forced, resume_path, config.checkpoint.resume == "force")
    changed = [key for key, _, _ in forced]
    finished = check_finished(config, resume_path, resume_state, forced)  # a finished run is never rewritten

    if config.checkpoint.init_from and resume_state is None:
        check_init_from(config, data)  # exists, and was trained on the dataset's vocabulary
    open_shards(data, open_dataset)
    if config.training.num_threads:
        torch.set_num_threads(config.training.num_threads)
    seed_everything(config.training.seed)
    model_cls = model_class()
    try:
        model = model_cls(config.bert_config())
    except ValueError as exc:  # the model refusing a model: value (hidden_act, position_embedding_type, ...)
        raise ConfigError("model: %s" % (one_line(exc),))
    if resume_state is None and config.checkpoint.init_from:
        load_init_from(config, data, model, model_cls)  # prints one line: what, from where, what is fresh
    optimizer = build_optimizer(model, config.optimizer, accounting.betas)
    scheduler = build_scheduler(optimizer, config.schedule, config.training.steps)
    if resume_state is not None:
        try:
            model.load_state_dict(resume_state.model)
            if changed:
                load_with_new_hyperparameters(optimizer, scheduler, resume_state)
            else:
                optimizer.load_state_dict(resume_state.optimizer)
                scheduler.load_state_dict(resume_state.scheduler)
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise UserError("checkpoint %s does not fit this config (%s)"
                            % (resume_path, one_line(exc)[:200]))
    return RunPlan(config, data, accounting, model, optimizer, scheduler, resume_state, resume_path, steps_per_epoch,
                   changed, forced, fingerprint, finished)


__all__ = ["RunPlan", "check_backend", "model_class", "plan_run", "seed_everything"]
