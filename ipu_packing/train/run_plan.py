"""Planning a run: every check of user input first, then the objects training starts from. Writes nothing.

``plan_run(config)`` checks, in this order and before anything heavy is built: the backend (poptorch, CUDA,
torchrun), the phase-1 model's architecture (read here, not by the config), the dataset against the config, the
batch, the run directory (which checkpoint a resume continues from, what that checkpoint records against this run,
whether the directory holds a finished run), the phase-1 weights' vocabulary, and the shards. Then it builds the
model, optimizer and schedule (train/build.py), restored from the checkpoint when resuming or initialised from
the phase-1 weights. The training loop (train/loop.py) runs the RunPlan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from ..errors import ConfigError, UserError
from .build import Built, build
from .checkpointer import Checkpointer
from .run_config import BatchAccounting, RunConfig
from .data import TrainingData, match_run_data, open_run_data, open_shards, read_training_data
from .fingerprint import Difference, recorded_fingerprint
from .phase1 import check_init_exists, with_init_architecture
from .run_dir import RunDirectory
from .state import TrainingState
from .task import Task, check_labelled


@dataclass
class RunPlan:
    """A checked run, ready to train (train/loop.py:execute)."""

    config: RunConfig
    """The config as run: with a phase-1 directory's architecture (phase1.with_init_architecture)."""
    data: TrainingData
    accounting: BatchAccounting
    """The batch as run for the dataset's packing factor (accounting.execution: the ExecutionConfig)."""
    checkpointer: Checkpointer
    """The run's checkpoints: its run directory, the checkpoint it resumes from, save, export, the lock."""
    steps_per_epoch: int
    """Optimizer steps in an epoch: whole host calls of whole global batches."""
    fingerprint: Dict[str, Any]
    """What every checkpoint of this run records about its data and batch (fingerprint.recorded_fingerprint)."""
    task: Task
    """What the run trains (train/task.py: from the config and the dataset's manifest)."""
    eval_data: Optional[TrainingData] = None
    """The split a fine-tuning run is evaluated on (task.eval_split), opened and checked; None for none."""
    built: Optional[Built] = None
    """The model, optimizer and schedule (None for a finished run: nothing is trained)."""

    @property
    def run_dir(self) -> RunDirectory:
        return self.checkpointer.run_dir

    @property
    def resume_state(self) -> Optional[TrainingState]:
        """The checkpoint the run resumes from (its model, optimizer and scheduler already loaded), or None."""
        return self.checkpointer.state

    @property
    def resume_path(self) -> Optional[str]:
        return self.checkpointer.resume_path

    @property
    def forced(self) -> List[Difference]:
        return self.checkpointer.forced

    @property
    def finished(self) -> Optional[Dict[str, Any]]:
        return self.checkpointer.finished

    @property
    def model(self):
        return self.built.model

    @property
    def optimizer(self):
        return self.built.optimizer

    @property
    def scheduler(self):
        return self.built.scheduler

    @property
    def start_step(self) -> int:
        return self.checkpointer.start_step


def check_backend(config: RunConfig) -> None:
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


def plan_run(config: RunConfig, open_dataset: Optional[Callable] = None) -> RunPlan:
    """Check every input, then build model, optimizer and schedule. Writes nothing."""
    check_backend(config)
    run_dir = RunDirectory(config.run_dir)
    run_dir.check_target([config.data.path, config.data.split_path(config.task.eval_split) if config.task.eval_split
                          else "", config.checkpoint.init_from])  # before anything is read
    config = with_init_architecture(config)  # a phase-1 Hugging Face directory's architecture
    data = read_training_data(config.data.path, config)  # its shards are opened last
    check_init_exists(config)  # before the dataset is matched against a vocabulary init_from would give
    task = match_run_data(config, data)
    check_labelled(data.manifest, data.path, "data.split")
    eval_data = None
    if task.evaluated and config.task.eval_split:
        eval_data, _ = open_run_data(config, config.data.split_path(config.task.eval_split), opened=False)
        check_labelled(eval_data.manifest, eval_data.path, "task.eval_split")
        if eval_data.manifest.get("task", {}).get("labels") != data.manifest["task"].get("labels"):
            raise UserError("dataset %s has other labels than %s: prepare both splits in one `prepare --task` run"
                            % (eval_data.path, data.path))
        if task.has_hook("check_eval_data"):  # e.g. every row of a question-answering split's examples file
            task.hook("check_eval_data")(eval_data.path, eval_data.manifest)
    accounting = config.batch_accounting(data.packing_factor)
    steps_per_epoch = _steps_per_epoch(data, accounting)

    fingerprint = recorded_fingerprint(data, accounting)
    checkpointer = Checkpointer(config, run_dir)
    checkpointer.choose(fingerprint)  # which checkpoint a resume continues from, checked; a finished run
    checkpointer.check_init(data)  # a fresh run's init_from: exists, trained on the dataset's vocabulary
    open_shards(data, open_dataset)
    if eval_data is not None:
        open_shards(eval_data, open_dataset)
    plan = RunPlan(config, data, accounting, checkpointer, steps_per_epoch, fingerprint, task, eval_data)
    if checkpointer.finished is None:
        plan.built = build(config, accounting.betas, task)
        checkpointer.load_weights(plan.built, data)  # the checkpoint's, the phase-1 weights', or seeded
    return plan


def _steps_per_epoch(data: TrainingData, accounting: BatchAccounting) -> int:
    per_step = accounting.global_batch_packs
    calls = accounting.execution.optimizer_steps_per_call
    steps = (data.num_packs // per_step) // calls * calls
    if steps < 1:
        raise UserError(
            "dataset %s has %d packs, fewer than one step's %d (micro batch %d x accumulation %d x replicas %d)"
            % (data.path, data.num_packs, per_step, accounting.execution.micro_batch_size,
               accounting.gradient_accumulation, accounting.execution.replication_factor))
    return steps


__all__ = ["RunPlan", "check_backend", "plan_run"]
