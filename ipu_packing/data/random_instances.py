"""Random NSP/MLM instances: the one generator of synthetic instances for the benches, the synthetic packs of
the execution checks and the test fixtures (never training data: `prepare` makes that from text).

    instances = random_instances(rng, lengths, vocab_size)            # List[reference.Instance]
    packs = random_packs(rng, [[30, 90], [128]], S=128, K=3, vocab_size=30522)   # (P,) pack records
    arrays = draw_instances(rng, lengths, vocab_size, width=S)         # the same, as dense (N, W) arrays

The rule, for an instance of length L (token ids from a ``numpy.random.Generator``):

- tokens: position 0 is [CLS] and position L - 1 is [SEP] (L >= 2). From MIN_SEQ_LENGTH (5) tokens on it is
  [CLS] A [SEP] B [SEP]: the middle [SEP] lies uniformly in [2, L - 3], so A and B hold at least one word
  each. Shorter instances (which `prepare` never makes) are one segment, [CLS] words [SEP]; one token is
  [CLS] alone. Every other token is a word, uniform in [FIRST_WORD_ID, vocab_size).
- token types: 0 up to and including the middle [SEP], 1 after it (all 0 in a one-segment instance).
- predictions: format.num_to_predict(L, masked_lm_prob, cap), the data recipe's count,
  min(cap, max(1, round(p * L)), L - 3), at positions drawn uniformly from the word tokens; none below
  MIN_SEQ_LENGTH. cap is max_predictions_per_seq, else none beyond round(p * L). Every chosen token
  becomes [MASK] (the recipe's 80/10/10 replacement matters to training, not to shapes) and its label is
  the original token. So a pack of such instances never holds more than format.mlm_slots(S, K) of them.
- NSP label: 0 or 1 with equal chance.

Draws come in one fixed order for the whole batch (tokens, splits, mask keys, NSP labels), each of a shape
set by (N, width) alone, so the same rng state and lengths give the same instances, and a cap of 0 gives the
same tokens unmasked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from .format import CLS_ID, FIRST_WORD_ID, MASK_ID, MIN_SEQ_LENGTH, SEP_ID, max_predictions, mlm_slots, \
    num_to_predict
from .reference import Instance, pack_sequences


@dataclass
class InstanceArrays:
    """N instances as dense arrays: W = width tokens per row, P = prediction columns per row."""

    input_ids: np.ndarray  # (N, W) int64 token ids after masking; 0 ([PAD]) from each row's length on
    token_type_ids: np.ndarray  # (N, W) int64, 0 for [CLS] A [SEP] and on padding, 1 for B [SEP]
    lengths: np.ndarray  # (N,) int64 tokens of each instance
    a_lengths: np.ndarray  # (N,) int64 tokens of [CLS] A [SEP] (the length itself for one segment)
    mlm_positions: np.ndarray  # (N, P) int64 masked positions, ascending; 0 from mlm_counts on
    mlm_labels: np.ndarray  # (N, P) int64 original token at each; 0 from mlm_counts on
    mlm_counts: np.ndarray  # (N,) int64 predictions of each instance
    nsp_labels: np.ndarray  # (N,) int64, 0: B follows A; 1: B is random

    def instance(self, i: int) -> Instance:
        n, q = int(self.lengths[i]), int(self.mlm_counts[i])
        return Instance(self.input_ids[i, :n].copy(), self.token_type_ids[i, :n].copy(),
                        self.mlm_positions[i, :q].copy(), self.mlm_labels[i, :q].copy(), int(self.nsp_labels[i]))

    def instances(self) -> List[Instance]:
        return [self.instance(i) for i in range(len(self.lengths))]


def draw_instances(rng: np.random.Generator, lengths: Sequence[int], vocab_size: int, masked_lm_prob: float = 0.15,
                   max_predictions_per_seq: Optional[int] = None, width: Optional[int] = None) -> InstanceArrays:
    """Instances of exactly the given lengths, by the module's rule, as dense arrays of ``width`` tokens (default
    the longest) and P = the cap prediction columns."""
    if vocab_size <= FIRST_WORD_ID:
        raise ValueError("vocab_size must exceed %d (the special tokens come first)" % FIRST_WORD_ID)
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if len(lengths) and lengths.min() < 1:
        raise ValueError("instance lengths must be >= 1, got %d" % lengths.min())
    n = len(lengths)
    w = int(width if width is not None else (lengths.max() if n else 1))
    if n and lengths.max() > w:
        raise ValueError("an instance of %d tokens does not fit width %d" % (lengths.max(), w))
    cap = max_predictions(w, masked_lm_prob, max_predictions_per_seq)
    rows, col = np.arange(n), np.arange(w)[None, :]
    inside = col < lengths[:, None]
    two = lengths >= MIN_SEQ_LENGTH

    ids = rng.integers(FIRST_WORD_ID, vocab_size, size=(n, w), dtype=np.int64)
    # the middle [SEP] at 2 + floor(u * (L - 4)): uniform in [2, L - 3]; one segment below MIN_SEQ_LENGTH
    middle = np.where(two, 2 + np.floor(rng.random(n) * (lengths - 4)).astype(np.int64), -1)
    keys = rng.random((n, w))
    nsp = rng.integers(0, 2, size=n, dtype=np.int64)

    ids[:, 0] = CLS_ID
    last = lengths - 1
    ids[rows[last > 0], last[last > 0]] = SEP_ID
    ids[rows[two], middle[two]] = SEP_ID
    ids[~inside] = 0
    types = ((col > middle[:, None]) & two[:, None] & inside).astype(np.int64)
    a_lengths = np.where(two, middle + 1, lengths)

    counts = np.where(two, num_to_predict(lengths, masked_lm_prob, cap), 0)
    words = inside & (ids >= FIRST_WORD_ID)  # L - 3 of them from MIN_SEQ_LENGTH on: counts never exceed them
    order = np.argsort(np.where(words, keys, 2.0), axis=1, kind="stable")[:, :cap]  # (N, <= P) words first
    order = np.pad(order, ((0, 0), (0, cap - order.shape[1])))
    chosen = np.arange(cap)[None, :] < counts[:, None]
    positions = np.sort(np.where(chosen, order, w), axis=1)  # unused columns (w) sort last
    used = positions < w
    positions = np.where(used, positions, 0)
    labels = np.where(used, ids[rows[:, None], positions], 0)
    # unused columns point at position 0 and write its [CLS] back unchanged
    ids[rows[:, None], positions] = np.where(used, MASK_ID, ids[rows[:, None], positions])
    return InstanceArrays(ids, types, lengths, a_lengths, positions, labels, counts, nsp)


def random_instance(rng: np.random.Generator, length: int, vocab_size: int, masked_lm_prob: float = 0.15,
                    max_predictions_per_seq: Optional[int] = None) -> Instance:
    """One instance of ``length`` tokens by the module's rule."""
    return draw_instances(rng, [length], vocab_size, masked_lm_prob, max_predictions_per_seq).instance(0)


def random_instances(rng: np.random.Generator, lengths: Sequence[int], vocab_size: int, masked_lm_prob: float = 0.15,
                     max_predictions_per_seq: Optional[int] = None) -> List[Instance]:
    """Instances of exactly the given lengths (one batch of draws), by the module's rule."""
    return draw_instances(rng, lengths, vocab_size, masked_lm_prob, max_predictions_per_seq).instances()


def keep_first_predictions(group: Sequence[Instance], limit: int) -> List[Instance]:
    """The instances of one pack with only its first ``limit`` predictions, in pack order; the others are
    unmasked (their original token back in place), so a pack fits an M smaller than mlm_slots."""
    out = []
    for instance in group:
        q = max(0, min(limit, len(instance.mlm_positions)))
        limit -= q
        if q == len(instance.mlm_positions):
            out.append(instance)
            continue
        ids = instance.input_ids.copy()
        ids[instance.mlm_positions[q:]] = instance.mlm_labels[q:]
        out.append(Instance(ids, instance.token_type_ids, instance.mlm_positions[:q], instance.mlm_labels[:q],
                            instance.nsp_label))
    return out


def random_packs(rng: np.random.Generator, groups: Sequence[Sequence[int]], S: int, K: int, vocab_size: int,
                 M: Optional[int] = None, masked_lm_prob: float = 0.15,
                 max_predictions_per_seq: Optional[int] = None) -> np.ndarray:
    """(P,) pack records of reference.pack_sequences: pack p holds random instances of the lengths groups[p].
    M defaults to mlm_slots(S, K) of the same recipe, which every pack fits; a smaller M keeps each pack's
    first M predictions (keep_first_predictions)."""
    flat = [int(n) for group in groups for n in group]
    instances = iter(draw_instances(rng, flat, vocab_size, masked_lm_prob, max_predictions_per_seq,
                                    width=S if flat else None).instances())
    packs = [[next(instances) for _ in group] for group in groups]
    slots = mlm_slots(S, K, masked_lm_prob, max_predictions_per_seq)
    if M is not None and M < slots:
        packs = [keep_first_predictions(group, M) for group in packs]
    return pack_sequences(packs, S, K, slots if M is None else M)
