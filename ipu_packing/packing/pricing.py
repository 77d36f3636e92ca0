"""Exact pricing for the cutting-stock LP (optimal.py): the knapsack ``max y.a`` over feasible patterns,
in integer arithmetic on a dyadic grid of duals.

Duals come from the LP solver as floats; ``grid_duals`` rounds them to nearest on a grid of
2**-DUAL_GRID_BITS and holds them as int64. Everything here is integer arithmetic from then on, so its
result does not depend on the order of a sum, numpy's SIMD dispatch or BLAS (optimal.py, "Exact
decisions"). Shape legend: n distinct lengths, f frontier items, S max sequence length, K max items.
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

DUAL_GRID_BITS = 32
ONE = 1 << DUAL_GRID_BITS  # a dual of 1 on the grid
NEW_COLUMNS_PER_ROUND = 64  # best patterns per round from leading pairs (and as many from single leads)
PAIR_LEADS_MAX = 1500  # frontier size above which only single leading items are tried

Column = Tuple[np.ndarray, np.ndarray, bytes]  # (rows int32 ascending, counts int64, key)


def make_column(rows) -> Column:
    """A pattern from the row index of each item it holds (repeats allowed)."""
    rows, counts = np.unique(np.asarray(rows, dtype=np.int32), return_counts=True)
    counts = counts.astype(np.int64)
    return rows, counts, rows.tobytes() + counts.astype(np.int32).tobytes()


def grid_duals(duals: np.ndarray) -> np.ndarray:
    """(n,) int64: duals in [0, 1] on the grid (units of 2**-DUAL_GRID_BITS), rounded to nearest."""
    return np.rint(np.clip(np.asarray(duals, dtype=np.float64), 0.0, 1.0) * ONE).astype(np.int64)


def column_value(duals: np.ndarray, column: Column) -> int:
    """y.a on the grid (exact)."""
    return int((duals[column[0]] * column[1]).sum())



class Pricing:
    """Exact pricing on the grid: best pattern value ``max y.a`` under length S and at most K items."""

    def __init__(self, lengths: np.ndarray, size: int, limit: int) -> None:
        self.lengths = lengths  # (n,) ascending distinct lengths
        self.size = size
        self.limit = limit
        # Rounding each dual moves a pattern's value by at most half a unit per item.
        # A column improves only when its grid value beats 1 by more than that: ONE + the most items a pack holds.
        self.threshold = ONE + min(limit, size // int(lengths[0]))

    def solve(self, duals: np.ndarray):
        """duals: (n,) int64 on the grid. Returns (best value, candidate patterns whose value
        beat ``threshold``), best first (value, then index)."""
        lengths, size = self.lengths, self.size
        threshold = self.threshold
        # Frontier: items whose dual beats every shorter item's (others are dominated).
        running = np.maximum.accumulate(np.concatenate([[0], duals]))[:-1]
        keep = np.flatnonzero(duals > running)
        if len(keep) == 0:
            return 0, []
        item_len = lengths[keep]
        item_val = duals[keep]
        bounded = self.limit < size // int(item_len[0])
        if bounded:
            best, rest, pair_best, pair_rest = self._layers(item_len, item_val)
        else:
            best, rest = self._unbounded(item_len, item_val)
            pair_best, pair_rest = best, rest
        # Leading pairs (i, j), l_j <= l_i, plus the best completion of the space left with
        # K - 2 more items: one candidate pattern per pair, the best few per round join the pool.
        pairs = len(keep) if len(keep) <= PAIR_LEADS_MAX else 1
        lead_val = item_val[:pairs, None] + item_val[None, :pairs]  # (f, f)
        lead_len = item_len[:pairs, None] + item_len[None, :pairs]  # (f, f)
        ok = np.tril(lead_len <= size)
        if self.limit < 2 or len(keep) > PAIR_LEADS_MAX:
            ok[:] = False
        values = np.where(ok, lead_val + pair_best[np.minimum(size - lead_len, size).clip(0)], -1).ravel()
        single = item_val + best[size - item_len]  # (f,) one leading item, K - 1 more
        top = int(max(single.max(), values.max()))
        leads = [(int(f // pairs), int(f % pairs)) for f in _best(values, threshold)]
        leads += [(int(i), -1) for i in _best(single, threshold)]
        patterns = []  # type: List[Column]
        seen = set()
        for i, j in leads:
            if j >= 0:
                items = [i, j] + pair_rest(size - int(item_len[i]) - int(item_len[j]))
            else:
                items = [i] + rest(size - int(item_len[i]))
            column = make_column(keep[items])
            if column[2] not in seen:
                seen.add(column[2])
                patterns.append(column)
        return top, patterns

    def _layers(self, item_len: np.ndarray, item_val: np.ndarray):
        """f[k][c]: best value of at most k items in capacity c; returns f[K-1] and backtrack."""
        size, layers = self.size, self.limit - 1
        values = np.zeros((layers + 1, size + 1), dtype=np.int64)  # (K, S + 1)
        choice = np.full((layers + 1, size + 1), -1, dtype=np.int32)  # (K, S + 1)
        for k in range(1, layers + 1):
            prev, cur, arg = values[k - 1], values[k], choice[k]
            cur[:] = prev
            for j in range(len(item_len)):
                length = int(item_len[j])
                if length > size:
                    break
                cand = prev[: size + 1 - length] + item_val[j]
                better = cand > cur[length:]
                cur[length:][better] = cand[better]
                arg[length:][better] = j

        def backtrack(k: int, capacity: int) -> List[int]:
            items = []
            while k > 0 and capacity > 0:
                j = int(choice[k, capacity])
                if j >= 0:
                    items.append(j)
                    capacity -= int(item_len[j])
                k -= 1
            return items

        pair_layers = max(layers - 1, 0)
        return (
            values[layers],
            lambda c: backtrack(layers, c),
            values[pair_layers],
            lambda c: backtrack(pair_layers, c),
        )

    def _unbounded(self, item_len: np.ndarray, item_val: np.ndarray):
        """g[c]: best value in capacity c with any number of items (K cannot bind)."""
        size = self.size
        best = np.zeros(size + 1, dtype=np.int64)  # (S + 1,)
        choice = np.full(size + 1, -1, dtype=np.int32)  # (S + 1,)
        upto = np.searchsorted(item_len, np.arange(size + 1), side="right")  # (S + 1,)
        for c in range(1, size + 1):
            best[c] = best[c - 1]
            m = int(upto[c])
            if m:
                cand = best[c - item_len[:m]] + item_val[:m]
                j = int(np.argmax(cand))  # the first of equal values: exact on int64
                if cand[j] > best[c]:
                    best[c] = cand[j]
                    choice[c] = j

        def rest(capacity: int) -> List[int]:
            items = []
            while capacity > 0:
                j = int(choice[capacity])
                if j < 0:
                    capacity -= 1
                else:
                    items.append(j)
                    capacity -= int(item_len[j])
            return items

        return best, rest


def _best(values: np.ndarray, threshold: int) -> np.ndarray:
    """Indices of the (at most NEW_COLUMNS_PER_ROUND) largest values above threshold, largest
    first, equal values by index: a stable sort, so the choice is the same on every CPU."""
    above = np.flatnonzero(values > threshold)
    order = np.argsort(-values[above], kind="stable")[:NEW_COLUMNS_PER_ROUND]
    return above[order]
