"""Compare two training runs, e.g. packed against padded: throughput, time to the same loss, and the
loss at equal sequences seen.

    python -m ipu_packing.compare RUN_A RUN_B [--json] [--plot PNG] [--window N] [--warmup N]

Each run is a run directory of ``run_pretraining.py`` (metrics.jsonl, config.json, summary.json), from
any backend. A is the candidate (say packed), B the baseline (say padded):

- ``throughput_ratio``: A's sequences/s over B's in steady state, i.e. leaving out each run's first
  ``--warmup`` steps (compilation, caches, the allocator's first passes; one that leaves no step of the shorter
  run is refused);
- ``time_to_target_ratio``: B's wall time to reach B's final smoothed MLM loss, over A's wall time to
  reach that same loss (null when A never reaches it);
- ``loss_gap``: the largest relative difference |A - B| / B of smoothed MLM loss at equal sequences seen,
  over the second half of the range both runs cover (A's curve is interpolated at B's points);
- for each run: sequences per optimizer step (mean and spread), tokens/s, final smoothed MLM loss and
  accuracy, NSP accuracy, and the batch accounting it ran with;
- a warning when the runs' mean sequences per optimizer step differ by more than 5%: the comparison is
  then not like for like (packing keeps the global batch in sequences; see BatchAccounting);
- a refusal, unless ``--force``, when the runs' config.json differ in S (``data.max_seq_length``), K
  (``data.max_sequences_per_pack``) or dataset: an S=128 run is ~6x "faster" than an S=512 one for reasons
  that have nothing to do with packing. With ``--force`` each difference is a warning.

A dataset is identified by its content digest (data/format.py ``dataset_identity``: its shards' sha256 and
counts, vocabulary, S, K, M, dtypes; no path), not by the text of ``data.dir``: two datasets both named
``data`` in two directories differ, one dataset spelled relative and absolute, or copied elsewhere, is the
same. A run's dataset is ``data.dir``/``data.layout``, the prepared root whose packed/ and padded/ a packed
and a padded run read; what each run read is found, in this order, from

1. what the run recorded: summary.json's ``dataset`` or, failing that, its newest step checkpoint's
   (``dataset.content_sha256`` and ``dataset.path``, read with ``torch.load(weights_only=True)``); the
   root's other layout is identified from its manifest when the recorded one still matches its own;
2. the manifests under ``data.dir`` (a relative path from the working directory) when the run recorded
   nothing.

Two runs read the same data when the layouts identified for both have the same digests. Where a run's
dataset cannot be identified (it recorded nothing and its ``data.dir`` is gone, or the two runs'
identified layouts do not overlap), compare falls back to the text of ``data.dir``, each made absolute from
the working directory (or the recorded path's root): the same directory is the same dataset.

Warnings are the ``warnings`` field of ``--json``, or the last lines of the text report; with ``--json``, a
forced difference in S, K or dataset is also a ``warning:`` line on stderr.

Smoothing: the smoothed value at step i is the mean over steps i-W+1 .. i (a trailing window of W steps,
fewer at the start), so it never looks ahead and "the first step whose smoothed loss is at most the
target" is a time the run had actually reached. W defaults to a tenth of the shorter run, at least 1.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from . import jsonin, jsonout, tasks
from .errors import ArgumentParser, UserError, one_line, require_extra, run_command
from .fsutil import atomic_write_with, check_output, open_regular

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


COUNTS = ("step", "sequences", "tokens", "seconds")
"""Fields of a step record that must be finite and >= 0; the losses and accuracies may be NaN (a diverged run)."""
CURVES = tasks.PRETRAINING.compared
"""The series compared (tasks/pretraining.py)."""


def read_run(path: str) -> Run:
    """A run directory's series, every record checked before use: each metrics line is a JSON object with
    the numeric fields, and config.json and summary.json (when present) are JSON objects. Anything else is
    a CompareError naming the file and the line."""
    from .train.run_dir import RunDirectory

    run_dir = RunDirectory(path)
    metrics = run_dir.file(RunDirectory.METRICS)
    if not os.path.isdir(path):
        raise CompareError("%s is not a run directory" % (path,))
    if not os.path.lexists(metrics):
        raise CompareError("%s has no metrics.jsonl (is it a run directory of run_pretraining.py?)" % (path,))
    extra = {}
    for name, file in (("config", run_dir.file(RunDirectory.CONFIG)), ("summary", run_dir.file(RunDirectory.SUMMARY))):
        if os.path.lexists(file):
            with open_regular(file, "rb", error=CompareError) as f:
                value = _json_value(f.read(), file)
            if not isinstance(value, dict):
                raise CompareError("%s is %s, not a JSON object" % (file, _kind(value)))
            extra[name] = value
    for section in ("training", "data", "task"):
        value = extra.get("config", {}).get(section)
        if value is not None and not isinstance(value, dict):
            raise CompareError("%s: %s is %s, not a JSON object" % (run_dir.file(RunDirectory.CONFIG), section,
                                                                    _kind(value)))
    task = (extra.get("config", {}).get("task") or {}).get("name")
    if task is not None and not tasks.get(str(task)).compared:  # config.json names the run's task
        raise CompareError("%s is a %s run: compare reads pretraining runs' MLM and NSP curves (python -m "
                           "ipu_packing.bench.convergence compares fine-tuning layouts)" % (path, task))
    keys = COUNTS + CURVES
    columns: Dict[str, List[float]] = {k: [] for k in keys}
    with open_regular(metrics, "rb", error=CompareError) as f:  # a FIFO or a device: one line, never a hang
        data = f.read()
    for number, line in jsonin.jsonl_lines(data):
        row = _json_value(line, "%s line %d" % (metrics, number))
        if not isinstance(row, dict):
            raise CompareError("%s line %d is %s, not a step record (a JSON object)"
                               % (metrics, number, _kind(row)))
        for k in keys:
            value = row.get(k)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                missing = [m for m in keys if isinstance(row.get(m), bool)
                           or not isinstance(row.get(m), (int, float))]
                raise CompareError("%s step record %d lacks %s" % (metrics, number, ", ".join(missing)))
            try:
                value = float(value)
            except OverflowError:
                value = float("inf")
            if k in COUNTS and not (math.isfinite(value) and value >= 0):
                raise CompareError("%s line %d: %s must be a finite number >= 0, got %s"
                                   % (metrics, number, k, repr(row.get(k))[:40]))
            columns[k].append(value)
    if not columns["step"]:
        raise CompareError("%s holds no steps" % (metrics,))
    column = {k: np.array(v, dtype=np.float64) for k, v in columns.items()}
    return Run(path, column["step"].astype(np.int64), column["sequences"], column["tokens"], column["seconds"],
               column["mlm_loss"], column["mlm_accuracy"], column["nsp_accuracy"], **extra)


def _json_value(data: bytes, where: str) -> Any:
    """json.loads(data), every way it can fail (not UTF-8, torn, nested past the recursion limit) one
    CompareError naming ``where``."""
    try:
        return jsonin.loads(data)
    except UnicodeDecodeError as exc:
        raise CompareError("%s is not UTF-8 (%s)" % (where, exc.reason))
    except (jsonin.TooDeep, RecursionError):
        raise CompareError("%s is not JSON this reads: nested too deeply" % (where,))
    except ValueError as exc:
        raise CompareError("%s is not JSON (%s; a torn last line?)" % (where, one_line(exc)[:120]))


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(type(value), "a number")


def _ratio(top: float, bottom: float) -> float:
    """top / bottom, NaN where bottom is 0 (jsonout writes it as null with a warning)."""
    return float(top) / float(bottom) if bottom else float("nan")


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
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero or NaN loss: NaN or inf, reported as null
        return float(np.max(np.abs(la - lb) / np.abs(lb)))


LIKE_DATA = (("S", "max_seq_length"), ("K", "max_sequences_per_pack"), ("dataset", "dir"))
"""What two compared runs must share: (name, key of config.json's ``data`` section)."""
LAYOUTS = ("packed", "padded")


@dataclass
class DatasetSeen:
    """What a run read, as far as it can be identified: its root (absolute), the layout it read, and the
    content digest of each layout under that root that could be identified."""

    root: str
    layout: str
    identities: Dict[str, str]
    source: str  # "recorded" (summary.json or a checkpoint) or "manifest"


def _manifest_identities(root: str) -> Dict[str, str]:
    """{layout: dataset_identity} of the layouts under a prepared root whose manifest reads cleanly."""
    from .data.format import MANIFEST, dataset_identity, read_manifest

    out = {}
    for layout in LAYOUTS:
        directory = os.path.join(root, layout)
        if os.path.isfile(os.path.join(directory, MANIFEST)):
            try:
                out[layout] = dataset_identity(read_manifest(directory))
            except (UserError, OSError, ValueError):
                continue  # a corrupt or foreign manifest identifies nothing
    return out


def _recorded_dataset(run: Run) -> Optional[Dict[str, Any]]:
    """The run's own record of its dataset ({content_sha256, path}): summary.json's ``dataset``, else its newest
    step checkpoint's (the checkpoint is read with torch.load(weights_only=True); a run without torch, or
    whose checkpoint cannot be read, has no record here)."""
    for record in (run.summary.get("dataset"),):
        if isinstance(record, dict) and isinstance(record.get("content_sha256"), str):
            return record
    from .train.run_dir import RunDirectory

    latest = RunDirectory(run.path).latest()
    if latest is None:
        return None
    try:
        import torch

        with open_regular(latest, "rb", error=CompareError) as f:
            state = torch.load(f, map_location="cpu", weights_only=True)
    except CompareError:
        raise
    except Exception:  # an unreadable or foreign checkpoint records nothing compare can use
        return None
    record = state.get("dataset") if isinstance(state, dict) else None
    return record if isinstance(record, dict) and isinstance(record.get("content_sha256"), str) else None


def run_dataset(run: Run) -> Optional[DatasetSeen]:
    """What `run` read (see the module notes), or None where nothing identifies it."""
    data = run.config.get("data") or {}
    layout = data.get("layout") if data.get("layout") in LAYOUTS else "packed"
    record = _recorded_dataset(run)
    if record is not None:
        path = record.get("path")
        root = os.path.dirname(os.path.abspath(path)) if isinstance(path, str) else None
        if isinstance(path, str) and os.path.basename(os.path.normpath(path)) in LAYOUTS:
            layout = os.path.basename(os.path.normpath(path))
        identities = {layout: record["content_sha256"]}
        if root is not None:
            found = _manifest_identities(root)
            if found.get(layout) == record["content_sha256"]:  # the root still holds what the run read
                identities.update(found)
        return DatasetSeen(root or "", layout, identities, "recorded")
    if not isinstance(data.get("dir"), str):
        return None
    root = os.path.abspath(data["dir"])
    found = _manifest_identities(root)
    if layout not in found:
        return None  # gone: the text of data.dir is all there is
    return DatasetSeen(root, layout, found, "manifest")


def _same_data(a: Optional[DatasetSeen], b: Optional[DatasetSeen]) -> Optional[bool]:
    """Whether two runs read one dataset, by content; None where that cannot be told."""
    if a is None or b is None:
        return None
    common = sorted(set(a.identities) & set(b.identities))
    if not common:
        return None
    return all(a.identities[layout] == b.identities[layout] for layout in common)


def _dataset_line(a: Run, b: Run, seen: List[Optional[DatasetSeen]]) -> Optional[str]:
    """The difference in dataset between two runs, by content where both are identified, else by data.dir."""
    dirs = [(run.config.get("data") or {}).get("dir") for run in (a, b)]
    same = _same_data(seen[0], seen[1])
    if same is True:
        return None
    if same is False:
        layout = min(set(seen[0].identities) & set(seen[1].identities))  # type: ignore[union-attr]
        cells = ["%s (%s, %s content %s)" % (_shown(d if isinstance(d, str) else s.root), side, layout,
                                            s.identities[layout][:12])  # type: ignore[union-attr]
                 for d, s, side in zip(dirs, seen, "AB")]
        return "the runs differ in dataset: data.dir %s against %s" % (cells[0], cells[1])
    # not identified by content: the directories, made absolute (a recorded root where the run recorded one)
    places = []
    for d, s in zip(dirs, seen):
        if s is not None and s.root:
            places.append(os.path.normpath(s.root))
        elif isinstance(d, str):
            places.append(os.path.normpath(os.path.abspath(d)))
        else:
            places.append(None)
    if None in places or places[0] == places[1]:
        return None
    return "the runs differ in dataset: data.dir %s (A) against %s (B)" % tuple(
        _shown(d if isinstance(d, str) else p) for d, p in zip(dirs, places))


def data_differences(a: Run, b: Run) -> List[str]:
    """One line per LIKE_DATA value in which the runs differ: S and K as their config.json record them (a value
    a run does not record, an older run's or a hand-made one, is not compared), the dataset by content where
    it can be identified (`run_dataset`), else by its directory."""
    out = []
    for name, key in LIKE_DATA:
        if key == "dir":
            line = _dataset_line(a, b, [run_dataset(a), run_dataset(b)])
            if line:
                out.append(line)
            continue
        values = [(run.config.get("data") or {}).get(key) for run in (a, b)]
        if None not in values and values[0] != values[1]:
            out.append("the runs differ in %s: data.%s %s (A) against %s (B)"
                       % (name, key, _shown(values[0]), _shown(values[1])))
    return out


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


def describe(run: Run, warmup: int, window: int) -> Dict[str, Any]:
    keep = slice(min(warmup, len(run.steps) - 1), None)
    training = run.config.get("training") or {}
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
        "micro_batch_size": run.summary.get("micro_batch_size"),
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


def compare(a: Run, b: Run, window: Optional[int] = None, warmup: Optional[int] = None,
            differences: Optional[List[str]] = None) -> Comparison:
    """The comparison of candidate `a` with baseline `b`; `differences`: data_differences(a, b) where the caller
    has them already."""
    shorter = min(len(a.steps), len(b.steps))
    window = int(window) if window else max(1, shorter // 10)
    warmup = int(warmup) if warmup is not None else max(1, shorter // 10) if shorter > 1 else 0
    target = float(smooth(b.mlm_loss, window)[-1])
    t_a, t_b = time_to(a, target, window), time_to(b, target, window)
    warnings = list(data_differences(a, b) if differences is None else differences)
    mean_a, mean_b = float(a.sequences.mean()), float(b.sequences.mean())
    if abs(mean_a - mean_b) > LIKE_FOR_LIKE * mean_b:
        warnings.append(
            "sequences per optimizer step differ: %.1f (A) against %.1f (B), %+.1f%%; the runs are not like for like"
            % (mean_a, mean_b, 100.0 * (_ratio(mean_a, mean_b) - 1.0))
        )
    return Comparison(
        throughput_ratio=_ratio(throughput(a, warmup), throughput(b, warmup)),
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
                "global_batch_sequences", "batch_accounting", "micro_batch_size", "gradient_accumulation",
                "packing_factor"):
        cells = []
        for side in (c.a, c.b):
            value = side.get(key)
            cells.append("%.4g" % value if isinstance(value, float) else str(value))
        lines.append("%-28s %14s %14s" % (key, cells[0], cells[1]))
    lines += ["warning: %s" % w for w in c.warnings]
    return "\n".join(lines)


def draw(a: Run, b: Run, window: int, path: str) -> str:
    matplotlib = require_extra("matplotlib", "compare --plot")
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
    # written to a temporary file beside it and renamed into place (the umask's mode; check_plot_path refused a
    # symlink, a FIFO or a device at the path first), so a failure leaves the old plot whole
    extension = os.path.splitext(path)[1][1:].lower()
    atomic_write_with(path, lambda f: figure.savefig(f, format=extension, dpi=100))
    plt.close(figure)
    return path


def check_plot_path(path: str, reading: Sequence[str] = ()) -> None:
    """Refuse a --plot path before any work: an extension matplotlib cannot write (naming those it can), then
    anything the one rule of every output refuses (fsutil.check_output: a symlink, a directory, a FIFO or a device,
    a file inside ``reading``, the run directories compared), or a parent that is a file."""
    matplotlib = require_extra("matplotlib", "compare --plot")
    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase

    supported = sorted(FigureCanvasBase.get_supported_filetypes())
    extension = os.path.splitext(path)[1][1:].lower()
    if extension not in supported:
        raise CompareError("--plot %s: %s; supported: %s" % (
            path, "unsupported extension .%s" % extension if extension else "no file extension",
            ", ".join("." + e for e in supported)))
    check_output(path, "--plot", reading=reading, error=CompareError)
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise CompareError("--plot %s: %s is not a directory" % (path, parent))


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
    parser.add_argument("--force", action="store_true",
                        help="compare runs that differ in S, K or dataset (each difference then a warning)")
    args = parser.parse_args(argv)
    if args.plot is not None:
        check_plot_path(args.plot, reading=[args.run_a, args.run_b])
    if args.window is not None and args.window < 1:
        raise CompareError("--window must be >= 1, got %d" % args.window)
    if args.warmup is not None and args.warmup < 0:
        raise CompareError("--warmup must be >= 0, got %d" % args.warmup)
    a, b = read_run(args.run_a), read_run(args.run_b)
    shorter = min(len(a.steps), len(b.steps))
    if args.warmup is not None and args.warmup >= shorter:
        raise CompareError("--warmup %d leaves no step of the shorter run (%d steps) to time: give at most %d"
                           % (args.warmup, shorter, shorter - 1))
    differences = data_differences(a, b)
    if differences and not args.force:
        raise CompareError("%s: the ratios would not measure packing; compare runs of one S, K and dataset, or "
                           "pass --force" % "; ".join(d[len("the runs differ in "):] if i else d
                                                     for i, d in enumerate(differences)))
    result = compare(a, b, window=args.window, warmup=args.warmup, differences=differences)
    if args.plot:
        draw(a, b, result.window, args.plot)
    if args.json:  # forced past a difference in S, K or dataset: said beside the object too
        for line in differences:
            print("warning: %s" % (line,), file=sys.stderr)
    print(jsonout.dumps(asdict(result), sort_keys=True) if args.json else format_comparison(result))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
