"""Packing plans: which combinations of lengths share one pack, and how many packs of each.

``plan_packing`` validates its input, runs one algorithm on the histogram and returns a
``PackingPlan`` that covers the histogram *exactly*: every sequence is placed once, no pack
is longer than ``max_seq_length`` and none holds more than ``max_sequences_per_pack``
sequences. The algorithms (see their modules):

- ``spfhp``: shortest-pack-first histogram packing (heuristics.py).
- ``lpfhp``: longest-pack-first, best fit, distributing copies (heuristics.py).
- ``nnlshp``: non-negative least squares over exact-fit strategies (nnlshp.py).
- ``optimal`` (default): cutting-stock LP by column generation, rounded and repaired, with
  an LP lower bound as certificate (optimal.py). It also runs spfhp and lpfhp and keeps the
  plan with the fewest packs, so it is never worse than those. Every decision it makes is
  exact (optimal.py says how), so a histogram gives the same plan on every machine. nnlshp is
  not among its candidates: its NNLS is floating point through BLAS, and the plan it rounds
  from moves with the CPU's kernels.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import time
import warnings
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from ..errors import InputError
from . import heuristics, nnlshp as _nnlshp, optimal as _optimal

ALGORITHMS = ("spfhp", "lpfhp", "nnlshp", "optimal")
# Limits that keep every count exact. The LP works in float64, which holds integers exactly below
# 2**53; token totals are int64 products. S is bounded so that a typo is refused before the
# (S,)-sized arrays are allocated.
MAX_COUNT = 2**53
MAX_TOKENS = 2**62
MAX_SEQ_LENGTH = 1 << 20


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
    lp_rounds: Optional[int] = None  # optimal: rounds of column generation run
    stopped_by: Optional[str] = None  # optimal: why column generation stopped (optimal.STOP_REASONS)

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

    def sha256(self) -> str:
        """Hex sha256 of the plan itself: S, K and its (strategies, repeats) in their canonical order.
        The same histogram and settings give the same digest on every machine (docs/packing.md)."""
        canonical = {
            "max_seq_length": self.max_seq_length,
            "max_sequences_per_pack": self.max_sequences_per_pack,
            "strategies": [list(s) for s in self.strategies],
            "repeats": [int(r) for r in self.repeats],
        }
        return hashlib.sha256(json.dumps(canonical, separators=(",", ":")).encode()).hexdigest()

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
            "lp_rounds": self.lp_rounds,
            "stopped_by": self.stopped_by,
            "seconds": self.seconds,
            "plan_sha256": self.sha256(),
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
        raise InputError("unknown packing algorithm %r (choose from %s)" % (algorithm, ", ".join(ALGORITHMS)))
    if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, numbers.Integral):
        raise InputError("max_seq_length must be an integer, got %r" % (max_seq_length,))
    if max_seq_length < 1:
        raise InputError("max_seq_length must be >= 1, got %d" % max_seq_length)
    if max_seq_length > MAX_SEQ_LENGTH:
        raise InputError("max_seq_length must be at most %d, got %d" % (MAX_SEQ_LENGTH, max_seq_length))
    if max_sequences_per_pack is not None:
        if isinstance(max_sequences_per_pack, bool) or not isinstance(max_sequences_per_pack, numbers.Integral):
            raise InputError("max_sequences_per_pack must be an integer >= 1 or None, got %r"
                             % (max_sequences_per_pack,))
        if max_sequences_per_pack < 1:
            raise InputError("max_sequences_per_pack must be >= 1, got %d" % max_sequences_per_pack)
    try:
        raw = np.asarray(histogram)
    except (TypeError, ValueError) as exc:
        raise InputError("histogram is not an array of counts: %s" % exc)
    if raw.ndim != 1:
        raise InputError("histogram must be one-dimensional, got shape %s" % (raw.shape,))
    if raw.size == 0:
        raise InputError("histogram is empty")
    if raw.dtype == bool or not (np.issubdtype(raw.dtype, np.integer) or np.issubdtype(raw.dtype, np.floating)):
        raise InputError("histogram counts must be numbers, got dtype %s" % raw.dtype)
    if np.issubdtype(raw.dtype, np.floating):
        if not np.isfinite(raw).all():
            raise InputError("histogram counts must be finite")
        if (raw != np.round(raw)).any():
            raise InputError("histogram counts must be whole numbers")
    if (raw < 0).any():
        first = int(np.flatnonzero(raw < 0)[0])
        raise InputError("histogram has a negative count (%d at length %d)" % (raw[first], first + 1))
    if (raw >= MAX_COUNT).any():  # compared before any cast, so uint64 and huge floats cannot wrap
        first = int(np.flatnonzero(raw >= MAX_COUNT)[0])
        raise InputError("histogram count %d at length %d is too large (counts must be below 2**53)"
                         % (int(raw[first]), first + 1))
    hist = raw.astype(np.int64)
    if len(hist) > max_seq_length:
        raise InputError(
            "histogram has %d bins but max_seq_length is %d (bin i counts length i + 1)"
            % (len(hist), max_seq_length)
        )
    if hist.sum() == 0:
        raise InputError("histogram has no sequences (all counts are zero)")
    present = np.flatnonzero(hist)
    tokens = sum(int(hist[i]) * (int(i) + 1) for i in present)  # Python ints: exact at any size
    if tokens >= MAX_TOKENS or int(hist.sum()) >= MAX_TOKENS:
        raise InputError("histogram holds %d tokens: totals must stay below 2**62" % tokens)
    out = np.zeros(max_seq_length, dtype=np.int64)
    out[: len(hist)] = hist
    return out


def _normalise(strategies, repeats, hist: np.ndarray) -> Tuple[Tuple[Tuple[int, ...], ...], np.ndarray]:
    """Merge duplicate strategies and drop over-covered slots so the plan holds `hist` exactly.

    Dropping a sequence from a pack never adds a pack (a pack left empty disappears), so the
    pack count can only fall. Raises AssertionError if the strategies hold too few sequences.
    """
    counts: Dict[Tuple[int, ...], int] = {}
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


def _run(algorithm: str, hist: np.ndarray, size: int, limit: int, max_rounds: int, time_limit: Optional[float]):
    """Returns (strategies, repeats, lower bound or None, LP rounds or None, stop reason or None)."""
    if algorithm == "spfhp":
        return heuristics.spfhp(hist, size, limit) + (None, None, None)
    if algorithm == "lpfhp":
        return heuristics.lpfhp(hist, size, limit) + (None, None, None)
    if algorithm == "nnlshp":
        return _nnlshp.nnlshp(hist, size, limit) + (None, None, None)
    # optimal: the best of the greedy heuristics, then the LP unless they are already optimal.
    candidates = [heuristics.spfhp(hist, size, limit), heuristics.lpfhp(hist, size, limit)]
    best = min((_normalise(s, r, hist) for s, r in candidates), key=lambda p: int(p[1].sum()))
    lp = _optimal.optimal(
        hist, size, limit, max_rounds=max_rounds, time_limit=time_limit, upper_bound=int(best[1].sum())
    )
    if lp.strategies is not None:
        candidate = _normalise(lp.strategies, lp.repeats, hist)
        if int(candidate[1].sum()) < int(best[1].sum()):
            best = candidate
    return best[0], best[1], lp.lower_bound, lp.rounds, lp.stopped_by


def plan_packing(
    histogram: Sequence[int],
    max_seq_length: int,
    max_sequences_per_pack: Optional[int] = None,
    algorithm: str = "optimal",
    max_rounds: int = _optimal.MAX_ROUNDS,
    time_limit: Optional[float] = _optimal.TIME_LIMIT,
) -> PackingPlan:
    """Plan packs for a histogram of sequence lengths.

    histogram: counts, bin i = sequences of length i + 1 (at most max_seq_length bins).
    max_sequences_per_pack: an int >= 1, or None for unbounded.
    algorithm: one of ALGORITHMS.
    max_rounds: rounds of column generation for `optimal` at most; it then stops with a valid,
        possibly weaker, bound. This is the stopping rule: the same input gives the same plan on
        any machine. The other algorithms ignore it.
    time_limit: seconds of column generation for `optimal` at most (a safety net), or None for
        no limit. A plan cut short by it depends on the machine's speed: ``stopped_by`` is then
        "time_limit" and a warning says so.
    Raises InputError (a ValueError) on bad input.
    """
    start = time.perf_counter()
    hist = _validate(histogram, max_seq_length, max_sequences_per_pack, algorithm)
    size = int(max_seq_length)
    limit = size if max_sequences_per_pack is None else int(min(max_sequences_per_pack, size))
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, numbers.Integral) or max_rounds < 1:
        raise InputError("max_rounds must be an integer >= 1, got %r" % (max_rounds,))
    if time_limit is not None:
        if isinstance(time_limit, bool) or not isinstance(time_limit, numbers.Real) or not (
            0 < time_limit < math.inf
        ):
            raise InputError("time_limit must be a number of seconds > 0, got %r" % (time_limit,))
        time_limit = float(time_limit)
    strategies, repeats, bound, rounds, stopped_by = _run(algorithm, hist, size, limit, int(max_rounds), time_limit)
    if stopped_by == "time_limit":
        warnings.warn(
            "the packing LP stopped at its %g s time limit after %d rounds: this plan depends on the "
            "machine's speed (raise the time limit, or lower max_rounds, for a reproducible plan)"
            % (time_limit, rounds),
            RuntimeWarning,
            stacklevel=2,
        )
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
        lp_rounds=rounds,
        stopped_by=stopped_by,
    )
