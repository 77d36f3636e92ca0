"""Packing plans: which combinations of lengths share one pack, and how many packs of each.

``plan_packing`` validates its input, runs one algorithm on the histogram and returns a
``PackingPlan`` that covers the histogram *exactly*: every sequence is placed once, no pack
is longer than ``max_seq_length`` and none holds more than ``max_sequences_per_pack``
sequences. The algorithms (see their modules):

- ``spfhp``: shortest-pack-first histogram packing (heuristics.py).
- ``lpfhp``: longest-pack-first, best fit, distributing copies (heuristics.py).
- ``nnlshp``: non-negative least squares over exact-fit strategies (nnlshp.py).
- ``optimal`` (default): cutting-stock LP by column generation, rounded and repaired, with
  an LP lower bound as certificate (optimal.py). It also runs spfhp and lpfhp (and nnlshp
  when its NNLS is small: S x strategies <= ``NNLSHP_IN_OPTIMAL``) and
  keeps the plan with the fewest packs, so it is never worse than those.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import heuristics, nnlshp as _nnlshp, optimal as _optimal

ALGORITHMS = ("spfhp", "lpfhp", "nnlshp", "optimal")
# optimal also runs nnlshp when S x (its number of strategies) is at most this (~2 s of NNLS;
# the Wikipedia histogram at K >= 3 needs 512 x 22,102 = 11.3M, ~20 s)
NNLSHP_IN_OPTIMAL = 1500000


@dataclass(frozen=True)
class PackingPlan:
    """Which combinations of lengths share one pack, and how many packs of each.

    strategies[j] is a tuple of sequence lengths (descending) that fill one pack;
    repeats[j] is how many packs use that strategy. Strategies are distinct and ordered by
    repeats, most frequent first. Together they hold exactly the histogram's sequences.
    """

    algorithm: str
    max_seq_length: int
    max_sequences_per_pack: Optional[int]  # None: unbounded
    histogram: np.ndarray  # (S,) int64, bin i counts sequences of length i + 1
    strategies: Tuple[Tuple[int, ...], ...]
    repeats: np.ndarray  # (P,) int64
    lower_bound_packs: Optional[float] = None  # LP bound on packs of any packing, where computed
    seconds: float = 0.0

    @property
    def num_sequences(self) -> int:
        return int(self.histogram.sum())

    @property
    def num_packs(self) -> int:
        return int(self.repeats.sum())

    @property
    def num_tokens(self) -> int:
        lengths = np.arange(1, len(self.histogram) + 1, dtype=np.int64)
        return int((self.histogram * lengths).sum())

    @property
    def efficiency(self) -> float:
        """Real tokens / (packs * max_seq_length)."""
        return self.num_tokens / float(self.num_packs * self.max_seq_length)

    @property
    def theoretical_speedup(self) -> float:
        """Padded rows (one per sequence) / packs, i.e. sequences per pack (the paper's packing factor)."""
        return self.num_sequences / float(self.num_packs)

    @property
    def lower_bound_integer(self) -> Optional[int]:
        """ceil(lower_bound_packs): no packing of this histogram has fewer packs."""
        if self.lower_bound_packs is None:
            return None
        return int(math.ceil(self.lower_bound_packs - 1e-9))

    @property
    def packs_above_bound(self) -> Optional[int]:
        """num_packs - lower_bound_integer; 0 proves the plan optimal."""
        bound = self.lower_bound_integer
        return None if bound is None else self.num_packs - bound

    @property
    def efficiency_bound(self) -> Optional[float]:
        """Best efficiency any packing could reach (from the lower bound)."""
        bound = self.lower_bound_integer
        if bound is None:
            return None
        return self.num_tokens / float(bound * self.max_seq_length)

    def placed_histogram(self) -> np.ndarray:
        """(S,) int64 sequences of each length the strategies hold (equals histogram)."""
        out = np.zeros(self.max_seq_length, dtype=np.int64)
        for strategy, count in zip(self.strategies, self.repeats):
            for length in strategy:
                out[length - 1] += count
        return out

    def validate(self) -> None:
        """Raises ValueError unless the plan holds exactly its histogram within its limits."""
        size = self.max_seq_length
        limit = self.max_sequences_per_pack or size
        if len(self.strategies) != len(self.repeats):
            raise ValueError("strategies and repeats differ in length")
        for strategy, count in zip(self.strategies, self.repeats):
            if count < 1 or not 1 <= len(strategy) <= limit or sum(strategy) > size or min(strategy) < 1:
                raise ValueError("invalid strategy %r x %d" % (strategy, count))
        if not np.array_equal(self.placed_histogram(), self.histogram):
            raise ValueError("the strategies do not hold exactly the histogram's sequences")

    def to_dict(self, top_strategies: int = 0) -> dict:
        """JSON-ready summary (the CLI's --json keys)."""
        out = {
            "algorithm": self.algorithm,
            "max_seq_length": self.max_seq_length,
            "max_sequences_per_pack": self.max_sequences_per_pack,
            "num_sequences": self.num_sequences,
            "num_tokens": self.num_tokens,
            "num_packs": self.num_packs,
            "num_strategies": len(self.strategies),
            "efficiency": self.efficiency,
            "theoretical_speedup": self.theoretical_speedup,
            "lower_bound_packs": self.lower_bound_packs,
            "lower_bound_integer": self.lower_bound_integer,
            "packs_above_bound": self.packs_above_bound,
            "seconds": self.seconds,
        }
        if top_strategies:
            out["strategies"] = [
                {"lengths": list(s), "repeats": int(r)}
                for s, r in zip(self.strategies[:top_strategies], self.repeats[:top_strategies])
            ]
        return out


def _validate(histogram, max_seq_length, max_sequences_per_pack, algorithm) -> np.ndarray:
    """Checks the input and returns the histogram as (S,) int64."""
    if algorithm not in ALGORITHMS:
        raise ValueError("unknown packing algorithm %r (choose from %s)" % (algorithm, ", ".join(ALGORITHMS)))
    if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, numbers.Integral):
        raise ValueError("max_seq_length must be an integer, got %r" % (max_seq_length,))
    if max_seq_length < 1:
        raise ValueError("max_seq_length must be >= 1, got %d" % max_seq_length)
    if max_sequences_per_pack is not None:
        if isinstance(max_sequences_per_pack, bool) or not isinstance(max_sequences_per_pack, numbers.Integral):
            raise ValueError("max_sequences_per_pack must be an integer >= 1 or None, got %r" % (max_sequences_per_pack,))
        if max_sequences_per_pack < 1:
            raise ValueError("max_sequences_per_pack must be >= 1, got %d" % max_sequences_per_pack)
    try:
        raw = np.asarray(histogram)
    except (TypeError, ValueError) as exc:
        raise ValueError("histogram is not an array of counts: %s" % exc)
    if raw.ndim != 1:
        raise ValueError("histogram must be one-dimensional, got shape %s" % (raw.shape,))
    if raw.size == 0:
        raise ValueError("histogram is empty")
    if raw.dtype == bool or not (np.issubdtype(raw.dtype, np.integer) or np.issubdtype(raw.dtype, np.floating)):
        raise ValueError("histogram counts must be numbers, got dtype %s" % raw.dtype)
    if np.issubdtype(raw.dtype, np.floating):
        if not np.isfinite(raw).all() or (raw != np.round(raw)).any():
            raise ValueError("histogram counts must be whole numbers")
        if raw.max() >= 2.0**62:
            raise ValueError("histogram counts are too large")
    hist = raw.astype(np.int64)
    if (hist < 0).any():
        first = int(np.flatnonzero(hist < 0)[0])
        raise ValueError("histogram has a negative count (%d at length %d)" % (hist[first], first + 1))
    if len(hist) > max_seq_length:
        raise ValueError(
            "histogram has %d bins but max_seq_length is %d (bin i counts length i + 1)"
            % (len(hist), max_seq_length)
        )
    if hist.sum() == 0:
        raise ValueError("histogram has no sequences (all counts are zero)")
    out = np.zeros(max_seq_length, dtype=np.int64)
    out[: len(hist)] = hist
    return out


def _normalise(strategies, repeats, hist: np.ndarray) -> Tuple[Tuple[Tuple[int, ...], ...], np.ndarray]:
    """Merge duplicate strategies and drop over-covered slots so the plan holds `hist` exactly.

    Dropping a sequence from a pack never adds a pack (a pack left empty disappears), so the
    pack count can only fall. Raises AssertionError if the strategies hold too few sequences.
    """
    counts = {}  # type: Dict[Tuple[int, ...], int]
    for strategy, count in zip(strategies, repeats):
        count = int(count)
        if count > 0 and len(strategy) > 0:
            key = tuple(sorted((int(v) for v in strategy), reverse=True))
            counts[key] = counts.get(key, 0) + count
    placed = np.zeros(len(hist), dtype=np.int64)
    for key, count in counts.items():
        for length in key:
            placed[length - 1] += count
    surplus = placed - hist
    if (surplus < 0).any():
        raise AssertionError("packing left sequences unplaced at lengths %s" % (np.flatnonzero(surplus < 0) + 1)[:10])
    for length in (np.flatnonzero(surplus > 0) + 1)[::-1]:
        extra = int(surplus[length - 1])
        while extra > 0:
            # each pass removes at most one copy of `length` from each pack
            for key in [k for k in counts if length in k]:
                take = min(counts[key], extra)
                counts[key] -= take
                if counts[key] == 0:
                    del counts[key]
                smaller = list(key)
                smaller.remove(length)
                if smaller:
                    counts[tuple(smaller)] = counts.get(tuple(smaller), 0) + take
                extra -= take
                if extra == 0:
                    break
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return tuple(k for k, _ in ordered), np.array([c for _, c in ordered], dtype=np.int64)


def _run(algorithm: str, hist: np.ndarray, size: int, limit: int, time_limit: float):
    """Returns (strategies, repeats, lower bound or None) for one algorithm."""
    if algorithm == "spfhp":
        return heuristics.spfhp(hist, size, limit) + (None,)
    if algorithm == "lpfhp":
        return heuristics.lpfhp(hist, size, limit) + (None,)
    if algorithm == "nnlshp":
        return _nnlshp.nnlshp(hist, size, limit) + (None,)
    # optimal: the best of the cheap algorithms, then the LP unless they are already optimal.
    candidates = [heuristics.spfhp(hist, size, limit), heuristics.lpfhp(hist, size, limit)]
    strategies, _ = _nnlshp.exact_fit_strategies(hist, size, limit)
    if size * len(strategies) <= NNLSHP_IN_OPTIMAL:
        candidates.append(_nnlshp.nnlshp(hist, size, limit))
    best = min((_normalise(s, r, hist) for s, r in candidates), key=lambda p: int(p[1].sum()))
    lp_strategies, lp_repeats, bound = _optimal.optimal(
        hist, size, limit, time_limit=time_limit, upper_bound=int(best[1].sum())
    )
    if lp_strategies is not None:
        lp = _normalise(lp_strategies, lp_repeats, hist)
        if int(lp[1].sum()) < int(best[1].sum()):
            best = lp
    return best[0], best[1], bound


def plan_packing(
    histogram: Sequence[int],
    max_seq_length: int,
    max_sequences_per_pack: Optional[int] = None,
    algorithm: str = "optimal",
    time_limit: float = 8.0,
) -> PackingPlan:
    """Plan packs for a histogram of sequence lengths.

    histogram: counts, bin i = sequences of length i + 1 (at most max_seq_length bins).
    max_sequences_per_pack: an int >= 1, or None for unbounded.
    algorithm: one of ALGORITHMS.
    time_limit: seconds of column generation for `optimal` (it stops early with a valid,
        possibly weaker, bound); the other algorithms ignore it.
    Raises ValueError on bad input.
    """
    start = time.perf_counter()
    hist = _validate(histogram, max_seq_length, max_sequences_per_pack, algorithm)
    size = int(max_seq_length)
    limit = size if max_sequences_per_pack is None else int(min(max_sequences_per_pack, size))
    strategies, repeats, bound = _run(algorithm, hist, size, limit, float(time_limit))
    strategies, repeats = _normalise(strategies, repeats, hist)
    return PackingPlan(
        algorithm=algorithm,
        max_seq_length=size,
        max_sequences_per_pack=None if max_sequences_per_pack is None else int(max_sequences_per_pack),
        histogram=hist,
        strategies=strategies,
        repeats=repeats,
        lower_bound_packs=None if bound is None else float(bound),
        seconds=time.perf_counter() - start,
    )
