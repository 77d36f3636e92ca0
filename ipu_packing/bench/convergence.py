"""Packed against padded fine-tuning, to the end: the final validation metrics of both layouts over seeds.

    python -m ipu_packing.bench.convergence [--config finetune_demo] [--seeds 1,2,3] [--output output/convergence]
        [--packed section.key=value ...] [--json] [section.key=value ...]

For each seed, two ``run_finetuning.py`` runs of the config from the same start (``checkpoint.init_from``, the
head initialised by ``training.seed``), the same steps and the same sequences per step
(``training.global_batch_sequences``; the packed run divides its accumulation by the packing factor, docs/
finetuning.md): ``data.layout=packed`` and ``data.layout=padded`` (DIR/<split>/padded, the same examples one per
row). Each run is evaluated per example on the config's evaluation split at its end. The runs go one after the
other in this process, into OUTPUT/<layout>_seed<N> (a finished run there asked for as it was is read back, not
trained again; one made with other values is refused, as run_finetuning.py refuses it; every run's config is
checked before the first trains); OUTPUT must be absent, empty or hold only such runs (fsutil.check_output,
checked before any work). The
overrides apply to every run (e.g. training.steps=100), ``--packed`` ones to the packed runs only. Printed: one
row per run (final evaluation metrics and loss, mean sequences per step, the run's sequences/s and training
seconds) and each layout's mean and standard deviation over the seeds, with the load average before and after.
Nothing is asserted about which layout wins.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from .. import jsonout
from ..errors import ArgumentParser, UserError, one_line, run_command
from .harness import load_line, progress
from .inputs import BenchError

LAYOUTS = ("packed", "padded")


def run_dir(output: str, layout: str, seed: int) -> str:
    return os.path.join(output, "%s_seed%d" % (layout, seed))


_RUN_NAME = re.compile(r"^(%s)_seed-?\d+$" % "|".join(LAYOUTS))


def made_here(output: str) -> bool:
    """Whether ``output`` holds only runs of this command (``run_dir``'s names, each a directory): an earlier
    --output, whose finished runs are read back and whose others are resumed."""
    return all(_RUN_NAME.match(name) and os.path.isdir(os.path.join(output, name)) for name in os.listdir(output))


def run_overrides(overrides: Sequence[str], layout: str, seed: int, directory: str) -> List[str]:
    """run_finetuning.py's overrides of one run: the command's, then what the command sets for each run."""
    return list(overrides) + ["data.layout=%s" % layout, "training.seed=%d" % seed,
                              "checkpoint.output_dir=%s" % directory, "logging.progress_bar=false"]


def one_run(config: str, overrides: Sequence[str], layout: str, seed: int, directory: str,
            log=lambda message: None) -> Dict[str, Any]:
    """Train one run, or read back a finished one: the run directory decides (asked for as it was, a finished run
    is read back; a run made with other values is refused, as run_finetuning.py refuses it); its row."""
    from ipu_packing.train.cli import command

    argv = ["--config", config] + run_overrides(overrides, layout, seed, directory)
    started = time.perf_counter()
    log("run_finetuning.py %s" % " ".join(argv))
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the runs' logs; stdout holds the table (or JSON) alone
            command(argv, fine_tuning=True)
    except UserError as exc:  # one line, naming the run
        error = BenchError("the %s run of seed %d (%s): %s" % (layout, seed, directory, one_line(exc)))
        error.exit_code = exc.exit_code
        raise error from None
    return run_row(layout, seed, directory, time.perf_counter() - started)


def run_row(layout: str, seed: int, directory: str, wall: float) -> Dict[str, Any]:
    """The table's row of a finished run: its summary.json and metrics.jsonl (``wall``: this command's seconds)."""
    from ipu_packing.jsonin import load_path
    from ipu_packing.train.run_dir import RunDirectory

    summary = load_path(RunDirectory(directory).file(RunDirectory.SUMMARY))  # a FIFO or a device: one line
    evaluation = summary.get("evaluation") or {}
    per_step = [record["sequences"] for record in RunDirectory(directory).read_metrics()]
    return {"layout": layout, "seed": seed, "run": directory, "steps": summary["steps"],
            "sequences_per_step": statistics.mean(per_step) if per_step else None,
            "metrics": evaluation.get("metrics", {}), "loss": evaluation.get("loss"),
            "examples": evaluation.get("examples"), "split": evaluation.get("split"),
            "sequences_per_second": summary.get("sequences_per_second"), "train_seconds": summary.get("train_seconds"),
            "wall_seconds": wall, "gradient_accumulation": summary.get("gradient_accumulation"),
            "packing_factor": summary.get("packing_factor")}


def aggregate(rows: List[Dict[str, Any]]) -> Dict[str, Dict[str, List[float]]]:
    """{layout: {metric: [mean, std]}} over the seeds (std 0 for one seed)."""
    out: Dict[str, Dict[str, List[float]]] = {}
    for layout in LAYOUTS:
        mine = [r for r in rows if r["layout"] == layout]
        if not mine:
            continue
        names = sorted(mine[0]["metrics"]) + ["loss"]
        out[layout] = {}
        for name in names:
            values = [float(r["loss"] if name == "loss" else r["metrics"][name]) for r in mine]
            out[layout][name] = [statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0]
    return out


def format_table(result: Dict[str, Any]) -> str:
    rows = result["rows"]
    names = sorted(rows[0]["metrics"]) if rows else []
    lines = ["%s, %d steps, seeds %s; %s" % (
        result["config"], rows[0]["steps"] if rows else 0, ",".join(str(s) for s in result["seeds"]),
        load_line(result["load_before"], result["load_after"])),
        "%-7s %5s " % ("layout", "seed") + " ".join("%10s" % n[:10] for n in names)
        + " %8s %9s %10s %9s" % ("loss", "seq/step", "seq/s", "train s")]
    for r in rows:
        lines.append("%-7s %5d " % (r["layout"], r["seed"]) + " ".join("%10.4f" % r["metrics"][n] for n in names)
                     + " %8.4f %9.2f %10.1f %9.1f" % (r["loss"], r["sequences_per_step"], r["sequences_per_second"],
                                                      r["train_seconds"]))
    for layout, stats in result["summary"].items():
        lines.append("%-7s %5s " % (layout, "mean") + " ".join("%10s" % ("%.4f" % stats[n][0]) for n in names)
                     + " %8.4f" % stats["loss"][0])
        lines.append("%-7s %5s " % (layout, "std") + " ".join("%10s" % ("%.4f" % stats[n][1]) for n in names)
                     + " %8.4f" % stats["loss"][1])
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m ipu_packing.bench.convergence", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="finetune_demo", help="a fine-tuning config (default: %(default)s)")
    p.add_argument("--seeds", default="1,2,3", help="training.seed of each pair of runs (default: %(default)s)")
    p.add_argument("--output", default=os.path.join("output", "convergence"),
                   help="the runs' parent directory (default: %(default)s)")
    p.add_argument("--packed", action="append", default=[], metavar="section.key=value",
                   help="an override for the packed runs only, e.g. execution.micro_batch_size=5 (packs per micro "
                   "batch) to hold about the padded runs' sequences per step; repeatable")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="overrides for every run")
    return p


def overrides_of(args, layout: str) -> List[str]:
    """The overrides of every run, then ``--packed``'s for a packed run."""
    return list(args.overrides) + (list(args.packed) if layout == "packed" else [])


def command(argv: Optional[List[str]]) -> int:
    args = build_parser().parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise BenchError("--seeds takes integers separated by commas, got %r" % (args.seeds,))
    if len(set(seeds)) != len(seeds):
        raise BenchError("--seeds names a seed twice: %s" % (args.seeds,))
    for o in list(args.overrides) + list(args.packed):
        if o.split("=", 1)[0] in ("data.layout", "training.seed", "checkpoint.output_dir"):
            raise BenchError("%s is set by the command for each run: leave it out" % (o.split("=", 1)[0],))
    from ipu_packing.train import load_config

    config = load_config(args.config, args.overrides)
    if not config.task.fine_tuning:
        raise BenchError("--config %s is not a fine-tuning config (no task: section)" % (args.config,))
    for seed in seeds:  # every run's config checked before the first one trains
        for layout in LAYOUTS:
            load_config(args.config, run_overrides(overrides_of(args, layout), layout, seed,
                                                   run_dir(args.output, layout, seed)))
    from ..fsutil import check_output

    check_output(args.output, "--output", directory=True, reading=[config.data.dir, config.checkpoint.init_from],
                 ours=made_here, error=BenchError)
    log = progress()
    load_before = list(os.getloadavg())
    rows = []
    for seed in seeds:
        for layout in LAYOUTS:
            rows.append(one_run(args.config, overrides_of(args, layout), layout, seed,
                                run_dir(args.output, layout, seed), log))
            log("%s seed %d: %s, %.1f s" % (layout, seed, rows[-1]["metrics"], rows[-1]["wall_seconds"]))
    result = {"config": args.config, "overrides": list(args.overrides), "packed_overrides": list(args.packed),
              "seeds": seeds, "rows": rows,
              "summary": aggregate(rows), "load_before": load_before, "load_after": list(os.getloadavg())}
    print(jsonout.dumps(result, sort_keys=True) if args.json else format_table(result))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(command, argv)


if __name__ == "__main__":
    sys.exit(main())
