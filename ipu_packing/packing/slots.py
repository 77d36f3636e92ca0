"""Where each sequence goes, from its length and its rank alone: the assignment, streamed.

`assign_sequences` places a corpus that fits in memory; `prepare` places one that does not, a slice
at a time, in worker processes that never see the whole corpus. Both use this map, so a sequence
lands in the same pack either way. A sequence's pack and its slot in the pack depend only on its
length l, its rank among the sequences of length l in corpus order, the plan and the seed:

1. **Shuffle within each length.** Rank r becomes slot pi_l(r) of the plan's n_l slots of length l,
   where pi_l is a seeded pseudo-random permutation of [0, n_l). Without it, packs would take
   sequences in corpus order, so e.g. every pack of one strategy would hold consecutive documents.
2. **Fill the plan.** The slots of length l are laid out strategy by strategy: strategy j's r_j packs
   are the rows of an (r_j, m_j) block, and each column q of length l takes the next r_j slots.
   The plan holds exactly the histogram, so every slot is taken exactly once.
3. **Shuffle the packs.** Plan pack p becomes pack pi_P(p), so neighbouring packs do not share a
   strategy. Each pack keeps its slots longest first (strategies are descending).

The permutations are keyed Feistel networks (`KeyedPermutation`, permutation.py): a bijection that is computed
element by element, vectorised, in O(1) memory, with its inverse, instead of a stored shuffle of n
entries. So placing a slice costs memory proportional to the slice, whatever the corpus.

Two ways to compute the same map. `SlotMap.place` goes forwards, from (length, rank) to (pack,
slot), for any slice. `SlotMap.assign` places a whole corpus backwards: a stable counting sort
groups the sequences by length; slot s of length l holds the one of rank pi_l^-1(s), evaluated for
all s at once; plan pack p starts at offsets[pi_P(p)], evaluated for the P packs, not for the N
sequences; each sequence index is then scattered to its place. Everything runs in fixed-size
chunks (CHUNK), so temporaries stay small and in cache, and in integer arithmetic only: neither the
chunk size nor the machine changes a bit of the result.

Shape legend: N sequences in the slice, S max sequence length, J strategies, P packs.
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import numpy as np

from .permutation import CHUNK, KeyedPermutation
from .plan import PackingPlan

# SlotMap.assign's gathers and scatters go STEPS * CHUNK elements at a time
STEPS = 8
# sequences per step of the counting sort by length (a radix argsort of each step's lengths)
SORT_CHUNK = 1 << 16


def _index_type(n: int) -> type:
    """The integer type that holds 0..n: int32 where it does (half the memory), else int64."""
    return np.int32 if n < 1 << 31 else np.int64


def _by_length(lengths: np.ndarray, size: int) -> Iterator[Tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """A stable counting sort of (N,) lengths in 1..size (unchecked), SORT_CHUNK at a time:
    yields (c, order, key, shift, count) for each chunk lengths[c:c + m], where order (m,) sorts it
    by length (corpus order within each), key (m,) = its lengths in that order, and for each length
    l, count[l] of the chunk's sequences have it and its i-th in `order` is the
    (i - shift[l])-th of them in corpus order ((size + 1,) int64, indexed by length)."""
    small = np.uint8 if size < 1 << 8 else np.uint16 if size < 1 << 16 else np.int64
    every = np.arange(size + 2)
    for c in range(0, len(lengths), SORT_CHUNK):
        key = lengths[c:c + SORT_CHUNK].astype(small, copy=False)
        order = np.argsort(key, kind="stable")  # numpy's radix sort: lengths are small integers
        key = key[order]
        bounds = np.searchsorted(key, every)  # (size + 2,) where each length starts in `key`
        yield c, order, key, bounds[:-1], np.diff(bounds)


def count_lengths(lengths: np.ndarray, size: int) -> np.ndarray:
    """(size,) int64: how many of (N,) integer lengths in 1..size (unchecked) are 1, 2, ... size;
    SORT_CHUNK at a time, so that no (N,) copy is made whatever their type."""
    counts = np.zeros(size + 1, dtype=np.int64)
    cast = not np.can_cast(lengths.dtype, np.intp)  # uint64: bincount takes intp
    for c in range(0, len(lengths), SORT_CHUNK):
        part = lengths[c:c + SORT_CHUNK]
        counts += np.bincount(part.astype(np.intp) if cast else part, minlength=size + 1)
    return counts[1:]


def _group_by_length(lengths: np.ndarray, size: int, counts: Optional[np.ndarray] = None
                     ) -> Tuple[np.ndarray, np.ndarray]:
    """(order, starts) for (N,) lengths in 1..size (unchecked) with histogram `counts` ((size,),
    counted here if None): order (N,) int32 (int64 past 2^31) groups the sequences by length,
    corpus order within each length (a stable argsort); the sequences of length l are
    order[starts[l - 1]:starts[l]], starts (size + 1,) int64."""
    starts = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(count_lengths(lengths, size) if counts is None else counts, out=starts[1:])
    order = np.empty(len(lengths), dtype=_index_type(len(lengths)))
    cursor = np.concatenate([[0], starts[:-1]])  # (size + 1,) where length l's next ones go
    for c, chunk_order, key, shift, count in _by_length(lengths, size):
        place = (cursor - shift)[key] + np.arange(len(key))
        order[place] = chunk_order + c
        cursor += count
    return order, starts


def _check_lengths(lengths: np.ndarray, size: int) -> np.ndarray:
    lengths = np.asarray(lengths)
    if lengths.size and not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError("lengths must be integers, got dtype %s" % lengths.dtype)
    if lengths.size and (int(lengths.min()) < 1 or int(lengths.max()) > size):
        raise ValueError("lengths outside 1..%d" % size)
    return lengths.ravel()


def length_ranks(lengths: np.ndarray, before: np.ndarray) -> np.ndarray:
    """(N,) int64: each sequence's rank among the sequences of its length, in corpus order, where
    `before` (S,) counts the sequences of each length that come before this slice."""
    before = np.asarray(before, dtype=np.int64)
    lengths = _check_lengths(lengths, len(before))
    seen = np.concatenate([[0], before])  # (S + 1,) sequences of length l before the chunk
    ranks = np.empty(len(lengths), dtype=np.int64)
    for c, order, key, shift, count in _by_length(lengths, len(before)):
        ranks[order + c] = (seen - shift)[key] + np.arange(len(key))
        seen += count
    return ranks


class SlotMap:
    """The plan's slots, and the permutations of the module notes, for one seed (picklable, small:
    O(J * K) numbers)."""

    def __init__(self, plan: PackingPlan, seed: int) -> None:
        self.max_seq_length = plan.max_seq_length
        repeats = np.asarray(plan.repeats, dtype=np.int64)  # (J,)
        self.strategy_size = np.array([len(s) for s in plan.strategies], dtype=np.int64)  # (J,)
        self.pack_start = np.concatenate([[0], np.cumsum(repeats)]).astype(np.int64)  # (J + 1,)
        self.num_packs = int(self.pack_start[-1])
        self.histogram = np.asarray(plan.histogram, dtype=np.int64)  # (S,)
        # one segment per (strategy j, column q): r_j consecutive slots of length strategies[j][q]
        segments = [(length, j, q) for j, strategy in enumerate(plan.strategies) for q, length in enumerate(strategy)
                    if repeats[j] > 0]
        segments.sort(key=lambda t: (t[0], t[1], t[2]))  # by length, then strategy, then column
        seg_length = np.array([t[0] for t in segments], dtype=np.int64)
        seg_strategy = np.array([t[1] for t in segments], dtype=np.int64)
        self.seg_position = np.array([t[2] for t in segments], dtype=np.int64)  # column q: slot in the pack
        self.seg_pack = self.pack_start[seg_strategy] if len(segments) else np.zeros(0, np.int64)
        size = repeats[seg_strategy] if len(segments) else np.zeros(0, np.int64)
        self.seg_size = size
        # seg_slot[i]: first slot (among those of its length) of segment i
        by_length = np.searchsorted(seg_length, np.arange(1, self.max_seq_length + 2))  # (S + 1,)
        self.seg_bounds = by_length
        before = np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.int64)  # slots of segments before i
        self.seg_slot = before - before[by_length[seg_length - 1]] if len(segments) else np.zeros(0, np.int64)
        self.seed = seed
        self._packs = KeyedPermutation(self.num_packs, seed, 0)
        self._lengths = {}

    def _within(self, length: int) -> KeyedPermutation:
        perm = self._lengths.get(length)
        if perm is None:
            perm = self._lengths[length] = KeyedPermutation(self.histogram[length - 1], self.seed, 1, length)
        return perm

    def place(self, lengths: np.ndarray, ranks: np.ndarray, chunk: int = 0) -> Tuple[np.ndarray, np.ndarray]:
        """(pack, slot): (N,) int64 pack indices in [0, P) and (N,) int64 slots in the pack, for
        sequences of `lengths` with `ranks` (`length_ranks`). `chunk` changes only the speed."""
        lengths = _check_lengths(lengths, self.max_seq_length)
        ranks = np.asarray(ranks, dtype=np.int64).ravel()
        if len(ranks) != len(lengths):
            raise ValueError("%d lengths but %d ranks" % (len(lengths), len(ranks)))
        chunk = chunk or CHUNK
        order, starts = _group_by_length(lengths, self.max_seq_length)
        plan_pack = np.empty(len(lengths), dtype=np.int64)
        slot = np.empty(len(lengths), dtype=np.int64)
        for length in np.flatnonzero(np.diff(starts)) + 1:
            perm = self._within(length)
            chosen = order[starts[length - 1]:starts[length]]  # (n,) the sequences of this length
            rank = ranks[chosen]
            if rank.min() < 0:
                raise ValueError("negative rank")
            if rank.max() >= perm.n:
                raise ValueError("more sequences of some length than the plan holds")
            shuffled = perm._apply(rank, True, chunk)  # (n,) slot among length's slots
            a, b = self.seg_bounds[length - 1], self.seg_bounds[length]
            seg = a + np.searchsorted(self.seg_slot[a:b], shuffled, side="right") - 1  # (n,) its segment
            plan_pack[chosen] = self.seg_pack[seg] + (shuffled - self.seg_slot[seg])
            slot[chosen] = self.seg_position[seg]
        return self._packs._apply(plan_pack, True, chunk), slot

    def assign(self, lengths: np.ndarray, chunk: int = 0, checked: bool = False) -> Tuple[np.ndarray, np.ndarray]:
        """(indices, offsets) of a whole corpus whose histogram is the plan's: (N,) int64 sequence
        indices by pack, longest first within, and (P + 1,) int64 pack offsets into them
        (`PackAssignment`). The same map as `place`, run backwards: slot s of length l holds the
        sequence of rank pi_l^-1(s), so no ranks are computed and pi_P runs over the P packs, not
        over the N sequences. `chunk` changes only the speed; `checked`: the caller has checked
        that `lengths` are integers with the plan's histogram (assign_sequences does)."""
        if checked:
            lengths = np.asarray(lengths)
        else:
            lengths = _check_lengths(lengths, self.max_seq_length)
            if not np.array_equal(count_lengths(lengths, self.max_seq_length), self.histogram):
                raise ValueError("lengths do not match the plan's histogram")
        chunk = chunk or CHUNK
        order, starts = _group_by_length(lengths, self.max_seq_length, self.histogram)  # (N,), (S + 1,)
        num_packs = self.num_packs
        # start[p]: where plan pack p's sequences begin in `indices`; first its pack pi_P(p)
        start = self._packs._everywhere(True, chunk, np.empty(num_packs, dtype=_index_type(len(lengths))))  # (P,)
        step = STEPS * chunk  # the loops below need no cache-sized steps, only bounded ones
        offsets = np.empty(num_packs + 1, dtype=np.int64)  # (P + 1,) first each pack's size, at its pack + 1
        offsets[0] = 0
        for c in range(0, num_packs, step):
            d = min(c + step, num_packs)
            j, k = np.searchsorted(self.pack_start, c, side="right") - 1, np.searchsorted(self.pack_start, d)
            spans = np.minimum(self.pack_start[j + 1:k + 1], d) - np.maximum(self.pack_start[j:k], c)
            offsets[start[c:d] + 1] = np.repeat(self.strategy_size[j:k], spans)
        np.cumsum(offsets, out=offsets)
        for c in range(0, num_packs, step):
            start[c:c + step] = offsets[start[c:c + step]]
        indices = np.empty(len(lengths), dtype=np.int64)  # (N,)
        buffer = np.empty(int(self.histogram.max(initial=0)), dtype=order.dtype)  # (max n_l,)
        for length in np.flatnonzero(self.histogram) + 1:
            perm, base = self._within(length), starts[length - 1]
            ranks = perm._everywhere(False, chunk, buffer[:perm.n])  # (n,) slot s of this length holds rank ranks[s]
            np.add(ranks, base, out=ranks)  # its place in `order`
            a, b = self.seg_bounds[length - 1], self.seg_bounds[length]
            first, end = self.seg_slot[a:b], self.seg_slot[a:b] + self.seg_size[a:b]  # length's segments
            pack_of_first, position = self.seg_pack[a:b] - first, self.seg_position[a:b]
            for c in range(0, perm.n, step):
                d = min(c + step, perm.n)
                # the segments that slots c..d fall in, and how many fall in each
                i, k = np.searchsorted(first, c, side="right") - 1, np.searchsorted(first, d)
                spans = np.minimum(end[i:k], d) - np.maximum(first[i:k], c)
                plan_pack = np.arange(c, d, dtype=np.int64) + np.repeat(pack_of_first[i:k], spans)
                indices[start[plan_pack] + np.repeat(position[i:k], spans)] = order[ranks[c:d]]
        return indices, offsets

    def pack_sizes(self, packs: np.ndarray) -> np.ndarray:
        """(n,) int64 sequences in each of `packs`."""
        plan_pack = self._packs.inverse(packs) if len(np.atleast_1d(packs)) else np.zeros(0, np.int64)
        return self.strategy_size[np.searchsorted(self.pack_start, plan_pack, side="right") - 1]

    def sequences_per_pack_histogram(self, max_sequences_per_pack: int) -> np.ndarray:
        """(K,) int64: packs holding 1 .. K sequences."""
        repeats = np.diff(self.pack_start)
        return np.bincount(self.strategy_size - 1, weights=repeats,
                           minlength=max_sequences_per_pack).astype(np.int64)[:max_sequences_per_pack]
