"""Throughput of packed against padded training: same model, same sequences, one run.

The synthetic mode of ``python -m ipu_packing.bench`` (cli.py parses and prints): a length histogram planned, a
sample of its packs timed in both layouts through the training runner; docs/app.md, "Throughput against the
padded baseline", says what is timed and reported.

    python -m ipu_packing.bench --histogram ../shared/data/wikipedia_512_histogram.json --max-seq-length 512
    python -m ipu_packing.bench --data output/data/demo_128 --attention dense,sdpa [--task question_answering]
"""

from __future__ import annotations

import contextlib
import os
import statistics
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..data.format import IGNORE_INDEX, as_batch, mlm_slots
from ..data.random_instances import random_instances
from ..data.reference import Instance, pack_sequences
from ..fsutil import atomic_open
from .harness import ORDERS, Contender, measure, restorer
from .inputs import MODEL_PRESETS, BenchError


@dataclass
class Layout:
    """Rows of one layout: the pack fields of data/format.py as int64 arrays (P, S) / (P, M) / (P, K)."""

    name: str
    arrays: Dict[str, np.ndarray]

    @property
    def rows(self) -> int:
        return int(self.arrays["input_ids"].shape[0])

    @property
    def sequences(self) -> int:
        return int(self.arrays["sequence_ids"].max(axis=1).sum())  # a row's sequences are numbered 1..k

    @property
    def tokens(self) -> int:
        return int((self.arrays["sequence_ids"] != 0).sum())


# -- layouts -----------------------------------------------------------------------------------


def make_sequences(lengths: np.ndarray, vocab_size: int, seed: int) -> List[Instance]:
    """Random NSP/MLM instances of exactly the given lengths, by data/random_instances.py's rule: the data
    recipe's prediction count at the default masked_lm_prob, so the pipeline's M (format.mlm_slots) holds
    every pack of them."""
    return random_instances(np.random.default_rng(seed + 1), lengths, vocab_size)


def build_layout(name: str, sequences: Sequence[Instance], groups: Sequence[Sequence[int]], S: int, K: int,
                 M: int) -> Layout:
    """Pack p holds sequences[i] for i in groups[p], laid out by format.pack_sequences."""
    packs = pack_sequences([[sequences[i] for i in group] for group in groups], S, K, M)
    return Layout(name, as_batch(packs, np.int64))


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


def timed_layouts(plan, S: int, K: int, timed_packs: Optional[int], vocab_size: int,
                  seed: int) -> Tuple[Layout, Layout]:
    """(padded, packed): the sequences of `timed_packs` packs of the plan, one per row and as the plan
    packs them, with M sized as the data pipeline sizes it (format.mlm_slots)."""
    chosen = select_packs(plan, timed_packs, seed)
    sequences = make_sequences(np.asarray([n for pack in chosen for n in pack], dtype=np.int64), vocab_size, seed)
    starts = np.cumsum([0] + [len(pack) for pack in chosen]).tolist()
    groups = [list(range(a, b)) for a, b in zip(starts[:-1], starts[1:])]
    padded = build_layout("padded", sequences, [[i] for i in range(len(sequences))], S, 1, mlm_slots(S, 1))
    packed = build_layout("packed", sequences, groups, S, K, mlm_slots(S, K))
    if packed.sequences != padded.sequences or packed.tokens != padded.tokens:
        raise AssertionError("packed and padded layouts hold different sequences")
    return padded, packed


def question_answering_layout(layout: Layout, seed: int) -> Layout:
    """The same rows as question-answering rows (data/format.py's question_answering fields the model reads): the
    four token fields and cls_positions as they are, and a seeded answer span inside each sequence's own tokens
    (between its [CLS] and its last token, at most 30 tokens long) in start_positions and end_positions;
    IGNORE_INDEX in an empty slot. The values change no timing; the model's per-sequence softmax and loss run
    over every sequence as in training."""
    rng = np.random.default_rng(seed + 2)
    cls = layout.arrays["cls_positions"]  # (P, K)
    counts = np.stack([(layout.arrays["sequence_ids"] == k + 1).sum(axis=1) for k in range(cls.shape[1])], axis=1)
    present = counts > 0
    first = cls + 1
    last = cls + np.maximum(counts - 2, 1)  # the token before the sequence's final [SEP]
    start = first + (rng.random(cls.shape) * (last - first + 1)).astype(np.int64)
    end = np.minimum(start + rng.integers(0, 30, size=cls.shape), last)
    arrays = {name: layout.arrays[name] for name in ("input_ids", "token_type_ids", "position_ids", "sequence_ids",
                                                      "cls_positions")}
    arrays["start_positions"] = np.where(present, start, IGNORE_INDEX).astype(np.int64)
    arrays["end_positions"] = np.where(present, end, IGNORE_INDEX).astype(np.int64)
    return Layout(layout.name, arrays)


# -- timing ------------------------------------------------------------------------------------


def layout_contender(layout: Layout, name: str, runner, batch_size: int, torch) -> Contender:
    """The harness's contender of one layout: its full micro batches of ``batch_size`` rows, each one
    ``runner.train_step`` (the loop's step: zero_grad, forward, backward, optimizer)."""
    tensors = {k: torch.from_numpy(v) for k, v in layout.arrays.items()}
    return Contender(name, [{k: v[b * batch_size : (b + 1) * batch_size] for k, v in tensors.items()}
                            for b in range(layout.rows // batch_size)], runner.train_step)


def synthetic_runner(model_kwargs: Dict[str, object], S: int, qa: bool, attention: Optional[str],
                     micro_batch_size: int, seed: int, device: str = "cpu", precision: str = "fp32"):
    """(model, runner): the synthetic bench's model (question answering's head and AdamW, else pretraining's heads
    and LAMB), seeded, with ``attention`` (None: the shipped default, ``auto``, as a training config on ``device``
    resolves it); one step = one micro batch on ``device`` at ``precision``, through the runner training uses."""
    import torch
    import transformers

    from ipu_packing.execution import ExecutionConfig, make_runner
    from ipu_packing.model import PackedBertForPreTraining, PackedBertForQuestionAnswering
    from ipu_packing.train.optim import LAMB, parameter_groups

    execution = ExecutionConfig(backend="torch", device=device, micro_batch_size=micro_batch_size,
                                precision=precision)
    if attention is None:
        from ipu_packing.train.model_section import resolve_attention

        attention = resolve_attention({}, execution, S)
    torch.manual_seed(seed)
    model_cls = PackedBertForQuestionAnswering if qa else PackedBertForPreTraining
    model = model_cls(transformers.BertConfig(**model_kwargs), attention=attention).to(device)
    model.train()
    optimizer = (torch.optim.AdamW if qa else LAMB)(parameter_groups(model, 0.01), lr=1e-4)
    return model, make_runner(model, optimizer, execution)


def matmul_flops(step, batch) -> Optional[float]:
    """Matmul FLOPs of ``step(batch)`` (forward and backward), from torch's FlopCounterMode (None before torch 2.1)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    counter = FlopCounterMode(display=False)
    with counter:
        step(batch)
    return float(counter.get_total_flops())


def sequence_lengths(sequence_ids: np.ndarray) -> List[List[int]]:
    """Per row of (rows, S) ``sequence_ids``: the lengths of its sequences, in slot order."""
    return [[int(n) for n in np.bincount(row[row > 0])[1:] if n > 0] for row in np.asarray(sequence_ids)]


def flops_per_sequence(layout: Layout, model: Dict[str, int], attention: str) -> float:
    """Forward FLOPs per real sequence of ``layout`` by the FLOP model behind ``flop_model_ratio`` (training is
    ~3x forward for every term, so forward counts give the ratios). Per row of S tokens, with H hidden, FF
    intermediate, L layers, V vocabulary, M MLM slots and sequence lengths l_i:

        linear    L * S * 2 * (4 H^2 + 2 H FF)     every token, padding included (shapes are static)
        attention L * 4 H * S^2   (dense, sdpa)     QK^T and PV over all S x S pairs
                  L * 4 H * sum l_i^2   (varlen)    only pairs within a sequence
        heads     M * 2 * (H^2 + H V)               MLM transform and decoder per slot

    Softmax, LayerNorm, GELU, embeddings, the optimizer step and varlen's gathers are left out: a lower bound on
    overhead."""
    H, FF, L, V = (int(model[k]) for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size"))
    ids = layout.arrays["sequence_ids"]
    rows, S = ids.shape
    M = layout.arrays["mlm_positions"].shape[1]
    linear = rows * L * S * 2.0 * (4 * H * H + 2 * H * FF)
    pairs = (float(sum(n * n for lengths in sequence_lengths(ids) for n in lengths)) if attention == "varlen"
             else rows * float(S) * S)
    heads = rows * M * 2.0 * (H * H + H * V)
    return (linear + L * 4.0 * H * pairs + heads) / layout.sequences


def run_bench(
    histogram: np.ndarray,
    S: int,
    K: int,
    model_preset: str = "tiny",
    micro_batch_size: int = 8,
    repeats: int = 3,
    algorithm: Optional[str] = None,
    attentions: Sequence[Optional[str]] = (None,),
    seed: int = 0,
    timed_packs: Optional[int] = 128,
    task: str = "pretraining",
    order: str = "calls",
    device: str = "cpu",
    precision: str = "fp32",
    log=lambda message: None,
) -> Dict[str, Any]:
    """The bench; ``attentions``: each one's model times both layouts (None: the default); every (attention,
    layout) pair is a contender of the same interleaved repeats. A dict (JSON-ready): the first attention's
    figures at the top (``overhead``: seconds per packed row / per padded row - 1, the same shape;
    ``cpu_overhead`` the same of this process's CPU seconds; ``flops_overhead`` of matmul FLOPs, None before torch
    2.1), ``attentions`` every pair's sequences_per_second, ``ratio`` to the first pair's (the first attention,
    padded), ``flop_model_ratio`` (the FLOP model's prediction of it; None for question answering),
    ``seconds_per_row`` of each repeat, ``cpu_seconds_per_row`` and ``matmul_flops_per_row``."""
    import torch

    model_kwargs = dict(MODEL_PRESETS[model_preset])
    model_kwargs.update(max_position_embeddings=max(512, S), attention_probs_dropout_prob=0.0)
    plan = plan_histogram(histogram, S, K, algorithm)
    padded, packed = timed_layouts(plan, S, K, timed_packs, model_kwargs["vocab_size"], seed)
    if task not in ("pretraining", "question_answering"):
        raise BenchError("--task %s: the synthetic bench times pretraining or question_answering" % (task,))
    qa = task == "question_answering"  # the QA head and fine-tuning's optimizer; else MLM/NSP and LAMB
    if qa:
        padded, packed = (question_answering_layout(layout, seed) for layout in (padded, packed))
    if min(padded.rows, packed.rows) < micro_batch_size:
        raise BenchError("--micro-batch-size %d is more than the %d timed packs" % (micro_batch_size, packed.rows))
    log(
        "plan: %d sequences -> %d packs (K=%d, %s, %.1f s): theoretical speed-up %.4f; timing %d packs = %d sequences "
        "(%d real tokens) at S=%d: theoretical speed-up %.4f"
        % (plan.num_sequences, plan.num_packs, K, plan.algorithm, plan.seconds, plan.theoretical_speedup, packed.rows,
           padded.sequences, padded.tokens, S, padded.rows / float(packed.rows))
    )
    # one model per attention, the same seed: the same initial weights; every (layout, attention) pair a contender
    built = [synthetic_runner(model_kwargs, S, qa, attention, micro_batch_size, seed, device, precision)
             for attention in attentions]
    layouts = (padded, packed)
    contenders = [layout_contender(layout, "%s %s" % (layout.name, model.attention_implementation), runner,
                                   micro_batch_size, torch) for model, runner in built for layout in layouts]
    flops = [matmul_flops(c.call, c.batches[0]) for c in contenders]  # noise-free, one step of each pair
    # the harness: a warm-up step of each pair (allocator, kernels), the weights restored, then the repeats
    timings = measure(contenders, repeats, order, restorer([model for model, _ in built]), torch=torch,
                      cuda=device == "cuda", log=log)
    names = [str(model.attention_implementation) for model, _ in built]
    pairs = pair_figures(timings, names, layouts, flops, micro_batch_size, None if qa else model_kwargs)
    rates = [pair["sequences_per_second"] for pair in pairs[:2]]
    per_row = [pair["seconds_per_row"] for pair in pairs[:2]]
    padded_flops, packed_flops = (pair["matmul_flops_per_row"] for pair in pairs[:2])
    tokens_per_sequence = padded.tokens / float(padded.sequences)
    return dict(
        padded_sequences_per_second=rates[0], packed_sequences_per_second=rates[1],
        padded_tokens_per_second=rates[0] * tokens_per_sequence,
        packed_tokens_per_second=rates[1] * tokens_per_sequence,
        speedup=rates[1] / rates[0], theoretical_speedup=padded.rows / float(packed.rows),
        overhead=statistics.median(per_row[1]) / statistics.median(per_row[0]) - 1.0,
        cpu_overhead=pairs[1]["cpu_seconds_per_row"] / pairs[0]["cpu_seconds_per_row"] - 1.0,
        flops_overhead=None if padded_flops is None else packed_flops / padded_flops - 1.0,
        plan_sequences=int(plan.num_sequences), plan_packs=int(plan.num_packs),
        plan_theoretical_speedup=plan.theoretical_speedup, num_sequences=padded.sequences, padded_rows=padded.rows,
        num_packs=packed.rows, num_tokens=padded.tokens, max_seq_length=S, max_sequences_per_pack=K,
        packing_algorithm=plan.algorithm, packing_efficiency=packed.tokens / float(packed.rows * S),
        packing_plan_seconds=float(plan.seconds), padded_seconds_per_row=per_row[0], packed_seconds_per_row=per_row[1],
        micro_batch_size=micro_batch_size, repeats=repeats, order=order, model=dict(model_kwargs, preset=model_preset),
        task=task, attention=pairs[0]["attention"], torch_threads=torch.get_num_threads(), attentions=pairs,
        device=device, precision=precision, plot=None)


def pair_figures(timings, attentions: Sequence[str], layouts: Sequence[Layout], flops: Sequence[Optional[float]],
                 batch_size: int, model: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Every (attention, layout) pair's figures, in the contenders' order (padded, packed of each attention): its
    seconds a row of each repeat, sequences/s over their median, median CPU seconds and matmul FLOPs a row, and
    its ``ratio`` to the first pair's sequences/s beside the FLOP model's (``model``: the BERT sizes; None, for
    question answering: no FLOP model)."""
    pairs = []
    for i, (contender, seconds) in enumerate(zip(timings.contenders, timings.seconds)):
        attention, layout = attentions[i // 2], layouts[i % 2]
        per_row = [s / (len(contender.batches) * batch_size) for s in seconds]
        pairs.append(dict(attention=attention, layout=layout.name, seconds_per_row=per_row,
                          sequences_per_second=layout.sequences / float(layout.rows) / statistics.median(per_row),
                          cpu_seconds_per_row=statistics.median(timings.cpu[i]) / batch_size,
                          matmul_flops_per_row=None if flops[i] is None else flops[i] / batch_size,
                          flops_per_sequence=None if model is None else flops_per_sequence(layout, model, attention)))
    first = pairs[0]  # the first attention's padded layout
    for pair in pairs:
        pair["ratio"] = pair["sequences_per_second"] / first["sequences_per_second"]
        pair["flop_model_ratio"] = None if model is None else first["flops_per_sequence"] / pair["flops_per_sequence"]
    return pairs


# -- report: the table and the plot (two_panels and draw_bars draw --config's too) ----------------------------


@contextlib.contextmanager
def two_panels(path: str) -> Iterator[Tuple[Any, Any, Any]]:
    """(figure, left axes, right axes) of a bench's plot, written to ``path`` (PNG, atomically) on exit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    try:
        yield fig, left, right
        fig.tight_layout()
        with atomic_open(path, "wb") as f:
            fig.savefig(f, format="png", dpi=100)
    finally:
        plt.close(fig)


def draw_plot(r: Dict[str, Any], histogram: np.ndarray, path: str) -> str:
    with two_panels(path) as (_, left, right):
        draw_bars(left, r["padded_sequences_per_second"], r["packed_sequences_per_second"], r["theoretical_speedup"],
                  "S=%(max_seq_length)d: speed-up %(speedup).2fx measured, %(theoretical_speedup).2fx theoretical, "
                  "overhead %(percent).1f%%" % dict(r, percent=100 * r["overhead"]))
        right.bar(np.arange(1, len(histogram) + 1), histogram / max(histogram.sum(), 1), width=1.0, color="#1f77b4")
        right.set_xlabel("sequence length (tokens)")
        right.set_ylabel("fraction of sequences")
        right.set_yscale("log")
        right.set_title("%(plan_sequences)d sequences -> %(plan_packs)d packs (%(plan_theoretical_speedup).3fx); "
                        "timed: %(padded_rows)d rows vs %(num_packs)d packs" % r, fontsize=9)
    return path


def draw_bars(axes, padded: float, packed: float, theoretical: float, title: str) -> None:
    """Sequences/s of the padded and packed layouts, and the padded one's times the theoretical speed-up."""
    values = [padded, packed, padded * theoretical]
    bars = axes.bar(["padded", "packed", "padded x theoretical"], values, color=["#999999", "#1f77b4", "#c6dbef"])
    for bar, value in zip(bars, values):
        axes.text(bar.get_x() + bar.get_width() / 2, value, "%.1f" % value, ha="center", va="bottom")
    axes.set_ylabel("sequences / s (training steps)")
    axes.set_title(title, fontsize=9)


def format_result(r: Dict[str, Any]) -> str:
    pairs, percent = r["attentions"], {k: 100 * r[k] for k in ("overhead", "cpu_overhead", "packing_efficiency")}
    flops = "" if r["flops_overhead"] is None else "; matmul FLOPs %+.2f%% (%.4g against %.4g a row%s)" % (
        100 * r["flops_overhead"], pairs[1]["matmul_flops_per_row"], pairs[0]["matmul_flops_per_row"],
        "" if r["attention"] == "dense" else "; torch counts no SDPA kernel on CPU: --attention dense counts "
        "attention too")
    lines = [
        "%(task)s model %(preset)s (hidden %(hidden_size)d, %(num_hidden_layers)d layers, vocab %(vocab_size)d), "
        % dict(r, **r["model"]) + "attention %(attention)s, %(precision)s on %(device)s, micro batch "
        "%(micro_batch_size)d, %(torch_threads)d torch threads, %(repeats)d repeats (%(words)s)"
        % dict(r, words=ORDERS[r["order"]]),
        "plan: %(plan_sequences)d sequences -> %(plan_packs)d packs (K=%(max_sequences_per_pack)d, "
        "%(packing_algorithm)s): theoretical speed-up %(plan_theoretical_speedup).3fx" % r,
        "timed: %(num_sequences)d sequences (%(num_tokens)d real tokens), S=%(max_seq_length)d; %(padded_rows)d "
        "padded rows vs %(num_packs)d packs (efficiency %(packing_efficiency).2f%%)" % dict(r, **percent),
        "padded: %(padded_sequences_per_second)10.2f sequences/s %(padded_tokens_per_second)12.1f tokens/s" % r,
        "packed: %(packed_sequences_per_second)10.2f sequences/s %(packed_tokens_per_second)12.1f tokens/s" % r,
        "measured speed-up:    %(speedup).3fx" % r,
        "theoretical speed-up: %(theoretical_speedup).3fx (padded rows / packs)" % r,
        "packing overhead:     %(overhead).2f%% (time per pack / time per padded row - 1); CPU time "
        "%(cpu_overhead)+.2f%%" % percent + flops,
    ]
    if len(pairs) > 2:
        lines += ["attention comparison: each pair's sequences/s over padded %s's, measured and by the FLOP model"
                  % pairs[0]["attention"],
                  "%-9s %-7s %12s %11s %11s" % ("attention", "layout", "sequences/s", "measured", "FLOP model")]
        lines += ["%-9s %-7s %12.2f %10.3fx %11s" % (
            a["attention"], a["layout"], a["sequences_per_second"], a["ratio"],
            "-" if a["flop_model_ratio"] is None else "%.3fx" % a["flop_model_ratio"]) for a in pairs]
    return "\n".join(lines + (["plot: %s" % r["plot"]] if r["plot"] else []))
