"""Greedy histogram packing: shortest-pack-first (SPFHP) and longest-pack-first (LPFHP).

Both follow Krell et al. (arXiv 2107.02027, section 3 and appendix). They walk the
histogram from the longest length down to the shortest and place *all* sequences of one
length at once, splitting groups of identical packs where a group only partly fits.
Their cost therefore depends on the number of distinct lengths and open pack groups, never
on the number of sequences.

Open packs are kept as groups ``[count, lengths]`` bucketed by their free space ("gap").
A sorted list of the non-empty gaps finds the next bucket in O(log S) instead of scanning
every possible gap, which keeps maximum lengths of several thousand cheap.

- SPFHP (worst fit): a length goes into the open pack with the *most* free space that
  still fits it, which is the shortest open pack.
- LPFHP (best fit): a length goes into the open pack with the *least* free space that fits
  it; where several copies fit, they go in together ("distribute"), so one pass can fill a
  gap with repeats of one length. New packs likewise start with as many copies as fit.

Within a bucket the most recently added group is used first (a stack), which reproduces
the reference figures of the paper exactly.

Both return ``(strategies, repeats)``: a list of length lists (any order) and their counts.
"""

from __future__ import annotations

import bisect
from typing import Dict, List, Tuple

import numpy as np

Groups = Dict[int, List[list]]  # gap -> stack of [count, lengths]


class _OpenPacks:
    """Open pack groups bucketed by free space, with a sorted index of non-empty gaps, and the
    closed groups (full, or holding `limit` sequences)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buckets = {}  # type: Groups
        self.gaps = []  # type: List[int]  # sorted, non-empty buckets only
        self.closed = []  # type: List[list]  # [count, lengths]

    def place(self, gap: int, count: int, lengths: List[int]) -> None:
        """`count` packs holding `lengths` with `gap` free: closed when full or at the limit, else open."""
        if gap == 0 or len(lengths) >= self.limit:
            self.closed.append([count, lengths])
        else:
            self.push(gap, count, lengths)

    def push(self, gap: int, count: int, lengths: List[int]) -> None:
        stack = self.buckets.get(gap)
        if stack is None:
            stack = self.buckets[gap] = []
            bisect.insort(self.gaps, gap)
        stack.append([count, lengths])

    def pop(self, gap: int) -> list:
        stack = self.buckets[gap]
        group = stack.pop()
        if not stack:
            del self.buckets[gap]
            del self.gaps[bisect.bisect_left(self.gaps, gap)]
        return group

    def largest_at_least(self, length: int) -> int:
        """Largest non-empty gap >= length, or -1."""
        if self.gaps and self.gaps[-1] >= length:
            return self.gaps[-1]
        return -1

    def smallest_at_least(self, length: int) -> int:
        """Smallest non-empty gap >= length, or -1."""
        i = bisect.bisect_left(self.gaps, length)
        return self.gaps[i] if i < len(self.gaps) else -1

    def result(self) -> Tuple[List[List[int]], List[int]]:
        """(strategies, repeats): the closed groups, then the open ones."""
        groups = self.closed + [group for stack in self.buckets.values() for group in stack]
        return [lengths for _, lengths in groups], [count for count, _ in groups]


def spfhp(histogram: np.ndarray, max_seq_length: int, max_sequences_per_pack: int):
    """Shortest-pack-first histogram packing. histogram: (S,) counts, bin i = length i + 1."""
    size, limit = max_seq_length, max_sequences_per_pack
    open_packs = _OpenPacks(limit)
    place = open_packs.place

    for length in range(size, 0, -1):
        todo = int(histogram[length - 1])
        while todo > 0:
            gap = open_packs.largest_at_least(length)
            if gap < 0:  # fits nowhere: open new packs, one sequence each
                place(size - length, todo, [length])
                break
            count, lengths = open_packs.pop(gap)
            used = min(count, todo)
            if count > used:
                open_packs.push(gap, count - used, lengths)
            todo -= used
            place(gap - length, used, lengths + [length])
    return open_packs.result()


def lpfhp(histogram: np.ndarray, max_seq_length: int, max_sequences_per_pack: int):
    """Longest-pack-first (best-fit, distributing) histogram packing."""
    size, limit = max_seq_length, max_sequences_per_pack
    open_packs = _OpenPacks(limit)
    place = open_packs.place

    for length in range(size, 0, -1):
        todo = int(histogram[length - 1])
        while todo > 0:
            gap = open_packs.smallest_at_least(length)
            if gap < 0:
                # New packs with as many copies as fit; the few left over share one more pack.
                copies = min(size // length, limit, todo)
                full = todo // copies
                place(size - copies * length, full, [length] * copies)
                rest = todo - full * copies
                if rest:
                    place(size - rest * length, 1, [length] * rest)
                break
            count, lengths = open_packs.pop(gap)
            copies = min(gap // length, limit - len(lengths), todo)
            used = min(count, todo // copies)
            if count > used:
                open_packs.push(gap, count - used, lengths)
            todo -= used * copies
            place(gap - copies * length, used, lengths + [length] * copies)
    return open_packs.result()
