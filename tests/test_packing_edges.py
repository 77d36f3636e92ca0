"""Histograms at the edges of exact arithmetic: refused with one line, or planned exactly."""

import numpy as np
import pytest

from ipu_packing.packing import plan_packing
from ipu_packing.packing.plan import MAX_SEQ_LENGTH

from packing_fixtures import check_plan


@pytest.mark.parametrize(
    "histogram, size, message",
    [
        ([0] * 511 + [10**18], 512, "too large"),  # used to report a negative efficiency
        ([2**53], 8, "too large"),
        (np.array([2**63 + 5], dtype=np.uint64), 8, "too large"),  # would wrap negative as int64
        ([2.0**60], 8, "too large"),
        ([2**53 - 1] * 600, 600, "below 2\\*\\*62"),  # each count exact, the token total is not
        ([1, float("inf")], 8, "finite"),
        ([1], MAX_SEQ_LENGTH + 1, "at most"),
        ([1], 10**11, "at most"),  # refused before an (S,) array is allocated
    ],
)
def test_refused(histogram, size, message):
    with pytest.raises(ValueError, match=message):
        plan_packing(histogram, size, 3)


@pytest.mark.parametrize("algorithm", ["spfhp", "lpfhp", "optimal"])
def test_largest_exact_counts_are_planned_exactly(algorithm):
    hist = [2**53 - 1, 0, 3, 2**52 + 1]
    plan = plan_packing(hist, 4, None, algorithm)
    check_plan(plan, hist, 4, None)
    tokens = (2**53 - 1) + 3 * 3 + 4 * (2**52 + 1)
    assert plan.num_tokens == tokens
    assert 0 < plan.efficiency <= 1
    assert plan.num_packs >= -(-tokens // 4)
