import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ipu_packing.packing import ALGORITHMS, plan_packing
from packing_fixtures import check_plan


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_small_exact_instance(algorithm):
    # lengths 6, 6, 4, 4 into packs of 10: two packs (6 + 4) with K >= 2, four with K = 1
    hist = np.zeros(10, dtype=np.int64)
    hist[5] = 2
    hist[3] = 2
    plan = plan_packing(hist, 10, 2, algorithm)
    check_plan(plan, hist, 10, 2)
    assert plan.num_packs == 2
    assert plan.strategies == ((6, 4),)
    assert plan.efficiency == 1.0
    plan1 = plan_packing(hist, 10, 1, algorithm)
    check_plan(plan1, hist, 10, 1)
    assert plan1.num_packs == 4


def test_optimal_is_certified_on_a_known_instance():
    # 3 x 5 and 3 x 4 and 3 x 1 into 10 with K = 3: 3 packs of 5 + 4 + 1 are optimal
    hist = np.zeros(10, dtype=np.int64)
    hist[[4, 3, 0]] = 3
    plan = plan_packing(hist, 10, 3)
    check_plan(plan, hist, 10, 3)
    assert plan.num_packs == 3
    assert plan.lower_bound_integer == 3
    assert plan.packs_above_bound == 0


def test_histogram_shorter_than_max_length_is_padded():
    plan = plan_packing([0, 3], 8, None, "lpfhp")
    assert len(plan.histogram) == 8
    assert plan.strategies == ((2, 2, 2),)
    assert plan.num_packs == 1


def test_unbounded_and_large_counts():
    hist = np.full(8, 10**8, dtype=np.int64)
    plan = plan_packing(hist, 8, None)
    check_plan(plan, hist, 8, None)
    # 36 tokens per 8 sequences: 4.5e8 packs of 8 tokens, all full
    assert plan.num_packs == 450_000_000
    assert plan.lower_bound_integer == 450_000_000


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(histogram=[], max_seq_length=8), "empty"),
        (dict(histogram=[1, -2, 3], max_seq_length=8), "negative"),
        (dict(histogram=[0, 0], max_seq_length=8), "no sequences"),
        (dict(histogram=[1] * 9, max_seq_length=8), "9 bins"),
        (dict(histogram=[1, 2], max_seq_length=8, max_sequences_per_pack=0), ">= 1"),
        (dict(histogram=[1, 2], max_seq_length=8, max_sequences_per_pack=True), "integer"),
        (dict(histogram=[1, 2], max_seq_length=8, max_sequences_per_pack=2.5), "integer"),
        (dict(histogram=[1, 2], max_seq_length=0), ">= 1"),
        (dict(histogram=[1.5, 2], max_seq_length=8), "whole numbers"),
        (dict(histogram=[[1, 2]], max_seq_length=8), "one-dimensional"),
        (dict(histogram=[1, 2], max_seq_length=8, algorithm="ffd"), "unknown packing algorithm"),
    ],
)
def test_bad_input_raises_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_packing(**kwargs)


@st.composite
def histograms(draw):
    size = draw(st.integers(8, 48))
    limit = draw(st.one_of(st.none(), st.integers(1, 6)))
    dense = draw(st.booleans())
    top = draw(st.sampled_from([3, 1000, 10**8]))
    if dense:
        counts = draw(st.lists(st.integers(0, top), min_size=size, max_size=size))
    else:
        counts = [0] * size
        for length in draw(st.lists(st.integers(1, size), min_size=1, max_size=6)):
            counts[length - 1] = draw(st.integers(1, top))
    if sum(counts) == 0:
        counts[draw(st.integers(0, size - 1))] = 1
    return np.asarray(counts, dtype=np.int64), size, limit


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(histograms())
@pytest.mark.slow
def test_every_algorithm_places_every_sequence_within_limits(case):
    hist, size, limit = case
    plans = {name: plan_packing(hist, size, limit, name) for name in ALGORITHMS}
    for plan in plans.values():
        check_plan(plan, hist, size, limit)
    best = plans["optimal"]
    bound = best.lower_bound_integer
    assert bound is not None and best.lower_bound_packs > 0
    for name, plan in plans.items():
        # optimal is never worse than any algorithm, and no plan beats the LP bound
        assert best.num_packs <= plan.num_packs, name
        assert bound <= plan.num_packs, name
    # the bound is at least the trivial bounds
    tokens = int((hist * np.arange(1, size + 1)).sum())
    assert bound >= -(-tokens // size)
    assert bound >= -(-int(hist.sum()) // (limit or size))
