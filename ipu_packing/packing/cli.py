"""Command line: plan a packing for a histogram file and print it.

    python -m ipu_packing.packing --histogram FILE --max-seq-length N \\
        --max-sequences-per-pack K|max --algorithm NAME [--json]

Bad input gets one line on stderr and exit code 2 (no traceback, nothing on stdout), through
ipu_packing.errors.run_command.
"""

from __future__ import annotations

import argparse
from typing import List, Optional

from .. import jsonout
from ..errors import ArgumentParser, InputError, run_command
from .io import load_histogram
from .optimal import MAX_ROUNDS, TIME_LIMIT
from .plan import ALGORITHMS, PackingPlan, plan_packing


def parse_limit(text: str) -> Optional[int]:
    """'max' -> None (unbounded), else an integer >= 1."""
    if text.strip().lower() == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be an integer >= 1 or 'max', got %r" % text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1 or 'max', got %d" % value)
    return value


def parse_length(text: str) -> int:
    """An integer >= 1 (lengths, rounds)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be an integer, got %r" % text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1, got %d" % value)
    return value


def parse_seconds(text: str) -> Optional[float]:
    """'none' -> None (no limit), else a finite number of seconds > 0."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a number of seconds or 'none', got %r" % text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError("must be > 0 and finite, got %r" % text)
    return value


def add_lp_arguments(parser: argparse.ArgumentParser) -> None:
    """The `optimal` planner's stopping rule, shared by every command that plans."""
    parser.add_argument("--lp-max-rounds", type=parse_length, default=MAX_ROUNDS,
                        help="optimal: rounds of column generation at most; the stopping rule, so the same "
                             "input gives the same plan on any machine (default %(default)s)")
    parser.add_argument("--lp-time-limit", type=parse_seconds, default=TIME_LIMIT,
                        help="optimal: safety-net seconds of column generation, or 'none'; a plan it cuts "
                             "short depends on machine speed and is reported (default %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m ipu_packing.packing",
                            description="Plan sequence packing for a length histogram.")
    parser.add_argument("--histogram", required=True,
                        help=".npy, .txt (one count per line) or .json; bin i = length i + 1")
    parser.add_argument("--max-seq-length", type=parse_length, default=None,
                        help="S, pack size in tokens (default: the JSON file's max_sequence_length)")
    parser.add_argument("--max-sequence-length", dest="max_seq_length", type=parse_length, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)  # the earlier spelling
    parser.add_argument("--max-sequences-per-pack", type=parse_limit, default=None, help="K >= 1, or 'max' (default)")
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="optimal")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--top", type=int, default=10, help="strategies to list in the table")
    add_lp_arguments(parser)
    return parser


def load_and_plan(args) -> PackingPlan:
    counts, file_length = load_histogram(args.histogram)
    length = args.max_seq_length if args.max_seq_length is not None else file_length
    if length is None:
        raise InputError("--max-seq-length is required (the file does not give one)")
    return plan_packing(counts, length, args.max_sequences_per_pack, args.algorithm,
                        max_rounds=args.lp_max_rounds, time_limit=args.lp_time_limit)


def format_table(plan: PackingPlan, top: int) -> str:
    k = "max" if plan.max_sequences_per_pack is None else str(plan.max_sequences_per_pack)
    rows = [
        ("algorithm", plan.algorithm),
        ("max sequence length", str(plan.max_seq_length)),
        ("max sequences per pack", k),
        ("sequences", "{:,}".format(plan.num_sequences)),
        ("packs", "{:,}".format(plan.num_packs)),
        ("efficiency", "{:.4%}".format(plan.efficiency)),
        ("theoretical speed-up", "{:.5f}".format(plan.theoretical_speedup)),
    ]
    if plan.lower_bound_packs is not None:
        rows += [
            ("LP lower bound (packs)",
             "{:,.3f} -> at least {:,}".format(plan.lower_bound_packs, plan.lower_bound_integer)),
            ("packs above the bound", "{:,}".format(plan.packs_above_bound)),
            ("best possible efficiency", "{:.4%}".format(plan.efficiency_bound)),
        ]
    if plan.lp_rounds is not None:
        rows.append(("LP rounds (stopped by)", "%d (%s)" % (plan.lp_rounds, plan.stopped_by)))
    rows += [("strategies", "{:,}".format(len(plan.strategies))), ("plan sha256", plan.sha256()),
             ("seconds", "{:.3f}".format(plan.seconds))]
    width = max(len(name) for name, _ in rows)
    lines = ["%-*s  %s" % (width, name, value) for name, value in rows]
    lines.append("")
    lines.append("most frequent strategies (lengths in one pack):")
    lines.append("%12s  %8s  %s" % ("packs", "tokens", "lengths"))
    for strategy, count in list(zip(plan.strategies, plan.repeats))[:top]:
        lines.append("%12s  %8d  %s" % ("{:,}".format(int(count)), sum(strategy), " + ".join(map(str, strategy))))
    return "\n".join(lines)


def _main(argv: Optional[List[str]]) -> int:
    args = build_parser().parse_args(argv)
    plan = load_and_plan(args)
    print(jsonout.dumps(plan.to_dict()) if args.json else format_table(plan, args.top))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(_main, argv)
