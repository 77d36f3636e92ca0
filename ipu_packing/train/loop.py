"""The pretraining run: validate everything, then train, checkpoint, log and export.

`plan_run(config)` does every check that can fail on user input (backend, config, dataset, phase-1
weights, resume checkpoint) and writes nothing. `execute(plan)` then trains. A run is
deterministic given the config: weights are seeded, each epoch's pack order depends only on
(training.seed, epoch), and checkpoints carry the RNG states, the data position and the optimizer
state as the runner keeps it (on IPUs: read back from the device). `compile_only(config)` compiles
the training step, or loads it from the executable cache, and stops.

Under PopRun the instances agree on their start before the first step and reduce every step's metrics
(train/instances.py). On IPUs the first step's compile is timed apart (``compile_seconds``), outside the
step's seconds and throughput.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from . import checkpoint as ckpt
from .config import BatchAccounting, PretrainingConfig
from .data import TrainingData, batch_rows, check_data_matches, open_shards, read_training_data
from .errors import ConfigError, TrainingError, UserError
from .instances import agree_on_start, agree_ready, reduce_step
from .metrics import MetricsLogger, StepRecord, run_summary, summary_line
from .optim import build_optimizer, build_scheduler
from .phase1 import check_init_from, load_init_from
from .resume import changed_keys, check_resume_matches, load_with_new_hyperparameters, resolve_resume
from .runlock import RunLock


@dataclass
class RunPlan:
    config: PretrainingConfig
    data: TrainingData
    accounting: BatchAccounting
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    resume_state: Optional[Dict[str, Any]]
    resume_path: Optional[str]
    steps_per_epoch: int
    changed_on_resume: List[str] = dataclasses.field(default_factory=list)
    """Keys a forced resume changed (checkpoint.resume=force); empty otherwise."""

    @property
    def run_dir(self) -> str:
        return self.config.run_dir

    @property
    def start_step(self) -> int:
        return int(self.resume_state["step"]) if self.resume_state else 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def _model_class():
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
    calls = _steps_per_call(accounting.execution)
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
    changed = []  # type: List[str]
    if resume_state is not None:
        check_resume_matches(config, data, resume_state, resume_path)
        changed = changed_keys(resume_state.get("config") or {}, config.to_dict())
        if changed and config.checkpoint.resume != "force":
            raise UserError(
                "checkpoint %s was trained with other values of %s: resuming would mix two runs; use "
                "another checkpoint.output_dir, or checkpoint.resume=force to continue with the new values"
                % (resume_path, ", ".join(changed))
            )

    if config.checkpoint.init_from and resume_state is None:
        check_init_from(config, data)  # exists, and was trained on the dataset's vocabulary
    open_shards(data, open_dataset)
    if config.training.num_threads:
        torch.set_num_threads(config.training.num_threads)
    seed_everything(config.training.seed)
    model_cls = _model_class()
    try:
        model = model_cls(config.bert_config())
    except ValueError as exc:  # the model refusing a model: value (hidden_act, position_embedding_type, ...)
        raise ConfigError("model: %s" % (" ".join(str(exc).split()),))
    if resume_state is None and config.checkpoint.init_from:
        load_init_from(config, data, model, model_cls)  # prints one line: what, from where, what is fresh
    optimizer = build_optimizer(model, config.optimizer, accounting.betas)
    scheduler = build_scheduler(optimizer, config.schedule, config.training.steps)
    if resume_state is not None:
        try:
            model.load_state_dict(resume_state["model"])
            if changed:
                load_with_new_hyperparameters(optimizer, scheduler, resume_state)
            else:
                optimizer.load_state_dict(resume_state["optimizer"])
                scheduler.load_state_dict(resume_state["scheduler"])
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise UserError("checkpoint %s does not fit this config (%s)"
                            % (resume_path, " ".join(str(exc).split())[:200]))
    return RunPlan(config, data, accounting, model, optimizer, scheduler, resume_state, resume_path, steps_per_epoch,
                   changed)


def _steps_per_call(execution) -> int:
    """Optimizer steps one runner.train_step runs (device iterations on poptorch, else 1)."""
    return int(getattr(execution, "optimizer_steps_per_call", 1))


def execute(plan: RunPlan, log: Callable[[str], None] = print,
            make_runner: Optional[Callable] = None) -> Dict[str, Any]:
    """Train to config.training.steps, holding the run directory's lock. Returns a summary dict (also
    written to run_dir/summary.json; a finished run returns the one it wrote and writes nothing)."""
    if make_runner is None:
        from ipu_packing.execution import make_runner
    run_dir = plan.run_dir
    step = plan.start_step
    epoch, position = 0, 0
    if plan.resume_state is not None:
        epoch = int(plan.resume_state["data"]["epoch"])
        position = int(plan.resume_state["data"]["step_in_epoch"])

    runner = make_runner(plan.model, plan.optimizer, plan.accounting.execution, scheduler=plan.scheduler)
    rank = int(getattr(runner, "rank", 0))
    writer = is_writer(runner)
    group = _instance_group(runner, run_dir)
    if group is not None:  # PopRun: the instances start alike or all stop, before anything is written
        agree_on_start(group, step, plan.resume_state is not None, runner.model,
                       log=log if writer else (lambda m: None))
    lock = RunLock(run_dir) if writer else None
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
        return _train(plan, runner, rank, writer, step, epoch, position, log, group)
    finally:
        if lock is not None:
            lock.release()


def _instance_group(runner, run_dir: str):
    """The PopRun instances' InstanceGroup (popdist_backend.instance_group), None on one instance and on torch."""
    launch = getattr(runner, "launch", None)
    if launch is None or int(getattr(launch, "num_instances", 1)) <= 1:
        return None
    from ipu_packing.execution.popdist_backend import instance_group

    return instance_group(launch, run_dir)


def _compile_first(runner, batch) -> float:
    """Seconds to compile (or load) the step ahead of its first call, where the runner compiles ahead of time
    (poptorch: its executor is not compiled yet); 0.0 elsewhere (torch compiles nothing ahead)."""
    executor = getattr(runner, "executor", None)
    if executor is None or not hasattr(executor, "isCompiled") or executor.isCompiled():
        return 0.0
    start = time.perf_counter()
    runner.compile(batch)
    return time.perf_counter() - start


def is_writer(runner) -> bool:
    """Whether this process writes the run's files and logs: the runner says (``is_writer``: PopRun instance 0),
    else the first torchrun process (rank 0)."""
    return bool(getattr(runner, "is_writer", int(getattr(runner, "rank", 0)) == 0))


def _train(plan: RunPlan, runner, rank: int, writer: bool, step: int, epoch: int, position: int, log,
           group=None) -> Dict[str, Any]:
    config, data, accounting = plan.config, plan.data, plan.accounting
    run_dir = plan.run_dir
    total = config.training.steps
    if plan.resume_state is not None:
        # Before the first step: on IPUs, poptorch writes the restored moments to the device when it attaches.
        try:
            runner.load_optimizer_state_dict(plan.resume_state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise UserError("checkpoint %s does not fit this config (%s)"
                            % (plan.resume_path, " ".join(str(exc).split())[:200]))
        per_rank = plan.resume_state.get("rng_per_rank") or [plan.resume_state["rng"]]
        ckpt.set_rng_state(per_rank[rank] if rank < len(per_rank) else plan.resume_state["rng"])
    # Under torchrun or poprun every process runs this loop; only the writer (the first) writes files and logs.
    main = writer
    if not main:
        log = lambda message: None  # noqa: E731
    jsonl = os.path.join(run_dir, "metrics.jsonl")
    summary_path = os.path.join(run_dir, "summary.json")
    if plan.resume_state is not None and step >= total and not plan.changed_on_resume and os.path.isfile(summary_path):
        log("run %s already finished at step %d (%s): nothing to do, nothing written" % (run_dir, step, summary_path))
        with open(summary_path, "r", encoding="utf-8") as f:
            return json.load(f)
    if main:
        os.makedirs(run_dir, exist_ok=True)
        ckpt.clean_run_directory(run_dir)
        if plan.changed_on_resume:
            # checkpoint.resume=force: keep the config the checkpoint was trained with beside the new one
            before = os.path.join(run_dir, "config.before_step_%07d.json" % step)
            ckpt.atomic_write_text(before, json.dumps(plan.resume_state.get("config"), indent=2, sort_keys=True) + "\n")
            log("checkpoint.resume=force: continuing with new values of %s (the old config is in %s)"
                % (", ".join(plan.changed_on_resume), before))
        ckpt.atomic_write_text(os.path.join(run_dir, "config.json"),
                               json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
        if plan.resume_state is not None:
            ckpt.truncate_jsonl(jsonl, step)
        elif os.path.exists(jsonl):
            os.unlink(jsonl)  # a fresh run in a directory without checkpoints
    if plan.resume_state is not None:
        log("resuming from %s at step %d (epoch %d, batch %d of %d)"
            % (plan.resume_path, step, epoch, position, plan.steps_per_epoch))
    if group is not None and not group.reduces_metrics:
        log("note: no horovod.torch: each step's metrics are instance 0's share (1 of %d instances; \"instances\": 1 "
            "in metrics.jsonl); install the Poplar SDK's horovod wheel to reduce them over the instances"
            % (group.num_instances,))
    log(data.describe())
    log(accounting.describe())
    log("training %s: %d steps, %d steps per epoch, run directory %s"
        % (config.name, total, plan.steps_per_epoch, run_dir))

    logger = MetricsLogger(run_dir, total, step, config.logging if main else _silent(config.logging), log=log)
    last_saved = plan.resume_path
    per_step = accounting.global_batch_packs
    calls = _steps_per_call(accounting.execution)
    history = []
    compiled = False
    try:
        while step < total:
            order = data.epoch_order(config.training.seed, epoch)
            subset = torch.utils.data.Subset(data.dataset,
                                             order[position * per_step : plan.steps_per_epoch * per_step].tolist())
            loader = runner.dataloader(subset, num_workers=config.data.num_workers)
            # Creating a DataLoader iterator draws a base seed from torch's global RNG; keep the
            # RNG stream independent of where a run was resumed.
            rng = torch.get_rng_state()
            batches = iter(loader)
            torch.set_rng_state(rng)
            for batch in batches:
                compile_seconds = 0.0
                if not compiled:  # the first step's compile, timed apart from the step
                    compile_seconds, compiled = _compile_first(runner, batch), True
                start = time.perf_counter()
                metrics = runner.train_step(batch)
                seconds = time.perf_counter() - start
                lr = float(plan.optimizer.param_groups[0]["lr"])
                step += calls
                position += calls
                mine = {k: float(getattr(metrics, k))
                        for k in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")}
                mine.update(sequences=int(metrics.sequences), tokens=int(metrics.tokens), packs=batch_rows(batch),
                            seconds=seconds, compile_seconds=compile_seconds)
                whole = reduce_step(group, mine, step)  # every PopRun instance's share (a collective with horovod)
                if not math.isfinite(whole["loss"]):  # reduced: every instance stops at the same step
                    raise TrainingError(
                        "loss is %s at step %d: the run diverged and stopped; the last checkpoint finite "
                        "throughout is %s" % (whole["loss"], step, last_saved or "none (no checkpoint was written yet)")
                    )
                rows, sequences, tokens, seconds = (int(whole["packs"]), int(whole["sequences"]), int(whole["tokens"]),
                                                    whole["seconds"])
                record = StepRecord(
                    step=step,
                    loss=whole["loss"],
                    mlm_loss=whole["mlm_loss"],
                    nsp_loss=whole["nsp_loss"],
                    mlm_accuracy=whole["mlm_accuracy"],
                    nsp_accuracy=whole["nsp_accuracy"],
                    lr=lr,
                    sequences=sequences,
                    tokens=tokens,
                    packs=rows,
                    packing_factor=sequences / float(max(1, rows)),
                    seconds=seconds,
                    sequences_per_second=sequences / max(seconds, 1e-9),
                    tokens_per_second=tokens / max(seconds, 1e-9),
                    epoch=epoch,
                    compile_seconds=whole["compile_seconds"],
                    instances=int(whole["instances"]),
                )
                logger.log(record)
                history.append(record)
                if position >= plan.steps_per_epoch:
                    epoch, position = epoch + 1, 0
                every = config.checkpoint.every_steps
                if step >= total or (every and step // every > (step - calls) // every):
                    getattr(runner, "sync_model", lambda: None)()  # pipelined: gather every stage's weights
                    optimizer_state = runner.optimizer_state_dict()  # a collective under torchrun
                    rng_states = _gathered(runner, ckpt.rng_state())
                    if main:
                        try:
                            last_saved = _save(plan, runner, step, epoch, position, record, optimizer_state, rng_states)
                        except ckpt.NonFiniteState as exc:
                            raise TrainingError(
                                "the run diverged: %s; not saved. The last checkpoint finite throughout is %s"
                                % (exc, last_saved or "none (no checkpoint was written yet)")
                            )
                if step >= total:
                    break
            if step < total and position != 0:  # the loader stopped early: its batches are not global_batch_packs
                raise TrainingError(
                    "the data loader gave fewer batches than %d per epoch; batch size mismatch"
                    % (plan.steps_per_epoch,)
                )
    finally:
        logger.close()

    summary = run_summary(plan, history, last_saved)
    if not main:
        return summary
    if config.checkpoint.export:
        export_dir = os.path.join(run_dir, "final")
        ckpt.export_hf(runner.model, export_dir, data.vocab_path)
        summary["export"] = export_dir
        log("exported the final model (Hugging Face BertForPreTraining) to %s" % (export_dir,))
    ckpt.atomic_write_text(summary_path, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    log(summary_line(summary))
    return summary


def _silent(logging_config):
    import dataclasses

    return dataclasses.replace(logging_config, progress_bar=False, tensorboard=False, jsonl=False)


def _gathered(runner, obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] (a collective under torchrun; [obj] in one process)."""
    world = int(getattr(runner, "world", 1))
    if world <= 1:
        return [obj]
    import torch.distributed as dist

    parts = [None] * world
    dist.all_gather_object(parts, obj)
    return parts


def _save(plan: RunPlan, runner, step: int, epoch: int, position: int, record: StepRecord, optimizer_state,
          rng_states) -> str:
    model = runner.model
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer_state,
        "scheduler": plan.scheduler.state_dict(),
        "data": {"epoch": epoch, "step_in_epoch": position},
        "rng": rng_states[0],
        "rng_per_rank": rng_states,  # each process's dropout stream (pipeline stages differ)
        "config": plan.config.to_dict(),
        "dataset": plan.data.fingerprint(),
        "metrics": record.to_dict(),
    }
    return ckpt.save_checkpoint(plan.run_dir, state, plan.config.checkpoint.keep)


def compile_only(
    config: PretrainingConfig,
    log: Callable[[str], None] = print,
    make_runner: Optional[Callable] = None,
    open_dataset: Optional[Callable] = None,
) -> Dict[str, Any]:
    """Compile the training step, or load it from the executable cache, then stop: no step runs and
    nothing but the cache is written (Graphcore's run_pretraining.py --compile-only does the same).

    The step is compiled for the shapes the run will feed it: the first host call's batch of the
    prepared dataset when it exists; otherwise a generated batch of the config's S and K and the M
    of the default masking recipe (Graphcore compiles on a generated batch too), with the
    accumulation the config's packing_factor_estimate gives."""
    check_backend(config)
    data = None
    if os.path.isfile(os.path.join(config.data.path, "manifest.json")):
        data = open_shards(read_training_data(config.data.path), open_dataset)
        check_data_matches(config, data)
    accounting = config.batch_accounting(data.packing_factor if data is not None
                                         else config.data.packing_factor_estimate)
    seed_everything(config.training.seed)
    model = _model_class()(config.bert_config())
    optimizer = build_optimizer(model, config.optimizer, accounting.betas)
    scheduler = build_scheduler(optimizer, config.schedule, config.training.steps)
    if make_runner is None:
        from ipu_packing.execution import make_runner
    runner = make_runner(model, optimizer, accounting.execution, scheduler=scheduler)
    if data is not None:
        batch = next(iter(runner.dataloader(data.dataset, num_workers=0)))
        source = "the first batch of %s" % (data.path,)
    else:
        batch = _generated_batch(config, accounting.execution.packs_per_loader_item)
        source = "a generated batch (S=%d, K=%d, M=%d; no dataset at %s)" % (
            config.data.max_seq_length, config.data.expected_sequences_per_pack, batch["mlm_positions"].shape[1],
            config.data.path)
    start = time.perf_counter()
    runner.compile(batch)
    seconds = time.perf_counter() - start
    cache = accounting.execution.executable_cache_dir
    log("compile only: compiled (or loaded) the training step of %s for %s in %.1f s" % (config.name, source, seconds))
    log("executable cache: %s"
        % (os.path.abspath(cache) if cache else "none (execution.executable_cache_dir is empty: nothing kept)"))
    return {"config": config.name, "executable_cache": cache, "compile_seconds": seconds}


def _generated_batch(config: PretrainingConfig, packs: int) -> Dict[str, torch.Tensor]:
    """A host call's batch of all-zero packs of the run's shapes: shapes and dtypes are all a compile sees."""
    import numpy as np

    from ipu_packing.data.format import as_batch, mlm_slots, pack_dtype

    S, K = config.data.max_seq_length, config.data.expected_sequences_per_pack
    records = np.zeros(packs, dtype=pack_dtype(S, mlm_slots(S, K), K))
    return {name: torch.from_numpy(array) for name, array in as_batch(records).items()}


def run(config: PretrainingConfig, log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Validate (no writes), then train; or, with execution.compile_only, compile and stop."""
    if config.execution_spec.compile_only:
        return compile_only(config, log=log)
    return execute(plan_run(config), log=log)
