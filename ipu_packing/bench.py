"""Throughput of packed against padded pretraining: same model, same sequences, one run.

    python -m ipu_packing.bench --histogram ../shared/data/wikipedia_512_histogram.json --max-seq-length 512
    python -m ipu_packing.bench --data output/data/demo_128 [--json] [--plot output/bench/bench.png]

What it does:

1. Reads a length histogram (bin i counts length i + 1): a histogram file, or the
   `sequence_length_histogram` of a prepared dataset (`--data DIR`, the prepare output or a dataset
   directory), and plans the packing of all of it with the packing engine (histogram packing,
   K = `--max-sequences-per-pack`, algorithm "optimal" by default).
2. Takes `--timed-packs` packs of the plan by systematic sampling and makes their sequences (random
   token ids, 15% masked, an NSP label each), then lays exactly these sequences out twice in the
   pack format of the data package: padded (one sequence per row, K = 1) and packed.
3. Runs full training steps (forward, backward, LAMB update) of one PackedBertForPreTraining over
   every row of each layout, `--micro-batch-size` rows per step, with the padded and packed steps
   interleaved in proportion so both see the same machine load (the machine may be shared), and
   repeats that `--repeats` times; per-row times are the median over repeats.

It reports sequences/s and real tokens/s of both, the measured speed-up (packed / padded sequences
per second), the theoretical speed-up (padded rows / packs) and the packing overhead: how much longer
one packed row takes than one padded row (mask, extra MLM and NSP slots), i.e.
theoretical / measured - 1. Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

FIELDS = ("input_ids", "token_type_ids", "position_ids", "sequence_ids", "mlm_positions", "mlm_labels", "cls_positions", "nsp_labels")
PAD, CLS, SEP, MASK, FIRST_WORD = 0, 2, 3, 4, 5

MODEL_PRESETS = {
    # name: transformers.BertConfig overrides
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, vocab_size=8192),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, vocab_size=30522),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, vocab_size=30522),
}


class BenchError(Exception):
    """Bad input: printed as one line, exit status 2."""


@dataclass
class Layout:
    """Rows of one layout in the pack format: arrays (P, S) / (P, M) / (P, K), int64."""

    name: str
    arrays: Dict[str, np.ndarray]

    @property
    def rows(self) -> int:
        return int(self.arrays["input_ids"].shape[0])

    @property
    def sequences(self) -> int:
        return int((self.arrays["nsp_labels"] != -100).sum())

    @property
    def tokens(self) -> int:
        return int((self.arrays["sequence_ids"] != 0).sum())


# --------------------------------------------------------------------------------------------
# Lengths
# --------------------------------------------------------------------------------------------


def shared_dir() -> str:
    """IPU_PACKING_SHARED, else <repo>/../shared, else /work/shared."""
    env = os.environ.get("IPU_PACKING_SHARED")
    if env:
        return env
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidate = os.path.join(os.path.dirname(repo), "shared")
    return candidate if os.path.isdir(candidate) else "/work/shared"


def read_histogram_file(path: str, max_seq_length: Optional[int]) -> np.ndarray:
    try:
        with open(path, "r", encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as exc:
        raise BenchError("histogram file %s: %s" % (path, exc.strerror or exc))
    except ValueError as exc:
        raise BenchError("histogram file %s is not valid JSON (%s)" % (path, exc))
    hist = raw.get("histogram") if isinstance(raw, dict) else raw
    if not isinstance(hist, list) or not hist or not all(isinstance(v, (int, float)) and v >= 0 for v in hist):
        raise BenchError("histogram file %s: field 'histogram' must be a list of counts (bin i = length i+1)" % (path,))
    hist = np.asarray(hist, dtype=np.float64)
    declared = raw.get("max_sequence_length") if isinstance(raw, dict) else None
    S = max_seq_length or declared or len(hist)
    if len(hist) > S and hist[S:].sum() > 0:
        raise BenchError("histogram file %s has sequences longer than --max-seq-length %d" % (path, S))
    out = np.zeros(S, dtype=np.float64)
    out[: min(S, len(hist))] = hist[:S]
    return out


def read_dataset_histogram(directory: str) -> np.ndarray:
    for candidate in (os.path.join(directory, "padded"), os.path.join(directory, "packed"), directory):
        manifest = os.path.join(candidate, "manifest.json")
        if os.path.isfile(manifest):
            try:
                with open(manifest, "r", encoding="utf-8") as f:
                    raw = json.load(f)
                hist = np.asarray(raw["sequence_length_histogram"], dtype=np.float64)
            except (ValueError, KeyError, TypeError) as exc:
                raise BenchError("dataset manifest %s is unusable (%s)" % (manifest, type(exc).__name__))
            return hist
    raise BenchError("no prepared dataset at %s (no manifest.json in it, or in its packed/ or padded/)" % (directory,))


# --------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------


def max_predictions(S: int) -> int:
    return max(1, int(round(0.15 * S)))


def make_sequences(lengths: np.ndarray, vocab_size: int, seed: int) -> List[Dict[str, np.ndarray]]:
    """Random NSP/MLM instances of exactly the given lengths: [CLS] A [SEP] B [SEP] (from 5 tokens),
    floor(15%) of the word tokens masked, so a pack's masked tokens never exceed 15% of S."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for n in lengths:
        n = int(n)
        tokens = rng.integers(FIRST_WORD, vocab_size, size=n)
        types = np.zeros(n, dtype=np.int64)
        tokens[0] = CLS
        if n >= 2:
            tokens[n - 1] = SEP
        if n >= 5:
            a = int(rng.integers(1, n - 3))
            tokens[1 + a] = SEP
            types[2 + a :] = 1
        words = np.flatnonzero(tokens >= FIRST_WORD)
        k = int(np.floor(0.15 * len(words)))
        positions = np.sort(rng.choice(words, size=k, replace=False)) if k else np.zeros(0, dtype=np.int64)
        labels = tokens[positions].copy()
        tokens[positions] = MASK
        out.append(dict(tokens=tokens, types=types, positions=positions, labels=labels, nsp=int(rng.integers(0, 2))))
    return out


def build_layout(name: str, sequences, groups: Sequence[Sequence[int]], S: int, K: int, M: int) -> Layout:
    P = len(groups)
    arrays = {
        "input_ids": np.zeros((P, S), np.int64),
        "token_type_ids": np.zeros((P, S), np.int64),
        "position_ids": np.zeros((P, S), np.int64),
        "sequence_ids": np.zeros((P, S), np.int64),
        "mlm_positions": np.zeros((P, M), np.int64),
        "mlm_labels": np.full((P, M), -100, np.int64),
        "cls_positions": np.zeros((P, K), np.int64),
        "nsp_labels": np.full((P, K), -100, np.int64),
    }
    for p, group in enumerate(groups):
        offset, slot = 0, 0
        if len(group) > K:
            raise AssertionError("pack %d holds %d sequences, more than K=%d" % (p, len(group), K))
        for k, idx in enumerate(group):
            seq = sequences[idx]
            n, m = len(seq["tokens"]), len(seq["positions"])
            if offset + n > S or slot + m > M:
                raise AssertionError("pack %d overflows S=%d or M=%d" % (p, S, M))
            arrays["input_ids"][p, offset : offset + n] = seq["tokens"]
            arrays["token_type_ids"][p, offset : offset + n] = seq["types"]
            arrays["position_ids"][p, offset : offset + n] = np.arange(n)
            arrays["sequence_ids"][p, offset : offset + n] = k + 1
            arrays["mlm_positions"][p, slot : slot + m] = seq["positions"] + offset
            arrays["mlm_labels"][p, slot : slot + m] = seq["labels"]
            arrays["cls_positions"][p, k] = offset
            arrays["nsp_labels"][p, k] = seq["nsp"]
            offset, slot = offset + n, slot + m
    return Layout(name, arrays)


def plan_histogram(histogram: np.ndarray, S: int, K: int, algorithm: Optional[str]):
    """Histogram packing of the whole length distribution with the packing engine."""
    from ipu_packing.packing import ALGORITHMS, plan_packing

    algorithm = algorithm or ("optimal" if "optimal" in ALGORITHMS else ALGORITHMS[0])
    if algorithm not in ALGORITHMS:
        raise BenchError("unknown packing algorithm %r (available: %s)" % (algorithm, ", ".join(ALGORITHMS)))
    counts = np.asarray(np.round(histogram), dtype=np.int64)
    return plan_packing(counts, S, K, algorithm)


def select_packs(plan, count: Optional[int], seed: int) -> List[Tuple[int, ...]]:
    """`count` packs of the plan by systematic sampling, as tuples of sequence lengths.

    The plan's packs are listed by strategy, ordered by number of sequences then lengths, and every
    (num_packs / count)-th one is taken from a seeded random start, so the sample keeps the plan's
    mix of 1-, 2- and 3-sequence packs (its padded rows / packs is close to the plan's)."""
    strategies = sorted(zip(plan.strategies, np.asarray(plan.repeats).tolist()), key=lambda sr: (len(sr[0]), sr[0]))
    strategies = [(tuple(int(n) for n in lengths), int(r)) for lengths, r in strategies if r > 0]
    total = sum(r for _, r in strategies)
    if not count or count >= total:
        return [lengths for lengths, r in strategies for _ in range(r)]
    step = total / float(count)
    start = np.random.default_rng(seed).random() * step
    targets = (start + step * np.arange(count)).astype(np.int64)
    ends = np.cumsum([r for _, r in strategies])
    return [strategies[int(j)][0] for j in np.searchsorted(ends, targets, side="right")]


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


@dataclass
class Result:
    padded_sequences_per_second: float
    packed_sequences_per_second: float
    padded_tokens_per_second: float
    packed_tokens_per_second: float
    speedup: float
    theoretical_speedup: float
    """Padded rows / packs of the timed sequences."""
    overhead: float
    plan_sequences: int
    plan_packs: int
    plan_theoretical_speedup: float
    """Sequences / packs of the whole plan (the dataset's theoretical speed-up)."""
    num_sequences: int
    padded_rows: int
    num_packs: int
    num_tokens: int
    max_seq_length: int
    max_sequences_per_pack: int
    packing_algorithm: str
    packing_efficiency: float
    packing_plan_seconds: float
    padded_seconds_per_row: List[float]
    packed_seconds_per_row: List[float]
    micro_batch_size: int
    repeats: int
    model: Dict[str, object]
    attention: str
    torch_threads: int
    plot: Optional[str] = None


def _train_batch(model, optimizer, batch) -> None:
    optimizer.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    optimizer.step()


def _time_pass(model, optimizer, layout: Layout, batch_size: int, torch) -> float:
    """Seconds per row for one training pass over all full micro batches of the layout."""
    return _time_interleaved(model, optimizer, [layout], batch_size, torch)[layout.name]


def _time_interleaved(model, optimizer, layouts: Sequence[Layout], batch_size: int, torch) -> Dict[str, float]:
    """Seconds per row of each layout, for one training pass over all full micro batches of each.

    The batches of the layouts are interleaved in proportion (two padded batches per packed one at a
    packing factor of 2), so that a busy period of a shared machine slows both layouts alike."""
    schedule = []
    for layout in layouts:
        tensors = {k: torch.from_numpy(v) for k, v in layout.arrays.items()}
        n = layout.rows // batch_size
        for b in range(n):
            batch = {k: v[b * batch_size : (b + 1) * batch_size] for k, v in tensors.items()}
            schedule.append(((b + 0.5) / n, layout.name, batch))
    schedule.sort(key=lambda item: (item[0], item[1]))
    seconds = {layout.name: 0.0 for layout in layouts}
    for _, name, batch in schedule:
        start = time.perf_counter()
        _train_batch(model, optimizer, batch)
        seconds[name] += time.perf_counter() - start
    return {layout.name: seconds[layout.name] / (layout.rows // batch_size * batch_size) for layout in layouts}


def run_bench(
    histogram: np.ndarray,
    S: int,
    K: int,
    model_preset: str = "tiny",
    micro_batch_size: int = 8,
    repeats: int = 3,
    algorithm: Optional[str] = None,
    attention: Optional[str] = None,
    seed: int = 0,
    timed_packs: Optional[int] = 128,
    log=lambda message: None,
) -> Result:
    import torch
    import transformers

    from ipu_packing.model import PackedBertForPreTraining
    from ipu_packing.train.optim import LAMB, parameter_groups

    model_kwargs = dict(MODEL_PRESETS[model_preset])
    model_kwargs.update(max_position_embeddings=max(512, S), attention_probs_dropout_prob=0.0)
    plan = plan_histogram(histogram, S, K, algorithm)
    plan_theoretical = plan.num_sequences / float(plan.num_packs)
    chosen = select_packs(plan, timed_packs, seed)
    lengths = np.asarray([n for pack in chosen for n in pack], dtype=np.int64)
    groups, offset = [], 0
    for pack in chosen:
        groups.append(list(range(offset, offset + len(pack))))
        offset += len(pack)
    sequences = make_sequences(lengths, model_kwargs["vocab_size"], seed)
    M = max_predictions(S)
    padded = build_layout("padded", sequences, [[i] for i in range(len(sequences))], S, 1, M)
    packed = build_layout("packed", sequences, groups, S, K, M + K - 1)
    if packed.sequences != padded.sequences or packed.tokens != padded.tokens:
        raise AssertionError("packed and padded layouts hold different sequences")
    if min(padded.rows, packed.rows) < micro_batch_size:
        raise BenchError("--micro-batch-size %d is more than the %d timed packs" % (micro_batch_size, packed.rows))
    log(
        "plan: %d sequences -> %d packs (K=%d, %s, %.1f s): theoretical speed-up %.4f; timing %d packs = %d sequences "
        "(%d real tokens) at S=%d: theoretical speed-up %.4f"
        % (plan.num_sequences, plan.num_packs, K, plan.algorithm, plan.seconds, plan_theoretical, packed.rows,
           padded.sequences, padded.tokens, S, padded.rows / float(packed.rows))
    )

    torch.manual_seed(seed)
    model = PackedBertForPreTraining(transformers.BertConfig(**model_kwargs), attention=attention)
    model.train()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = LAMB(parameter_groups(model, 0.01), lr=1e-4)
    # warm-up: one step of each layout (allocator, kernels), then restore the weights
    _time_pass(model, optimizer, Layout("warm", {k: v[:micro_batch_size] for k, v in padded.arrays.items()}), micro_batch_size, torch)
    _time_pass(model, optimizer, Layout("warm", {k: v[:micro_batch_size] for k, v in packed.arrays.items()}), micro_batch_size, torch)
    model.load_state_dict(initial)

    per_row = {"padded": [], "packed": []}
    for r in range(repeats):
        times = _time_interleaved(model, optimizer, (padded, packed), micro_batch_size, torch)
        for name, seconds in times.items():
            per_row[name].append(seconds)
        log("repeat %d: padded %.2f ms per row, packed %.2f ms per row" % (r + 1, 1000 * times["padded"], 1000 * times["packed"]))

    padded_row = statistics.median(per_row["padded"])
    packed_row = statistics.median(per_row["packed"])
    padded_seq_s = (padded.sequences / float(padded.rows)) / padded_row
    packed_seq_s = (packed.sequences / float(packed.rows)) / packed_row
    theoretical = padded.rows / float(packed.rows)
    speedup = packed_seq_s / padded_seq_s
    tokens_per_sequence = padded.tokens / float(padded.sequences)
    return Result(
        padded_sequences_per_second=padded_seq_s,
        packed_sequences_per_second=packed_seq_s,
        padded_tokens_per_second=padded_seq_s * tokens_per_sequence,
        packed_tokens_per_second=packed_seq_s * tokens_per_sequence,
        speedup=speedup,
        theoretical_speedup=theoretical,
        overhead=packed_row / padded_row - 1.0,
        plan_sequences=int(plan.num_sequences),
        plan_packs=int(plan.num_packs),
        plan_theoretical_speedup=plan_theoretical,
        num_sequences=padded.sequences,
        padded_rows=padded.rows,
        num_packs=packed.rows,
        num_tokens=padded.tokens,
        max_seq_length=S,
        max_sequences_per_pack=K,
        packing_algorithm=plan.algorithm,
        packing_efficiency=packed.tokens / float(packed.rows * S),
        packing_plan_seconds=float(plan.seconds),
        padded_seconds_per_row=per_row["padded"],
        packed_seconds_per_row=per_row["packed"],
        micro_batch_size=micro_batch_size,
        repeats=repeats,
        model=dict(model_kwargs, preset=model_preset),
        attention=model.attention_implementation if hasattr(model, "attention_implementation") else str(attention),
        torch_threads=torch.get_num_threads(),
    )


def draw_plot(result: Result, histogram: np.ndarray, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = ["padded", "packed", "padded x theoretical"]
    values = [
        result.padded_sequences_per_second,
        result.packed_sequences_per_second,
        result.padded_sequences_per_second * result.theoretical_speedup,
    ]
    bars = left.bar(names, values, color=["#999999", "#1f77b4", "#c6dbef"])
    for bar, value in zip(bars, values):
        left.text(bar.get_x() + bar.get_width() / 2, value, "%.1f" % value, ha="center", va="bottom")
    left.set_ylabel("sequences / s (training steps)")
    left.set_title(
        "S=%d: speed-up %.2fx measured, %.2fx theoretical, overhead %.1f%%"
        % (result.max_seq_length, result.speedup, result.theoretical_speedup, 100 * result.overhead),
        fontsize=9,
    )
    right.bar(np.arange(1, len(histogram) + 1), histogram / max(histogram.sum(), 1), width=1.0, color="#1f77b4")
    right.set_xlabel("sequence length (tokens)")
    right.set_ylabel("fraction of sequences")
    right.set_yscale("log")
    right.set_title(
        "%d sequences -> %d packs (%.3fx); timed: %d rows vs %d packs"
        % (result.plan_sequences, result.plan_packs, result.plan_theoretical_speedup, result.padded_rows, result.num_packs),
        fontsize=9,
    )
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def format_result(r: Result) -> str:
    return "\n".join(
        [
            "model %s (hidden %d, %d layers, vocab %d), attention %s, micro batch %d, %d torch threads, %d repeats"
            % (r.model["preset"], r.model["hidden_size"], r.model["num_hidden_layers"], r.model["vocab_size"], r.attention, r.micro_batch_size, r.torch_threads, r.repeats),
            "plan: %d sequences -> %d packs (K=%d, %s): theoretical speed-up %.3fx"
            % (r.plan_sequences, r.plan_packs, r.max_sequences_per_pack, r.packing_algorithm, r.plan_theoretical_speedup),
            "timed: %d sequences (%d real tokens), S=%d; %d padded rows vs %d packs (efficiency %.2f%%)"
            % (r.num_sequences, r.num_tokens, r.max_seq_length, r.padded_rows, r.num_packs, 100 * r.packing_efficiency),
            "padded: %10.2f sequences/s %12.1f tokens/s" % (r.padded_sequences_per_second, r.padded_tokens_per_second),
            "packed: %10.2f sequences/s %12.1f tokens/s" % (r.packed_sequences_per_second, r.packed_tokens_per_second),
            "measured speed-up:    %.3fx" % r.speedup,
            "theoretical speed-up: %.3fx (padded rows / packs)" % r.theoretical_speedup,
            "packing overhead:     %.2f%% (time per pack / time per padded row - 1)" % (100 * r.overhead),
        ]
        + (["plot: %s" % r.plot] if r.plot else [])
    )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        sys.stderr.write("error: %s (see --help)\n" % (message,))
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m ipu_packing.bench", description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group()
    source.add_argument("--histogram", help="length histogram JSON (key 'histogram', bin i = length i+1); default: the shared Wikipedia 512 one")
    source.add_argument("--data", help="prepared data (prepare's --output DIR, or one dataset directory)")
    p.add_argument("--max-seq-length", type=int, default=None, help="S (default: the histogram's or dataset's)")
    p.add_argument("--max-sequences-per-pack", type=int, default=3, help="K of the packed layout (default: %(default)s)")
    p.add_argument("--timed-packs", type=int, default=128,
                   help="packs of the plan to time, with their sequences padded; 0 = all (default: %(default)s)")
    p.add_argument("--micro-batch-size", type=int, default=8, help="rows per training step (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="timed passes over both layouts, interleaved (default: %(default)s)")
    p.add_argument("--model", choices=sorted(MODEL_PRESETS), default="tiny", help="BERT size (default: %(default)s)")
    p.add_argument("--attention", default=None, help="model attention implementation (dense, sdpa, ...; default: the model's)")
    p.add_argument("--algorithm", default=None, help="packing algorithm (default: optimal)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s: steadier timings on a shared machine; 0 = torch default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=os.path.join("output", "bench", "bench.png"), help="PNG path (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.timed_packs < 0:
            raise BenchError("--timed-packs must be >= 0")
        for name in ("micro_batch_size", "repeats", "max_sequences_per_pack"):
            if getattr(args, name) < 1:
                raise BenchError("--%s must be >= 1" % name.replace("_", "-"))
        if args.data:
            histogram = read_dataset_histogram(args.data)
            if args.max_seq_length and args.max_seq_length != len(histogram):
                raise BenchError("--max-seq-length %d differs from the dataset's S=%d" % (args.max_seq_length, len(histogram)))
        else:
            path = args.histogram or os.path.join(shared_dir(), "data", "wikipedia_512_histogram.json")
            if not args.histogram and not os.path.isfile(path):
                raise BenchError(
                    "no length histogram: %s is absent (set IPU_PACKING_SHARED, or pass --histogram FILE or "
                    "--data DIR, e.g. --data output/data/demo_128)" % (path,)
                )
            histogram = read_histogram_file(path, args.max_seq_length)
        S = len(histogram)
        if args.model not in MODEL_PRESETS:
            raise BenchError("unknown model preset %r" % (args.model,))
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        log = (lambda message: print(message, file=sys.stderr, flush=True)) if not args.json else (lambda message: None)
        result = run_bench(
            histogram,
            S,
            args.max_sequences_per_pack,
            model_preset=args.model,
            micro_batch_size=args.micro_batch_size,
            repeats=args.repeats,
            algorithm=args.algorithm,
            attention=args.attention,
            seed=args.seed,
            timed_packs=args.timed_packs or None,
            log=log,
        )
        if args.plot:
            result.plot = draw_plot(result, histogram, args.plot)
    except BenchError as exc:
        sys.stderr.write("error: %s\n" % (exc,))
        return 2
    if args.json:
        print(json.dumps(asdict(result), sort_keys=True))
    else:
        print(format_result(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
