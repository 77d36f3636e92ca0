"""The one timing harness of the throughput benches: every contender's calls interleaved in proportion.

    seconds, peaks = interleaved([(batches, step, after), ...])

One pass over every batch of every contender, the calls interleaved in proportion: the contender whose next batch
is due soonest, by its fraction of its own batches, goes next (two padded calls per packed one at a packing
factor of 2), so that a busy period of a shared machine slows every contender alike. Each call is timed alone
(``after`` runs outside the timing: an optimizer's zero_grad, a CUDA cache release). On CUDA the device is
synchronised around each call and the peak bytes a call allocated beyond what was allocated before it are
kept. ``repeat`` runs the pass ``repeats`` times after one warm-up call of each contender.
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

Contender = Tuple[Sequence[Any], Callable[[Any], Any], Optional[Callable[[], None]]]
"""(batches, the call that times one batch, what runs after it untimed or None)."""


def schedule(counts: Sequence[int]) -> List[Tuple[int, int]]:
    """(contender, batch) in the order of one interleaved pass over ``counts`` batches of each contender."""
    return [(i, b) for _, i, b in sorted(((b + 0.5) / n, i, b) for i, n in enumerate(counts) for b in range(n))]


def interleaved(contenders: Sequence[Contender], torch: Any = None,
                cuda: bool = False) -> Tuple[List[float], List[Optional[int]]]:
    """(seconds of each contender, its calls' peak bytes beyond what was allocated before them: CUDA only, else
    None) for one interleaved pass."""
    seconds = [0.0] * len(contenders)
    peaks: List[Optional[int]] = [None] * len(contenders)
    for i, b in schedule([len(batches) for batches, _, _ in contenders]):
        batches, call, after = contenders[i]
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        start = time.perf_counter()
        call(batches[b])
        if cuda:
            torch.cuda.synchronize()
        seconds[i] += time.perf_counter() - start
        if cuda:
            peaks[i] = max(peaks[i] or 0, torch.cuda.max_memory_allocated() - before)
        if after is not None:
            after()
    return seconds, peaks


def warm_up(contenders: Sequence[Contender]) -> None:
    """Each contender's first call, untimed (allocations, kernel choices, lazy imports)."""
    for batches, call, after in contenders:
        call(batches[0])
        if after is not None:
            after()


__all__ = ["Contender", "interleaved", "schedule", "warm_up"]
