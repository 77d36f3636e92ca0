import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ipu_packing.packing import PackAssignment, assign_sequences, histogram_from_lengths, plan_packing


def lengths_for(hist, seed):
    lengths = np.repeat(np.arange(1, len(hist) + 1), hist)
    np.random.default_rng(seed).shuffle(lengths)
    return lengths


def check_assignment(packs, plan, lengths):
    n = len(lengths)
    assert isinstance(packs, PackAssignment)
    assert packs.indices.dtype == np.int64 and packs.offsets.dtype == np.int64
    assert len(packs) == plan.num_packs
    assert packs.offsets[0] == 0 and packs.offsets[-1] == n
    # every sequence exactly once
    np.testing.assert_array_equal(np.sort(packs.indices), np.arange(n))
    # each pack is one of the plan's strategies (longest first), used as often as planned
    used = {}
    for pack in packs:
        key = tuple(int(v) for v in lengths[pack])
        assert sum(key) <= plan.max_seq_length
        assert len(key) <= (plan.max_sequences_per_pack or plan.max_seq_length)
        used[key] = used.get(key, 0) + 1
    assert used == {s: int(r) for s, r in zip(plan.strategies, plan.repeats)}


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    size=st.integers(8, 40),
    limit=st.one_of(st.none(), st.integers(1, 5)),
    counts=st.lists(st.integers(0, 30), min_size=1, max_size=40),
    algorithm=st.sampled_from(["optimal", "lpfhp", "spfhp"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_assignment_places_every_sequence_once(size, limit, counts, algorithm, seed):
    counts = counts[:size]
    if sum(counts) == 0:
        counts[0] = 1
    hist = histogram_from_lengths(lengths_for(counts, 0), size)
    plan = plan_packing(hist, size, limit, algorithm)
    lengths = lengths_for(counts, seed)
    packs = assign_sequences(plan, lengths, seed)
    check_assignment(packs, plan, lengths)
    assert np.array_equal(packs.sizes, [len(p) for p in packs])


def test_assignment_is_seeded_and_shuffles_within_lengths():
    hist = np.zeros(64, dtype=np.int64)
    hist[[9, 19, 29, 63]] = [300, 300, 300, 50]
    lengths = np.repeat(np.arange(1, 65), hist)  # sorted: order alone would bias the packs
    plan = plan_packing(hist, 64, 3)
    first = assign_sequences(plan, lengths, seed=7)
    again = assign_sequences(plan, lengths, seed=7)
    other = assign_sequences(plan, lengths, seed=8)
    check_assignment(first, plan, lengths)
    assert first.indices.tobytes() == again.indices.tobytes()
    assert first.offsets.tobytes() == again.offsets.tobytes()
    assert first.indices.tobytes() != other.indices.tobytes()
    # within one length the packs take the sequences in a shuffled order, not index order
    tens = np.concatenate([p[lengths[p] == 10] for p in first])
    assert sorted(tens.tolist()) == list(range(300))
    assert tens.tolist() != list(range(300))


def test_assignment_rejects_lengths_that_do_not_match_the_plan():
    plan = plan_packing([2, 2], 4, None)
    with pytest.raises(ValueError, match="do not match"):
        assign_sequences(plan, np.array([1, 1, 2]), seed=0)
    with pytest.raises(ValueError, match="1..4"):
        assign_sequences(plan, np.array([1, 1, 2, 5]), seed=0)


def test_histogram_from_lengths():
    np.testing.assert_array_equal(histogram_from_lengths([3, 1, 3, 4], 5), [1, 0, 2, 1, 0])
    with pytest.raises(ValueError, match="1..5"):
        histogram_from_lengths([0, 1], 5)
    with pytest.raises(ValueError, match="integers"):
        histogram_from_lengths([1.5], 5)


def test_assignment_memory_is_a_few_bytes_per_sequence():
    # the output itself is 8 bytes a sequence (indices) + 8 a pack (offsets); the rest is an int32
    # grouping by length and the packs' starts. (It once took 92 bytes a sequence: 1,436 MiB traced
    # for Wikipedia's 16.3M.)
    import tracemalloc

    size = 128
    hist = np.zeros(size, dtype=np.int64)
    hist[:] = 4000
    hist[size - 1] = 600000  # a spike at full length, as in Wikipedia's lengths
    hist[10:40] = 20000
    plan = plan_packing(hist, size, 3, "lpfhp")
    lengths = lengths_for(hist, 0)
    tracemalloc.start()
    try:
        packs = assign_sequences(plan, lengths, seed=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert packs.offsets[-1] == len(lengths) == 1588000
    assert peak / len(lengths) < 40, peak / len(lengths)
