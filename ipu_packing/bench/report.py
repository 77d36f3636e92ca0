"""What the synthetic mode reports (throughput.py): its result, as a table and a plot (the two panels and the
throughput bars --config's plot draws too)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ..fsutil import atomic_open
from .harness import ORDERS


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
    """Seconds per packed row / seconds per padded row - 1 (the same shape, the first attention's), wall time."""
    cpu_overhead: float
    """The same ratio of this process's CPU seconds (a call's time descheduled by other processes left out)."""
    flops_overhead: Optional[float]
    """The same ratio of matmul FLOPs (torch's FlopCounterMode, one step of each; None before torch 2.1). The
    counter has no formula for some SDPA kernels (CPU's among them: they count 0), so under sdpa or varlen
    attention on CPU it counts the linear layers and heads only; dense attention's matmuls are counted."""
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
    task: str = "pretraining"
    """The model timed: pretraining (MLM and NSP heads, LAMB) or question_answering (the QA head, AdamW)."""
    plot: Optional[str] = None
    order: str = "calls"
    """The order of each repeat's calls (harness.ORDERS)."""
    attentions: List[Dict[str, Any]] = field(default_factory=list)
    """Every (attention, layout) pair's sequences_per_second, its ``ratio`` to the first pair's (the first
    attention, padded), ``flops_per_sequence`` and ``flop_model_ratio`` (the FLOP model's prediction of that
    ratio; None for question answering), ``seconds_per_row`` of each repeat, ``cpu_seconds_per_row`` (median)
    and ``matmul_flops_per_row``."""
    device: str = "cpu"
    precision: str = "fp32"


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


def draw_plot(result: Result, histogram: np.ndarray, path: str) -> str:
    with two_panels(path) as (_, left, right):
        draw_bars(left, result.padded_sequences_per_second, result.packed_sequences_per_second,
                  result.theoretical_speedup, "S=%d: speed-up %.2fx measured, %.2fx theoretical, overhead %.1f%%"
                  % (result.max_seq_length, result.speedup, result.theoretical_speedup, 100 * result.overhead))
        right.bar(np.arange(1, len(histogram) + 1), histogram / max(histogram.sum(), 1), width=1.0, color="#1f77b4")
        right.set_xlabel("sequence length (tokens)")
        right.set_ylabel("fraction of sequences")
        right.set_yscale("log")
        right.set_title(
            "%d sequences -> %d packs (%.3fx); timed: %d rows vs %d packs"
            % (result.plan_sequences, result.plan_packs, result.plan_theoretical_speedup, result.padded_rows,
               result.num_packs),
            fontsize=9,
        )
    return path


def draw_bars(axes, padded: float, packed: float, theoretical: float, title: str) -> None:
    """Sequences/s of the padded and packed layouts, and the padded one's times the theoretical speed-up."""
    values = [padded, packed, padded * theoretical]
    bars = axes.bar(["padded", "packed", "padded x theoretical"], values, color=["#999999", "#1f77b4", "#c6dbef"])
    for bar, value in zip(bars, values):
        axes.text(bar.get_x() + bar.get_width() / 2, value, "%.1f" % value, ha="center", va="bottom")
    axes.set_ylabel("sequences / s (training steps)")
    axes.set_title(title, fontsize=9)


def format_result(r: Result) -> str:
    return "\n".join(
        [
            "%s model %s (hidden %d, %d layers, vocab %d), attention %s, %s on %s, micro batch %d, %d torch threads, "
            "%d repeats (%s)" % (r.task, r.model["preset"], r.model["hidden_size"], r.model["num_hidden_layers"],
                                 r.model["vocab_size"], r.attention, r.precision, r.device, r.micro_batch_size,
                                 r.torch_threads, r.repeats, ORDERS[r.order]),
            "plan: %d sequences -> %d packs (K=%d, %s): theoretical speed-up %.3fx"
            % (r.plan_sequences, r.plan_packs, r.max_sequences_per_pack, r.packing_algorithm,
               r.plan_theoretical_speedup),
            "timed: %d sequences (%d real tokens), S=%d; %d padded rows vs %d packs (efficiency %.2f%%)"
            % (r.num_sequences, r.num_tokens, r.max_seq_length, r.padded_rows, r.num_packs, 100 * r.packing_efficiency),
            "padded: %10.2f sequences/s %12.1f tokens/s" % (r.padded_sequences_per_second, r.padded_tokens_per_second),
            "packed: %10.2f sequences/s %12.1f tokens/s" % (r.packed_sequences_per_second, r.packed_tokens_per_second),
            "measured speed-up:    %.3fx" % r.speedup,
            "theoretical speed-up: %.3fx (padded rows / packs)" % r.theoretical_speedup,
            "packing overhead:     %.2f%% (time per pack / time per padded row - 1); CPU time %+.2f%%%s"
            % (100 * r.overhead, 100 * r.cpu_overhead, "" if r.flops_overhead is None else
               "; matmul FLOPs %+.2f%% (%.4g against %.4g a row%s)" % (
                   100 * r.flops_overhead, r.attentions[1]["matmul_flops_per_row"],
                   r.attentions[0]["matmul_flops_per_row"], "" if r.attention == "dense" else
                   "; torch counts no SDPA kernel on CPU: --attention dense counts attention too")),
        ]
        + (["attention comparison: each pair's sequences/s over padded %s's, measured and by the FLOP model"
            % r.attentions[0]["attention"],
            "%-9s %-7s %12s %11s %11s" % ("attention", "layout", "sequences/s", "measured", "FLOP model")]
           + ["%-9s %-7s %12.2f %10.3fx %11s" % (
               a["attention"], a["layout"], a["sequences_per_second"], a["ratio"],
               "-" if a["flop_model_ratio"] is None else "%.3fx" % a["flop_model_ratio"]) for a in r.attentions]
           if len(r.attentions) > 2 else [])
        + (["plot: %s" % r.plot] if r.plot else [])
    )
