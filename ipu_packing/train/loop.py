"""The training loop: for each batch, one step, its record, its checkpoint when due.

``run(config)`` plans (train/run_plan.py: every check, nothing written), then ``execute(plan)`` trains through the
runner's declared interface (execution/runner.py, Runner). The checkpointer (train/checkpointer.py) owns the run
directory's lock, resuming, saving and the export; the guard (train/guard.py) what may stop a run between two
steps; the validator (train/evaluate.py) a fine-tuning run's evaluation. The body of the loop is the step:

    for batch in batches:
        record = train_step(...)                  # one host call, its metrics over every process
        guard.check_loss(...)                     # a loss that is not finite stops every process
        logger.log(record)
        stopping = guard.stop_requested(...)      # a signal anywhere? (every process agrees)
        if stopping or checkpoint_due(...):
            checkpointer.save(...)
        if stopping:
            raise guard.stopped(...)
        if validator.due(...):                    # fine-tuning: the held-out split, per example
            validator.run(...)
        guard.check_data(...)                     # the shards unchanged, before the next batch is read

A run is deterministic given the config: weights are seeded, each epoch's pack order depends only on
(training.seed, epoch), and checkpoints (train/state.py:TrainingState) carry the RNG states, the data position
and the optimizer state as the runner keeps it (on IPUs: read back from the device). On IPUs the first step's
compile is timed apart (``compile_seconds``), outside the step's seconds and throughput.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import closing
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

from ..errors import TrainingError
from .checkpointer import Progress
from .compile_only import compile_only
from .evaluate import Validator
from .guard import StepGuard
from .metrics import MetricsLogger, StepRecord, run_summary, summary_line
from .run_config import RunConfig
from .run_dir import RunDirectory
from .run_plan import RunPlan, plan_run


def run(config: RunConfig, log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Validate (no writes), then train; or, with execution.compile_only, compile and stop."""
    if config.execution_spec.compile_only:
        return compile_only(config, log=log)
    return execute(plan_run(config), log=log)


def execute(plan: RunPlan, log: Callable[[str], None] = print,
            make_runner: Optional[Callable] = None) -> Dict[str, Any]:
    """Train to config.training.steps, holding the run directory's lock. Returns a summary dict (also written to
    run_dir/summary.json; a finished run returns the one it wrote and writes nothing, the lock included)."""
    if plan.finished is not None:
        log("run %s already finished at step %d: nothing to do, nothing written" % (plan.run_dir.path, plan.start_step))
        return plan.finished
    if make_runner is None:
        from ipu_packing.execution import make_runner
    from ipu_packing.execution.runner_common import deterministic_kernels

    built = plan.built
    runner = make_runner(built.model, built.optimizer, plan.accounting.execution, scheduler=built.scheduler,
                         metrics=plan.task.metrics)
    say = log if runner.is_writer else (lambda m: None)
    # every process starts alike or all stop, before anything is written (PopRun: the instances exchange)
    runner.agree_on_start(plan.run_dir.path, plan.start_step, plan.resume_state is not None, say)
    refused = plan.checkpointer.open(runner)  # the lock: a second run in this directory is refused here
    try:
        runner.agree_ready(refused)
        with deterministic_kernels(plan.accounting.execution):
            return train(plan, runner, say)
    finally:
        plan.checkpointer.close()


def train(plan: RunPlan, runner, log: Callable[[str], None]) -> Dict[str, Any]:
    """Every process runs this loop (under torchrun or poprun); only the writer writes files, and only its ``log``
    prints."""
    config, total, checkpointer = plan.config, plan.config.training.steps, plan.checkpointer
    progress = checkpointer.load(runner, log)
    announce(plan, progress, log)
    logging = config.logging if runner.is_writer else dataclasses.replace(
        config.logging, progress_bar=False, tensorboard=False, jsonl=False)
    calls = plan.accounting.execution.optimizer_steps_per_call
    validator = Validator(plan)
    history = []  # type: List[StepRecord]
    with StepGuard(plan.data.shard_paths) as guard, closing(MetricsLogger(
            plan.run_dir.file(RunDirectory.METRICS), plan.run_dir.file(RunDirectory.TENSORBOARD), total,
            progress.step, logging, shown=plan.task.last_metrics, log=log)) as logger:
        if progress.step < total:
            guard.check_data(progress.step, checkpointer.last_saved)
            with guard.evaluating(progress.step):
                validator.resume(runner, progress.step, log)
        while progress.step < total:
            for batch in epoch_batches(plan, runner, progress):
                record = train_step(plan, runner, batch, progress, first=not history)
                guard.check_loss(record.loss, progress.step, checkpointer.last_finite())
                logger.log(record)
                history.append(record)
                if progress.step_in_epoch >= plan.steps_per_epoch:
                    progress.epoch, progress.step_in_epoch = progress.epoch + 1, 0
                stopping = progress.step < total and guard.stop_requested(runner, progress.step)
                if stopping or checkpoint_due(progress.step, calls, config.checkpoint.every_steps, total):
                    with guard.saving():
                        checkpointer.save(runner, progress, record)
                    guard.saved(progress.step, checkpointer.last_saved)
                if stopping:
                    raise guard.stopped(progress.step, checkpointer.last_saved)
                if validator.due(progress.step):
                    with guard.evaluating(progress.step):
                        validator.run(runner, progress.step, log)
                if progress.step >= total:
                    break
                guard.check_data(progress.step, checkpointer.last_saved)
            if progress.step < total and progress.step_in_epoch != 0:  # the loader stopped early: short batches
                raise TrainingError("the data loader gave fewer batches than %d per epoch; batch size mismatch"
                                    % (plan.steps_per_epoch,))
        logger.close()  # metrics.jsonl complete before the summary
        summary = finish(plan, runner, validator, history, log)
    if guard.signum is not None:  # it came after the last step: the run finished first
        raise guard.stopped(progress.step, checkpointer.last_saved, finished=True)
    return summary


def announce(plan: RunPlan, progress: Progress, log: Callable[[str], None]) -> None:
    if plan.resume_state is not None:
        log("resuming from %s at step %d (epoch %d, step %d of its %d)"
            % (plan.resume_path, progress.step, progress.epoch, progress.step_in_epoch, plan.steps_per_epoch))
    log(plan.data.describe())
    log(plan.accounting.describe())
    log(plan.accounting.describe_passes())
    log("training %s (%s): %d steps, %d steps per epoch, run directory %s"
        % (plan.config.name, describe_run(plan), plan.config.training.steps, plan.steps_per_epoch, plan.run_dir.path))


def describe_run(plan: RunPlan) -> str:
    """What the run is, in words: "pretraining", "pretraining from the weights of DIR" (a phase 2 from phase 1),
    "fine-tuning classification from the weights of DIR" (or "from fresh weights")."""
    task, source = plan.task, plan.config.checkpoint.init_from
    what = ("fine-tuning %s" % task.name) if task.fine_tuning else task.name
    if source:
        return "%s from the weights of %s" % (what, source)
    return what + (" from fresh weights" if task.fine_tuning else "")


def epoch_batches(plan: RunPlan, runner, progress: Progress) -> Iterator[Any]:
    """The rest of ``progress.epoch``'s batches, in its seeded order, from ``progress.step_in_epoch`` on."""
    per_step = plan.accounting.global_batch_packs
    order = plan.data.epoch_order(plan.config.training.seed, progress.epoch)
    rest = order[progress.step_in_epoch * per_step : plan.steps_per_epoch * per_step]
    subset = torch.utils.data.Subset(plan.data.dataset, rest.tolist())
    loader = runner.dataloader(subset, num_workers=plan.config.data.num_workers)
    # Creating a DataLoader iterator draws a base seed from torch's global RNG; keep the
    # RNG stream independent of where a run was resumed.
    rng = torch.get_rng_state()
    batches = iter(loader)
    torch.set_rng_state(rng)
    return batches


def train_step(plan: RunPlan, runner, batch, progress: Progress, first: bool) -> StepRecord:
    """One host call (``optimizer_steps_per_call`` optimizer steps): compiled ahead on this process's first
    (timed apart), run and timed, ``progress`` advanced, its metrics reduced over the processes (a collective
    under PopRun with horovod). Returns the call's record (the guard then refuses a loss that is not finite)."""
    compile_seconds = compile_ahead(runner, batch) if first else 0.0
    start = time.perf_counter()
    metrics = runner.train_step(batch)
    seconds = time.perf_counter() - start
    lr = float(plan.built.optimizer.param_groups[0]["lr"])
    calls = plan.accounting.execution.optimizer_steps_per_call
    progress.step += calls
    progress.step_in_epoch += calls
    mine = dict(metrics.values)
    mine.update(sequences=int(metrics.sequences), tokens=int(metrics.tokens), packs=int(metrics.packs),
                seconds=seconds, compile_seconds=compile_seconds)
    whole = runner.reduce_metrics(mine)
    return StepRecord.from_metrics(progress.step, progress.epoch, lr, whole, plan.task.metrics)


def compile_ahead(runner, batch) -> float:
    """Seconds to compile (or load) the step before its first call, where the runner is not compiled yet
    (poptorch); 0.0 elsewhere (torch compiles nothing ahead)."""
    if runner.is_compiled():
        return 0.0
    start = time.perf_counter()
    runner.compile(batch)
    return time.perf_counter() - start


def checkpoint_due(step: int, calls: int, every: int, total: int) -> bool:
    """Whether the host call of ``calls`` optimizer steps that ended at ``step`` ends the run or crosses a
    multiple of ``every`` (checkpoint.every_steps; 0: at the end only)."""
    return step >= total or bool(every and step // every > (step - calls) // every)


def finish(plan: RunPlan, runner, validator: Validator, history: List[StepRecord],
           log: Callable[[str], None]) -> Dict[str, Any]:
    """The run's summary; the writer exports the final model (checkpoint.export) and writes summary.json, last. A
    run resumed at its last step (stopped during its export) trains nothing and completes both. Its first and
    last steps' figures are the run's, every invocation's; its seconds and rates this invocation's steps'."""
    # metrics.jsonl holds every step of the run (cut back to the checkpoint a resume started from); the writer's
    records = plan.run_dir.read_metrics() if runner.is_writer or not history else [r.to_dict() for r in history]
    summary = run_summary(plan, records, len(history), plan.checkpointer.last_saved)
    final = validator.final(runner, log)
    if final is not None:
        summary["evaluation"] = final
    if not runner.is_writer:
        return summary
    if plan.config.checkpoint.export:
        summary["export"] = plan.checkpointer.export(runner, plan.data)
        log("exported the final model (Hugging Face %s) to %s" % (plan.task.export, summary["export"]))
    plan.run_dir.write_summary(summary)
    log(summary_line(summary, plan.task))
    return summary


__all__ = ["Progress", "checkpoint_due", "execute", "plan_run", "run", "train_step"]
