"""The command line of ``python -m ipu_packing.bench`` (the console script ipu-packing-bench): the synthetic
mode (throughput.py; --attention A,B,... times each attention), --config (config_bench.py), --peers, ours against
transformers' BertForPreTraining (peers.py), and --classifier, sequence classification against transformers'
BertForSequenceClassification and its pipeline, inference or fine-tuning steps (classify_peers.py).
throughput.py's docstring says what is measured."""

from __future__ import annotations

import argparse
import os
from typing import List, Optional, Sequence

from .. import jsonout
from ..errors import ArgumentParser, run_command
from . import harness, peers, throughput
from .classify_peers import main_classifier
from .config_bench import main_config
from .harness import ORDERS
from .inputs import (MODEL_PRESETS, BenchError, attention_list, check_writable, read_dataset_histogram,
                     read_histogram_file, refuse_other_modes_options, shared_dir)
from .throughput import draw_plot, format_result, run_bench


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m ipu_packing.bench", description=throughput.__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group()
    source.add_argument("--histogram", help="length histogram JSON (key 'histogram', bin i = length i+1); "
                        "default: the shared Wikipedia 512 one")
    source.add_argument("--data", help="prepared data (prepare's --output DIR, or one dataset directory)")
    p.add_argument("--max-seq-length", type=int, default=None, help="S (default: the histogram's or dataset's)")
    p.add_argument("--max-sequences-per-pack", type=int, default=None,
                   help="K of the packed layout (default: 3; with --classifier: 32)")
    p.add_argument("--timed-packs", type=int, default=128,
                   help="packs of the plan to time, with their sequences padded; 0 = all (default: %(default)s)")
    p.add_argument("--micro-batch-size", type=int, default=None,
                   help="rows per training step (default: 8; with --classifier: 32 rows a call)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed passes over both layouts, interleaved (default: %(default)s)")
    p.add_argument("--order", choices=sorted(ORDERS), default="calls",
                   help="the order of a repeat's calls: 'calls' interleaved in proportion (the fairest under load), "
                   "'passes' each contender's pass back to back, rotated each repeat (a training run's steady "
                   "state); default: %(default)s")
    p.add_argument("--model", choices=sorted(MODEL_PRESETS), default=None,
                   help="BERT size (default: tiny; with --classifier: the directory's architecture)")
    p.add_argument("--attention", default=None,
                   help="model attention implementation (dense, sdpa, ...; default: a training config's `auto` for "
                   "S on this CPU: sdpa below S=256, varlen from it); one or more separated by commas, each timed "
                   "with both layouts, interleaved")
    p.add_argument("--algorithm", default=None, help="packing algorithm (default: optimal)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default: %(default)s: steadier timings on a shared machine; 0 = torch default)")
    p.add_argument("--task", choices=("pretraining", "question_answering"), default="pretraining",
                   help="synthetic mode: the model timed, pretraining's or question answering's (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=os.path.join("output", "bench", "bench.png"),
                   help="PNG path (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--config", default=None, help="time through this training config's runner, data and batch "
                   "accounting (configs/NAME.yaml or a path); sequences from its prepared dataset, or --histogram")
    p.add_argument("--steps", type=int, default=10,
                   help="with --config: optimizer steps of each layout (default: %(default)s)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="with --config: config overrides")
    p.add_argument("--peers", action="store_true", help="ours (padded and packed, every attention) against "
                   "transformers' BertForPreTraining (padded, and grouped by length), on the same sequences "
                   "(peers.py)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="synthetic mode and --peers (default: %(default)s)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="synthetic mode and --peers: "
                   "bf16 = torch.autocast bfloat16 for every contender (default: %(default)s)")
    p.add_argument("--classifier", default=None, metavar="DIR", help="sequence classification, ours (padded and "
                   "packed, through ipu_packing.predict) against transformers' BertForSequenceClassification (padded, "
                   "grouped, its pipeline) on the same texts: DIR, a BERT directory with its tokenizer "
                   "(classify_peers.py)")
    p.add_argument("--input", default=None, help="with --classifier: the texts (as predict --input reads them; "
                   "default: the embedded demo task's)")
    p.add_argument("--inputs", type=int, default=1024, help="with --classifier: texts timed (default: %(default)s)")
    p.add_argument("--train", action="store_true", help="with --classifier: fine-tuning steps (AdamW) instead of "
                   "inference")
    p.add_argument("--table", action="store_true", help="with --classifier: serving, then fine-tuning steps, each "
                   "contender against every transformers layout (the peer table of docs/results.md)")
    return p



def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(_main, None if argv is None else list(argv))


def check_histogram_options(parser, args) -> None:
    """The synthetic mode's and --peers' options (a length histogram's), checked before anything is timed or
    written; the defaults both take filled in."""
    refuse_other_modes_options(parser, args, "--peers" if args.peers else "the synthetic mode")
    for name, default in (("model", "tiny"), ("max_sequences_per_pack", 3), ("micro_batch_size", 8)):
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.peers:
        args.plot = None
    # Every input is checked before anything is timed or written.
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BenchError("--device cuda: torch %s sees no CUDA device" % torch.__version__)
    if args.timed_packs < 0:
        raise BenchError("--timed-packs must be >= 0")
    for name in ("micro_batch_size", "repeats", "max_sequences_per_pack"):
        if getattr(args, name) < 1:
            raise BenchError("--%s must be >= 1" % name.replace("_", "-"))


def _main(argv: Optional[List[str]]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    modes = [name for name in ("peers", "config", "classifier") if getattr(args, name)]
    if len(modes) > 1:
        raise BenchError("--%s and --%s are two modes of the bench: give one" % tuple(modes[:2]))
    if args.classifier:
        return main_classifier(parser, args)
    if args.config:
        return main_config(parser, args)
    check_histogram_options(parser, args)
    attentions = attention_list(args)
    if args.data:
        histogram = read_dataset_histogram(args.data)
        if args.max_seq_length and args.max_seq_length != len(histogram):
            raise BenchError("--max-seq-length %d differs from the dataset's S=%d"
                             % (args.max_seq_length, len(histogram)))
    else:
        path = args.histogram or os.path.join(shared_dir(), "data", "wikipedia_512_histogram.json")
        if not args.histogram and not os.path.isfile(path):
            raise BenchError(
                "no length histogram: %s is absent (set IPU_PACKING_SHARED, or pass --histogram FILE or "
                "--data DIR, e.g. --data output/data/demo_128)" % (path,)
            )
        histogram = read_histogram_file(path, args.max_seq_length)
    if args.plot:
        check_writable(args.plot, reading=[args.data or path])
    S = len(histogram)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.peers:
        return peers.main_peers(args, histogram)
    log = harness.progress(args.json)
    result = run_bench(histogram, S, args.max_sequences_per_pack, model_preset=args.model,
                       micro_batch_size=args.micro_batch_size, repeats=args.repeats, algorithm=args.algorithm,
                       attentions=attentions, seed=args.seed, timed_packs=args.timed_packs or None,
                       task=args.task, order=args.order, device=args.device, precision=args.precision, log=log)
    if args.plot:
        result["plot"] = draw_plot(result, histogram, args.plot)
    print(jsonout.dumps(result, sort_keys=True) if args.json else format_result(result))
    return 0

