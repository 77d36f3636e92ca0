"""Histogram packing: histogram -> plan -> assignment of real sequences.

Public API:

    plan = plan_packing(histogram, max_seq_length, max_sequences_per_pack, algorithm="optimal")
    packs = assign_sequences(plan, lengths, seed)

`histogram[i]` counts sequences of length i + 1. `max_sequences_per_pack` is an int >= 1
or None (unbounded).
"""

from .plan import PackingPlan, plan_packing, ALGORITHMS
from .assign import PackAssignment, assign_sequences, histogram_from_lengths

__all__ = [
    "ALGORITHMS",
    "PackingPlan",
    "plan_packing",
    "PackAssignment",
    "assign_sequences",
    "histogram_from_lengths",
]
