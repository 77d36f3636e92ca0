"""What the synthetic mode reports (throughput.py's result, a dict: docs/app.md names its keys), as a table and a
plot (the two panels and the throughput bars --config's plot draws too)."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, Iterator, Tuple

import numpy as np

from ..fsutil import atomic_open
from .harness import ORDERS


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
        "%(cpu_overhead)+.2f%%" % percent + ("" if r["flops_overhead"] is None else
                                              "; matmul FLOPs %+.2f%% (%.4g against %.4g a row%s)" % (
            100 * r["flops_overhead"], pairs[1]["matmul_flops_per_row"], pairs[0]["matmul_flops_per_row"],
            "" if r["attention"] == "dense" else "; torch counts no SDPA kernel on CPU: --attention dense counts "
            "attention too")),
    ]
    if len(pairs) > 2:
        lines += ["attention comparison: each pair's sequences/s over padded %s's, measured and by the FLOP model"
                  % pairs[0]["attention"],
                  "%-9s %-7s %12s %11s %11s" % ("attention", "layout", "sequences/s", "measured", "FLOP model")]
        lines += ["%-9s %-7s %12.2f %10.3fx %11s" % (
            a["attention"], a["layout"], a["sequences_per_second"], a["ratio"],
            "-" if a["flop_model_ratio"] is None else "%.3fx" % a["flop_model_ratio"]) for a in pairs]
    return "\n".join(lines + (["plot: %s" % r["plot"]] if r["plot"] else []))
