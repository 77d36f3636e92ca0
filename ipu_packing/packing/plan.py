"""Packing plans.

PLACEHOLDER: a minimal first-fit-decreasing over the histogram so that other packages can be
built against the API. The packing work replaces the algorithms, keeping `PackingPlan` and
`plan_packing` as they are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

ALGORITHMS = ("optimal",)


@dataclass(frozen=True)
class PackingPlan:
    """Which combinations of lengths share one pack, and how many packs of each.

    strategies[j] is a tuple of sequence lengths (descending) that fill one pack;
    repeats[j] is how many packs use that strategy.
    """

    algorithm: str
    max_sequence_length: int
    max_sequences_per_pack: Optional[int]  # None: unbounded
    histogram: np.ndarray  # (S,) int64, bin i counts sequences of length i + 1
    strategies: Tuple[Tuple[int, ...], ...]
    repeats: np.ndarray  # (P,) int64
    lower_bound_packs: Optional[float] = None  # LP bound where the algorithm computes one
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
        """Real tokens / (packs * max_sequence_length)."""
        return self.num_tokens / float(self.num_packs * self.max_sequence_length)

    @property
    def packing_factor(self) -> float:
        """Sequences per pack."""
        return self.num_sequences / float(self.num_packs)

    @property
    def theoretical_speedup(self) -> float:
        """Padded rows (one per sequence) / packs."""
        return self.num_sequences / float(self.num_packs)


def plan_packing(
    histogram: Sequence[int],
    max_sequence_length: int,
    max_sequences_per_pack: Optional[int] = None,
    algorithm: str = "optimal",
) -> PackingPlan:
    start = time.perf_counter()
    hist = np.asarray(histogram, dtype=np.int64)
    if algorithm not in ALGORITHMS:
        raise ValueError("unknown packing algorithm %r" % (algorithm,))
    k_max = max_sequences_per_pack or len(hist) * 0 + 10**9
    # first-fit decreasing, sequence by sequence (placeholder: cost grows with the count)
    packs = []  # list of [free, lengths]
    for length in range(len(hist), 0, -1):
        for _ in range(int(hist[length - 1])):
            for pack in packs:
                if pack[0] >= length and len(pack[1]) < k_max:
                    pack[0] -= length
                    pack[1].append(length)
                    break
            else:
                packs.append([max_sequence_length - length, [length]])
    counts = {}
    for _, lengths in packs:
        key = tuple(lengths)
        counts[key] = counts.get(key, 0) + 1
    strategies = tuple(sorted(counts))
    repeats = np.array([counts[s] for s in strategies], dtype=np.int64)
    return PackingPlan(
        algorithm=algorithm,
        max_sequence_length=max_sequence_length,
        max_sequences_per_pack=max_sequences_per_pack,
        histogram=hist,
        strategies=strategies,
        repeats=repeats,
        seconds=time.perf_counter() - start,
    )
