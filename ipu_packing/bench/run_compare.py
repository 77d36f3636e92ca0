"""Training commands and their bitwise comparison, for gpu_check.py: run a command from the repository root
(``run_command_line``), or run_pretraining.py killed by SIGKILL at a known step (``run_killed``), read a run
directory's metrics.jsonl losses and checkpoints, and compare two runs bitwise (``compare_runs``: the losses
as exact floats, the last checkpoints' model, optimizer, scheduler, data position and RNG states with
``torch.equal``)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any, Dict, List, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPARED_FIELDS = ("step", "model", "optimizer", "scheduler", "data", "rng", "rng_per_rank")
"""Checkpoint fields compared bitwise (the config and the metrics hold paths and wall times)."""


def run_killed(kill_after_step: int, argv: Sequence[str]) -> None:
    """run_pretraining.py's command (``ipu_packing.train.cli.main``, all that the script runs) with ``argv``, and
    SIGKILL this process as soon as the metrics of step ``kill_after_step`` are logged: a kill at a known point,
    no cleanup. gpu_check's killed command: ``python -c KILLED STEP --config ...``."""
    from ipu_packing.train import metrics
    from ipu_packing.train.cli import main

    original = metrics.MetricsLogger.log

    def log(self, record):
        original(self, record)
        if record.step == kill_after_step:
            os.kill(os.getpid(), signal.SIGKILL)

    metrics.MetricsLogger.log = log
    raise SystemExit(main(list(argv)))


KILLED = ("import sys; from ipu_packing.bench.run_compare import run_killed; "
          "run_killed(int(sys.argv[1]), sys.argv[2:])")


def run_command_line(command: List[str], timeout: float) -> Dict[str, Any]:
    """Run one command from the repository root: exit status (negative: the signal), seconds, its output's tail."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=max(timeout, 1.0))
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        returncode = None
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = "timed out after %.0f s; " % timeout + (
            exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or ""))
    return dict(command=command, returncode=returncode, seconds=time.perf_counter() - start,
                output_tail=(stdout + stderr)[-2000:])


def read_losses(run_dir: str) -> List[List[Any]]:
    """[step, loss, mlm_loss, nsp_loss, sequences_per_second] of every record of run_dir/metrics.jsonl."""
    from ipu_packing.train.run_dir import RunDirectory

    return [[r["step"], r["loss"], r["mlm_loss"], r["nsp_loss"], r["sequences_per_second"]]
            for r in RunDirectory(run_dir).read_metrics()]


def checkpoints(run_dir: str) -> List[str]:
    from ipu_packing.train.run_dir import RunDirectory

    return [os.path.basename(p) for p in RunDirectory(run_dir).checkpoints()]


def _flatten(value: Any, path: str):
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from _flatten(value[key], "%s.%s" % (path, key) if path else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _flatten(item, "%s[%d]" % (path, i))
    else:
        yield path, value


def compare_checkpoints(a: str, b: str) -> Dict[str, Any]:
    """Every value of ``COMPARED_FIELDS`` in two step checkpoints, tensors with ``torch.equal``: how many were
    compared, which differ (the first 20), the largest absolute difference among differing float tensors."""
    import torch

    from ipu_packing.model.pretrained import load_tensors

    left, right = load_tensors(a), load_tensors(b)
    flat_a = dict(_flatten({k: left.get(k) for k in COMPARED_FIELDS if k in left}, ""))
    flat_b = dict(_flatten({k: right.get(k) for k in COMPARED_FIELDS if k in right}, ""))
    differ, largest, tensors = [], 0.0, 0
    for key in sorted(set(flat_a) | set(flat_b)):
        x, y = flat_a.get(key), flat_b.get(key)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            tensors += 1
            same = x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
            if not same and x.shape == y.shape and x.is_floating_point() and y.is_floating_point():
                largest = max(largest, float((x.double() - y.double()).abs().max()))
        else:
            same = key in flat_a and key in flat_b and type(x) is type(y) and x == y
        if not same:
            differ.append(key)
    return dict(tensors_compared=tensors, values_compared=len(set(flat_a) | set(flat_b)), differing=differ[:20],
                differing_count=len(differ), max_abs_difference=largest, equal=not differ)


def compare_runs(reference: str, other: str) -> Dict[str, Any]:
    """metrics.jsonl losses (exact floats) and the last checkpoints (``compare_checkpoints``) of two runs."""
    from ipu_packing.train.run_dir import RunDirectory

    a, b = read_losses(reference), read_losses(other)
    losses_a, losses_b = [row[:4] for row in a], [row[:4] for row in b]
    last_a, last_b = RunDirectory(reference).latest(), RunDirectory(other).latest()
    out: Dict[str, Any] = dict(losses_equal=bool(losses_a) and losses_a == losses_b, steps=[len(a), len(b)],
                               checkpoints=[os.path.basename(last_a or ""), os.path.basename(last_b or "")])
    if not losses_a or losses_a != losses_b:
        out["first_differing_step"] = next((i + 1 for i, (x, y) in enumerate(zip(losses_a, losses_b)) if x != y),
                                           min(len(losses_a), len(losses_b)) + 1)
    if last_a and last_b:
        out["checkpoint"] = compare_checkpoints(last_a, last_b)
    out["bitwise"] = bool(out["losses_equal"] and out.get("checkpoint", {}).get("equal"))
    return out
