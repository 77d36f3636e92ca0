"""The one timing harness of every throughput bench: warm-up, the order of the calls, repeats, the record, the
report's rows.

    timings = measure([Contender(name, batches, call, sequences=n), ...], repeats=3, order="calls",
                      reset=restore_weights)
    timings.median(i)          # contender i's seconds for one pass over its batches, the median over repeats
    rows(timings, {"ratio": "transformers padded"})   # each contender's sequences/s, and over the baseline's

1. Warm-up: each contender's first batch (or its ``warmup`` batch) once, untimed (allocations, kernel choices,
   lazy imports); then ``reset`` (the initial weights back, say). With ``keep_going`` a contender whose warm-up
   raises is left out and named in ``failed``; without it the error propagates (a failing contender is a bug).
2. ``repeats`` passes over every batch of every contender, in one of two orders (``ORDERS``):
   - ``calls``: the calls interleaved in proportion: the contender whose next batch is due soonest, by its
     fraction of its own batches, goes next (two padded calls per packed one at a packing factor of 2), so a
     busy period of a shared machine slows every contender alike. Each call then starts after another
     contender's, its weights and optimizer state evicted from the caches by the other's: the order for a
     machine under load, and a penalty on the contender whose calls are shortest.
   - ``passes``: each contender's pass back to back, the contenders' order rotated each repeat (none always
     first): a training run's or a server's steady state, every call after one of its own. Load is then
     evened out across repeats only (their median), not within one.
3. Each call timed alone, wall and CPU seconds (``before`` and ``after`` run outside the timing: attaching a
   poptorch executable, an optimizer's zero_grad). On CUDA the device is synchronised around each call and the
   peak bytes a call allocated beyond what was allocated before it are kept. ``os.getloadavg()`` is recorded
   before and after.
4. ``rows``: what a report says of each contender (its sequences/s over the median pass, ratios to baselines),
   ``table`` its lines.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import one_line

ORDERS = {"calls": "calls interleaved in proportion", "passes": "each pass back to back"}
"""The orders of a repeat's calls (the module docstring), and the words a report says them in."""


@dataclass
class Contender:
    """One contender: its batches (one per timed call) and the call that runs one."""

    name: str
    batches: Sequence[Any]
    call: Callable[[Any], Any]
    after: Optional[Callable[[], None]] = None
    """Run after each call, untimed (an optimizer's zero_grad, a poptorch executable detached)."""
    before: Optional[Callable[[], None]] = None
    """Run before each call, untimed (a poptorch executable attached)."""
    warmup: Any = None
    """The warm-up call's batch, where it is not the first of ``batches``."""
    sequences: int = 0
    """Sequences of one pass over ``batches``: what the report's rate counts."""
    computed_tokens: int = 0
    """Positions one pass computes, padding included (rows x row length); 0 where the bench does not count them."""


@dataclass
class Timings:
    """What ``measure`` records, per contender timed (in ``contenders``' order)."""

    contenders: List[Contender]
    """The contenders timed: every one given, less those whose warm-up failed under ``keep_going``."""
    seconds: List[List[float]]
    """Seconds of each repeat's pass over the contender's batches."""
    calls: List[List[float]]
    """Seconds of each timed call, in the order they ran, every repeat."""
    cpu: List[List[float]]
    """This process's CPU seconds of each timed call (``calls``' order): time spent descheduled by other
    processes does not count, the steadier measure of a single-threaded call on a shared machine."""
    warmup: List[float]
    """Seconds of the warm-up call."""
    peaks: List[Optional[int]]
    """The largest bytes a call allocated beyond what was allocated before it (CUDA), else None."""
    failed: List[str] = field(default_factory=list)
    """``"name: error"`` of each contender left out."""
    load_before: List[float] = field(default_factory=list)
    load_after: List[float] = field(default_factory=list)

    def median(self, i: int) -> float:
        """Contender ``i``'s seconds for one pass, the median over repeats."""
        return statistics.median(self.seconds[i])


def rows(timings: Timings, baselines: Dict[str, str]) -> List[Dict[str, Any]]:
    """The report's row of each contender timed: name, calls (of one pass), sequences, computed_tokens, seconds
    (each repeat's pass), sequences_per_second (over the median pass) and step_memory_bytes (CUDA: the most a call
    allocated beyond what was allocated before it; else None); and for each ``baselines`` key, its sequences/s
    over that of the contender named (NaN if that one failed)."""
    out = [dict(name=c.name, calls=len(c.batches), sequences=c.sequences, computed_tokens=c.computed_tokens,
                seconds=timings.seconds[i], sequences_per_second=c.sequences / timings.median(i),
                step_memory_bytes=timings.peaks[i]) for i, c in enumerate(timings.contenders)]
    speed = {row["name"]: row["sequences_per_second"] for row in out}
    for row in out:
        for key, name in baselines.items():
            row[key] = row["sequences_per_second"] / speed.get(name, float("nan"))
    return out


def table(rows: Sequence[Dict[str, Any]], columns: Sequence[Tuple[str, int, Callable[[Dict[str, Any]], str]]]
          ) -> List[str]:
    """``rows`` as fixed-width lines under a header: each column (header, width, cell of a row), the first one
    left-aligned (the contender's name), the others right-aligned."""
    def line(cells):
        return " ".join(cell.ljust(width) if j == 0 else cell.rjust(width)
                        for j, (cell, (_, width, _)) in enumerate(zip(cells, columns)))

    return [line([header for header, _, _ in columns])] + [line([cell(row) for _, _, cell in columns]) for row in rows]


def progress(quiet: bool = False) -> Callable[[str], None]:
    """A bench's progress log: each message a line on stderr (flushed), or nothing when ``quiet`` (``--json``)."""
    if quiet:
        return lambda message: None
    import sys

    return lambda message: print(message, file=sys.stderr, flush=True)


def restorer(models: Sequence[Any], optimizers: Sequence[Any] = ()) -> Callable[[], None]:
    """``measure``'s ``reset``: every model's weights back as they are now (host copies), every optimizer's
    state emptied."""
    saved = [(m, {k: v.detach().cpu().clone() for k, v in m.state_dict().items()}) for m in models]

    def reset() -> None:
        for model, state in saved:
            model.load_state_dict(state)
        for optimizer in optimizers:
            optimizer.state.clear()

    return reset


def load_line(before: Sequence[float], after: Sequence[float]) -> str:
    """``os.getloadavg()`` before and after, as every report says it."""
    return "load average before %s, after %s" % (" ".join("%.2f" % x for x in before),
                                                 " ".join("%.2f" % x for x in after))


def schedule(counts: Sequence[int], order: str = "calls", repeat: int = 0) -> List[Tuple[int, int]]:
    """(contender, batch) in the order of one pass over ``counts`` batches of each contender, repeat ``repeat``."""
    if order == "passes":
        n = len(counts)
        return [(i, b) for i in [(repeat + j) % n for j in range(n)] for b in range(counts[i])]
    return [(i, b) for _, i, b in sorted(((b + 0.5) / n, i, b) for i, n in enumerate(counts) for b in range(n))]


def _timed(contender: Contender, batch: Any, torch: Any, cuda: bool) -> Tuple[float, float, Optional[int]]:
    """(seconds, this process's CPU seconds, peak bytes beyond what was allocated before: CUDA only) of one call."""
    if contender.before is not None:
        contender.before()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        allocated = torch.cuda.memory_allocated()
    try:
        start, start_cpu = time.perf_counter(), time.process_time()
        contender.call(batch)
        if cuda:
            torch.cuda.synchronize()
        seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    finally:
        if contender.after is not None:
            contender.after()
    return seconds, cpu, torch.cuda.max_memory_allocated() - allocated if cuda else None


def measure(contenders: Sequence[Contender], repeats: int = 1, order: str = "calls",
            reset: Optional[Callable[[], None]] = None, keep_going: bool = False, torch: Any = None,
            cuda: bool = False, log: Callable[[str], None] = lambda message: None) -> Timings:
    """The module docstring's steps 1-3."""
    if order not in ORDERS:
        raise ValueError("order %r: one of %s" % (order, ", ".join(ORDERS)))
    load_before = list(os.getloadavg())
    timed, warmup, failed = [], [], []
    for c in contenders:
        try:
            warmup.append(_timed(c, c.batches[0] if c.warmup is None else c.warmup, torch, cuda)[0])
        except Exception as exc:
            if not keep_going:
                raise
            failed.append("%s: %s: %s" % (c.name, type(exc).__name__, one_line(exc)[:300]))
            log("failed " + failed[-1])
            if cuda:
                torch.cuda.empty_cache()
        else:
            timed.append(c)
    if reset is not None:
        reset()
    seconds: List[List[float]] = [[] for _ in timed]
    calls: List[List[float]] = [[] for _ in timed]
    cpu: List[List[float]] = [[] for _ in timed]
    peaks: List[Optional[int]] = [None] * len(timed)
    for r in range(repeats):
        passes = [0.0] * len(timed)
        for i, b in schedule([len(c.batches) for c in timed], order, r):
            s, process, peak = _timed(timed[i], timed[i].batches[b], torch, cuda)
            passes[i] += s
            calls[i].append(s)
            cpu[i].append(process)
            if peak is not None:
                peaks[i] = max(peaks[i] or 0, peak)
        for i, s in enumerate(passes):
            seconds[i].append(s)
        log("repeat %d of %d: %s" % (r + 1, repeats, ", ".join("%s %.2f s" % (c.name, s)
                                                               for c, s in zip(timed, passes))))
    return Timings(timed, seconds, calls, cpu, warmup, peaks, failed, load_before, list(os.getloadavg()))


__all__ = ["Contender", "ORDERS", "Timings", "load_line", "measure", "progress", "restorer", "rows", "schedule",
           "table"]
