"""The streaming assignment (packing/slots.py): a slice placed on its own lands where the whole
corpus placed at once puts it, and its permutations are bijections."""

import hashlib
import pickle

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ipu_packing.packing import assign_sequences, histogram_from_lengths, permutation, plan_packing
from ipu_packing.packing.plan import PackingPlan
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


# --- the map itself, pinned: prepared data and the golden losses are made with it -------------------

_MASK64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def reference_permutation(n, seed, spawn_key, x, forward=True):
    """KeyedPermutation's documented recipe in plain Python integers, one point at a time: a
    6-round Feistel network on [0, 2^b), b >= 2 the fewest bits that hold n values, a value being
    a high part of ceil(b/2) bits and a low part of floor(b/2) that trade places each round;
    cycle-walked into [0, n)."""
    bits = max(2, (max(n, 1) - 1).bit_length())
    high, low = (bits + 1) // 2, bits // 2
    keys = [int(k) for k in np.random.SeedSequence(seed, spawn_key=spawn_key).generate_state(6, np.uint64)]
    while True:
        left, right = x >> low, x & ((1 << low) - 1)
        for i in range(6) if forward else range(5, -1, -1):
            mask = (1 << (high if i % 2 == 0 else low)) - 1  # round i xors into the part of this width
            if forward:
                left, right = right, left ^ (_splitmix64(right ^ keys[i]) & mask)
            else:
                left, right = right ^ (_splitmix64(left ^ keys[i]) & mask), left
        x = (left << low) | right
        if x < n:
            return x


@pytest.mark.parametrize("n, spawn_key", [(1, (0,)), (2, (5,)), (3, (1, 9)), (5, (4,)), (1000, (3,)), (70000, ()),
                                          (8143857, (0,)), (2**33 + 1, (7,)), (2**40 + 7, (2,))])
def test_keyed_permutation_is_the_documented_feistel_network(n, spawn_key):
    # tables (h <= 16) or arithmetic (h > 16), pool walk or the whole small domain at once: one map
    perm = KeyedPermutation(n, 12345, *spawn_key)
    x = np.unique(np.concatenate([np.arange(min(n, 50)), np.random.default_rng(0).integers(0, n, 200)]))
    expected = [reference_permutation(n, 12345, spawn_key, int(v)) for v in x]
    np.testing.assert_array_equal(perm(x), expected)
    back = [reference_permutation(n, 12345, spawn_key, int(v), forward=False) for v in x]
    np.testing.assert_array_equal(perm.inverse(x), back)
    if n <= 70000:  # all of it at once (SlotMap.assign's way) agrees too
        np.testing.assert_array_equal(perm._everywhere(True)[x], expected)
        np.testing.assert_array_equal(perm._everywhere(False)[x], back)


def test_keyed_permutation_values_are_those_of_the_prepared_data():
    # recorded when the domain became 2^b (it was 4^h: the same map where b is even, as for n = 1000)
    assert KeyedPermutation(1000, 5, 3)(np.arange(0, 1000, 97)).tolist() == \
        [196, 525, 476, 722, 509, 12, 576, 20, 382, 618, 374]
    big = KeyedPermutation(2**40 + 7, 1, 2)
    x = np.array([0, 1, 2**39, 2**40 + 6])
    assert big(x).tolist() == [385676572931, 328434159649, 1059005067480, 570678533165]
    assert big.inverse(x).tolist() == [227772619293, 766299938600, 1034081505895, 573308739411]
    assert KeyedPermutation(70000, 9)(np.arange(0, 70000, 6999)).tolist() == \
        [57027, 4906, 2446, 44103, 20329, 10721, 44048, 5792, 46797, 58950, 29019]


@pytest.mark.parametrize("n", [1000, 3000, 5000, 70000])  # b = 10, 12, 13, 17: balanced and not
def test_keyed_permutation_looks_like_a_random_one(n):
    # where a value lands is independent of where it starts, in its high bits and in its low ones:
    # chi-square of the 8 x 8 contingency tables (49 degrees of freedom: mean 49, sd 9.9)
    x = np.arange(n)
    for key in range(3):
        y = KeyedPermutation(n, 2024, key)(x)
        for cells in ((x * 8 // n, y * 8 // n), (x % 8, y % 8)):
            table = np.bincount(cells[0] * 8 + cells[1], minlength=64).reshape(8, 8).astype(float)
            expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / n
            assert ((table - expected) ** 2 / expected).sum() < 49 + 6 * 9.9
        assert np.sum(y == x) < 10  # a random permutation has 1 fixed point on average
        assert abs(np.corrcoef(x, y)[0, 1]) < 5 / np.sqrt(n)


def explicit_plan(scale=1):
    """A plan written out by hand (no planner involved): S = 16, K = 3."""
    strategies = ((16,), (12, 4), (9, 7), (8, 5, 3), (6, 6, 2), (10,), (1,))
    repeats = np.array([3000, 2500, 4000, 2000, 1500, 1000, 7], dtype=np.int64) // scale
    histogram = np.zeros(16, dtype=np.int64)
    for strategy, count in zip(strategies, repeats):
        for length in strategy:
            histogram[length - 1] += count
    return PackingPlan(algorithm="explicit", max_seq_length=16, max_sequences_per_pack=3, histogram=histogram,
                       strategies=strategies, repeats=repeats)


def test_assignment_and_placement_are_those_of_the_prepared_data():
    # recorded when the domain became 2^b
    plan = explicit_plan()
    lengths = np.repeat(np.arange(1, 17), plan.histogram)
    np.random.default_rng(5).shuffle(lengths)
    packs = assign_sequences(plan, lengths, seed=11)
    assert (len(lengths), len(packs)) == (27507, 14007)
    assert [packs[p].tolist() for p in (0, 1, 2, 9006)] == [[2821, 19991], [3866, 4882], [15078, 20101],
                                                              [249, 23359, 2063]]
    digest = hashlib.sha256(packs.indices.tobytes() + packs.offsets.tobytes()).hexdigest()
    assert digest == "1f7953ef019cbdcd7202e541ef801fa67870dc750444b72481bdfe986d7e8f08"
    before = np.bincount(lengths[:1000] - 1, minlength=16)
    pack, slot = SlotMap(plan, 11).place(lengths[1000:1010], length_ranks(lengths[1000:1010], before))
    assert pack.tolist() == [10080, 10821, 6992, 3112, 6492, 8392, 2042, 10137, 8887, 1806]
    assert slot.tolist() == [0, 0, 0, 0, 1, 1, 0, 1, 0, 0]


ROUTES = [(2, 1 << 14), (37, 1 << 14), (1000, 1 << 14), (64, 0), (64, 1 << 20)]  # (chunk, SMALL_DOMAIN)


@pytest.mark.parametrize("chunk, small_domain", ROUTES)
def test_keyed_permutation_chunk_size_and_route_change_nothing(monkeypatch, chunk, small_domain):
    x = np.random.default_rng(2).integers(0, 5000, 3000)
    for n in (5000, 20000):  # small domain (4^7) and not (4^8)
        perm = KeyedPermutation(n, 4, 8)
        expected = perm(x), perm.inverse(x), perm._everywhere(True), perm._everywhere(False)
        with monkeypatch.context() as patch:
            patch.setattr(permutation, "SMALL_DOMAIN", small_domain)
            perm = KeyedPermutation(n, 4, 8)
            got = perm(x, chunk=chunk), perm.inverse(x, chunk=chunk), perm._everywhere(True, chunk), \
                perm._everywhere(False, chunk)
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)


def test_keyed_permutation_refuses_arguments_outside_its_domain():
    perm = KeyedPermutation(10, 0)
    for bad in ([-1], [10], [0.5]):
        with pytest.raises(ValueError):
            perm(np.array(bad))
        with pytest.raises(ValueError):
            perm.inverse(np.array(bad))


def test_a_slot_map_pickles_small_after_use():
    # the round tables are rebuilt where used, not shipped to every worker
    plan = explicit_plan()
    slot_map = SlotMap(plan, 0)
    lengths = np.repeat(np.arange(1, 17), plan.histogram)
    ranks = length_ranks(lengths, np.zeros(16, np.int64))
    placed = slot_map.place(lengths, ranks)  # builds the tables of every permutation
    assert len(pickle.dumps(slot_map)) < 20000
    restored = pickle.loads(pickle.dumps(slot_map))
    for got, want in zip(restored.place(lengths, ranks), placed):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("chunk, small_domain", ROUTES)
def test_slot_map_chunk_size_and_route_change_nothing(monkeypatch, chunk, small_domain):
    plan = explicit_plan(scale=10)  # 2,746 sequences
    lengths = np.repeat(np.arange(1, 17), plan.histogram)
    np.random.default_rng(1).shuffle(lengths)
    expected = assign_sequences(plan, lengths, seed=4)  # default chunk, default route
    before = np.bincount(lengths[:100] - 1, minlength=16)
    ranks = length_ranks(lengths[100:900], before)
    placed = SlotMap(plan, 4).place(lengths[100:900], ranks)
    monkeypatch.setattr(permutation, "SMALL_DOMAIN", small_domain)
    slot_map = SlotMap(plan, 4)
    indices, offsets = slot_map.assign(lengths, chunk=chunk)
    np.testing.assert_array_equal(indices, expected.indices)
    np.testing.assert_array_equal(offsets, expected.offsets)
    for got, want in zip(slot_map.place(lengths[100:900], ranks, chunk=chunk), placed):
        np.testing.assert_array_equal(got, want)


def test_lengths_of_any_integer_type_are_ranked_and_placed_alike():
    plan = explicit_plan(scale=10)
    lengths = np.repeat(np.arange(1, 17), plan.histogram)
    np.random.default_rng(3).shuffle(lengths)
    before = np.zeros(16, dtype=np.int64)
    ranks = length_ranks(lengths, before)
    slot_map = SlotMap(plan, 2)
    pack, slot = slot_map.place(lengths, ranks)
    whole = assign_sequences(plan, lengths, seed=2)
    for dtype in (np.uint8, np.int16, np.uint16, np.int32, np.uint64):
        np.testing.assert_array_equal(length_ranks(lengths.astype(dtype), before), ranks)
        for got, want in zip(slot_map.place(lengths.astype(dtype), ranks), (pack, slot)):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(assign_sequences(plan, lengths.astype(dtype), seed=2).indices, whole.indices)


def test_bad_lengths_and_ranks_are_refused():
    with pytest.raises(ValueError, match="1..3"):
        length_ranks(np.array([1, 4]), np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="1..3"):
        length_ranks(np.array([0, 1]), np.zeros(3, np.int64))
    slot_map = SlotMap(explicit_plan(scale=1000), 0)  # 3 packs of (16,), 2 of (12, 4), 4 of (9, 7), ...
    with pytest.raises(ValueError, match="more sequences"):
        slot_map.place(np.array([16]), np.array([3]))
    with pytest.raises(ValueError, match="negative"):
        slot_map.place(np.array([16]), np.array([-1]))
    with pytest.raises(ValueError, match="1..16"):
        slot_map.place(np.array([17]), np.array([0]))
    with pytest.raises(ValueError, match="histogram"):
        slot_map.assign(np.array([16, 16]))
