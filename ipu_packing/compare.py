"""Compare two training runs, e.g. packed against padded: throughput, time to the same loss, and the
loss at equal sequences seen.

    python -m ipu_packing.compare RUN_A RUN_B [--json] [--plot PNG] [--window N] [--warmup N]

Each run is a run directory of ``run_pretraining.py`` (metrics.jsonl, config.json, summary.json), from
any backend. A is the candidate (say packed), B the baseline (say padded):

- ``throughput_ratio``: A's sequences/s over B's in steady state, i.e. leaving out each run's first
  ``--warmup`` steps (compilation, caches, the allocator's first passes);
- ``time_to_target_ratio``: B's wall time to reach B's final smoothed MLM loss, over A's wall time to
  reach that same loss (null when A never reaches it);
- ``loss_gap``: the largest relative difference |A - B| / B of smoothed MLM loss at equal sequences seen,
  over the second half of the range both runs cover (A's curve is interpolated at B's points);
- for each run: sequences per optimizer step (mean and spread), tokens/s, final smoothed MLM loss and
  accuracy, NSP accuracy, and the batch accounting it ran with;
- a warning when the runs' mean sequences per optimizer step differ by more than 5%: the comparison is
  then not like for like (packing keeps the global batch in sequences; see BatchAccounting).

Smoothing: the smoothed value at step i is the mean over steps i-W+1 .. i (a trailing window of W steps,
fewer at the start), so it never looks ahead and "the first step whose smoothed loss is at most the
target" is a time the run had actually reached. W defaults to a tenth of the shorter run, at least 1.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

from .errors import ArgumentParser, UserError, run_command

LIKE_FOR_LIKE = 0.05
"""Largest relative difference of mean sequences per step before compare warns."""


class CompareError(UserError):
    """A run directory cannot be compared (missing, empty, unreadable)."""


@dataclass
class Run:
    """One run's per-step series, read from its run directory."""

    path: str
    steps: np.ndarray  # (T,) int
    sequences: np.ndarray  # (T,) sequences in each optimizer step
    tokens: np.ndarray  # (T,)
    seconds: np.ndarray  # (T,) wall time of each step
    mlm_loss: np.ndarray  # (T,)
    mlm_accuracy: np.ndarray  # (T,)
    nsp_accuracy: np.ndarray  # (T,)
    config: Dict[str, Any] = field(default_factory=dict)
    summary: Dict[str, Any] = field(default_factory=dict)


def read_run(path: str) -> Run:
    metrics = os.path.join(path, "metrics.jsonl")
    if not os.path.isdir(path):
        raise CompareError("%s is not a run directory" % (path,))
    if not os.path.isfile(metrics):
        raise CompareError("%s has no metrics.jsonl (is it a run directory of run_pretraining.py?)" % (path,))
    rows = []
    with open(metrics, "r", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                raise CompareError("%s line %d is not JSON" % (metrics, number))
    if not rows:
        raise CompareError("%s holds no steps" % (metrics,))
    keys = ("step", "sequences", "tokens", "seconds", "mlm_loss", "mlm_accuracy", "nsp_accuracy")
    for number, row in enumerate(rows, 1):
        missing = [k for k in keys if not isinstance(row.get(k), (int, float)) or isinstance(row.get(k), bool)]
        if missing:
            raise CompareError("%s step record %d lacks %s" % (metrics, number, ", ".join(missing)))
    column = {k: np.array([float(r[k]) for r in rows]) for k in keys}
    extra = {}
    for name in ("config", "summary"):
        file = os.path.join(path, name + ".json")
        if os.path.isfile(file):
            try:
                with open(file, "r", encoding="utf-8") as f:
                    extra[name] = json.load(f)
            except ValueError:
                raise CompareError("%s is not JSON" % (file,))
    return Run(path, column["step"].astype(np.int64), column["sequences"], column["tokens"], column["seconds"],
               column["mlm_loss"], column["mlm_accuracy"], column["nsp_accuracy"], **extra)


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` steps (fewer at the start): (T,) -> (T,)."""
    values = np.asarray(values, dtype=np.float64)
    sums = np.cumsum(np.concatenate([[0.0], values]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def throughput(run: Run, warmup: int) -> float:
    """Sequences per second over the steps after the first ``warmup``."""
    keep = slice(min(warmup, len(run.steps) - 1), None)
    return float(run.sequences[keep].sum() / max(run.seconds[keep].sum(), 1e-12))


def time_to(run: Run, target: float, window: int) -> Optional[float]:
    """Wall seconds until the run's smoothed MLM loss first reaches ``target`` (None if never)."""
    reached = np.flatnonzero(smooth(run.mlm_loss, window) <= target)
    if not len(reached):
        return None
    return float(np.cumsum(run.seconds)[reached[0]])


def loss_gap(a: Run, b: Run, window: int) -> float:
    """Largest |A - B| / B of smoothed MLM loss at equal sequences seen, over the second half of the
    sequences both runs cover; A is interpolated at B's points."""
    seen_a, seen_b = np.cumsum(a.sequences), np.cumsum(b.sequences)
    common = min(seen_a[-1], seen_b[-1])
    points = (seen_b >= common / 2.0) & (seen_b <= common) & (seen_b >= seen_a[0])
    if not points.any():
        return float("nan")
    la = np.interp(seen_b[points], seen_a, smooth(a.mlm_loss, window))
    lb = smooth(b.mlm_loss, window)[points]
    return float(np.max(np.abs(la - lb) / np.abs(lb)))


def describe(run: Run, warmup: int, window: int) -> Dict[str, Any]:
    keep = slice(min(warmup, len(run.steps) - 1), None)
    training = run.config.get("training", {}) if isinstance(run.config, dict) else {}
    return {
        "path": run.path,
        "steps": int(len(run.steps)),
        "sequences_per_step_mean": float(run.sequences.mean()),
        "sequences_per_step_std": float(run.sequences.std()),
        "sequences_per_second": throughput(run, warmup),
        "tokens_per_second": float(run.tokens[keep].sum() / max(run.seconds[keep].sum(), 1e-12)),
        "final_mlm_loss": float(smooth(run.mlm_loss, window)[-1]),
        "final_mlm_accuracy": float(smooth(run.mlm_accuracy, window)[-1]),
        "final_nsp_accuracy": float(smooth(run.nsp_accuracy, window)[-1]),
        "global_batch_sequences": training.get("global_batch_sequences"),
        "batch_accounting": run.summary.get("batch_accounting", training.get("batch_accounting")),
        "gradient_accumulation": run.summary.get("gradient_accumulation"),
        "packing_factor": run.summary.get("packing_factor"),
    }


@dataclass
class Comparison:
    throughput_ratio: float
    time_to_target_ratio: Optional[float]
    target_mlm_loss: float
    loss_gap: float
    window: int
    warmup: int
    a: Dict[str, Any]
    b: Dict[str, Any]
    warnings: List[str]


def compare(a: Run, b: Run, window: Optional[int] = None, warmup: Optional[int] = None) -> Comparison:
    shorter = min(len(a.steps), len(b.steps))
    window = int(window) if window else max(1, shorter // 10)
    warmup = int(warmup) if warmup is not None else max(1, shorter // 10) if shorter > 1 else 0
    target = float(smooth(b.mlm_loss, window)[-1])
    t_a, t_b = time_to(a, target, window), time_to(b, target, window)
    warnings = []
    mean_a, mean_b = float(a.sequences.mean()), float(b.sequences.mean())
    if abs(mean_a - mean_b) > LIKE_FOR_LIKE * mean_b:
        warnings.append(
            "sequences per optimizer step differ: %.1f (A) against %.1f (B), %+.1f%%; the runs are not like for like"
            % (mean_a, mean_b, 100.0 * (mean_a / mean_b - 1.0))
        )
    return Comparison(
        throughput_ratio=throughput(a, warmup) / throughput(b, warmup),
        time_to_target_ratio=None if t_a is None or t_b is None else t_b / max(t_a, 1e-12),
        target_mlm_loss=target,
        loss_gap=loss_gap(a, b, window),
        window=window,
        warmup=warmup,
        a=describe(a, warmup, window),
        b=describe(b, warmup, window),
        warnings=warnings,
    )


def format_comparison(c: Comparison) -> str:
    ttt = "never (A does not reach it)" if c.time_to_target_ratio is None else "%.3fx" % c.time_to_target_ratio
    lines = [
        "A: %s" % c.a["path"],
        "B: %s" % c.b["path"],
        "throughput ratio (A/B, steady state after %d steps)  %.3fx" % (c.warmup, c.throughput_ratio),
        "time to B's final smoothed MLM loss %.4f (B/A)      %s" % (c.target_mlm_loss, ttt),
        "loss gap at equal sequences seen (2nd half)        %.2f%%" % (100.0 * c.loss_gap),
        "smoothing: trailing mean over %d steps" % c.window,
        "",
        "%-28s %14s %14s" % ("", "A", "B"),
    ]
    for key in ("steps", "sequences_per_step_mean", "sequences_per_step_std", "sequences_per_second",
                "tokens_per_second", "final_mlm_loss", "final_mlm_accuracy", "final_nsp_accuracy",
                "global_batch_sequences", "batch_accounting", "gradient_accumulation", "packing_factor"):
        cells = []
        for side in (c.a, c.b):
            value = side.get(key)
            cells.append("%.4g" % value if isinstance(value, float) else str(value))
        lines.append("%-28s %14s %14s" % (key, cells[0], cells[1]))
    lines += ["warning: %s" % w for w in c.warnings]
    return "\n".join(lines)


def draw(a: Run, b: Run, window: int, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for run, label in ((a, "A " + os.path.basename(os.path.normpath(a.path))),
                       (b, "B " + os.path.basename(os.path.normpath(b.path)))):
        loss = smooth(run.mlm_loss, window)
        left.plot(np.cumsum(run.sequences), loss, label=label)
        right.plot(np.cumsum(run.seconds), loss, label=label)
    left.set_xlabel("sequences seen")
    right.set_xlabel("wall-clock seconds (sum of step times)")
    for axis in (left, right):
        axis.set_ylabel("MLM loss (trailing mean, %d steps)" % window)
        axis.legend()
    figure.tight_layout()
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _main(argv: Optional[List[str]]) -> int:
    parser = ArgumentParser(prog="python -m ipu_packing.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", help="candidate run directory (e.g. packed)")
    parser.add_argument("run_b", help="baseline run directory (e.g. padded)")
    parser.add_argument("--window", type=int, default=None,
                        help="smoothing window in steps (default: a tenth of the shorter run)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="steps left out of throughput (default: a tenth of the shorter run)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", default=None, help="PNG: MLM loss against sequences seen and against seconds")
    args = parser.parse_args(argv)
    if args.window is not None and args.window < 1:
        raise CompareError("--window must be >= 1, got %d" % args.window)
    if args.warmup is not None and args.warmup < 0:
        raise CompareError("--warmup must be >= 0, got %d" % args.warmup)
    a, b = read_run(args.run_a), read_run(args.run_b)
    result = compare(a, b, window=args.window, warmup=args.warmup)
    if args.plot:
        draw(a, b, result.window, args.plot)
    print(json.dumps(asdict(result), sort_keys=True) if args.json else format_comparison(result))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
