"""Shared pieces of the packing tests: the check that a plan holds exactly its histogram within the limits
(tests/test_packing_plan.py and the packing tests after it) and a synthetic length histogram (the bench tests)."""

import numpy as np


def check_plan(plan, histogram, max_seq_length, max_sequences_per_pack):
    """Asserts that a plan holds exactly the histogram within the limits."""
    hist = np.zeros(max_seq_length, dtype=np.int64)
    hist[: len(histogram)] = histogram
    limit = max_sequences_per_pack or max_seq_length
    placed = np.zeros(max_seq_length, dtype=np.int64)
    tokens = 0
    assert len(plan.strategies) == len(plan.repeats)
    assert len(set(plan.strategies)) == len(plan.strategies)
    for strategy, count in zip(plan.strategies, plan.repeats):
        assert count >= 1
        assert 1 <= len(strategy) <= limit
        assert sum(strategy) <= max_seq_length
        assert list(strategy) == sorted(strategy, reverse=True)
        for length in strategy:
            placed[length - 1] += count
        tokens += sum(strategy) * int(count)
    np.testing.assert_array_equal(placed, hist)
    np.testing.assert_array_equal(plan.histogram, hist)
    assert plan.num_packs == int(np.asarray(plan.repeats).sum())
    assert plan.num_sequences == int(hist.sum())
    assert plan.num_tokens == tokens
    assert abs(plan.efficiency - tokens / (plan.num_packs * max_seq_length)) < 1e-12
    assert abs(plan.theoretical_speedup - hist.sum() / plan.num_packs) < 1e-12


def synthetic_histogram(S=64):
    hist = np.zeros(S)
    hist[5:20] = 30  # short sequences
    hist[S - 1] = 200  # many full-length ones
    hist[30:40] = 20
    return hist
