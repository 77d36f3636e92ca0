"""Assignment of real sequences to the packs of a plan.

A plan says "r_j packs of strategy j"; assignment decides *which* sequences fill them. It is
fully vectorised (no Python loop over sequences or packs) and seeded:

1. Sequences are grouped by length (a stable radix sort) and shuffled within each length.
   Without the shuffle, packs would take sequences in corpus order, so e.g. every pack of
   one strategy would hold consecutive documents.
2. The packs are filled strategy by strategy: the r_j packs of strategy j form an
   (r_j, m_j) block whose column q takes the next r_j sequences of length strategies[j][q].
   The plan holds exactly the histogram of `lengths`, so every queue empties exactly.
3. The packs are put in a random order (a permutation of all packs), each keeping its
   slots longest first, so neighbouring packs do not share a strategy.

Memory: a few int32/int16 arrays of N entries plus the (N,) int64 result; 16.3M sequences
stay well under 1 GB. Lengths are sorted as int16 (radix sort) when they fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..errors import InputError

from .plan import PackingPlan


def histogram_from_lengths(lengths, max_seq_length: int) -> np.ndarray:
    """(S,) int64 histogram; bin i counts sequences of length i + 1.

    Raises InputError (a ValueError) if a length is < 1 or > max_seq_length.
    """
    lengths = np.asarray(lengths)
    if lengths.ndim != 1:
        raise InputError("lengths must be one-dimensional, got shape %s" % (lengths.shape,))
    if lengths.size and not np.issubdtype(lengths.dtype, np.integer):
        raise InputError("lengths must be integers, got dtype %s" % lengths.dtype)
    if lengths.size:
        low, high = int(lengths.min()), int(lengths.max())
        if low < 1 or high > max_seq_length:
            raise InputError(
                "sequence lengths must lie in 1..%d, found %d"
                % (max_seq_length, low if low < 1 else high)
            )
    counts = np.bincount(lengths.astype(np.int64) - 1, minlength=max_seq_length)
    return counts.astype(np.int64)


@dataclass(frozen=True)
class PackAssignment:
    """Packs as groups of sequence indices, stored flat (CSR).

    Pack p holds indices[offsets[p]:offsets[p + 1]], longest first.
    """

    indices: np.ndarray  # (N,) int64, every sequence index exactly once
    offsets: np.ndarray  # (P + 1,) int64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, p: int) -> np.ndarray:
        return self.indices[self.offsets[p] : self.offsets[p + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        for p in range(len(self)):
            yield self[p]

    @property
    def sizes(self) -> np.ndarray:
        """(P,) int64 sequences per pack."""
        return np.diff(self.offsets)


def _key_dtype(max_seq_length: int):
    return np.int16 if max_seq_length < 2**15 else np.int32


def assign_sequences(plan: PackingPlan, lengths, seed: int) -> PackAssignment:
    """Place each real sequence (by index into `lengths`) into a pack of the plan.

    lengths: (N,) ints whose histogram equals plan.histogram (else InputError).
    seed: the only source of randomness; the same inputs give byte-identical outputs.
    """
    size = plan.max_seq_length
    lengths = np.asarray(lengths)
    hist = histogram_from_lengths(lengths, size)
    if not np.array_equal(hist, plan.histogram):
        diff = np.flatnonzero(hist != plan.histogram)
        raise InputError(
            "lengths do not match the plan's histogram (first difference at length %d: %d given, %d planned)"
            % (diff[0] + 1, hist[diff[0]], plan.histogram[diff[0]])
        )
    n = len(lengths)
    index = np.int32 if n < 2**31 else np.int64
    rng = np.random.default_rng(seed)

    # 1. sequences grouped by length (stable radix sort), then shuffled within each length
    queue = np.argsort(lengths.astype(_key_dtype(size)), kind="stable")  # (N,) int64
    starts = np.concatenate([[0], np.cumsum(hist)])  # (S + 1,) queue[starts[l-1]:starts[l]] has length l
    for length in np.flatnonzero(hist > 1) + 1:
        rng.shuffle(queue[starts[length - 1] : starts[length]])

    # 2. fill the packs strategy by strategy: strategy j's r_j packs are rows of an (r_j, m_j)
    #    block; column q takes the next r_j sequences of length strategies[j][q].
    repeats = np.asarray(plan.repeats, dtype=np.int64)  # (J,)
    strategy_size = np.array([len(s) for s in plan.strategies], dtype=np.int64)  # (J,)
    block_start = np.concatenate([[0], np.cumsum(repeats * strategy_size)])  # (J + 1,)
    grouped = np.empty(n, dtype=np.int64)  # (N,) packs in strategy order
    taken = starts[:-1].copy()  # (S,) next unused queue position per length
    for j, strategy in enumerate(plan.strategies):
        block = grouped[block_start[j] : block_start[j + 1]].reshape(int(repeats[j]), len(strategy))
        for q, length in enumerate(strategy):
            first = taken[length - 1]
            block[:, q] = queue[first : first + repeats[j]]
            taken[length - 1] = first + repeats[j]
    del queue

    # 3. the packs in random order (each keeps its slots, longest first)
    pack_strategy = np.repeat(np.arange(len(repeats), dtype=np.int32), repeats)  # (P,)
    grouped_offsets = np.zeros(len(pack_strategy) + 1, dtype=np.int64)  # (P + 1,)
    np.cumsum(strategy_size[pack_strategy], out=grouped_offsets[1:])
    perm = rng.permutation(len(pack_strategy))  # (P,) new pack p is grouped pack perm[p]
    sizes = strategy_size[pack_strategy[perm]]  # (P,)
    del pack_strategy
    offsets = np.zeros(len(perm) + 1, dtype=np.int64)  # (P + 1,)
    np.cumsum(sizes, out=offsets[1:])
    # slot s of the output reads grouped[source[s]], source = pack shift + running slot number
    shift = (grouped_offsets[:-1][perm] - offsets[:-1]).astype(index)  # (P,)
    del perm, grouped_offsets
    source = np.repeat(shift, sizes)  # (N,)
    del shift, sizes
    source += np.arange(n, dtype=index)
    indices = grouped[source]  # (N,) int64
    return PackAssignment(indices=indices, offsets=offsets)
