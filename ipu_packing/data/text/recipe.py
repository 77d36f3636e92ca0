"""Documents of token ids -> NSP/MLM training instances (the BERT phase-2 recipe).

This follows google-research/bert create_pretraining_data.py in behaviour, restructured for speed:

* Sentences are tokenized in large batches by the Rust tokenizer, once, into one flat int32 array;
  a sentence is a (start, end) range in it and a document a range of sentences. `dupe_factor` passes
  over the documents reuse those ids, so the text is tokenized once however many duplicates are made.
* Choosing segments is the only per-document Python loop, and it works on sentence *offsets*, never on
  tokens: segment A and segment B of an instance are each one contiguous token range (sentences of a
  document are adjacent in the flat array, and truncation only trims the ends). The tokens of all
  instances are then gathered with one vectorised index operation.
* Truncation and masking are vectorised over thousands of instances at once.

Randomness: one `numpy.random.Generator` per shard, passed explicitly to every function that draws.
Its seed is derived from (seed, shard index) by `numpy.random.SeedSequence`, so a shard's instances do
not depend on which worker builds it or on how many workers there are. The segment loop draws its
scalars from a buffered block of uniforms of that same generator (`Uniforms`), which is much faster
than asking the generator for one number at a time.

Recipe, step by step (the reference's choices unless said otherwise):

1. `target_seq_length` is `max_seq_length - 3` (room for [CLS] and two [SEP]); with probability
   `short_seq_prob` it is instead uniform in [2, max_seq_length - 3], so that the model also sees short
   sequences (phase 2 otherwise never would).
2. Sentences are accumulated until the chunk reaches the target or the document ends. A random
   number of the chunk's leading sentences becomes A.
3. The "actual next" B is the rest of the chunk. With probability 1/2, B is instead a random segment:
   a random start sentence in another document (10 tries to avoid the same document). The chunk's
   sentences that were not used for A are put back, so they start the next chunk instead of being
   wasted. Otherwise B is the actual next.
   Deviation (NSP without a length shortcut): a random B is exactly as long as the actual next B
   would have been, not (as in the reference) extended to fill the target. And a chunk of a single
   sentence, which has no next sentence to offer, is split at a random token inside the sentence
   *before* the label is drawn, for both labels alike: A is its first part, and B is either the rest
   of it (a true continuation) or a random segment of that same length. So the two labels see the
   same lengths, and the label is independent of how long a sequence is: the share of "is next"
   stays 1/2 overall and among short sequences alike. The reference instead forces a random B for a
   single-sentence chunk and fills a random B to the target, so on a corpus of short documents
   (docstrings, Wikipedia stubs) short sequences are mostly "is next" and long ones "random"; a
   model can learn NSP from the length alone. Splitting only the single sentences that drew "is
   next" (the obvious way to keep 50/50) has the same flaw: it makes many very short "is next"
   pairs. The random B starts at a sentence of the other document, moved earlier in it when the
   rest of that document is too short for the length wanted.
4. If A + B exceeds `max_seq_length - 3`, tokens are removed one at a time from the longer segment
   (B on a tie), each from the front or the back with probability 1/2. Which segment loses how many
   tokens is a closed-form function of the two lengths; the front/back split is a binomial draw.
5. Masking: the candidates are all tokens except [CLS] and [SEP]; with whole-word masking a word's
   "##" continuation pieces join the word's group (never across a [SEP]). The number to predict is
   min(max_predictions_per_seq, max(1, round(masked_lm_prob * length))). Groups are visited in random
   order and taken while they fit in that number (a group that would overshoot is skipped, a smaller
   later one may still fit). Each chosen token becomes [MASK] with probability 0.8, stays itself with
   0.1, and becomes a random token with 0.1. Deviation: the random token is drawn from the vocabulary
   without its bracketed special tokens ([PAD], [CLS], [unused5], ...), not from all of it.

NSP label: 0 when B follows A in the document, 1 when B is random (the reference's and Hugging Face's
convention).
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from ...errors import DataError
from ..format import max_predictions, num_to_predict
from ..instance_files import Instances, ranges


@dataclass
class RecipeConfig:
    """How instances are made from documents."""

    max_seq_length: int = 128
    """S: tokens per instance, [CLS] and [SEP]s included."""
    masked_lm_prob: float = 0.15
    """Share of each instance's tokens to predict."""
    max_predictions_per_seq: Optional[int] = None
    """Cap on predictions per instance; None derives ceil(masked_lm_prob * max_seq_length) (20 at S=128)."""
    short_seq_prob: float = 0.1
    """Probability of a shorter random target length for an instance."""
    dupe_factor: int = 10
    """Passes over the corpus, each with different segments and masks."""
    whole_word_masking: bool = False
    """Mask all pieces of a word together."""

    def __post_init__(self) -> None:
        if self.max_seq_length < 8:
            raise DataError("--max-seq-length must be >= 8, got %d" % self.max_seq_length)
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise DataError("--masked-lm-prob must be in (0, 1), got %r" % self.masked_lm_prob)
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise DataError("--short-seq-prob must be in [0, 1], got %r" % self.short_seq_prob)
        if self.dupe_factor < 1:
            raise DataError("--dupe-factor must be >= 1, got %d" % self.dupe_factor)
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq < 1:
            raise DataError("--max-predictions-per-seq must be >= 1, got %d" % self.max_predictions_per_seq)

    @property
    def max_predictions(self) -> int:
        return max_predictions(self.max_seq_length, self.masked_lm_prob, self.max_predictions_per_seq)

    def num_to_predict(self, lengths: np.ndarray) -> np.ndarray:
        """(N,) int64 predictions an instance of each length gets (format.num_to_predict)."""
        return num_to_predict(lengths, self.masked_lm_prob, self.max_predictions)


class Uniforms:
    """Scalar draws for the segment loop, served from blocks of a numpy Generator's uniforms.

    `random` is the `__next__` of an iterator over the blocks (drawn lazily, one block of `block`
    uniforms whenever the previous one is used up): a call into C, several times cheaper than a
    Python method."""

    def __init__(self, rng: np.random.Generator, block: int = 8192) -> None:
        self.rng = rng
        self.block = block
        blocks = iter(lambda: rng.random(block).tolist(), None)  # never None: an endless stream of blocks
        self.random = itertools.chain.from_iterable(blocks).__next__

    def randint(self, low: int, high: int) -> int:
        """Uniform integer in [low, high], both inclusive."""
        span = high - low + 1
        return low + min(int(self.random() * span), span - 1)


@dataclass
class TokenizedShard:
    """Documents as token ranges: sentence s is tokens[sentence_offsets[s]:sentence_offsets[s + 1]],
    document d is sentences [document_offsets[d], document_offsets[d + 1])."""

    tokens: np.ndarray  # (T,) int32
    sentence_offsets: List[int]  # n_sentences + 1
    document_offsets: List[int]  # n_documents + 1

    @property
    def num_documents(self) -> int:
        return len(self.document_offsets) - 1


def tokenize_documents(documents: List[List[str]], encode) -> TokenizedShard:
    """Batch-tokenize every sentence (`encode`: a vocab.BatchEncoder, or any function from a list of
    str to a list of id lists); empty sentences and documents are dropped."""
    sentences = [s for document in documents for s in document]
    if hasattr(encode, "encode_flat"):
        tokens, lengths_array = encode.encode_flat(sentences)
        lengths = lengths_array.tolist()
    else:
        ids = encode(sentences)
        lengths = [len(x) for x in ids]
        tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=sum(lengths))
    sentence_offsets = [0]
    document_offsets = [0]
    k = 0
    for document in documents:
        for _ in document:
            if lengths[k]:
                sentence_offsets.append(sentence_offsets[-1] + lengths[k])
            k += 1
        if len(sentence_offsets) - 1 > document_offsets[-1]:
            document_offsets.append(len(sentence_offsets) - 1)
    return TokenizedShard(tokens, sentence_offsets, document_offsets)


@dataclass
class SegmentPairs:
    """(N,) token ranges of segments A and B in the shard's flat token array, and NSP labels."""

    a_start: np.ndarray
    a_end: np.ndarray
    b_start: np.ndarray
    b_end: np.ndarray
    is_random_next: np.ndarray  # (N,) bool


def choose_segments(shard: TokenizedShard, recipe: RecipeConfig, draws: Uniforms) -> SegmentPairs:
    """Steps 1-3 of the recipe: segment ranges for every instance of every dupe pass."""
    offsets = shard.sentence_offsets
    documents = shard.document_offsets
    n_documents = shard.num_documents
    max_num_tokens = recipe.max_seq_length - 3
    out: List[tuple] = []
    append = out.append
    random = draws.random  # randint(low, high) is inlined below as low + min(int(random() * span), span - 1)
    short_seq_prob = recipe.short_seq_prob
    for _ in range(recipe.dupe_factor):
        for d in range(n_documents):
            first, last = documents[d], documents[d + 1]
            target = max_num_tokens
            if random() < short_seq_prob:
                target = 2 + min(int(random() * (max_num_tokens - 1)), max_num_tokens - 2)
            start = first
            while start < last:
                # the chunk ends at the first sentence i that brings it to the target, else at the last
                i = min(bisect_left(offsets, offsets[start] + target, start + 1, last + 1) - 1, last - 1)
                n = i - start + 1
                # A, and the actual next B [b0, b1), before the label is drawn (see the module notes)
                if n >= 2:
                    a_end_sentence = start + 1 + min(int(random() * (n - 1)), n - 2)
                    a0, a1 = offsets[start], offsets[a_end_sentence]
                    b0, b1 = a1, offsets[i + 1]
                else:
                    a_end_sentence = start + 1
                    a0, b1 = offsets[start], offsets[start + 1]
                    if b1 - a0 >= 2:  # single sentence: split it at a random token, whatever the label
                        a1 = b0 = a0 + 1 + min(int(random() * (b1 - a0 - 1)), b1 - a0 - 2)
                    else:  # one token: no next to offer, so B is random, filling the target
                        a1 = b0 = b1
                is_random = random() < 0.5 or b0 == b1
                if is_random:
                    length_b = b1 - b0 if b1 > b0 else target - (a1 - a0)  # the actual next's length
                    r = d
                    for _ in range(10):
                        r = min(int(random() * n_documents), n_documents - 1)
                        if r != d:
                            break
                    r_first, r_last = documents[r], documents[r + 1]
                    r_start = r_first + min(int(random() * (r_last - r_first)), r_last - r_first - 1)
                    end = offsets[r_last]
                    # start earlier in the document if the rest of it is shorter than length_b
                    r_start = max(r_first, min(r_start, bisect_right(offsets, end - length_b, r_first, r_last) - 1))
                    b0 = offsets[r_start]
                    b1 = min(b0 + length_b, end)
                    if n >= 2:
                        i = a_end_sentence - 1  # put the unused sentences back
                append((a0, a1, b0, b1, is_random))
                start = i + 1
    table = np.array(out, dtype=np.int64).reshape(-1, 5)
    return SegmentPairs(table[:, 0], table[:, 1], table[:, 2], table[:, 3], table[:, 4].astype(bool))


def truncation_counts(len_a: np.ndarray, len_b: np.ndarray, max_num_tokens: int):
    """Tokens the reference's truncate_seq_pair removes from A and from B, in closed form.

    It removes from the longer segment (B on a tie) until the pair fits: first the difference is
    taken off the longer one, then the two shrink alternately starting with B.
    """
    excess = np.maximum(len_a + len_b - max_num_tokens, 0)
    diff = len_a - len_b
    first = np.minimum(excess, np.abs(diff))
    rest = excess - first
    remove_a = np.where(diff > 0, first, 0) + rest // 2
    remove_b = np.where(diff > 0, 0, first) + (rest + 1) // 2
    return remove_a, remove_b


@dataclass
class Vocabulary:
    """What masking needs to know about the vocabulary."""

    cls_id: int
    sep_id: int
    mask_id: int
    continuation: np.ndarray  # (V,) bool, "##" pieces
    replacement_ids: np.ndarray  # (R,) int32, ids the random replacement draws from


def assemble(shard: TokenizedShard, pairs: SegmentPairs, recipe: RecipeConfig, vocab: Vocabulary,
             rng: np.random.Generator):
    """Step 4: truncate and gather [CLS] A [SEP] B [SEP] for every pair -> (tokens, lengths, a_lengths)."""
    len_a = pairs.a_end - pairs.a_start
    len_b = pairs.b_end - pairs.b_start
    remove_a, remove_b = truncation_counts(len_a, len_b, recipe.max_seq_length - 3)
    front_a = rng.binomial(remove_a, 0.5)
    front_b = rng.binomial(remove_b, 0.5)
    a_start = pairs.a_start + front_a
    b_start = pairs.b_start + front_b
    len_a = len_a - remove_a
    len_b = len_b - remove_b
    # the specials sit after the corpus tokens, so every piece is a range of one array
    source = np.concatenate([shard.tokens, np.array([vocab.cls_id, vocab.sep_id], dtype=np.int32)])
    cls_at, sep_at = len(shard.tokens), len(shard.tokens) + 1
    n = len(len_a)
    ones = np.ones(n, dtype=np.int64)
    starts = np.stack([np.full(n, cls_at), a_start, np.full(n, sep_at), b_start, np.full(n, sep_at)], axis=1)
    lengths = np.stack([ones, len_a, ones, len_b, ones], axis=1)
    tokens = source[ranges(starts.ravel(), lengths.ravel())]
    return tokens, (len_a + len_b + 3).astype(np.int32), (len_a + 2).astype(np.int32)


def _choose_whole_words(ids: np.ndarray, candidate: np.ndarray, budget: np.ndarray, vocab: Vocabulary,
                        rng: np.random.Generator) -> np.ndarray:
    """(N, W) bool: tokens chosen by whole-word masking (step 5), vectorised over the N instances."""
    n, width = ids.shape
    previous = np.zeros_like(candidate)
    previous[:, 1:] = candidate[:, :-1]
    group_start = candidate & ~(vocab.continuation[ids] & previous)  # a "##" piece joins the word before
    group = np.cumsum(group_start, axis=1) - 1  # (N, W) group index of each token
    n_groups = group_start.sum(axis=1)  # (N,)
    g_max = max(1, int(n_groups.max()))
    rows = np.broadcast_to(np.arange(n)[:, None], (n, width))
    sizes = np.bincount((rows * g_max + group)[candidate], minlength=n * g_max).reshape(n, g_max)  # (N, G)
    keys = rng.random((n, g_max))
    keys[np.arange(g_max)[None, :] >= n_groups[:, None]] = 2.0
    order = np.argsort(keys, axis=1, kind="stable")  # (N, G) groups in random visiting order
    sorted_sizes = np.take_along_axis(sizes, order, axis=1)
    taken_sorted = np.zeros((n, g_max), dtype=bool)
    count = np.zeros(n, dtype=np.int64)
    for j in range(g_max):  # greedy: take a group if it still fits, else skip it
        size = sorted_sizes[:, j]
        fits = (size > 0) & (count + size <= budget)
        taken_sorted[:, j] = fits
        count += size * fits
        if j % 8 == 7 and (count >= budget).all():
            break
    taken = np.zeros((n, g_max), dtype=bool)
    np.put_along_axis(taken, order, taken_sorted, axis=1)
    return candidate & taken[rows, np.maximum(group, 0)]


def _smallest_keys(keys: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """(N, W) bool: the budget[i] smallest keys of each row i (on a tie, the leftmost), as a stable
    argsort of each row would choose them. A partial sort finds each row's budget-th smallest key,
    which is much cheaper than sorting whole rows; rows where that threshold is shared by several keys
    (ties: not expected from random floats) are redone by the full sort."""
    n, width = keys.shape
    kth = min(max(1, int(budget.max(initial=0))), width)
    smallest = np.partition(keys, kth - 1, axis=1)[:, :kth]  # (N, kth) unordered
    smallest.sort(axis=1)
    threshold = np.where(budget > 0, smallest[np.arange(n), np.clip(budget - 1, 0, kth - 1)], -np.inf)  # (N,)
    chosen = keys <= threshold[:, None]
    bad = np.flatnonzero(chosen.sum(axis=1) != budget)
    if len(bad):
        order = np.argsort(keys[bad], axis=1, kind="stable")
        redo = np.zeros((len(bad), width), dtype=bool)
        np.put_along_axis(redo, order, np.arange(width)[None, :] < budget[bad, None], axis=1)
        chosen[bad] = redo
    return chosen


def mask_tokens(tokens: np.ndarray, lengths: np.ndarray, a_lengths: np.ndarray, recipe: RecipeConfig,
                vocab: Vocabulary, rng: np.random.Generator, chunk: int = 4096):
    """Step 5, vectorised over chunks of instances -> (masked tokens, mlm_counts, positions, labels)."""
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    out_tokens = tokens.copy()
    counts, positions, labels = [], [], []
    for c0 in range(0, len(lengths), chunk):
        c1 = min(c0 + chunk, len(lengths))
        length = lengths[c0:c1].astype(np.int64)  # (N,)
        n, width = len(length), int(length.max())
        col = np.arange(width)[None, :]  # (1, W)
        valid = col < length[:, None]  # (N, W)
        ids = np.zeros((n, width), dtype=np.int32)
        ids[valid] = tokens[offsets[c0]:offsets[c1]]
        candidate = valid & (col != 0) & (col != (a_lengths[c0:c1, None] - 1)) & (col != (length[:, None] - 1))
        budget = recipe.num_to_predict(length)  # (N,)
        if recipe.whole_word_masking:
            chosen = _choose_whole_words(ids, candidate, budget, vocab, rng)
        else:
            # Every group is one token, so the greedy pass of _choose_whole_words reduces to taking the first
            # `budget` candidates of a random order: the candidates with the `budget` smallest random keys.
            keys = np.where(candidate, rng.random((n, width)), 2.0)  # (N, W)
            chosen = _smallest_keys(keys, budget)
        r, c = np.nonzero(chosen)  # row-major: positions ascending within an instance
        original = ids[r, c]
        u_mask, u_keep = rng.random(len(r)), rng.random(len(r))
        random_ids = vocab.replacement_ids[rng.integers(0, len(vocab.replacement_ids), len(r))]
        ids[r, c] = np.where(u_mask < 0.8, vocab.mask_id, np.where(u_keep < 0.5, original, random_ids))
        out_tokens[offsets[c0]:offsets[c1]] = ids[valid]
        counts.append(np.bincount(r, minlength=n))
        positions.append(c.astype(np.int32))
        labels.append(original.astype(np.int32))
    if not counts:
        empty = np.zeros(0, dtype=np.int32)
        return out_tokens, empty, empty, empty
    return (out_tokens, np.concatenate(counts).astype(np.int32), np.concatenate(positions),
            np.concatenate(labels))


def create_instances(shard: TokenizedShard, recipe: RecipeConfig, vocab: Vocabulary,
                     rng: np.random.Generator) -> Instances:
    """All instances of one shard (every dupe pass), from one explicitly passed generator."""
    if shard.num_documents == 0:
        empty = np.zeros(0, dtype=np.int32)
        return Instances(empty, empty, empty, empty, empty, empty, empty)
    pairs = choose_segments(shard, recipe, Uniforms(rng))
    tokens, lengths, a_lengths = assemble(shard, pairs, recipe, vocab, rng)
    tokens, counts, positions, labels = mask_tokens(tokens, lengths, a_lengths, recipe, vocab, rng)
    return Instances(tokens, lengths, a_lengths, pairs.is_random_next.astype(np.int32), counts, positions, labels)
