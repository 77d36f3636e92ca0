"""Packing overhead of the model: step time (forward + backward) per pack, packed against padded.

    python -m ipu_packing.bench.model_overhead [--preset tiny|small|base] [--max-seq-length 128] [--batch 8] ...

Both runs have the same shape (B, S) and the same code path; they differ only in what the rows hold:

- packed: each row is a pack of K sequences that fill it (block-diagonal mask, positions restarting, NSP at
  K [CLS] positions, M MLM slots as the data pipeline sizes them, data/format.py's mlm_slots);
- padded: each row holds one sequence of 3/4 S tokens followed by padding (K = 1, M = mlm_slots(S, 1)).

Rows are random instances of data/random_instances.py, laid out by the pack format's reference builder
(data/reference.py, pack_sequences).

The encoder costs the same in both (the dense mask is (B, 1, S, S) either way); the overhead of packing is
what the pretraining heads do on more slots, and building the mask. A packed step processes K sequences per
row instead of 1, which is where the speed-up comes from (the throughput columns show it).

Steps alternate between the two workloads (in ABBA order: harness.py's ``passes``, one step a pass) so that
load from other processes hits both alike. Reported: median and minimum wall time, and median CPU time of this
process (with ``--threads 1`` on a shared machine the steadier measure: time spent descheduled by other
processes does not count), and the matmul FLOPs of one step of each (torch's FlopCounterMode, torch >= 2.1),
which no noise affects. Not a test: it prints numbers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from .presets import MODEL_PRESETS
from ..data.format import FIRST_WORD_ID, IGNORE_INDEX, as_batch
from ..data.random_instances import random_packs
from ..errors import ArgumentParser, run_command
from ..model.attention import ATTENTION_IMPLEMENTATIONS
from .harness import Contender, measure


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = ArgumentParser(prog="python -m ipu_packing.bench.model_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(MODEL_PRESETS), default="small",
                        help="model size (bench/presets.py; default small)")
    parser.add_argument("--vocab-size", type=int, default=None, help="V (default: the preset's)")
    parser.add_argument("--max-seq-length", type=int, default=128, help="S, tokens per row")
    parser.add_argument("--seq-len", dest="max_seq_length", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=8, help="B, rows (packs) per step")
    parser.add_argument("--max-sequences-per-pack", type=int, default=3, help="K of the packed run")
    parser.add_argument("--max-predictions-per-seq", type=int, default=20, help="cap on MLM predictions per sequence")
    parser.add_argument("--attention", choices=ATTENTION_IMPLEMENTATIONS, default="dense")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32", help="autocast dtype")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per workload")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed steps per workload (at least the harness's warm-up step)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.vocab_size is None:
        args.vocab_size = MODEL_PRESETS[args.preset]["vocab_size"]
    if args.vocab_size <= FIRST_WORD_ID:
        parser.error("--vocab-size must exceed %d (the special tokens), got %d" % (FIRST_WORD_ID, args.vocab_size))
    for name in ("max_seq_length", "batch", "max_sequences_per_pack", "max_predictions_per_seq", "steps"):
        if getattr(args, name) < 1:
            parser.error("--%s must be >= 1, got %d" % (name.replace("_", "-"), getattr(args, name)))
    for name in ("warmup", "threads"):
        if getattr(args, name) < 0:
            parser.error("--%s must be >= 0, got %d" % (name, getattr(args, name)))
    if args.max_seq_length < 2 * args.max_sequences_per_pack:
        parser.error("--max-seq-length %d cannot hold %d sequences of length >= 2"
                     % (args.max_seq_length, args.max_sequences_per_pack))
    if args.device.split(":")[0] not in ("cpu", "cuda"):
        parser.error("--device must be cpu or cuda[:N], got %r" % args.device)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device %s: CUDA is not available" % args.device)
    return args


def make_batch(
    batch: int, seq_len: int, sequences: int, slots_per_sequence: int, vocab_size: int, generator: torch.Generator
) -> Dict[str, torch.Tensor]:
    """Rows of ``sequences`` random instances (data/random_instances.py's rule) that fill S; sequences == 1
    gives the padded baseline, one instance of 3/4 S per row and padding after it. ``slots_per_sequence`` caps
    each instance's predictions; M is mlm_slots(S, K) with that cap, which every row fits. The instances'
    numpy Generator is seeded by one draw from ``generator``: the same torch seed gives the same batch, and
    the next call a different one."""
    rng = np.random.default_rng(int(torch.randint(0, 2 ** 62, (1,), generator=generator)))
    real = seq_len if sequences > 1 else (3 * seq_len) // 4
    groups = []
    for _ in range(batch):
        # split `real` tokens into `sequences` lengths >= 2; the rest of the row is padding
        cuts = np.sort(rng.integers(0, real - 2 * sequences + 1, size=sequences - 1)) if sequences > 1 else []
        bounds = [0] + [int(c) + 2 * (i + 1) for i, c in enumerate(cuts)] + [real]
        groups.append(np.diff(bounds).tolist())
    packs = random_packs(rng, groups, seq_len, sequences, vocab_size, max_predictions_per_seq=slots_per_sequence)
    return {k: torch.from_numpy(v) for k, v in as_batch(packs, np.int64).items()}


def count_flops(step: Callable[[Dict[str, torch.Tensor]], Any], fields: Dict[str, torch.Tensor]) -> float:
    """Matmul FLOPs of one step, from torch's FlopCounterMode (torch >= 2.1; 0 when unavailable)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return 0.0
    counter = FlopCounterMode(display=False)
    with counter:
        step(fields)
    return float(counter.get_total_flops())


def print_report(args, config, workloads: Dict[str, Dict[str, torch.Tensor]], times: Dict[str, List[float]],
                 cpu_times: Dict[str, List[float]], flops: Dict[str, float]) -> None:
    """The module docstring's figures, on stdout."""
    median = {name: statistics.median(values) for name, values in times.items()}
    cpu_median = {name: statistics.median(values) for name, values in cpu_times.items()}
    sequences = {name: int((fields["nsp_labels"] != IGNORE_INDEX).sum()) for name, fields in workloads.items()}
    tokens = {name: int((fields["sequence_ids"] != 0).sum()) for name, fields in workloads.items()}
    print(
        "model: preset=%s (H=%d, L=%d, heads=%d, V=%d), attention=%s, precision=%s, device=%s, threads=%d"
        % (args.preset, config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.vocab_size,
           args.attention, args.precision, args.device, torch.get_num_threads())
    )
    print(
        "shape: B=%d S=%d; packed K=%d M=%d; padded K=1 M=%d; %d timed steps each (median), %d warm-up"
        % (args.batch, args.max_seq_length, args.max_sequences_per_pack,
           workloads["packed"]["mlm_labels"].shape[1], workloads["padded"]["mlm_labels"].shape[1], args.steps,
           args.warmup)
    )
    fastest = {name: min(values) for name, values in times.items()}
    print("%-8s %14s %14s %14s %12s %14s" % ("run", "median ms/pack", "min ms/pack", "cpu ms/pack", "seq/s",
                                            "real tokens/s"))
    for name in workloads:
        seconds = median[name]
        print(
            "%-8s %14.2f %14.2f %14.2f %12.1f %14.0f"
            % (name, 1000 * seconds / args.batch, 1000 * fastest[name] / args.batch,
               1000 * cpu_median[name] / args.batch, sequences[name] / seconds, tokens[name] / seconds)
        )

    def overhead(values: Dict[str, float]) -> float:
        return 100.0 * (values["packed"] / values["padded"] - 1.0)

    print(
        "packing overhead per pack (packed vs padded, same shape): %+.2f%% median wall, %+.2f%% min wall, "
        "%+.2f%% median CPU time" % (overhead(median), overhead(fastest), overhead(cpu_median))
    )
    if flops["packed"] and flops["padded"]:
        print(
            "matmul FLOPs per step (forward + backward, noise-free): packed %.4g, padded %.4g, overhead %+.2f%%"
            % (flops["packed"], flops["padded"], overhead(flops))
        )


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(_main, argv)


def _main(argv: Optional[List[str]]) -> int:
    args = parse_args(argv)
    import transformers

    from ipu_packing.model import PackedBertForPreTraining

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    config = transformers.BertConfig(**dict(MODEL_PRESETS[args.preset], vocab_size=args.vocab_size,
                                            max_position_embeddings=max(512, args.max_seq_length)))
    device = torch.device(args.device)
    model = PackedBertForPreTraining(config, attention=args.attention).to(device).train()
    generator = torch.Generator().manual_seed(args.seed)
    workloads = {
        "packed": make_batch(
            args.batch, args.max_seq_length, args.max_sequences_per_pack, args.max_predictions_per_seq, args.vocab_size,
            generator
        ),
        "padded": make_batch(args.batch, args.max_seq_length, 1, args.max_predictions_per_seq, args.vocab_size,
                             generator),
    }
    workloads = {name: {k: v.to(device) for k, v in fields.items()} for name, fields in workloads.items()}
    autocast_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]

    def step(fields: Dict[str, torch.Tensor]) -> None:
        """One forward + backward."""
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            out = model(**fields)
        out.loss.backward()

    flops = {name: count_flops(step, fields) for name, fields in workloads.items()}
    # one step of each workload a repeat, their order swapped each repeat (ABBA: none always runs second); the
    # harness's warm-up step, then the first --warmup - 1 repeats untimed
    names = list(workloads)
    timings = measure([Contender(name, [workloads[name]], step) for name in names], max(0, args.warmup - 1)
                      + args.steps, "passes", torch=torch, cuda=device.type == "cuda")
    skip = max(0, args.warmup - 1)
    times = {name: timings.calls[i][skip:] for i, name in enumerate(names)}
    cpu_times = {name: timings.cpu[i][skip:] for i, name in enumerate(names)}

    print_report(args, config, workloads, times, cpu_times, flops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
