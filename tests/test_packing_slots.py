"""The streaming assignment (packing/slots.py): a slice placed on its own lands where the whole
corpus placed at once puts it, and its permutations are bijections."""

import numpy as np
from hypothesis import given, settings, strategies as st

from ipu_packing.packing import assign_sequences, histogram_from_lengths, plan_packing
from ipu_packing.packing.slots import KeyedPermutation, SlotMap, length_ranks


@settings(max_examples=40, deadline=None, derandomize=True)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**63 - 1), key=st.integers(0, 1000))
def test_keyed_permutation_is_a_bijection_with_its_inverse(n, seed, key):
    perm = KeyedPermutation(n, seed, key)
    x = np.arange(n)
    y = perm(x) if n else np.zeros(0, np.int64)
    np.testing.assert_array_equal(np.sort(y), x)
    if n:
        np.testing.assert_array_equal(perm.inverse(y), x)


def test_keyed_permutation_depends_on_the_seed_and_key_and_is_not_near_identity():
    n = 10000
    a, b, c = KeyedPermutation(n, 1, 0)(np.arange(n)), KeyedPermutation(n, 2, 0)(np.arange(n)), \
        KeyedPermutation(n, 1, 1)(np.arange(n))
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    # a shuffle, not a shift: neighbours land far apart, and few points stay put
    assert np.median(np.abs(np.diff(a))) > n / 10
    assert np.sum(a == np.arange(n)) < 10
    # its correlation with the identity is that of a random permutation (|r| ~ 1/sqrt(n) = 0.01)
    assert abs(np.corrcoef(a, np.arange(n))[0, 1]) < 0.05


def test_length_ranks_count_same_length_sequences_before_each():
    lengths = np.array([3, 1, 3, 2, 3, 1])
    before = np.array([10, 0, 5])  # lengths 1, 2, 3 seen before this slice
    np.testing.assert_array_equal(length_ranks(lengths, before), [5, 10, 6, 0, 7, 11])


@settings(max_examples=20, deadline=None, derandomize=True)
@given(counts=st.lists(st.integers(0, 40), min_size=4, max_size=32), k=st.integers(1, 4),
       cuts=st.lists(st.floats(0, 1), max_size=6), seed=st.integers(0, 2**32))
def test_slices_placed_on_their_own_land_where_the_whole_corpus_does(counts, k, cuts, seed):
    size = len(counts)
    if sum(counts) == 0:
        counts[-1] = 1
    lengths = np.repeat(np.arange(1, size + 1), counts)
    np.random.default_rng(seed).shuffle(lengths)
    plan = plan_packing(histogram_from_lengths(lengths, size), size, k)
    whole = assign_sequences(plan, lengths, seed)
    pack_of = np.repeat(np.arange(len(whole)), whole.sizes)[np.argsort(whole.indices)]  # (N,) pack of each
    slot_map = SlotMap(plan, seed)
    bounds = sorted({0, len(lengths)} | {int(c * len(lengths)) for c in cuts})
    for a, b in zip(bounds[:-1], bounds[1:]):
        before = np.bincount(lengths[:a] - 1, minlength=size)
        packs, slots = slot_map.place(lengths[a:b], length_ranks(lengths[a:b], before))
        np.testing.assert_array_equal(packs, pack_of[a:b])
        # slot q of a pack is its q-th member, longest first
        for i, (p, q) in enumerate(zip(packs.tolist(), slots.tolist())):
            assert whole[p][q] == a + i
        np.testing.assert_array_equal(slot_map.pack_sizes(packs), whole.sizes[packs])
    hist = slot_map.sequences_per_pack_histogram(k)
    np.testing.assert_array_equal(hist, np.bincount(whole.sizes - 1, minlength=k))
