"""The pretraining run: validate everything, then train, checkpoint, log and export.

`plan_run(config)` (train/plan.py) does every check that can fail on user input and writes nothing.
`execute(plan)` then trains, through the runner's declared interface (execution/runner.py:Runner). A run
is deterministic given the config: weights are seeded, each epoch's pack order depends only on
(training.seed, epoch), and checkpoints (train/state.py:TrainingState) carry the RNG states, the data
position and the optimizer state as the runner keeps it (on IPUs: read back from the device).
`compile_only(config)` compiles the training step, or loads it from the executable cache, and stops.

The loop is split as torchtitan splits its Trainer: `train_step` runs one host call and returns its
StepRecord (StepRecord.from_metrics), `checkpoint_due` is the cadence, `save_state` gathers and writes the
TrainingState; `gather_rng_states` and the divergence checks are functions of their own.

SIGINT and SIGTERM (train/stopping.py) let the step in flight complete, write its checkpoint and stop with
exit status 130 or 143; every rank stops after the same step.

Under PopRun the instances agree on their start before the first step and reduce every step's metrics
(train/instances.py). On IPUs the first step's compile is timed apart (``compile_seconds``), outside the
step's seconds and throughput.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

from . import checkpoint as ckpt
from .compile_only import compile_only
from .config import PretrainingConfig
from .data import batch_rows
from .. import jsonout
from ..errors import one_line
from ..fsutil import atomic_write_text
from ..errors import TrainingError, UserError
from .fingerprints import record_forced
from .poprun import agree_on_start, agree_ready, reduce_step
from .metrics import MetricsLogger, StepRecord, repair_jsonl, run_summary, summary_line
from .run_plan import RunPlan, check_backend, plan_run, seed_everything
from .runlock import RunLock
from .state import TrainingState
from .shard_watch import ShardWatch, guarded
from .stopping import StopRequests

LOSSES = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")
"""The StepMetrics every host call reports, averaged over the PopRun instances."""


@dataclass
class Progress:
    """Where a run stands: optimizer steps done, and where the next batch comes from."""

    step: int
    epoch: int
    position: int
    """Optimizer steps of ``epoch`` done (the next batch's place in the epoch's order)."""


def execute(plan: RunPlan, log: Callable[[str], None] = print,
            make_runner: Optional[Callable] = None) -> Dict[str, Any]:
    """Train to config.training.steps, holding the run directory's lock. Returns a summary dict (also
    written to run_dir/summary.json; a finished run returns the one it wrote and writes nothing)."""
    if plan.finished is not None:  # train/finished.py: no runner, no lock, nothing written
        log("run %s already finished at step %d: nothing to do, nothing written" % (plan.run_dir, plan.start_step))
        return plan.finished
    if make_runner is None:
        from ipu_packing.execution import make_runner
    runner = make_runner(plan.model, plan.optimizer, plan.accounting.execution, scheduler=plan.scheduler)
    writer = runner.is_writer
    group = _instance_group(runner, plan.run_dir)
    if group is not None:  # PopRun: the instances start alike or all stop, before anything is written
        agree_on_start(group, plan.start_step, plan.resume_state is not None, runner.model,
                       log=log if writer else (lambda m: None))
    lock = RunLock(plan.run_dir) if writer else None
    refused = None  # type: Optional[UserError]
    if lock is not None:
        try:
            lock.acquire()  # before anything is written: a second run in this directory is refused here
        except UserError as exc:
            if group is None:
                raise
            refused = exc  # the other PopRun instances learn it and stop too
    try:
        if group is not None:
            agree_ready(group, refused)
        return _train(plan, runner, group, log if writer else (lambda m: None))
    finally:
        if lock is not None:
            lock.release()


def _instance_group(runner, run_dir: str):
    """The PopRun instances' InstanceGroup (popdist_backend.instance_group), None on one instance and on torch."""
    if runner.launch is None or runner.launch.num_instances <= 1:
        return None
    from ipu_packing.execution.popdist_backend import instance_group

    return instance_group(runner.launch, run_dir)


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
        raise UserError("checkpoint %s does not fit this config (%s)"
                        % (plan.resume_path, one_line(exc)[:200]))
    ckpt.set_rng_state(state.rng_for(runner.rank))
    epoch, position = state.position
    return Progress(int(state.step), epoch, position)


def _train(plan: RunPlan, runner, group, log: Callable[[str], None]) -> Dict[str, Any]:
    """Under torchrun or poprun every process runs this loop; only the writer writes files, and only its
    ``log`` prints."""
    config, total = plan.config, plan.config.training.steps
    progress = restore(plan, runner)
    summary_path = os.path.join(plan.run_dir, "summary.json")
    if runner.is_writer:
        _prepare_run_dir(plan, progress.step, log)
    _announce(plan, group, progress, log)
    logging_config = config.logging if runner.is_writer else _silent(config.logging)
    logger = MetricsLogger(plan.run_dir, total, progress.step, logging_config, log=log)
    history = []  # type: List[StepRecord]
    last_saved = plan.resume_path
    calls = plan.accounting.execution.optimizer_steps_per_call
    watch = ShardWatch.of(plan.data.path) if progress.step < total else None  # a shard changed: one line
    with StopRequests() as stop:  # SIGINT, SIGTERM: the step in flight completes and is checkpointed
        stop.last_saved, stop.step = last_saved, progress.step
        try:
            while progress.step < total:
                for batch in guarded(epoch_batches(plan, runner, progress), watch, stop):
                    record = train_step(plan, runner, batch, group, progress, not history, last_saved)
                    logger.log(record)
                    history.append(record)
                    if progress.position >= plan.steps_per_epoch:
                        progress.epoch, progress.position = progress.epoch + 1, 0
                    stopping = progress.step < total and stop.agreed(runner, group, progress.step)
                    if stopping or checkpoint_due(progress.step, calls, config.checkpoint.every_steps, total):
                        with stop.saving():
                            last_saved = stop.last_saved = save_state(plan, runner, progress, record, last_saved)
                    if stopping:
                        raise stop.stopped(progress.step, last_saved)
                    if progress.step >= total:
                        break
                if progress.step < total and progress.position != 0:  # the loader stopped early: short batches
                    raise TrainingError(
                        "the data loader gave fewer batches than %d per epoch; batch size mismatch"
                        % (plan.steps_per_epoch,)
                    )
        finally:
            logger.close()
        summary = _finish(plan, runner, history, last_saved, summary_path, log)
    if stop.signum is not None:  # it came after the last step: the run finished first
        raise stop.stopped(progress.step, last_saved, finished=True)
    return summary


def _prepare_run_dir(plan: RunPlan, step: int, log: Callable[[str], None]) -> None:
    """The writer's files before the first step: stale temporaries gone, config.json (and, on a forced resume,
    the checkpoint's config beside it), metrics.jsonl cut back to the checkpoint's step or removed."""
    run_dir, jsonl = plan.run_dir, os.path.join(plan.run_dir, "metrics.jsonl")
    os.makedirs(run_dir, exist_ok=True)
    ckpt.clean_run_directory(run_dir)
    if plan.forced:  # checkpoint.resume=force: what it changed, and the checkpoint's config, beside the run
        log(record_forced(run_dir, step, plan.resume_path, plan.resume_state.config or {}, plan.forced))
    atomic_write_text(os.path.join(run_dir, "config.json"),
                           json.dumps(plan.config.to_dict(), indent=2, sort_keys=True) + "\n")
    if plan.resume_state is not None:
        repair_jsonl(jsonl, step, log)  # a torn last line (a kill mid-write) is dropped, in one line
    elif os.path.exists(jsonl):
        os.unlink(jsonl)  # a fresh run in a directory without checkpoints


def _announce(plan: RunPlan, group, progress: Progress, log: Callable[[str], None]) -> None:
    if plan.resume_state is not None:
        log("resuming from %s at step %d (epoch %d, batch %d of %d)"
            % (plan.resume_path, progress.step, progress.epoch, progress.position, plan.steps_per_epoch))
    if group is not None and not group.reduces_metrics:
        log("note: no horovod.torch: each step's metrics are instance 0's share (1 of %d instances; \"instances\": 1 "
            "in metrics.jsonl); install the Poplar SDK's horovod wheel to reduce them over the instances"
            % (group.num_instances,))
    log(plan.data.describe())
    log(plan.accounting.describe())
    log("training %s: %d steps, %d steps per epoch, run directory %s"
        % (plan.config.name, plan.config.training.steps, plan.steps_per_epoch, plan.run_dir))


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


def train_step(plan: RunPlan, runner, batch, group, progress: Progress, first: bool,
               last_saved: Optional[str]) -> StepRecord:
    """One host call (``optimizer_steps_per_call`` optimizer steps): compiled ahead on this process's first
    (timed apart), run and timed, ``progress`` advanced, its metrics reduced over the PopRun instances (a
    collective with horovod) and refused when the loss is not finite. Returns the call's record."""
    compile_seconds = compile_ahead(runner, batch) if first else 0.0
    start = time.perf_counter()
    metrics = runner.train_step(batch)
    seconds = time.perf_counter() - start
    lr = float(plan.optimizer.param_groups[0]["lr"])
    calls = plan.accounting.execution.optimizer_steps_per_call
    progress.step += calls
    progress.position += calls
    mine = {k: float(getattr(metrics, k)) for k in LOSSES}
    mine.update(sequences=int(metrics.sequences), tokens=int(metrics.tokens), packs=batch_rows(batch),
                seconds=seconds, compile_seconds=compile_seconds)
    whole = reduce_step(group, mine, progress.step)
    check_finite_loss(whole["loss"], progress.step, last_saved)  # reduced: every instance stops at this step
    return StepRecord.from_metrics(progress.step, progress.epoch, lr, whole)


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
    rng_states = gather_rng_states(runner)
    if not runner.is_writer:
        return last_saved
    state = TrainingState(
        step=progress.step,
        model=runner.model.state_dict(),
        optimizer=optimizer_state,
        scheduler=plan.scheduler.state_dict(),
        data={"epoch": progress.epoch, "step_in_epoch": progress.position},
        rng=rng_states[0],
        rng_per_rank=rng_states,
        config=plan.config.to_dict(),
        dataset=plan.fingerprint or plan.data.fingerprint(),
        metrics=record.to_dict(),
    )
    try:
        return ckpt.save_checkpoint(plan.run_dir, state, plan.config.checkpoint.keep)
    except ckpt.NonFiniteState as exc:
        raise TrainingError("the run diverged: %s; not saved. The last checkpoint finite throughout is %s"
                            % (exc, _last_finite(last_saved)))


def gather_rng_states(runner) -> List[Dict[str, Any]]:
    """Every torch process's generator states, by rank (a collective under torchrun; this process's alone in
    one process and on poptorch)."""
    state = ckpt.rng_state()
    if runner.world <= 1:
        return [state]
    import torch.distributed as dist

    parts = [None] * runner.world  # type: List[Any]
    dist.all_gather_object(parts, state)
    return parts


def check_finite_loss(loss: float, step: int, last_saved: Optional[str]) -> None:
    """Stop the run (TrainingError) at a step whose loss is inf or NaN, naming the last finite checkpoint."""
    if not math.isfinite(loss):
        raise TrainingError("loss is %s at step %d: the run diverged and stopped; the last checkpoint finite "
                            "throughout is %s" % (loss, step, _last_finite(last_saved)))


def _last_finite(last_saved: Optional[str]) -> str:
    return last_saved or "none (no checkpoint was written yet)"


def _finish(plan: RunPlan, runner, history: List[StepRecord], last_saved: Optional[str], summary_path: str,
            log: Callable[[str], None]) -> Dict[str, Any]:
    """The run's summary; the writer exports the final model (checkpoint.export) and writes summary.json."""
    summary = run_summary(plan, history, last_saved)
    if not runner.is_writer:
        return summary
    if plan.config.checkpoint.export:
        export_dir = os.path.join(plan.run_dir, "final")
        ckpt.export_hf(runner.model, export_dir, plan.data.vocab_path)
        summary["export"] = export_dir
        log("exported the final model (Hugging Face BertForPreTraining) to %s" % (export_dir,))
    atomic_write_text(summary_path, jsonout.dumps(summary, indent=2, sort_keys=True) + "\n")
    log(summary_line(summary))
    return summary


def _silent(logging_config):
    import dataclasses

    return dataclasses.replace(logging_config, progress_bar=False, tensorboard=False, jsonl=False)


def run(config: PretrainingConfig, log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Validate (no writes), then train; or, with execution.compile_only, compile and stop."""
    if config.execution_spec.compile_only:
        return compile_only(config, log=log)
    return execute(plan_run(config), log=log)


__all__ = ["Progress", "RunPlan", "check_backend", "checkpoint_due", "compile_only", "execute", "plan_run",
           "run", "seed_everything", "train_step"]
