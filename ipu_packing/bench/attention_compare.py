"""Packed + varlen attention against padded + dense and packed + dense: measured and FLOP-model ratios.

Used by ``python -m ipu_packing.bench --attention varlen``: the same timed sequences (the bench's padded
and packed layouts) run through two models holding the same weights, one with dense attention and one with
varlen, all four (layout, attention) pairs interleaved in every repeat so that a shared machine slows them
alike. Each ratio is of sequences per second, printed beside the FLOP model's prediction.

FLOP model (training FLOPs are ~3x forward for every term, so forward counts give the ratios). Per row of
S tokens, with H hidden, FF intermediate, L layers, V vocabulary, M MLM slots and sequence lengths l_i:

    linear    L * S * 2 * (4 H^2 + 2 H FF)     every token, padding included (shapes are static)
    attention L * 4 H * S^2   (dense)           QK^T and PV over all S x S pairs
              L * 4 H * sum l_i^2   (varlen)    only pairs within a sequence
    heads     M * 2 * (H^2 + H V)               MLM transform and decoder per slot

Predicted ratio A / B = (FLOPs per sequence of B) / (FLOPs per sequence of A). It leaves out softmax,
LayerNorm, GELU, embeddings and the optimizer step, and the varlen gathers: a lower bound on overhead.
"""

from __future__ import annotations

import statistics
from typing import Dict

import numpy as np

from .presets import MODEL_PRESETS
from .harness import measure, restorer
from .throughput import layout_contender, plan_histogram, synthetic_runner, timed_layouts

PAIRS = (("padded", "dense"), ("packed", "dense"), ("padded", "varlen"), ("packed", "varlen"))
RATIOS = (
    # (name, numerator pair, denominator pair)
    ("packed+varlen / padded+dense", ("packed", "varlen"), ("padded", "dense")),
    ("packed+varlen / packed+dense", ("packed", "varlen"), ("packed", "dense")),
    ("padded+varlen / padded+dense", ("padded", "varlen"), ("padded", "dense")),
    ("packed+dense / padded+dense", ("packed", "dense"), ("padded", "dense")),
)


def sequence_lengths(sequence_ids: np.ndarray) -> list:
    """Per row of (rows, S) ``sequence_ids``: the lengths of its sequences."""
    rows = []
    for row in np.asarray(sequence_ids):
        counts = np.bincount(row[row > 0])
        rows.append([int(n) for n in counts[1:] if n > 0])
    return rows


def flops_per_sequence(layout, model: Dict[str, int], attention: str) -> float:
    """Forward FLOPs of the FLOP model (module docstring), per real sequence of ``layout``."""
    H, FF, L, V = (int(model[k]) for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size"))
    ids = layout.arrays["sequence_ids"]
    rows, S = ids.shape
    M = layout.arrays["mlm_positions"].shape[1]
    linear = rows * L * S * 2.0 * (4 * H * H + 2 * H * FF)
    if attention == "dense":
        pairs = rows * float(S) * S
    else:
        pairs = float(sum(n * n for lengths in sequence_lengths(ids) for n in lengths))
    heads = rows * M * 2.0 * (H * H + H * V)
    return (linear + L * 4.0 * H * pairs + heads) / layout.sequences


def compare_attention(padded, packed, model_kwargs: Dict[str, object], micro_batch_size: int, repeats: int,
                      seed: int, order: str = "calls") -> Dict[str, object]:
    """Seconds per sequence of the four (layout, attention) pairs, their ratios and the FLOP model's.

    One model per attention, from the same initial weights, each stepping through the training runner
    (``make_runner``) as the bench's main comparison does; the four pairs are the harness's contenders."""
    import torch

    layouts = {"padded": padded, "packed": packed}
    models, runners = {}, {}
    for attention in ("dense", "varlen"):  # the same seed: the same initial weights
        models[attention], runners[attention] = synthetic_runner(model_kwargs, padded.arrays["input_ids"].shape[1],
                                                                 False, attention, micro_batch_size, seed)
    models["varlen"].load_state_dict(models["dense"].state_dict())
    contenders = [layout_contender(layouts[name], "%s+%s" % (name, a), runners[a], micro_batch_size, torch)
                  for name, a in PAIRS]
    timings = measure(contenders, repeats, order, restorer(models.values()))
    per_row = {c.name: [s / (len(c.batches) * micro_batch_size) for s in seconds]
               for c, seconds in zip(contenders, timings.seconds)}
    per_sequence = {}
    for layout_name, attention in PAIRS:
        layout = layouts[layout_name]
        key = "%s+%s" % (layout_name, attention)
        per_sequence[key] = statistics.median(per_row[key]) * layout.rows / float(layout.sequences)
    flops = {"%s+%s" % (name, a): flops_per_sequence(layouts[name], model_kwargs, a) for name, a in PAIRS}
    ratios = []
    for name, top, bottom in RATIOS:
        top_key, bottom_key = "%s+%s" % top, "%s+%s" % bottom
        ratios.append(dict(
            name=name,
            measured=per_sequence[bottom_key] / per_sequence[top_key],
            flop_model=flops[bottom_key] / flops[top_key],
        ))
    return dict(
        seconds_per_sequence=per_sequence,
        seconds_per_row=per_row,
        flops_per_sequence=flops,
        speedups=ratios,
        theoretical_packing_speedup=padded.rows / float(packed.rows),
    )


def run_comparison(histogram: np.ndarray, S: int, K: int, model_preset: str, micro_batch_size: int, repeats: int,
                   algorithm, seed: int, timed_packs, order: str = "calls") -> Dict[str, object]:
    """The bench's plan and timed layouts (the same sequences as its main result), then ``compare_attention``."""
    model_kwargs = dict(MODEL_PRESETS[model_preset])
    model_kwargs.update(max_position_embeddings=max(512, S), attention_probs_dropout_prob=0.0)
    plan = plan_histogram(histogram, S, K, algorithm)
    padded, packed = timed_layouts(plan, S, K, timed_packs, model_kwargs["vocab_size"], seed)
    return compare_attention(padded, packed, model_kwargs, micro_batch_size, repeats, seed, order)


def format_comparison(comparison: Dict[str, object]) -> str:
    lines = ["attention comparison (speed-up = sequences/s ratio; theoretical packing speed-up %.4f):"
             % comparison["theoretical_packing_speedup"],
             "  %-30s %9s %11s" % ("", "measured", "FLOP model")]
    for row in comparison["speedups"]:
        lines.append("  %-30s %8.3fx %10.3fx" % (row["name"], row["measured"], row["flop_model"]))
    return "\n".join(lines)
