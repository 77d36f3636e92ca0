"""Benchmark: every packing algorithm side by side on one histogram (not a test).

    python -m ipu_packing.bench.planner --histogram FILE --max-seq-length N \\
        [--max-sequences-per-pack K|max] [--assign [--assign-repeats R]] [--json]

Columns: efficiency (real tokens / pack tokens), theoretical speed-up (sequences per pack),
packs above the LP lower bound that `optimal` proves (no packing can have fewer packs than
that bound), and wall-clock seconds of planning. Timings depend on the machine's load.

--assign also times assign_sequences for the optimal plan on synthetic lengths with the
histogram's counts (int64, shuffled), next to its yardstick measured in the same process on the
same lengths: a stable np.argsort of them as uint16 (numpy's radix sort, the fastest stable
argsort numpy has for small integers; the int64 one is timed too). Each is the best of R runs,
interleaved and untraced; the peak memory comes from one more assignment run under tracemalloc.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .. import jsonout
from ..errors import ArgumentParser, InputError, run_command
from ..packing.cli import add_lp_arguments, parse_length, parse_limit
from ..packing.io import load_histogram
from ..packing.plan import ALGORITHMS, plan_packing


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(_main, argv)


def _main(argv: Optional[List[str]]) -> int:
    parser = ArgumentParser(prog="python -m ipu_packing.bench.planner", description=__doc__.split("\n")[0])
    parser.add_argument("--histogram", required=True)
    parser.add_argument("--max-seq-length", type=parse_length, default=None, help="S, pack size in tokens")
    parser.add_argument("--max-sequence-length", dest="max_seq_length", type=parse_length, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)  # the earlier spelling
    parser.add_argument("--max-sequences-per-pack", type=parse_limit, default=None, help="K >= 1, or 'max' (default)")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS), help="comma-separated subset")
    parser.add_argument("--json", action="store_true", help="one JSON object per algorithm, one per line")
    parser.add_argument("--assign", action="store_true",
                        help="also time assign_sequences for the optimal plan on synthetic lengths with these counts")
    parser.add_argument("--assign-repeats", type=int, default=3, metavar="R",
                        help="--assign: best of R runs of the assignment and of the argsort (default 3)")
    add_lp_arguments(parser)
    args = parser.parse_args(argv)
    names = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if not names:
        raise InputError("--algorithms names no algorithm (choose from %s)" % ", ".join(ALGORITHMS))
    for name in names:
        if name not in ALGORITHMS:
            raise InputError("unknown algorithm %r (choose from %s)" % (name, ", ".join(ALGORITHMS)))
    counts, file_length = load_histogram(args.histogram)
    length = args.max_seq_length if args.max_seq_length is not None else file_length
    if length is None:
        raise InputError("--max-seq-length is required (the file does not give one)")
    # optimal first: its bound is the yardstick for the others
    order = ["optimal"] + [n for n in names if n != "optimal"]
    plans = {}
    for name in order:
        plans[name] = plan_packing(counts, length, args.max_sequences_per_pack, name,
                                   max_rounds=args.lp_max_rounds, time_limit=args.lp_time_limit)
    bound = plans["optimal"].lower_bound_integer
    if args.assign_repeats < 1:
        raise InputError("--assign-repeats must be at least 1, got %d" % args.assign_repeats)
    assignment = _time_assignment(plans["optimal"], args.assign_repeats) if args.assign else None
    k = "max" if args.max_sequences_per_pack is None else str(args.max_sequences_per_pack)
    if args.json:
        for name in names:
            row = plans[name].to_dict()
            row["packs_above_lp_bound"] = plans[name].num_packs - bound
            print(jsonout.dumps(row))
        if assignment is not None:
            print(jsonout.dumps(assignment))
        return 0
    print("histogram %s, max length %d, max sequences per pack %s" % (args.histogram, length, k))
    print("%s sequences; LP lower bound %s packs (best possible efficiency %.4f%%)" % (
        "{:,}".format(plans["optimal"].num_sequences), "{:,}".format(bound), 100 * plans["optimal"].efficiency_bound))
    print()
    header = "| algorithm | efficiency | theoretical speed-up | packs | packs above LP bound | seconds |"
    print(header)
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        plan = plans[name]
        print("| %s | %.4f%% | %.5f | %s | %s | %.2f |" % (
            name, 100 * plan.efficiency, plan.theoretical_speedup, "{:,}".format(plan.num_packs),
            "{:,}".format(plan.num_packs - bound), plan.seconds))
    if assignment is not None:
        print()
        print("assign_sequences (optimal plan): %s sequences into %s packs in %.2f s, peak %.0f MiB traced"
              " (the (N,) lengths input itself: %.0f MiB)" % (
                  "{:,}".format(assignment["num_sequences"]), "{:,}".format(assignment["num_packs"]),
                  assignment["seconds"], assignment["peak_mib"], assignment["input_mib"]))
        print("stable np.argsort of the same lengths: %.2f s as uint16, %.2f s as int64; the assignment takes"
              " %.1fx the uint16 argsort (best of %d each, same process)" % (
                  assignment["argsort_seconds"], assignment["argsort_int64_seconds"],
                  assignment["ratio_to_argsort"], assignment["repeats"]))
    return 0


def _time_assignment(plan, repeats: int = 3) -> dict:
    """Times assign_sequences on shuffled lengths with the plan's histogram against a stable argsort of the same
    lengths through harness.py (a warm-up run of each, then ``repeats`` runs interleaved), best of the repeats
    each; peak memory of one more run by tracemalloc."""
    import tracemalloc

    import numpy as np

    from ..packing.assign import assign_sequences
    from .harness import Contender, measure

    lengths = np.repeat(np.arange(1, plan.max_seq_length + 1, dtype=np.int64), plan.histogram)  # (N,)
    np.random.default_rng(0).shuffle(lengths)
    small = lengths.astype(np.uint16 if plan.max_seq_length < 1 << 16 else np.int64)  # (N,)
    timings = measure([Contender("assign", [lengths], lambda x: assign_sequences(plan, x, seed=0)),
                       Contender("argsort", [small], lambda x: np.argsort(x, kind="stable")),
                       Contender("argsort_int64", [lengths], lambda x: np.argsort(x, kind="stable"))], repeats)
    assign_runs, argsort_runs, argsort_int64_runs = timings.seconds
    seconds, argsort_seconds = min(assign_runs), min(argsort_runs)
    tracemalloc.start()
    packs = assign_sequences(plan, lengths, seed=0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "assign": True,
        "num_sequences": int(len(lengths)),
        "num_packs": len(packs),
        "seconds": seconds,
        "argsort_seconds": argsort_seconds,
        "argsort_int64_seconds": min(argsort_int64_runs),
        "ratio_to_argsort": seconds / argsort_seconds if argsort_seconds > 0 else None,
        "repeats": repeats,
        "runs": {"assign": assign_runs, "argsort": argsort_runs, "argsort_int64": argsort_int64_runs},
        "peak_mib": peak / 2.0**20,
        "input_mib": lengths.nbytes / 2.0**20,
    }


if __name__ == "__main__":
    sys.exit(main())
