"""Near-optimal histogram packing as a cutting-stock problem, with its own certificate.

Formulation (Gilmore-Gomory). Let the rows be the n distinct lengths l_i present in the
histogram, with demand b_i. A *pattern* a (n,) counts how many sequences of each length
one pack holds; it is feasible when ``sum_i a_i l_i <= S`` and ``sum_i a_i <= K``. Packing
is then the integer program

    minimise  sum_j x_j   subject to   A x >= b,  x >= 0 integer,

whose columns A[:, j] range over all feasible patterns (far too many to list).

1. Column generation solves the LP relaxation. A restricted master over a pool of patterns
   is solved with HiGHS (scipy.optimize.linprog); its duals y price new patterns by the
   bounded knapsack ``max y.a`` over feasible a, solved exactly by dynamic programming over
   (items used, capacity): O(K S n), or O(S n) when K cannot bind. Every item whose dual
   is matched by a shorter item is dropped from pricing first (it can be swapped for the
   shorter one), which keeps n small. Patterns with reduced cost < 0 join the pool, the
   best one per leading item, until none is left.
2. Certificate. For any dual y >= 0 and v = max_a y.a, y / max(v, 1) is dual-feasible for
   the full LP, so ``b.y / max(v, 1)`` (Farley's bound) is a valid lower bound on the
   number of packs of *any* packing, even when column generation is stopped early; its
   ceiling is a valid integer bound. We also keep the trivial bounds tokens / S and
   sequences / K and report the largest.
3. Rounding and repair. x is rounded down (a packing of most sequences, at most one pack per
   pattern below the LP), and the residual demand (at most a few sequences per basic column)
   is packed by a small integer program over the pattern pool (scipy.optimize.milp, with a
   time limit) or, if that is worse or fails, by the greedy heuristics. Over-covered slots
   are removed afterwards by plan.py (never adding packs).
4. plan.py finally keeps the best of this result and the other algorithms' results, so
   `optimal` is never worse than them.
"""

from __future__ import annotations

import time
from typing import List, Optional, Tuple

import numpy as np
from scipy import optimize
from scipy.sparse import csc_matrix

from .heuristics import lpfhp, spfhp

REDUCED_COST_TOL = 1e-9
NEW_COLUMNS_PER_ROUND = 64  # best patterns per round from leading pairs (and as many from single leads)
PAIR_LEADS_MAX = 1500  # frontier size above which only single leading items are tried
SMOOTHING = 0.9  # Wentges smoothing weight of the dual centre
# Appending columns keeps the basis primal feasible: primal simplex from it, no presolve.
MASTER_OPTIONS = (("presolve", "off"), ("simplex_strategy", 4), ("threads", 1))


class Pricing:
    """Exact pricing: best pattern value ``max y.a`` under length S and at most K items."""

    def __init__(self, lengths: np.ndarray, size: int, limit: int) -> None:
        self.lengths = lengths  # (n,) ascending distinct lengths
        self.size = size
        self.limit = limit

    def solve(self, duals: np.ndarray):
        """Returns (best value, candidate patterns (n,) int64 with value > 1, their values)."""
        lengths, size = self.lengths, self.size
        # Frontier: items whose dual beats every shorter item's (others are dominated).
        running = np.maximum.accumulate(np.concatenate([[0.0], duals]))[:-1]
        keep = np.flatnonzero(duals > running + 1e-15)
        if len(keep) == 0:
            return 0.0, [], []
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
        values = np.where(ok, lead_val + pair_best[np.minimum(size - lead_len, size).clip(0)], -np.inf)
        single = item_val + best[size - item_len]  # (f,) one leading item, K - 1 more
        top = float(max(single.max(), values.max()))
        flat = np.flatnonzero(values.ravel() > 1.0 + REDUCED_COST_TOL)
        if len(flat) > NEW_COLUMNS_PER_ROUND:
            flat = flat[np.argpartition(-values.ravel()[flat], NEW_COLUMNS_PER_ROUND)[:NEW_COLUMNS_PER_ROUND]]
        leads = [(int(f // pairs), int(f % pairs)) for f in flat]
        ones = np.flatnonzero(single > 1.0 + REDUCED_COST_TOL)
        if len(ones) > NEW_COLUMNS_PER_ROUND:
            ones = ones[np.argpartition(-single[ones], NEW_COLUMNS_PER_ROUND)[:NEW_COLUMNS_PER_ROUND]]
        leads += [(int(i), -1) for i in ones]
        patterns = []  # type: List[np.ndarray]
        found = []  # type: List[float]
        seen = set()
        for i, j in leads:
            pattern = np.zeros(len(lengths), dtype=np.int64)
            pattern[keep[i]] += 1
            room = size - int(item_len[i])
            if j >= 0:
                pattern[keep[j]] += 1
                room -= int(item_len[j])
                items = pair_rest(room)
            else:
                items = rest(room)
            for k in items:
                pattern[keep[k]] += 1
            key = pattern.tobytes()
            if key not in seen:
                seen.add(key)
                patterns.append(pattern)
                found.append(float(pattern @ duals))
        return top, patterns, found

    def _layers(self, item_len: np.ndarray, item_val: np.ndarray):
        """f[k][c]: best value of at most k items in capacity c; returns f[K-1] and backtrack."""
        size, layers = self.size, self.limit - 1
        values = np.zeros((layers + 1, size + 1))  # (K, S + 1)
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
        best = np.zeros(size + 1)  # (S + 1,)
        choice = np.full(size + 1, -1, dtype=np.int32)  # (S + 1,)
        upto = np.searchsorted(item_len, np.arange(size + 1), side="right")  # (S + 1,)
        for c in range(1, size + 1):
            best[c] = best[c - 1]
            m = int(upto[c])
            if m:
                cand = best[c - item_len[:m]] + item_val[:m]
                j = int(np.argmax(cand))
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


class _Master:
    """The restricted master LP ``min 1.x  s.t.  pool x >= demand, x >= 0``.

    Columns are appended between solves. With the HiGHS object that scipy bundles
    (scipy >= 1.15) each solve is warm-started from the previous basis; otherwise every
    solve starts afresh through scipy.optimize.linprog (same answers, slower).
    """

    def __init__(self, demand: np.ndarray) -> None:
        self.demand = demand.astype(np.float64)  # (n,)
        self.blocks = []  # type: List[np.ndarray]  # (n, c) column blocks, in order
        self.highs = None
        try:  # private but version-pinned; every failure falls back to linprog
            from scipy.optimize._highspy import _core

            highs = _core._Highs()
            highs.setOptionValue("output_flag", False)
            for key, value in MASTER_OPTIONS:
                highs.setOptionValue(key, value)
            n = len(demand)
            self.inf = highs.getInfinity()
            highs.addRows(
                n, self.demand, np.full(n, self.inf), 0,
                np.zeros(n, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0),
            )
            self.highs = highs
            self.status_optimal = _core.HighsModelStatus.kOptimal
        except Exception:  # pragma: no cover - depends on the scipy build
            self.highs = None

    def add(self, columns: np.ndarray) -> None:
        """columns: (n, c) int64 patterns."""
        self.blocks.append(columns)
        if self.highs is not None:
            rows, cols = np.nonzero(columns.T)  # column-major entries
            starts = np.searchsorted(rows, np.arange(columns.shape[1])).astype(np.int32)
            values = columns.T[rows, cols].astype(np.float64)
            c = columns.shape[1]
            self.highs.addCols(
                c, np.ones(c), np.zeros(c), np.full(c, self.inf), len(values),
                starts, cols.astype(np.int32), values,
            )

    @property
    def pool(self) -> np.ndarray:
        """(n, m) all columns so far."""
        if len(self.blocks) > 1:
            self.blocks = [np.concatenate(self.blocks, axis=1)]
        return self.blocks[0]

    def solve(self):
        """Returns (x (m,), objective, duals (n,) >= 0)."""
        if self.highs is not None:
            self.highs.run()
            if self.highs.getModelStatus() == self.status_optimal:
                sol = self.highs.getSolution()
                x = np.asarray(sol.col_value, dtype=np.float64)
                duals = np.maximum(np.asarray(sol.row_dual, dtype=np.float64), 0.0)
                return x, float(x.sum()), duals
            self.highs = None  # pragma: no cover - fall back to a cold solve
        m = self.pool.shape[1]
        res = optimize.linprog(
            np.ones(m),
            A_ub=-csc_matrix(self.pool.astype(np.float64)),
            b_ub=-self.demand,
            bounds=(0, None),
            method="highs",
        )
        if res.status != 0:
            raise RuntimeError("master LP failed: %s" % res.message)
        duals = np.maximum(-np.asarray(res.ineqlin.marginals, dtype=np.float64), 0.0)
        return np.asarray(res.x, dtype=np.float64), float(res.fun), duals


def _to_vectors(strategies, index: dict, n: int) -> List[np.ndarray]:
    out = []
    for strategy in strategies:
        vec = np.zeros(n, dtype=np.int64)
        for length in strategy:
            vec[index[length]] += 1
        out.append(vec)
    return out


def _residual_packing(
    pool: np.ndarray, residual: np.ndarray, lengths: np.ndarray, size: int, limit: int, seconds: float
):
    """Pack the (small) residual demand; returns (strategies, repeats)."""
    hist = np.zeros(size, dtype=np.int64)
    hist[lengths - 1] = residual
    best = None  # type: Optional[Tuple[list, list]]
    for heuristic in (lpfhp, spfhp):
        strategies, repeats = heuristic(hist, size, limit)
        if best is None or sum(repeats) < sum(best[1]):
            best = (strategies, repeats)
    if seconds > 0.05 and residual.sum() > 0:
        rows = np.flatnonzero(residual > 0)
        sub = pool[rows]  # (r, m)
        cols = np.flatnonzero(sub.sum(axis=0) > 0)
        sub = sub[:, cols]
        try:
            res = optimize.milp(
                np.ones(len(cols)),
                constraints=optimize.LinearConstraint(csc_matrix(sub.astype(np.float64)), lb=residual[rows]),
                integrality=np.ones(len(cols)),
                bounds=optimize.Bounds(0, float(residual.max())),
                options={"time_limit": seconds, "disp": False},
            )
        except (ValueError, RuntimeError):  # pragma: no cover - solver trouble falls back to greedy
            res = None
        if res is not None and res.x is not None:
            z = np.round(res.x).astype(np.int64)
            if (sub @ z >= residual[rows]).all() and z.sum() < sum(best[1]):
                strategies = []
                repeats = []
                for j in np.flatnonzero(z):
                    col = pool[:, cols[j]]
                    strategies.append([int(lengths[i]) for i in np.flatnonzero(col) for _ in range(int(col[i]))])
                    repeats.append(int(z[j]))
                best = (strategies, repeats)
    return best


def optimal(
    histogram: np.ndarray,
    max_sequence_length: int,
    max_sequences_per_pack: int,
    time_limit: float = 8.0,
    upper_bound: Optional[int] = None,
):
    """Returns (strategies, repeats, lower_bound_packs).

    upper_bound: packs of a packing already known (column generation stops once its
    integer bound proves that packing optimal).
    """
    start = time.perf_counter()
    size, limit = max_sequence_length, max_sequences_per_pack
    hist = np.asarray(histogram, dtype=np.int64)
    lengths = np.flatnonzero(hist) + 1  # (n,) ascending
    demand = hist[lengths - 1]  # (n,)
    n = len(lengths)
    tokens = float((demand * lengths).sum())
    trivial = max(tokens / size, float(demand.sum()) / limit)
    bound = trivial
    if upper_bound is not None and upper_bound <= np.ceil(trivial * (1 - 1e-12)):
        return None, None, trivial  # the known packing is already provably optimal

    index = {int(l): i for i, l in enumerate(lengths)}
    columns = list(np.eye(n, dtype=np.int64))  # singletons keep the LP feasible
    for heuristic in (spfhp, lpfhp):
        strategies, _ = heuristic(hist, size, limit)
        columns.extend(_to_vectors(strategies, index, n))
    master = _Master(demand)
    master.add(np.unique(np.stack(columns, axis=1), axis=1))
    pricing = Pricing(lengths.astype(np.int64), size, limit)

    # Column generation with Wentges dual smoothing. Patterns are priced at a point between
    # the master's duals y and the best dual found so far (the "centre", which starts at the
    # token-proportional duals l_i / S, whose Farley bound is tokens / S). This avoids the
    # long degenerate start of plain column generation (12-16 rounds instead of ~150 on the
    # Wikipedia histogram). A pattern joins the pool only if it improves on y; when none
    # does, the point moves towards y; at y itself "none" proves the LP optimal.
    centre = lengths / float(size)  # (n,)
    centre_bound = float(centre @ demand)
    while True:
        x, objective, duals = master.solve()
        alpha = SMOOTHING
        while True:
            point = alpha * centre + (1.0 - alpha) * duals
            top, patterns, _ = pricing.solve(point)
            point_bound = float(point @ demand) / max(top, 1.0)
            if point_bound > centre_bound:
                centre, centre_bound = point, point_bound
            improving = [p for p in patterns if float(p @ duals) > 1.0 + REDUCED_COST_TOL]
            if improving or alpha == 0.0:
                break
            alpha = alpha - 0.3 if alpha > 0.3 else 0.0
        bound = max(bound, centre_bound)
        integer_bound = np.ceil(bound * (1 - 1e-12) - 1e-9)
        if not improving or integer_bound >= np.ceil(objective * (1 - 1e-12) - 1e-9):
            break  # LP solved, or it cannot raise the integer bound any further
        if upper_bound is not None and upper_bound <= integer_bound:
            break  # the known packing is optimal
        if time.perf_counter() - start > time_limit:
            break
        master.add(np.stack(improving, axis=1))
    pool = master.pool

    whole = np.floor(x + 1e-6).astype(np.int64)  # (m,)
    residual = np.maximum(demand - pool @ whole, 0)  # (n,)
    left = max(0.5, time_limit - (time.perf_counter() - start))
    res_strategies, res_repeats = _residual_packing(pool, residual, lengths, size, limit, min(2.0, left))
    strategies = []  # type: List[List[int]]
    repeats = []  # type: List[int]
    for j in np.flatnonzero(whole):
        col = pool[:, j]
        strategies.append([int(lengths[i]) for i in np.flatnonzero(col) for _ in range(int(col[i]))])
        repeats.append(int(whole[j]))
    strategies.extend(res_strategies)
    repeats.extend(res_repeats)
    # A hair below the computed bound guards against rounding in b.y (relative 1e-12).
    return strategies, repeats, bound * (1 - 1e-12)
