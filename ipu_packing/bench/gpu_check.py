"""One prepared command for the day a GPU is lent: ``make gpu-check``, i.e.

    python -m ipu_packing.bench.gpu_check [--cpu] [--output DIR] [--data DIR]

CUDA mode (the default; refused in one line when torch sees no CUDA device), sized to finish within 8 minutes
on one GPU (322 s on an H200: docs/results.md, which says what it records):

1. Data: the prepared ``output/data/demo_512`` (`--data`), prepared first when absent (the embedded default,
   S=512, K=3).
2. Training: ``run_pretraining.py --config demo_512_cuda`` for ``Mode.steps`` steps with each attention under
   bf16 autocast, checkpoints every 2 steps, each run into OUTPUT/runs/ATTENTION: exit status, every step's
   losses (all finite) and sequences/s.
3. Kill and resume, with deterministic kernels (``execution.deterministic=true``; without them CUDA's kernels
   differ run to run in the last bits): the sdpa run uninterrupted, then again SIGKILLed by
   ``run_compare.run_killed`` once step 3's metrics are logged (the step-2 checkpoint on disk, step 3 lost) and
   resumed by the same command line; its losses and final checkpoint compared bitwise with the uninterrupted
   run's. On CUDA a mismatch is followed by a second uninterrupted run, which tells a resume fault from kernels
   that are still not deterministic run to run.
4. Peers: ``bench --peers --device cuda --precision bf16`` (peers.py) at BERT-Base S=512, then BERT-Large when
   the time left allows, on the Wikipedia 512 lengths where shared/ has them, else the data's; a contender
   whose warm-up step fails is left out, the others timed, and the check fails naming it.
5. OUTPUT/gpu_check.json (everything) and OUTPUT/gpu_check.md (the tables, also printed). OUTPUT (default
   output/gpu_check) must be absent or empty: nothing is overwritten.

``--cpu``: the same steps on CPU with tiny sizes (S=128 data, 4 steps, the tiny peers preset), about a minute on
one core; tests/test_gpu_check.py runs it, so it cannot rot. Exit status: 0 every check passed; 1 a check
failed (the report says which, and the last line); 2 bad input (one line ``error: <cause>``, nothing written).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import jsonout
from ..errors import ArgumentParser, one_line, run_command
from .harness import load_line
from .inputs import BenchError, read_dataset_histogram, shared_dir
from .run_compare import KILLED, REPO, checkpoints, compare_runs, read_losses, run_command_line
RUN_PRETRAINING = os.path.join(REPO, "run_pretraining.py")
CONFIG = "demo_512_cuda"
ATTENTIONS = ("dense", "sdpa", "varlen")
RESUMED_ATTENTION = "sdpa"
"""The attention of the kill-and-resume run: demo_512_cuda's own (``auto`` on CUDA)."""
DETERMINISTIC = "execution.deterministic=true"
"""The kill-and-resume runs' override: the runs are compared bitwise."""
CHECKPOINT_EVERY = 2
KILL_AFTER_STEP = CHECKPOINT_EVERY + 1
"""The killed run dies once this step's metrics are logged: its first checkpoint is on disk, this step is lost."""


@dataclass
class PeersSpec:
    """One peers bench run of the check."""

    model: str
    timed_packs: int
    micro_batch_size: int
    repeats: int
    precision: str
    min_seconds_left: Optional[float] = None
    """Skipped (and said so) when less of the mode's budget is left than this; None: always run, whatever the
    load (the mode's budget is then only a bound on the optional runs)."""


@dataclass
class Mode:
    """The sizes of one mode of the check."""

    name: str
    device: str
    data: str
    """The prepared dataset's root, relative to the repository (--data overrides)."""
    max_seq_length: int
    steps: int
    budget_seconds: float
    """The check's time budget: the optional peers runs are skipped rather than overrun it."""
    run_timeout: float
    """Seconds one training command may take before it is killed (and the check fails)."""
    peers: List[PeersSpec]
    overrides: List[str] = field(default_factory=list)
    """Training overrides of this mode beyond the common ones (``training_overrides``)."""


MODES = {
    "cuda": Mode("cuda", "cuda", os.path.join("output", "data", "demo_512"), 512, 8, 480.0, 150.0,
                 [PeersSpec("base", 256, 16, 5, "bf16", 0.0), PeersSpec("large", 256, 16, 3, "bf16", 200.0)]),
    "cpu": Mode("cpu", "cpu", os.path.join("output", "data", "demo_128"), 128, 4, 600.0, 120.0,
                [PeersSpec("tiny", 8, 4, 1, "bf16")], ["execution.device=cpu"]),
}


def progress(message: str) -> None:
    """A line on stderr as the check goes (a GPU session is short: where it is, and what took how long)."""
    print("gpu-check: " + message, file=sys.stderr, flush=True)


# -- one training command ------------------------------------------------------------------------------------


def training_overrides(mode: Mode, data: str, S: int, attention: str, run_dir: str) -> List[str]:
    return ["data.dir=%s" % data, "data.max_seq_length=%d" % S, "training.steps=%d" % mode.steps,
            "checkpoint.every_steps=%d" % CHECKPOINT_EVERY, "checkpoint.keep=2", "execution.precision=bf16",
            "model.packed_attention=%s" % attention, "logging.progress_bar=false", "logging.tensorboard=false",
            "checkpoint.output_dir=%s" % run_dir] + mode.overrides


def training_run(mode: Mode, data: str, S: int, attention: str, run_dir: str, timeout: float,
                 extra: Sequence[str] = ()) -> Dict[str, Any]:
    """One run_pretraining.py command (``extra``: overrides after the mode's) and what its run directory shows."""
    command = [sys.executable, RUN_PRETRAINING, "--config", CONFIG] + training_overrides(
        mode, data, S, attention, run_dir) + list(extra)
    out = run_command_line(command, timeout)
    losses = read_losses(run_dir)
    rates = [row[4] for row in losses[1:]] or [row[4] for row in losses]
    out.update(attention=attention, run_dir=run_dir, steps=len(losses), losses=[row[:4] for row in losses],
               finite=bool(losses) and all(math.isfinite(x) for row in losses for x in row[1:4]),
               sequences_per_second=statistics.median(rates) if rates else None, checkpoints=checkpoints(run_dir))
    out["passed"] = out["returncode"] == 0 and out["steps"] == mode.steps and out["finite"]
    progress("trained %s into %s: exit %s, %d steps, %.1f s" % (attention, run_dir, out["returncode"], out["steps"],
                                                               out["seconds"]))
    return out


def kill_and_resume(mode: Mode, data: str, S: int, runs: str, timeout) -> Dict[str, Any]:
    """The RESUMED_ATTENTION run with deterministic kernels: uninterrupted, then killed after step
    KILL_AFTER_STEP and resumed with the same run_pretraining.py command, and the two compared bitwise."""
    reference = training_run(mode, data, S, RESUMED_ATTENTION, os.path.join(runs, RESUMED_ATTENTION + "_deterministic"),
                             timeout(), [DETERMINISTIC])
    run_dir = os.path.join(runs, RESUMED_ATTENTION + "_resumed")
    overrides = training_overrides(mode, data, S, RESUMED_ATTENTION, run_dir) + [DETERMINISTIC]
    killed = run_command_line([sys.executable, "-c", KILLED, str(KILL_AFTER_STEP), "--config", CONFIG] + overrides,
                              timeout())
    killed.update(checkpoints=checkpoints(run_dir), metrics_steps=[row[0] for row in read_losses(run_dir)],
                  final_exported=os.path.isdir(os.path.join(run_dir, "final")))
    progress("killed run: exit %s, checkpoints %s" % (killed["returncode"], killed["checkpoints"]))
    resumed = run_command_line([sys.executable, RUN_PRETRAINING, "--config", CONFIG] + overrides, timeout())
    comparison = compare_runs(reference["run_dir"], run_dir)
    progress("resumed run: exit %s; bitwise equal to the uninterrupted run: %s" % (resumed["returncode"],
                                                                                   comparison["bitwise"]))
    from ipu_packing.train.run_dir import RunDirectory

    first_checkpoint = RunDirectory.checkpoint_name(CHECKPOINT_EVERY)
    out = dict(reference=reference, killed=killed, resumed=resumed, comparison=comparison, run_dir=run_dir,
               killed_by_sigkill=killed["returncode"] == -signal.SIGKILL,
               first_checkpoint_on_disk_at_kill=first_checkpoint in killed["checkpoints"],
               killed_before_the_end=not killed["final_exported"])
    if not comparison["bitwise"] and mode.device == "cuda":  # a resume fault, or the GPU's own nondeterminism?
        again = training_run(mode, data, S, RESUMED_ATTENTION, os.path.join(runs, RESUMED_ATTENTION + "_again"),
                             timeout(), [DETERMINISTIC])
        out["run_to_run"] = dict(run=again, comparison=compare_runs(reference["run_dir"], again["run_dir"]))
    out["passed"] = bool(reference["passed"] and out["killed_by_sigkill"] and out["first_checkpoint_on_disk_at_kill"]
                         and out["killed_before_the_end"] and resumed["returncode"] == 0 and comparison["bitwise"])
    return out


# -- peers ---------------------------------------------------------------------------------------------------


def peers_histogram(mode: Mode, data: str) -> Tuple[Any, str]:
    """(histogram, where from): on CUDA the shared Wikipedia 512 one where it is there, else the prepared data's."""
    from .inputs import read_histogram_file

    wikipedia = os.path.join(shared_dir(), "data", "wikipedia_512_histogram.json")
    if mode.device == "cuda" and os.path.isfile(wikipedia):
        return read_histogram_file(wikipedia, 512), wikipedia
    return read_dataset_histogram(data), data


def peers_command(spec: PeersSpec, mode: Mode, S: int, source: str) -> str:
    """The bench command line a peers run of the check is the same as."""
    return ("python -m ipu_packing.bench --peers %s --max-seq-length %d --model %s --timed-packs %d "
            "--micro-batch-size %d --repeats %d --device %s --precision %s"
            % (("--data " + source) if os.path.isdir(source) else ("--histogram " + source), S, spec.model,
               spec.timed_packs, spec.micro_batch_size, spec.repeats, mode.device, spec.precision))


def skip_reason(spec: PeersSpec, mode: Mode, left: float) -> Optional[str]:
    """Why a peers run is skipped with ``left`` seconds of the mode's budget left, or None when it runs."""
    if spec.min_seconds_left is None or left >= spec.min_seconds_left:
        return None
    return "%.0f s of the %.0f s budget left, %.0f s wanted" % (left, mode.budget_seconds, spec.min_seconds_left)


def skipped_peers(spec: PeersSpec, mode: Mode, S: int, source: str, reason: str) -> Dict[str, Any]:
    return dict(model=spec.model, command=peers_command(spec, mode, S, source), skipped=reason)


def run_peers_spec(spec: PeersSpec, mode: Mode, histogram, source: str) -> Dict[str, Any]:
    import torch

    from .peers import format_peers, run_peers

    S = len(histogram)
    out: Dict[str, Any] = dict(model=spec.model, command=peers_command(spec, mode, S, source))
    try:
        result = run_peers(histogram, S, 3, model_preset=spec.model, micro_batch_size=spec.micro_batch_size,
                           repeats=spec.repeats, timed_packs=spec.timed_packs, device=mode.device,
                           precision=spec.precision, keep_going=True, log=progress)
        out["result"] = result
        out["table"] = format_peers(result)
    except Exception as exc:  # a GPU session is short: record it and go on with the rest of the check
        import traceback

        out["error"] = "%s: %s" % (type(exc).__name__, one_line(exc)[:500])
        out["traceback_tail"] = traceback.format_exc()[-3000:]
    finally:
        if mode.device == "cuda":
            torch.cuda.empty_cache()
    return out


# -- the report ----------------------------------------------------------------------------------------------


def failures(report: Dict[str, Any]) -> List[str]:
    out = ["training %s: exit %s, %d of %d steps, losses finite: %s"
           % (r["attention"], r["returncode"], r["steps"], report["steps"], r["finite"])
           for r in report["training"] if not r["passed"]]
    resume = report.get("resume")
    if resume is not None and not resume["passed"]:
        c = resume["comparison"]
        out.append("kill and resume: deterministic run exit %s, killed by SIGKILL %s, checkpoint on disk %s, resumed "
                   "exit %s, losses equal %s, checkpoint equal %s" % (
                       resume["reference"]["returncode"], resume["killed_by_sigkill"],
                       resume["first_checkpoint_on_disk_at_kill"], resume["resumed"]["returncode"],
                       c["losses_equal"], c.get("checkpoint", {}).get("equal")))
    out.extend("peers %s: %s" % (p["model"], p["error"]) for p in report["peers"] if "error" in p)
    out.extend("peers %s: %s" % (p["model"], note) for p in report["peers"] for note in p.get("result", {}).get(
        "failed", []))
    return out


def format_markdown(report: Dict[str, Any]) -> str:
    m = report["machine"]
    lines = ["# gpu-check (%s mode), %s" % (report["mode"], report["started"]), "",
             "%s; torch %s, transformers %s, Python %s; %s; %.0f s in all."
             % (m["device_name"], m["torch"], m["transformers"], m["python"],
                load_line(m["load_before"], m["load_after"]), report["seconds"]), "",
             "## Training: `run_pretraining.py --config %s`, %d steps, bf16 autocast, data %s (S=%d)"
             % (CONFIG, report["steps"], report["data"]["dir"], report["data"]["max_seq_length"]), "",
             "| attention | exit | steps | loss first -> last | finite | sequences/s (median) | seconds |",
             "|---|---|---|---|---|---|---|"]
    for r in report["training"]:
        losses = r["losses"]
        lines.append("| %s | %s | %d | %s | %s | %s | %.1f |" % (
            r["attention"], r["returncode"], r["steps"],
            "%.6g -> %.6g" % (losses[0][1], losses[-1][1]) if losses else "-", r["finite"],
            "%.1f" % r["sequences_per_second"] if r["sequences_per_second"] is not None else "-", r["seconds"]))
    resume = report.get("resume")
    if resume is not None:
        c = resume["comparison"]
        ck = c.get("checkpoint", {})
        ref = resume["reference"]
        lines += ["", "## Kill and resume (%s, %s, SIGKILL once step %d is logged, checkpoint every %d steps)"
                  % (RESUMED_ATTENTION, DETERMINISTIC, KILL_AFTER_STEP, CHECKPOINT_EVERY), "",
                  "The uninterrupted run with deterministic kernels: exit %s, %d steps, %s sequences/s (median)."
                  % (ref["returncode"], ref["steps"], "%.1f" % ref["sequences_per_second"]
                     if ref["sequences_per_second"] is not None else "-"), "",
                  "| killed by SIGKILL | checkpoints at the kill | resumed exit | losses equal (%s steps) | "
                  "checkpoint values equal | differing | max abs difference |" % c["steps"][0],
                  "|---|---|---|---|---|---|---|",
                  "| %s | %s | %s | %s | %s of %s (%s tensors) | %s | %g |" % (
                      resume["killed_by_sigkill"], ", ".join(resume["killed"]["checkpoints"]) or "none",
                      resume["resumed"]["returncode"], c["losses_equal"], ck.get("equal"),
                      ck.get("values_compared"), ck.get("tensors_compared"), ck.get("differing_count"),
                      ck.get("max_abs_difference", float("nan")))]
        if "run_to_run" in resume:
            again = resume["run_to_run"]["comparison"]
            lines.append("\nA second uninterrupted run against the first: losses equal %s, checkpoint equal %s "
                         "(max abs difference %g): %s" % (
                             again["losses_equal"], again.get("checkpoint", {}).get("equal"),
                             again.get("checkpoint", {}).get("max_abs_difference", float("nan")),
                             "the GPU's kernels are not deterministic run to run" if not again["bitwise"]
                             else "runs repeat bitwise, so the mismatch is the resume's"))
    for p in report["peers"]:
        lines += ["", "## Peers, %s: `%s`" % (p["model"], p["command"]), ""]
        if "skipped" in p:
            lines.append("skipped: %s" % p["skipped"])
            continue
        if "error" in p:
            lines.append("error: %s" % p["error"])
            continue
        lines += ["```", p["table"], "```"]  # the peers bench's own table (format_peers)
    fails = report["failures"]
    lines += ["", "**%s**" % ("every check passed" if not fails else "FAILED: " + "; ".join(fails))]
    return "\n".join(lines) + "\n"


# -- the command ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m ipu_packing.bench.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="the CPU mode: tiny sizes, about a minute")
    p.add_argument("--output", default=os.path.join("output", "gpu_check"),
                   help="report and run directories; must be absent or empty (default: %(default)s)")
    p.add_argument("--data", default=None, help="prepared data root (default: output/data/demo_512, or "
                   "output/data/demo_128 with --cpu; prepared when absent)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(_main, None if argv is None else list(argv))


def _main(argv: Optional[List[str]]) -> int:
    args = build_parser().parse_args(argv)
    mode = MODES["cpu" if args.cpu else "cuda"]
    import torch

    if mode.device == "cuda" and not torch.cuda.is_available():
        raise BenchError("torch %s sees no CUDA device: gpu-check needs a GPU and a CUDA build of torch "
                         "(--cpu runs the CPU mode)" % torch.__version__)
    output = os.path.abspath(args.output)
    data = os.path.abspath(args.data or os.path.join(REPO, mode.data))
    from ..fsutil import check_output

    check_output(output, "--output", directory=True, reading=[data], error=BenchError)  # absent or empty
    if os.path.exists(data) and not os.path.isfile(os.path.join(data, "packed", "manifest.json")):
        raise BenchError("%s has no prepared packed dataset (packed/manifest.json); give --data a prepare "
                         "--output directory, or a path that does not exist yet to prepare it there" % data)
    os.makedirs(output, exist_ok=True)
    threads = torch.get_num_threads()
    try:
        if mode.device == "cpu":
            torch.set_num_threads(1)
        report = check(mode, data, output)
    finally:
        torch.set_num_threads(threads)
    from ..fsutil import atomic_write_text

    markdown = format_markdown(report)
    atomic_write_text(os.path.join(output, "gpu_check.json"), jsonout.dumps(report, sort_keys=True, indent=1) + "\n")
    atomic_write_text(os.path.join(output, "gpu_check.md"), markdown)
    print(markdown, end="")
    print("report: %s, %s" % (os.path.join(output, "gpu_check.json"), os.path.join(output, "gpu_check.md")))
    if report["failures"]:
        print("gpu-check: %d check(s) failed: %s" % (len(report["failures"]), "; ".join(report["failures"])),
              file=sys.stderr)
        return 1
    return 0


def check(mode: Mode, data: str, output: str) -> Dict[str, Any]:
    """Every step of the module docstring, in order; returns the report."""
    import platform

    import torch
    import transformers

    started = time.perf_counter()
    load_before = list(os.getloadavg())

    def left() -> float:
        return mode.budget_seconds - (time.perf_counter() - started)

    def timeout() -> float:
        return min(mode.run_timeout, max(left(), 30.0))

    prepared = None
    if not os.path.isfile(os.path.join(data, "packed", "manifest.json")):
        prepared = run_command_line([sys.executable, "-m", "ipu_packing.data", "prepare", "--input", "default",
                                     "--output", data, "--max-seq-length", str(mode.max_seq_length),
                                     "--max-sequences-per-pack", "3"], timeout())
        if prepared["returncode"] != 0:
            raise BenchError("preparing %s failed (exit %s): %s" % (data, prepared["returncode"],
                                                                    one_line(prepared["output_tail"])[-300:]))
    S = len(read_dataset_histogram(data))
    runs = os.path.join(output, "runs")
    report: Dict[str, Any] = dict(
        mode=mode.name, started=time.strftime("%Y-%m-%d %H:%M:%S %Z"), steps=mode.steps,
        budget_seconds=mode.budget_seconds, data=dict(dir=data, max_seq_length=S, prepared_now=prepared),
        training=[], peers=[])
    for attention in ATTENTIONS:
        report["training"].append(training_run(mode, data, S, attention, os.path.join(runs, attention), timeout()))
    report["resume"] = kill_and_resume(mode, data, S, runs, timeout)
    histogram, source = peers_histogram(mode, data)
    report["peers_lengths"] = source
    for spec in mode.peers:
        reason = skip_reason(spec, mode, left())
        if reason is not None:
            report["peers"].append(skipped_peers(spec, mode, len(histogram), source, reason))
            continue
        progress("peers %s (%.0f s of the budget left)" % (spec.model, left()))
        report["peers"].append(run_peers_spec(spec, mode, histogram, source))
    report["seconds"] = time.perf_counter() - started
    cpu_name = "CPU (%s)" % (platform.processor() or platform.machine())
    report["machine"] = dict(
        device_name=torch.cuda.get_device_name() if mode.device == "cuda" else cpu_name,
        torch=torch.__version__, cuda=torch.version.cuda, transformers=transformers.__version__,
        python=platform.python_version(), cpu_count=os.cpu_count(), load_before=load_before,
        load_after=list(os.getloadavg()))
    report["failures"] = failures(report)
    report["passed"] = not report["failures"]
    return report


if __name__ == "__main__":
    sys.exit(main())
