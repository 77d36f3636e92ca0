"""The training loop: for each batch, one step, its record, its checkpoint when due.

``run(config)`` plans (train/run_plan.py: every check, nothing written), then ``execute(plan)`` trains through the
runner's declared interface (execution/runner.py, Runner) in the run directory (train/run_dir.py), which owns
every file the run writes. The body of the loop is the step:

    for batch in batches:
        record = train_step(...)                  # one host call, its metrics over every process
        logger.log(record)
        stopping = guard.stop_requested(...)      # a signal anywhere? (every process agrees)
        if stopping or checkpoint_due(...):
            save_state(...)
        if stopping:
            raise guard.stopped(...)
        if evaluation_due(...):                   # fine-tuning: the held-out split, per example
            evaluate_now(...)
        guard.check_data(...)                     # the shards unchanged, before the next batch is read

A run is deterministic given the config: weights are seeded, each epoch's pack order depends only on
(training.seed, epoch), and checkpoints (train/state.py:TrainingState) carry the RNG states, the data position
and the optimizer state as the runner keeps it (on IPUs: read back from the device). On IPUs the first step's
compile is timed apart (``compile_seconds``), outside the step's seconds and throughput.
"""

from __future__ import annotations

import dataclasses
import math
import time
from contextlib import closing
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

from ..errors import TrainingError, UserError, one_line
from .compile_only import compile_only
from .run_config import RunConfig
from .data import batch_rows, embeddings_from_model, write_tokenizer_files
from .guard import StepGuard
from .metrics import MetricsLogger, StepRecord, run_summary, summary_line
from .run_dir import NonFiniteState, RunDirectory
from .run_plan import RunPlan, plan_run
from .state import TrainingState, rng_state, set_rng_state


@dataclass
class Progress:
    """Where a run stands: optimizer steps done, and where the next batch comes from."""

    step: int
    epoch: int
    position: int
    """Optimizer steps of ``epoch`` done (the next batch's place in the epoch's order)."""


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
    built = plan.built
    runner = make_runner(built.model, built.optimizer, plan.accounting.execution, scheduler=built.scheduler,
                         metrics=plan.task.metrics)
    say = log if runner.is_writer else (lambda m: None)
    # every process starts alike or all stop, before anything is written (PopRun: the instances exchange)
    runner.agree_on_start(plan.run_dir.path, plan.start_step, plan.resume_state is not None, say)
    refused = None  # type: Optional[UserError]
    if runner.is_writer:
        try:
            plan.run_dir.lock()  # a second run in this directory is refused here
        except UserError as exc:
            refused = exc
    try:
        runner.agree_ready(refused)
        return train(plan, runner, say)
    finally:
        plan.run_dir.unlock()


def restore(plan: RunPlan, runner) -> Progress:
    """Where the run starts; resuming, the runner's optimizer state and this process's RNG states are the
    checkpoint's (before the first step: on IPUs, poptorch writes the restored moments to the device when it
    attaches)."""
    state = plan.resume_state
    if state is None:
        return Progress(0, 0, 0)
    try:
        runner.load_optimizer_state_dict(state.optimizer)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise UserError("checkpoint %s does not fit this config (%s)" % (plan.resume_path, one_line(exc)[:200]))
    set_rng_state(state.rng_for(runner.rank))
    epoch, position = state.position
    return Progress(int(state.step), epoch, position)


def train(plan: RunPlan, runner, log: Callable[[str], None]) -> Dict[str, Any]:
    """Every process runs this loop (under torchrun or poprun); only the writer writes files, and only its ``log``
    prints."""
    config, total, run_dir = plan.config, plan.config.training.steps, plan.run_dir
    progress = restore(plan, runner)
    if runner.is_writer:
        if plan.forced:  # checkpoint.resume=force: what it changed, and the checkpoint's config, beside the run
            log(run_dir.record_forced(progress.step, plan.resume_path, plan.resume_state.config or {}, plan.forced))
        run_dir.prepare(config.to_dict(), progress.step if plan.resume_state is not None else None, log)
    announce(plan, progress, log)
    logging = config.logging if runner.is_writer else dataclasses.replace(
        config.logging, progress_bar=False, tensorboard=False, jsonl=False)
    calls = plan.accounting.execution.optimizer_steps_per_call
    history = []  # type: List[StepRecord]
    last_saved = plan.resume_path
    with StepGuard(plan.data.shard_paths) as guard, closing(MetricsLogger(
            run_dir.file(RunDirectory.METRICS), run_dir.file(RunDirectory.TENSORBOARD), total, progress.step, logging,
            shown=plan.task.last_metrics, log=log)) as logger:
        if progress.step < total:
            guard.check_data(progress.step, last_saved)
            with guard.evaluating(progress.step):
                resume_evaluation(plan, runner, progress.step, log)
        while progress.step < total:
            for batch in epoch_batches(plan, runner, progress):
                record = train_step(plan, runner, batch, progress, first=not history, last_saved=last_saved)
                logger.log(record)
                history.append(record)
                if progress.position >= plan.steps_per_epoch:
                    progress.epoch, progress.position = progress.epoch + 1, 0
                stopping = progress.step < total and guard.stop_requested(runner, progress.step)
                if stopping or checkpoint_due(progress.step, calls, config.checkpoint.every_steps, total):
                    with guard.saving():
                        last_saved = save_state(plan, runner, progress, record, last_saved)
                    guard.saved(progress.step, last_saved)
                if stopping:
                    raise guard.stopped(progress.step, last_saved)
                if evaluation_due(plan, progress.step, calls):
                    with guard.evaluating(progress.step):
                        evaluate_now(plan, runner, progress.step, log)
                if progress.step >= total:
                    break
                guard.check_data(progress.step, last_saved)
            if progress.step < total and progress.position != 0:  # the loader stopped early: short batches
                raise TrainingError("the data loader gave fewer batches than %d per epoch; batch size mismatch"
                                    % (plan.steps_per_epoch,))
        logger.close()  # metrics.jsonl complete before the summary
        summary = finish(plan, runner, history, last_saved, log)
    if guard.signum is not None:  # it came after the last step: the run finished first
        raise guard.stopped(progress.step, last_saved, finished=True)
    return summary


def announce(plan: RunPlan, progress: Progress, log: Callable[[str], None]) -> None:
    if plan.resume_state is not None:
        log("resuming from %s at step %d (epoch %d, batch %d of %d)"
            % (plan.resume_path, progress.step, progress.epoch, progress.position, plan.steps_per_epoch))
    log(plan.data.describe())
    log(plan.accounting.describe())
    log(plan.accounting.describe_passes())
    log("training %s: %d steps, %d steps per epoch, run directory %s"
        % (plan.config.name, plan.config.training.steps, plan.steps_per_epoch, plan.run_dir.path))


def epoch_batches(plan: RunPlan, runner, progress: Progress) -> Iterator[Any]:
    """The rest of ``progress.epoch``'s batches, in its seeded order, from ``progress.position`` on."""
    per_step = plan.accounting.global_batch_packs
    order = plan.data.epoch_order(plan.config.training.seed, progress.epoch)
    subset = torch.utils.data.Subset(plan.data.dataset,
                                     order[progress.position * per_step : plan.steps_per_epoch * per_step].tolist())
    loader = runner.dataloader(subset, num_workers=plan.config.data.num_workers)
    # Creating a DataLoader iterator draws a base seed from torch's global RNG; keep the
    # RNG stream independent of where a run was resumed.
    rng = torch.get_rng_state()
    batches = iter(loader)
    torch.set_rng_state(rng)
    return batches


def train_step(plan: RunPlan, runner, batch, progress: Progress, first: bool,
               last_saved: Optional[str]) -> StepRecord:
    """One host call (``optimizer_steps_per_call`` optimizer steps): compiled ahead on this process's first
    (timed apart), run and timed, ``progress`` advanced, its metrics reduced over the processes (a collective
    under PopRun with horovod) and refused when the loss is not finite. Returns the call's record."""
    compile_seconds = compile_ahead(runner, batch) if first else 0.0
    start = time.perf_counter()
    metrics = runner.train_step(batch)
    seconds = time.perf_counter() - start
    lr = float(plan.built.optimizer.param_groups[0]["lr"])
    calls = plan.accounting.execution.optimizer_steps_per_call
    progress.step += calls
    progress.position += calls
    mine = dict(metrics.values)
    mine.update(sequences=int(metrics.sequences), tokens=int(metrics.tokens), packs=batch_rows(batch),
                seconds=seconds, compile_seconds=compile_seconds)
    whole = runner.reduce_metrics(mine)
    check_finite_loss(whole["loss"], progress.step, last_saved)  # reduced: every process stops at this step
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


def save_state(plan: RunPlan, runner, progress: Progress, record: StepRecord,
               last_saved: Optional[str]) -> Optional[str]:
    """Gather the TrainingState on every process (collectives under torchrun) and write it on the writer.
    Returns the last checkpoint written (refusing, as a divergence, a state that is not finite)."""
    runner.sync_model()  # pipelined: gather every stage's weights
    optimizer_state = runner.optimizer_state_dict()  # a collective under torchrun
    rng_states = runner.gather_rng_states(rng_state())
    if not runner.is_writer:
        return last_saved
    state = TrainingState(
        step=progress.step,
        model=runner.model.state_dict(),
        optimizer=optimizer_state,
        scheduler=plan.built.scheduler.state_dict(),
        data={"epoch": progress.epoch, "step_in_epoch": progress.position},
        rng=rng_states[0],
        rng_per_rank=rng_states,
        config=plan.config.to_dict(),
        dataset=plan.fingerprint,
        metrics=record.to_dict(),
    )
    try:
        return plan.run_dir.save(state, plan.config.checkpoint.keep)
    except NonFiniteState as exc:
        raise TrainingError("the run diverged: %s; not saved. The last checkpoint finite throughout is %s"
                            % (exc, _last_finite(last_saved)))


def evaluation_due(plan: RunPlan, step: int, calls: int) -> bool:
    """Whether a fine-tuning run evaluates after the host call that ended at ``step``: every
    task.eval_every_steps (crossed by the call) and at the last step."""
    if plan.eval_data is None:
        return False
    return checkpoint_due(step, calls, plan.config.task.eval_every_steps, plan.config.training.steps)


def evaluate_now(plan: RunPlan, runner, step: int, log: Callable[[str], None]) -> Optional[Dict[str, Any]]:
    """Evaluate the model as it is after ``step`` on the held-out split (train/evaluate.py), on the writer; the
    result goes to eval.jsonl and one log line. Every process syncs the model first (a collective on a pipeline)."""
    from .evaluate import evaluate

    runner.sync_model()
    if not runner.is_writer:
        return None
    result = evaluate(runner.model, plan.eval_data, plan.task, plan.config.task.eval_batch_packs,
                      plan.config.task.eval_split)
    record = dict(result, step=step)
    plan.run_dir.append_evaluation(record)
    log("evaluation at step %d on %s (%d examples): %s" % (step, result["split"], result["examples"], ", ".join(
        "%s %s" % (k, "%.4f" % v if isinstance(v, float) else v) for k, v in sorted(result["metrics"].items()))))
    return record


def resume_evaluation(plan: RunPlan, runner, step: int, log: Callable[[str], None]) -> None:
    """A resumed run whose checkpoint's step was due an evaluation that eval.jsonl lacks (the run was stopped
    during it, by a second signal or a kill) evaluates first. Every process agrees (``runner.agree``: the writer
    decides from eval.jsonl), since evaluating syncs the model on all of them."""
    if plan.resume_state is None or not evaluation_due(plan, step, plan.accounting.execution.optimizer_steps_per_call):
        return
    missing = runner.is_writer and not any(
        r.get("step") == step for r in plan.run_dir.read_metrics(RunDirectory.EVAL))
    if runner.agree(int(missing)):
        log("the evaluation after step %d is missing from %s (the run was stopped during it): running it first"
            % (step, RunDirectory.EVAL))
        evaluate_now(plan, runner, step, log)


def check_finite_loss(loss: float, step: int, last_saved: Optional[str]) -> None:
    """Stop the run (TrainingError) at a step whose loss is inf or NaN, naming the last finite checkpoint."""
    if not math.isfinite(loss):
        raise TrainingError("loss is %s at step %d: the run diverged and stopped; the last checkpoint finite "
                            "throughout is %s" % (loss, step, _last_finite(last_saved)))


def _last_finite(last_saved: Optional[str]) -> str:
    return last_saved or "none (no checkpoint was written yet)"


def finish(plan: RunPlan, runner, history: List[StepRecord], last_saved: Optional[str],
           log: Callable[[str], None]) -> Dict[str, Any]:
    """The run's summary; the writer exports the final model (checkpoint.export) and writes summary.json, last. A
    run resumed at its last step (stopped during its export) trains nothing and completes both."""
    records = [r.to_dict() for r in history] or plan.run_dir.read_metrics()
    summary = run_summary(plan, records, len(history), last_saved)
    if plan.eval_data is not None:
        done = [r for r in plan.run_dir.read_metrics(RunDirectory.EVAL) if r.get("step") == plan.config.training.steps]
        final = done[-1] if done else evaluate_now(plan, runner, plan.config.training.steps, log)
        if final is not None:
            summary["evaluation"] = {k: final[k] for k in ("split", "step", "examples", "loss", "metrics")}
    if not runner.is_writer:
        return summary
    if plan.config.checkpoint.export:
        positions, vocab = plan.config.model_value("max_position_embeddings"), plan.config.model_value("vocab_size")

        def save(directory: str) -> None:
            runner.model.save_pretrained(directory)
            write_tokenizer_files(directory, plan.data, positions, vocab, embeddings_from_model(plan.config))

        summary["export"] = plan.run_dir.export(save)
        log("exported the final model (Hugging Face %s) to %s" % (plan.task.export, summary["export"]))
    plan.run_dir.write_summary(summary)
    log(summary_line(summary, plan.task))
    return summary


__all__ = ["Progress", "checkpoint_due", "execute", "plan_run", "run", "train_step"]
