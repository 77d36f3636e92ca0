"""The one owner of a run's checkpoints, shaped like torchtitan's CheckpointManager.

    checkpointer = Checkpointer(config, run_dir)     # planning: writes nothing
    checkpointer.choose(fingerprint)                 # which checkpoint a resume continues from, checked
    checkpointer.load_weights(built, data)           # the checkpoint's model, optimizer and schedule, or init_from
    ...
    refused = checkpointer.open(runner)              # the run directory's lock (the writer)
    progress = checkpointer.load(runner, log)        # the optimizer's state on the runner, the RNG, the position
    checkpointer.save(runner, progress, record)      # a TrainingState, kept by checkpoint.keep
    checkpointer.export(runner, data)                # final/, a Hugging Face directory
    checkpointer.close()                             # the lock let go

It decides everything about resuming (``checkpoint.resume``: which checkpoint, what it records against this run,
what a forced resume changes, whether the directory holds a finished run that must not be rewritten), loads a
checkpoint or the phase-1 weights (``checkpoint.init_from``), saves and keeps checkpoints, exports the final model
and holds the lock. The run directory (train/run_dir.py) owns the files themselves; the checkpoint's content is
train/state.py's TrainingState.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from ..errors import TrainingError, UserError, one_line
from .fingerprint import Difference, check_fixed, refuse_or_force, resume_differences
from .model_section import MODEL_DEFAULTS
from .phase1 import check_init_from, load_init_from
from .run_dir import NonFiniteState, RunDirectory
from .state import TrainingState, rng_state, set_rng_state


@dataclass
class Progress:
    """Where a run stands: optimizer steps done, and where the next batch comes from."""

    step: int
    epoch: int
    step_in_epoch: int
    """Optimizer steps of ``epoch`` done: the next batch's place in the epoch's order (a checkpoint's data
    entry of the same name)."""


class Checkpointer:
    """A run's checkpoints: resume, init_from, save, keep, export, the finished run and the lock."""

    def __init__(self, config, run_dir: RunDirectory) -> None:
        self.config = config
        self.run_dir = run_dir
        self.resume_path: Optional[str] = None
        """The checkpoint the run resumes from, or None (a fresh start)."""
        self.state: Optional[TrainingState] = None
        """Its content (the model, optimizer and schedule are loaded into the built objects by load_weights)."""
        self.forced: List[Difference] = []
        """What a forced resume changes: (key, the checkpoint's value, this run's)."""
        self.finished: Optional[Dict[str, Any]] = None
        """The summary of the finished run the directory holds, asked for again as it was: nothing is trained or
        written."""
        self.last_saved: Optional[str] = None
        """The last checkpoint written or resumed from (every checkpoint is finite throughout)."""
        self.fingerprint: Dict[str, Any] = {}
        """What every checkpoint of the run records about its data and batch (choose's)."""
        self.scheduler: Any = None
        """The run's schedule, whose state every checkpoint holds (load_weights')."""

    # ---- planning: nothing written -------------------------------------------------------------------------

    def choose(self, fingerprint: Dict[str, Any]) -> None:
        """The checkpoint ``checkpoint.resume`` continues from, checked against this run: readable and resumable,
        the same S, K, vocabulary, QKV layout and step count, every other difference refused unless
        ``checkpoint.resume=force``; and whether the directory holds a finished run (never rewritten)."""
        config, run_dir = self.config, self.run_dir
        path = run_dir.resume_point(config.checkpoint.resume)
        state = TrainingState.load(path) if path else None
        if state is not None:
            state.check_resumable(path)
            check_fixed(config, fingerprint, state, path)  # S, K, vocabulary, qkv layout, step count
            self.forced = resume_differences(state, config.to_dict(), fingerprint, MODEL_DEFAULTS)
            refuse_or_force(self.forced, path, config.checkpoint.resume == "force", run_dir.file(RunDirectory.FORCED))
        recorded = state.config if state is not None and path == run_dir.latest() else None
        self.finished = run_dir.finished(recorded, path, self.forced, config.checkpoint.export)
        self.resume_path, self.state, self.last_saved, self.fingerprint = path, state, path, fingerprint

    def check_init(self, data) -> None:
        """A fresh run's checkpoint.init_from: it exists and was trained on the dataset's vocabulary."""
        if self.config.checkpoint.init_from and self.state is None:
            check_init_from(self.config, data)

    @property
    def start_step(self) -> int:
        return int(self.state.step) if self.state else 0

    def load_weights(self, built, data) -> None:
        """The built model, optimizer and schedule: the checkpoint's when resuming (a forced resume: the moments
        and step counts only), the phase-1 weights (init_from), or left as built (seeded)."""
        state = self.state
        self.scheduler = built.scheduler
        if state is None:
            if self.config.checkpoint.init_from:
                load_init_from(self.config, data, built.model, type(built.model))  # one line: what, from where
            return
        try:
            built.model.load_state_dict(state.model)
            if self.forced:
                load_with_new_hyperparameters(built.optimizer, built.scheduler, state)
            else:
                built.optimizer.load_state_dict(state.optimizer)
                built.scheduler.load_state_dict(state.scheduler)
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise UserError("checkpoint %s does not fit this config (%s)" % (self.resume_path, one_line(exc)[:200]))

    # ---- the run -------------------------------------------------------------------------------------------

    def open(self, runner) -> Optional[UserError]:
        """The writer takes the run directory's lock; a second run in it is refused (returned, so that every
        process stops alike)."""
        if not runner.is_writer:
            return None
        try:
            self.run_dir.lock()
        except UserError as exc:
            return exc
        return None

    def close(self) -> None:
        self.run_dir.unlock()

    def load(self, runner, log: Callable[[str], None]) -> Progress:
        """Where the run starts. Resuming, the runner's optimizer state and this process's RNG states are the
        checkpoint's (before the first step: on IPUs, poptorch writes the restored moments to the device when it
        attaches). The writer then records the run's config (and a forced resume's changes) in the directory."""
        state = self.state
        progress = Progress(0, 0, 0)
        if state is not None:
            try:
                runner.load_optimizer_state_dict(state.optimizer)
            except (RuntimeError, ValueError, KeyError) as exc:
                raise UserError("checkpoint %s does not fit this config (%s)" % (self.resume_path,
                                                                                 one_line(exc)[:200]))
            set_rng_state(state.rng_for(runner.rank))
            epoch, step_in_epoch = state.position
            progress = Progress(int(state.step), epoch, step_in_epoch)
        if runner.is_writer:
            if self.forced:  # checkpoint.resume=force: what it changed, and the checkpoint's config, beside the run
                log(self.run_dir.record_forced(progress.step, self.resume_path, state.config or {}, self.forced))
            self.run_dir.prepare(self.config.to_dict(), progress.step if state is not None else None, log)
        return progress

    def save(self, runner, progress: Progress, record) -> Optional[str]:
        """Gather the TrainingState on every process (collectives under torchrun) and write it on the writer,
        keeping checkpoint.keep. Returns the last checkpoint written; a state that is not finite is refused as a
        divergence (TrainingError naming the last finite one)."""
        runner.sync_model()  # pipelined: gather every stage's weights
        optimizer_state = runner.optimizer_state_dict()  # a collective under torchrun
        rng_states = runner.gather_rng_states(rng_state())
        if not runner.is_writer:  # the writer writes it; every process names it (a stop's line, the guard's)
            self.last_saved = self.run_dir.checkpoint_path(progress.step)
            return self.last_saved
        state = TrainingState(
            step=progress.step,
            model=runner.model.state_dict(),
            optimizer=optimizer_state,
            scheduler=self.scheduler.state_dict(),
            data={"epoch": progress.epoch, "step_in_epoch": progress.step_in_epoch},
            rng=rng_states[0],
            rng_per_rank=rng_states,
            config=self.config.to_dict(),
            dataset=self.fingerprint,
            metrics=record.to_dict(),
        )
        try:
            self.last_saved = self.run_dir.save(state, self.config.checkpoint.keep)
        except NonFiniteState as exc:
            raise TrainingError("the run diverged: %s; not saved. The last checkpoint finite throughout is %s"
                                % (exc, self.last_finite()))
        return self.last_saved

    def last_finite(self) -> str:
        return self.last_saved or "none (no checkpoint was written yet)"

    def export(self, runner, data) -> str:
        """final/: the model as transformers saves it, with the dataset's tokenizer files (published whole)."""
        from .data import embeddings_from_model, write_tokenizer_files

        config = self.config
        positions, vocab = config.model_value("max_position_embeddings"), config.model_value("vocab_size")

        def save(directory: str) -> None:
            runner.model.save_pretrained(directory)
            write_tokenizer_files(directory, data, positions, vocab, embeddings_from_model(config))

        return self.run_dir.export(save)


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


__all__ = ["Checkpointer", "Progress", "load_with_new_hyperparameters"]
