"""Non-negative least-squares histogram packing (NNLSHP), Krell et al. (arXiv 2107.02027).

1. Enumerate every *exact-fit* strategy: a multiset of at most d lengths summing exactly to
   the maximum length S.
2. Solve ``min ||W (A x - h)||`` over x >= 0 with scipy's NNLS, where column j of A counts
   the lengths of strategy j and h is the histogram. W down-weights the eight shortest
   lengths (0.09), as in the paper, so the fit spends its accuracy on long sequences.
3. Round x to the nearest integer.
4. Every sequence the rounded x leaves uncovered gets a pack of its own (the paper pairs it
   with a phantom partner of length S - l; the pack count is the same), and every slot the
   rounded x over-covers becomes padding (the sequence is removed from one such pack).

The enumeration grows like S^(d-1) / (d-1)!^2, so d is min(K, D) where D is the largest depth
whose strategy count stays within ``MAX_STRATEGIES`` (22,102 strategies for S=512, K=3, the
paper's setting; deeper searches are neither tractable for NNLS nor used in the paper).
Lengths absent from the histogram are left out of the enumeration only when the dense
enumeration would exceed the cap, so the paper's setting is reproduced exactly.
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

MAX_STRATEGIES = 25000
SHORT_LENGTHS = 8  # the paper's penalisation cut-off
SHORT_WEIGHT = 0.09


class _TooMany(Exception):
    pass


def _exact_fits(lengths: List[int], size: int, depth: int, cap: int) -> List[Tuple[int, ...]]:
    """All multisets of at most `depth` values from ascending `lengths` summing to `size`."""
    out = []  # type: List[Tuple[int, ...]]
    present = set(lengths)

    def extend(prefix: Tuple[int, ...], start: int, rest: int, left: int) -> None:
        # prefix is non-decreasing; the next value is >= lengths[start] and completes or recurses
        if left == 1:
            if rest in present and rest >= (prefix[-1] if prefix else 0):
                out.append(prefix + (rest,))
                if len(out) > cap:
                    raise _TooMany
            return
        if rest in present and rest >= (prefix[-1] if prefix else 0):
            out.append(prefix + (rest,))
            if len(out) > cap:
                raise _TooMany
        for i in range(start, len(lengths)):
            value = lengths[i]
            # the remaining left-1 values are each >= value
            if value * 2 > rest:
                break
            extend(prefix + (value,), i, rest - value, left - 1)

    extend((), 0, size, depth)
    return out


def exact_fit_strategies(histogram: np.ndarray, size: int, limit: int, cap: int = MAX_STRATEGIES):
    """Exact-fit strategies for NNLSHP and the depth used (see module doc).

    Depths are tried in increasing order over all lengths 1..S; once that enumeration passes
    the cap, only lengths present in the histogram are used; the deepest enumeration within
    the cap wins.
    """
    dense = list(range(1, size + 1))
    sparse = [int(i) + 1 for i in np.flatnonzero(histogram)]
    lengths = dense
    chosen = ([], 0)  # type: Tuple[List[Tuple[int, ...]], int]
    depth = 1
    while depth <= min(limit, size):
        try:
            chosen = (_exact_fits(lengths, size, depth, cap), depth)
        except _TooMany:
            if lengths is dense:
                lengths = sparse
                continue
            break
        depth += 1
    return chosen


def nnlshp(histogram: np.ndarray, max_seq_length: int, max_sequences_per_pack: int):
    """Returns (strategies, repeats) covering the histogram exactly (after padding removal)."""
    size = max_seq_length
    hist = np.asarray(histogram, dtype=np.int64)
    strategies, _ = exact_fit_strategies(hist, size, max_sequences_per_pack)
    counts = np.zeros(len(strategies), dtype=np.int64)
    if strategies:
        matrix = np.zeros((size, len(strategies)))  # (S, J) sequences of each length per strategy
        for j, strategy in enumerate(strategies):
            for length in strategy:
                matrix[length - 1, j] += 1
        weight = np.ones(size)  # (S,)
        weight[:SHORT_LENGTHS] = SHORT_WEIGHT
        from scipy.optimize import nnls  # lazy: ~0.5 s of imports that other algorithms do not pay

        x, _ = nnls(weight[:, None] * matrix, weight * hist.astype(np.float64))
        counts = np.rint(x).astype(np.int64)
    out_strategies = [list(s) for s, c in zip(strategies, counts) if c > 0]
    out_repeats = [int(c) for c in counts if c > 0]
    # Left-over sequences each get a pack of their own.
    covered = np.zeros(size, dtype=np.int64)
    for strategy, count in zip(out_strategies, out_repeats):
        for length in strategy:
            covered[length - 1] += count
    left = hist - covered
    for length in np.flatnonzero(left > 0) + 1:
        out_strategies.append([int(length)])
        out_repeats.append(int(left[length - 1]))
    # Over-covered slots become padding: plan.py's remove_surplus drops those sequences.
    return out_strategies, out_repeats
