"""Command line: `python -m ipu_packing.data prepare|pack|inspect ...`.

User errors print one line `error: ...` on stderr and exit with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

import numpy as np

from .. import tasks
from ..errors import ArgumentParser, run_command
from ..packing.cli import add_lp_arguments
from ..errors import DataError


def _add_packing_arguments(p: argparse.ArgumentParser) -> None:
    """The options of write/datasets.py's PackingOptions, the same for prepare and pack."""
    from .write.datasets import PackingOptions

    defaults = PackingOptions()
    p.add_argument("--max-sequences-per-pack", type=int, default=defaults.max_sequences_per_pack)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--workers", type=int, default=defaults.workers, help="0: min(4, CPUs)")
    p.add_argument("--packing-algorithm", default=defaults.packing_algorithm)
    add_lp_arguments(p)
    p.add_argument("--shard-mb", type=float, default=defaults.shard_bytes / 2.0 ** 20, help="output shard size")
    p.add_argument("--no-padded", action="store_true", help="skip the padded baseline")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _packing_options(args: argparse.Namespace):
    from .write.datasets import PackingOptions

    if not 0 < args.shard_mb < float("inf"):  # also refuses nan
        raise DataError("--shard-mb must be a number > 0, got %r" % args.shard_mb)
    return PackingOptions(
        max_sequences_per_pack=args.max_sequences_per_pack, seed=args.seed, workers=args.workers,
        packing_algorithm=args.packing_algorithm, lp_max_rounds=args.lp_max_rounds, lp_time_limit=args.lp_time_limit,
        shard_bytes=max(1, int(args.shard_mb * 2 ** 20)), padded=not args.no_padded, progress=not args.quiet)


def _parser() -> argparse.ArgumentParser:
    from .format import PROBLEM_TYPES
    from .text.pipeline import PrepareConfig
    from .vocab import DEFAULT_VOCAB_SIZE

    defaults = PrepareConfig(input="default", output="-")
    fine_tuning = " or ".join(task.name for task in tasks.TASKS.values() if task.fine_tuning)
    parser = ArgumentParser(prog="python -m ipu_packing.data", description=__doc__)
    commands = parser.add_subparsers(dest="command", parser_class=ArgumentParser)
    commands.required = True
    p = commands.add_parser("prepare", help="corpus -> packed/ and padded/ datasets; --task %s: train/validation/test "
                            "files -> OUT/<split>/packed and padded" % fine_tuning)
    p.add_argument("--input", default=None,
                   help='file, directory, glob, or "default" (embedded corpus; with a --task: its embedded demo '
                   "task)")
    p.add_argument("--output", required=True, help="output directory (must not exist or be empty)")
    p.add_argument("--max-seq-length", type=int, default=None,
                   help="S [%s]" % "; ".join("%d with --task %s" % (task.max_seq_length, task.name)
                                             for task in tasks.TASKS.values()))
    p.add_argument("--vocab", "--tokenizer", dest="vocab", default=None, metavar="PATH",
                   help='vocab.txt or Hugging Face tokenizer directory (never downloaded), or "default": the default '
                   "corpus' vocabulary. Your own --input needs --vocab or --train-vocab; --input default without "
                   "either gets the default vocabulary. A task needs the model's own tokenizer (--tokenizer DIR)")
    t = p.add_argument_group("fine-tuning task (--task %s; data/finetune/)" % fine_tuning)
    t.add_argument("--task", choices=tasks.NAMES, default=tasks.PRETRAINING.name,
                   help=", ".join("%s (%s)" % (task.name, task.inputs) for task in tasks.TASKS.values()))
    t.add_argument("--train", default=None, metavar="FILE", help="the train split (it decides columns and labels)")
    t.add_argument("--validation", default=None, metavar="FILE", help="the validation split")
    t.add_argument("--test", default=None, metavar="FILE", help="the test split (optional; may have no labels)")
    t.add_argument("--sentence1-key", default=None,
                   help="first text column [sentence1, else the first non-label column]")
    t.add_argument("--sentence2-key", default=None, help="second text column [sentence2 where there is one]")
    t.add_argument("--label-key", default="label", help="label column [label]")
    t.add_argument("--problem-type", choices=PROBLEM_TYPES, default=None,
                   help="force the labels' kind (default: inferred as run_glue.py does)")
    t.add_argument("--doc-stride", type=int, default=None,
                   help="question answering: context tokens two consecutive windows share [128, run_qa.py's]")
    t.add_argument("--max-query-length", type=int, default=None,
                   help="question answering: a longer question is cut to its words whose tokens fit [64]")
    p.add_argument("--train-vocab", "--vocab-size", dest="train_vocab", type=int, default=None, metavar="N",
                   help="train a WordPiece vocabulary of (at most) N tokens on --input, deterministically (the same "
                   "input gives the same vocab.txt); the default corpus' vocabulary is N=%d" % DEFAULT_VOCAB_SIZE)
    p.add_argument("--lower-case", choices=("auto", "yes", "no"), default=defaults.lower_case,
                   help="lower-case the text: for a bare vocab.txt auto = uncased unless it has upper-case tokens; for "
                   "--train-vocab auto = yes; a Hugging Face tokenizer decides its own. Recorded in the manifest "
                   "(do_lower_case) and in the export's tokenizer_config.json")
    p.add_argument("--format", choices=("auto", "bert", "text"), default=defaults.format)
    p.add_argument("--dupe-factor", type=int, default=defaults.dupe_factor)
    p.add_argument("--short-seq-prob", type=float, default=defaults.short_seq_prob)
    p.add_argument("--masked-lm-prob", type=float, default=defaults.masked_lm_prob)
    p.add_argument("--max-predictions-per-seq", type=int, default=None, help="default ceil(masked_lm_prob * S)")
    p.add_argument("--whole-word-masking", action="store_true")
    p.add_argument("--shard-chars", type=int, default=defaults.shard_chars,
                   help="characters of text per input shard (unit of work and of RNG seeding; part of the recipe)")
    _add_packing_arguments(p)
    k = commands.add_parser("pack", help="existing NVIDIA BERT HDF5 or google-research/bert TFRecord data -> "
                            "packed/ and padded/ datasets, every instance kept as it is")
    k.add_argument("--input", required=True, help="file, directory or glob of .hdf5 / TFRecord files")
    k.add_argument("--output", required=True, help="output directory (must not exist or be empty)")
    k.add_argument("--vocab", required=True,
                   help="the vocab.txt (or Hugging Face tokenizer directory) the data's token ids refer to")
    k.add_argument("--format", choices=("auto", "hdf5", "tfrecord"), default="auto")
    k.add_argument("--lower-case", choices=("auto", "yes", "no"), default=defaults.lower_case,
                   help="whether the data was lower-cased, for a bare vocab.txt (recorded in the manifest)")
    _add_packing_arguments(k)
    i = commands.add_parser("inspect", help="print a dataset's manifest, length histogram and packing statistics")
    i.add_argument("directory")
    i.add_argument("--no-verify", action="store_true", help="skip the checksums")
    return parser


def _keep_freed_memory() -> None:
    """Let glibc's malloc reuse freed memory instead of returning it to the kernel.

    The pipeline allocates and frees many short-lived arrays of tens of MB. By default glibc serves
    each with a fresh mmap and unmaps it on free, so every new array pays its page faults again.
    Raising the mmap and trim thresholds keeps freed blocks in the heap for the next array; forked
    worker processes inherit the setting. Only the command does this (it is
    process-wide); it changes no output. Skipped where there is no glibc.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def _prepare(args: argparse.Namespace) -> None:
    from .text.pipeline import PrepareConfig, prepare

    packing = _packing_options(args)
    _keep_freed_memory()
    config = PrepareConfig(
        input=args.input or "", output=args.output, max_seq_length=args.max_seq_length, vocab=args.vocab,
        train_vocab=args.train_vocab, lower_case=args.lower_case, format=args.format,
        dupe_factor=args.dupe_factor, short_seq_prob=args.short_seq_prob, masked_lm_prob=args.masked_lm_prob,
        max_predictions_per_seq=args.max_predictions_per_seq, whole_word_masking=args.whole_word_masking,
        shard_chars=args.shard_chars, packing=packing, task=args.task, train=args.train,
        validation=args.validation, test=args.test, sentence1_key=args.sentence1_key,
        sentence2_key=args.sentence2_key, label_key=args.label_key, problem_type=args.problem_type,
        doc_stride=args.doc_stride, max_query_length=args.max_query_length)
    result = prepare(config)
    for line in tasks.get(args.task).hook("prepared")(args.output, result):
        print(line)
    print("seconds: " + ", ".join("%s %.2f" % item for item in result.seconds.items()))


def _pack(args: argparse.Namespace) -> None:
    from .existing.pack import PackConfig, pack

    packing = _packing_options(args)
    _keep_freed_memory()
    config = PackConfig(input=args.input, output=args.output, vocab=args.vocab, format=args.format,
                        lower_case=args.lower_case, packing=packing)
    result = pack(config)
    packed, padded, seconds = result.packed, result.padded, result.seconds
    print("packed %s (%s, %d files) in %.1f s: %d sequences (%.0f/s) -> %d packs (packing factor %.3f, "
          "efficiency %.1f%%, M = %d)%s"
          % (args.output, packed["corpus"]["format"], packed["corpus"]["files"], seconds["total"],
             packed["num_sequences"], packed["num_sequences"] / seconds["total"], packed["num_packs"],
             packed["packing_factor"], 100 * packed["packing_efficiency"], packed["mlm_slots"],
             "; padded baseline %d rows (efficiency %.1f%%)" % (padded["num_packs"], 100 * padded["packing_efficiency"])
             if padded else ""))
    print("seconds: " + ", ".join("%s %.2f" % item for item in seconds.items()))


def _histogram_lines(histogram: List[int], buckets: int = 16, width: int = 40) -> List[str]:
    counts = np.asarray(histogram, dtype=np.int64)
    edges = np.linspace(0, len(counts), min(buckets, len(counts)) + 1).astype(int)
    sums = [int(counts[a:b].sum()) for a, b in zip(edges[:-1], edges[1:])]
    top = max(1, max(sums))
    return ["  %4d-%-4d %9d %s" % (a + 1, b, s, "#" * int(round(width * s / top)))
            for a, b, s in zip(edges[:-1], edges[1:], sums)]


def _inspect(args: argparse.Namespace) -> None:
    from .format import read_manifest
    from .shards import validate_shards

    manifest = read_manifest(args.directory)
    validate_shards(args.directory, manifest, checksums=not args.no_verify)
    print("manifest (%s, checksums %s):" % (args.directory, "not checked" if args.no_verify else "ok"))
    for key in sorted(manifest):
        if key in ("sequence_length_histogram", "sequences_per_pack_histogram", "shards"):
            continue
        value = manifest[key]
        print("  %-24s %s" % (key, json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value))
    print("  %-24s %d files, %d packs" % ("shards", len(manifest["shards"]), manifest["num_packs"]))
    s, n, p = manifest["max_seq_length"], manifest["num_sequences"], manifest["num_packs"]
    lengths = np.asarray(manifest["sequence_length_histogram"], dtype=np.int64)
    mean = float((lengths * np.arange(1, s + 1)).sum()) / max(1, n)
    print("sequence length histogram (%d sequences, mean length %.1f of %d):" % (n, mean, s))
    print("\n".join(_histogram_lines(manifest["sequence_length_histogram"])))
    print("packing statistics:")
    per_pack = manifest["sequences_per_pack_histogram"]
    print("  sequences per pack       " + ", ".join("%d: %d" % (k + 1, c) for k, c in enumerate(per_pack)))
    print("  packing factor           %.4f sequences/pack" % manifest["packing_factor"])
    print("  packing efficiency       %.2f%% (padding %.2f%%)" % (100 * manifest["packing_efficiency"],
                                                                 100 * (1 - manifest["packing_efficiency"])))
    padded_efficiency = manifest["num_tokens"] / float(max(1, n) * s)
    print("  padded efficiency        %.2f%% (one sequence per row)" % (100 * padded_efficiency))
    print("  speed-up over padded     %.4fx (rows: %d padded / %d packs)" % (n / float(max(1, p)), n, p))
    if "task" in manifest:
        _inspect_task(args.directory, manifest)
        return
    print("  masked tokens            %d (%.2f per sequence, %d slots per pack)"
          % (manifest["num_masked_tokens"], manifest["num_masked_tokens"] / float(max(1, n)), manifest["mlm_slots"]))


def _inspect_task(directory: str, manifest: dict) -> None:
    """A task dataset's task, as its recipe describes it (tasks/)."""
    print("task:")
    for line in tasks.get(manifest["task"]["name"]).hook("inspect")(directory, manifest):
        print(line)


def _main(argv: Optional[List[str]]) -> int:
    args = _parser().parse_args(argv)
    if args.command == "prepare":
        _prepare(args)
    elif args.command == "pack":
        _pack(args)
    else:
        _inspect(args)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(_main, argv)


def _subcommand(name: str, argv: Optional[List[str]]) -> int:
    return main([name] + list(sys.argv[1:] if argv is None else argv))


def prepare_main(argv: Optional[List[str]] = None) -> int:
    """The `ipu-packing-prepare` console script: `python -m ipu_packing.data prepare ...`."""
    return _subcommand("prepare", argv)


def pack_main(argv: Optional[List[str]] = None) -> int:
    """The `ipu-packing-pack` console script: `python -m ipu_packing.data pack ...`."""
    return _subcommand("pack", argv)


def inspect_main(argv: Optional[List[str]] = None) -> int:
    """The `ipu-packing-inspect` console script: `python -m ipu_packing.data inspect ...`."""
    return _subcommand("inspect", argv)
