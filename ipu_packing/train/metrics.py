"""Per-step metrics: a named record, a progress bar, TensorBoard scalars and JSON lines."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .. import jsonin, jsonout


@dataclass
class StepRecord:
    """What one host call reports (metrics.jsonl holds one of these per line, its metrics at the top level)."""

    step: int
    metrics: Dict[str, float]
    """The task's step metrics (train/task.py), "loss" first; ``record.loss`` reads ``metrics["loss"]``."""
    lr: float
    sequences: int
    """Real sequences in the step (all packs of the step)."""
    tokens: int
    """Real (non-padding) tokens in the step."""
    packs: int
    """Rows of the step: packs, or padded sequences for the baseline."""
    packing_factor: float
    """sequences / packs in this step."""
    seconds: float
    """Wall time of the step (of its slowest PopRun instance), its compile left out."""
    sequences_per_second: float
    tokens_per_second: float
    epoch: int
    compile_seconds: float = 0.0
    """Seconds compiling (or loading) the step ahead of its first call, apart from ``seconds``: on IPUs the
    first step of a run, the slowest instance's; 0 on every other step and on torch."""
    instances: int = 1
    """PopRun instances whose shares the record sums: all of them with horovod.torch; 1 on one instance,
    on torch, and under PopRun without horovod (instance 0's share then)."""

    def __getattr__(self, name: str) -> float:
        metrics = self.__dict__.get("metrics") or {}
        if name in metrics:
            return metrics[name]
        raise AttributeError(name)

    @classmethod
    def from_metrics(cls, step: int, epoch: int, lr: float, whole: Mapping[str, float],
                     names: Sequence[str]) -> "StepRecord":
        """The record of the host call that ended at ``step``, from its values over every process (the runner's
        ``reduce_metrics``: the metrics ``names``, sequences, tokens, packs, seconds, compile_seconds and
        ``instances``); the rates are over ``seconds``."""
        rows, sequences, tokens = int(whole["packs"]), int(whole["sequences"]), int(whole["tokens"])
        seconds = whole["seconds"]
        return cls(
            step=step,
            metrics={name: whole[name] for name in names},
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

    def to_dict(self) -> Dict[str, Any]:
        """The metrics.jsonl line: the metrics first, then every other field."""
        out = dict(self.metrics)
        for f in dataclasses.fields(self):
            if f.name != "metrics":
                out[f.name] = getattr(self, f.name)
        return out


class MetricsLogger:
    """Writes StepRecords to metrics.jsonl and TensorBoard, and drives a tqdm progress bar."""

    def __init__(self, jsonl_path: str, tensorboard_dir: str, total_steps: int, start_step: int, logging_config,
                 shown=("loss",), log=print):
        self.jsonl_path = jsonl_path if logging_config.jsonl else None
        self.shown = tuple(shown)
        self.writer = None
        if logging_config.tensorboard:
            from ..errors import MissingExtra, one_line, require_extra

            try:
                writer = require_extra("torch.utils.tensorboard", "logging.tensorboard").SummaryWriter
                self.writer = writer(tensorboard_dir, purge_step=start_step + 1)
            except Exception as exc:  # tensorboard is optional (e.g. a Poplar SDK venv without it)
                cause = str(exc) if isinstance(exc, MissingExtra) else "%s: %s" % (type(exc).__name__, one_line(exc))
                log("note: TensorBoard logging off (%s; or set logging.tensorboard=false)" % (cause[:300],))
        self.bar = None
        if logging_config.progress_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, file=sys.stderr)
        self._jsonl = open(self.jsonl_path, "a", encoding="utf-8") if self.jsonl_path else None

    def log(self, record: StepRecord) -> None:
        if self._jsonl is not None:
            self._jsonl.write(jsonout.jsonl_text([record.to_dict()]))  # NaN: null + warnings
            self._jsonl.flush()
        if self.writer is not None:
            for key, value in record.to_dict().items():
                if key not in ("step", "epoch"):
                    self.writer.add_scalar("train/" + key, value, record.step)
        if self.bar is not None:
            self.bar.update(1)
            shown = {name: "%.3f" % record.metrics[name] for name in self.shown}
            shown.update(seq_s="%.1f" % record.sequences_per_second, pf="%.2f" % record.packing_factor)
            self.bar.set_postfix(refresh=False, **shown)

    def write(self, message: str) -> None:
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr)

    def close(self) -> None:
        """Close the bar, the event file and metrics.jsonl (again: nothing)."""
        bar, writer, jsonl = self.bar, self.writer, self._jsonl
        self.bar = self.writer = self._jsonl = None
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
        if jsonl is not None:
            jsonl.close()


def _mean(values) -> float:
    values = list(values)
    return float(sum(values) / len(values)) if values else float("nan")


def run_summary(plan, history: List[Dict[str, Any]], steps_this_run: int, last_saved: Optional[str]) -> Dict[str, Any]:
    """summary.json of a run (plan: the loop's RunPlan; history: its step records as dicts, the run's metrics.jsonl
    on the writer, else this process's steps): first_steps and last_steps from the first and last records, the
    seconds, compile seconds and rates from the last ``steps_this_run`` (this invocation's)."""
    task = plan.task
    n = max(1, min(10, len(history) // 4 or 1))
    first, last = history[:n], history[-n:]
    timed = history[-steps_this_run:] if steps_this_run else []
    seconds = sum(r["seconds"] for r in timed)
    return {
        "config": plan.config.name,
        "task": task.name,
        "steps": plan.config.training.steps,
        "steps_this_run": steps_this_run,
        "checkpoint": last_saved,
        "packing_factor": plan.data.packing_factor,
        "dataset": {"content_sha256": plan.fingerprint["content_sha256"], "path": plan.data.path},
        "batch_accounting": plan.accounting.method,
        "micro_batch_size": plan.accounting.execution.micro_batch_size,
        "gradient_accumulation": plan.accounting.gradient_accumulation,
        "global_batch_packs": plan.accounting.global_batch_packs,
        "betas": list(plan.accounting.betas),
        "first_steps": {name: _mean(r[name] for r in first) for name in task.first_metrics},
        "last_steps": {name: _mean(r[name] for r in last) for name in task.last_metrics},
        "train_seconds": seconds,
        "compile_seconds": sum(r["compile_seconds"] for r in timed),
        "instances": history[-1]["instances"] if history else 1,
        "sequences_per_second": sum(r["sequences"] for r in timed) / max(seconds, 1e-9),
        "tokens_per_second": sum(r["tokens"] for r in timed) / max(seconds, 1e-9),
    }


def summary_line(s: Dict[str, Any], task) -> str:
    if not s["steps_this_run"]:
        return "nothing to train: already at step %d; %s" % (s["steps"], task.describe(s))
    compiled = s.get("compile_seconds") or 0.0
    return (
        "done: %d steps in %.1f s%s; %s; %.1f sequences/s, %.0f real tokens/s; packing factor %.3f"
        % (
            s["steps_this_run"],
            s["train_seconds"],
            " (and %.1f s compiling)" % compiled if compiled else "",
            task.describe(s),
            s["sequences_per_second"],
            s["tokens_per_second"],
            s["packing_factor"],
        )
    )


def repair_jsonl(path: str, last_step: int, log=print) -> int:
    """Cut metrics.jsonl back to the records of steps up to ``last_step`` (the checkpoint a run resumes from),
    atomically. A last line a kill tore (no newline, not JSON, not a record) is dropped and said in one line;
    a bad line before it is refused (UserError naming the file and line). Returns the records kept."""
    from ..fsutil import atomic_write_text
    from ..errors import UserError

    if not os.path.lexists(path):
        return 0
    from ..fsutil import open_regular

    with open_regular(path, "rb", error=UserError) as f:
        original = f.read()
    lines = jsonin.jsonl_lines(original)  # at "\n" only, as every JSON Lines file is read
    complete = jsonin.jsonl_complete(original)
    kept = []  # type: list
    for index, (number, raw) in enumerate(lines):
        record = _record(raw)
        last = index == len(lines) - 1
        if record is None or (last and not complete):
            if not last:
                raise UserError("%s line %d is not a metrics record (%r): the file was edited or corrupted; "
                                "move it away to resume" % (path, number, raw[:60]))
            log("note: %s: dropped a torn last line (%d bytes, left by a kill while it was written)"
                % (path, len(raw)))
            continue
        if record["step"] <= last_step:
            kept.append(record)
    text = jsonout.jsonl_text(kept)
    if text.encode("utf-8") != original:  # unchanged: not rewritten
        atomic_write_text(path, text)
    return len(kept)


def _record(raw: bytes) -> Optional[Dict[str, Any]]:
    """The metrics record a line holds, or None when it is not one (torn, not UTF-8, not an object with
    an integer step)."""
    try:
        record = jsonin.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or isinstance(record.get("step"), bool) or not isinstance(record.get("step"), int):
        return None
    return record
