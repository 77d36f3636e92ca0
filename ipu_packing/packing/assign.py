"""Assignment of real sequences to the packs of a plan.

A plan says "r_j packs of strategy j"; assignment decides *which* sequences fill them: seeded,
vectorised, every sequence exactly once. The recipe (shuffle within each length, fill the plan's
blocks strategy by strategy, shuffle the packs) lives in slots.py, which places any slice of a
corpus on its own; `assign_sequences` applies it to a corpus held in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..errors import InputError

from .plan import PackingPlan
from .slots import SlotMap, count_lengths


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
    return count_lengths(lengths, max_seq_length)


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
    # slots.py places each sequence from its length and its rank among its length alone (the recipe
    # is explained there), so that prepare can place a corpus a slice at a time; here all at once.
    indices, offsets = SlotMap(plan, seed).assign(lengths, checked=True)
    return PackAssignment(indices=indices, offsets=offsets)
