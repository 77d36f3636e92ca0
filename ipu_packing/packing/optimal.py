"""Near-optimal histogram packing as a cutting-stock problem, with its own certificate.

Formulation (Gilmore-Gomory). Let the rows be the n distinct lengths l_i present in the
histogram, with demand b_i. A *pattern* a (n,) counts how many sequences of each length
one pack holds; it is feasible when ``sum_i a_i l_i <= S`` and ``sum_i a_i <= K``. Packing
is then the integer program

    minimise  sum_j x_j   subject to   A x >= b,  x >= 0 integer,

whose columns A[:, j] range over all feasible patterns (far too many to list).

1. Column generation solves the LP relaxation. A restricted master over a pool of patterns
   (singletons plus the SPFHP/LPFHP strategies) is solved with HiGHS, warm-started after
   each batch of new columns (scipy's bundled HiGHS object; scipy.optimize.linprog as the
   fallback). Its duals y price new patterns by the knapsack ``max y.a`` over feasible a,
   solved exactly by dynamic programming over (items used, capacity): O(K S n), or O(S n)
   when K cannot bind. Items whose dual is matched by a shorter item are dropped from
   pricing first (swapping in the shorter one never hurts), which keeps n small. Each round
   adds the best completion of the best leading pairs and of every leading item. Pricing
   uses Wentges dual smoothing from the token-proportional duals l_i / S (see optimal()).
2. Certificate. For any dual y >= 0 and v = max_a y.a, y / max(v, 1) is dual-feasible for
   the full LP, so ``b.y / max(v, 1)`` (Farley's bound) is a valid lower bound on the
   number of packs of *any* packing, even when column generation is stopped early; its
   ceiling is a valid integer bound. We also keep the trivial bounds tokens / S and
   sequences / K and report the largest.
3. Rounding and repair. x is rounded down (at most one pack per basic pattern below the LP);
   optionally the fractional patterns with the largest fractional parts are rounded up while
   they still cover residual demand; whatever demand is left (a few sequences per basic
   pattern) goes to the greedy heuristics. The cheaper of the two variants wins. Over-covered
   slots are removed afterwards by plan.py (never adding packs).
4. Stopping. Column generation ends when the LP is solved, when the bound proves the
   current packing optimal, or after ``max_rounds`` rounds of pricing. These rules depend
   only on the input, so the same histogram gives the same plan on any machine at any load.
   The wall-clock ``time_limit`` is only a safety net for pathological inputs; when it
   fires, the result says so (``stopped_by == "time_limit"``), because that plan then
   depends on the machine's speed.
5. plan.py finally keeps the best of this result and the other algorithms' results, so
   `optimal` is never worse than them.
"""

from __future__ import annotations

import time
from typing import List, NamedTuple, Optional, Tuple

import numpy as np

from ..errors import InputError

from .heuristics import lpfhp, spfhp

REDUCED_COST_TOL = 1e-9
NEW_COLUMNS_PER_ROUND = 64  # best patterns per round from leading pairs (and as many from single leads)
PAIR_LEADS_MAX = 1500  # frontier size above which only single leading items are tried
SMOOTHING = 0.9  # Wentges smoothing weight of the dual centre
# Rounds of column generation before it stops with its current (valid) bound. The Wikipedia
# histogram at S=512 converges in 13-46 rounds (K=max..3); the same lengths spread over
# S=2048 need 269, so 300 lets such inputs converge too (rounds grow dearer as the master
# grows: that case takes about 80 s). The time limit is only a safety net above that.
MAX_ROUNDS = 300
TIME_LIMIT = 600.0
STOP_REASONS = ("lp_optimal", "bound", "known_optimal", "max_rounds", "time_limit", "stalled")
# Appending columns keeps the basis primal feasible: primal simplex from it, no presolve.
MASTER_OPTIONS = (("presolve", "off"), ("simplex_strategy", 4), ("threads", 1))


Column = Tuple[np.ndarray, np.ndarray, bytes]  # (rows int32 ascending, counts float64, key)


def make_column(rows) -> Column:
    """A pattern from the row index of each item it holds (repeats allowed)."""
    rows, counts = np.unique(np.asarray(rows, dtype=np.int32), return_counts=True)
    return rows, counts.astype(np.float64), rows.tobytes() + counts.astype(np.int32).tobytes()


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
        patterns = []  # type: List[Column]
        found = []  # type: List[float]
        seen = set()
        for i, j in leads:
            items = [i] + ([j] + pair_rest(size - int(item_len[i]) - int(item_len[j])) if j >= 0 else rest(size - int(item_len[i])))
            column = make_column(keep[items])
            if column[2] not in seen:
                seen.add(column[2])
                patterns.append(column)
                found.append(float(duals[column[0]] @ column[1]))
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
        self.columns = []  # type: List[Column]
        self.keys = set()
        self._matrix = None
        self.highs = None
        # scipy is imported here, not at module level: importing scipy.optimize costs ~0.5 s of
        # start-up that commands which never plan (or plan with a heuristic) should not pay.
        try:  # private but version-pinned; every failure falls back to linprog
            from ._solvers import highs_core

            _core = highs_core()

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

    def add(self, columns: List[Column]) -> int:
        """Appends the columns not yet in the pool; returns how many were new."""
        fresh = [c for c in columns if c[2] not in self.keys]
        if not fresh:
            return 0
        for column in fresh:
            self.keys.add(column[2])
            self.columns.append(column)
        self._matrix = None
        if self.highs is not None:
            sizes = np.array([len(c[0]) for c in fresh])
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
            rows = np.concatenate([c[0] for c in fresh]).astype(np.int32)
            values = np.concatenate([c[1] for c in fresh])
            k = len(fresh)
            self.highs.addCols(k, np.ones(k), np.zeros(k), np.full(k, self.inf), len(values), starts, rows, values)
        return len(fresh)

    @property
    def matrix(self):
        """(n, m) sparse CSC matrix of all columns so far."""
        if self._matrix is None:
            sizes = np.array([len(c[0]) for c in self.columns])
            indptr = np.concatenate([[0], np.cumsum(sizes)])
            rows = np.concatenate([c[0] for c in self.columns])
            values = np.concatenate([c[1] for c in self.columns])
            from scipy.sparse import csc_matrix  # lazy: see _Master.__init__

            self._matrix = csc_matrix((values, rows, indptr), shape=(len(self.demand), len(self.columns)))
        return self._matrix

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
        m = len(self.columns)
        from scipy import optimize

        res = optimize.linprog(
            np.ones(m),
            A_ub=-self.matrix,
            b_ub=-self.demand,
            bounds=(0, None),
            method="highs",
        )
        if res.status != 0:
            raise RuntimeError("master LP failed: %s" % res.message)
        duals = np.maximum(-np.asarray(res.ineqlin.marginals, dtype=np.float64), 0.0)
        return np.asarray(res.x, dtype=np.float64), float(res.fun), duals


def _to_columns(strategies, index: np.ndarray) -> List[Column]:
    """index: (S + 1,) row of each length."""
    return [make_column(index[np.asarray(strategy, dtype=np.int64)]) for strategy in strategies]


def _greedy(residual: np.ndarray, lengths: np.ndarray, size: int, limit: int):
    """Best of the greedy heuristics on a residual demand; returns (strategies, repeats)."""
    hist = np.zeros(size, dtype=np.int64)
    hist[lengths - 1] = residual
    best = ([], [])  # type: Tuple[list, list]
    if residual.sum() > 0:
        best = min((heuristic(hist, size, limit) for heuristic in (lpfhp, spfhp)), key=lambda sr: sum(sr[1]))
    return best


def _round(x: np.ndarray, master: "_Master", lengths: np.ndarray, size: int, limit: int):
    """Integer packing from the LP solution x (m,): returns (whole (m,), strategies, repeats).

    Two deterministic candidates, the one with fewer packs wins:
    - floor: x rounded down; the residual demand goes to the greedy heuristics.
    - round-up: additionally, fractional columns in decreasing order of their fractional part
      get one more pack while they still cover some residual demand; the rest goes to the
      greedy heuristics. (Over-covered slots are removed later, never adding packs.)
    """
    demand = master.demand.astype(np.int64)
    whole = np.floor(x + 1e-6).astype(np.int64)  # (m,)
    # matrix @ whole, without importing scipy.sparse (~0.2 s): the entries are small integers, so
    # the float sums are exact in any order.
    sizes = np.array([len(c[0]) for c in master.columns])
    rows = np.concatenate([c[0] for c in master.columns]).astype(np.int64)
    values = np.concatenate([c[1] for c in master.columns]).astype(np.float64)
    weights = values * np.repeat(whole.astype(np.float64), sizes)
    covered = np.rint(np.bincount(rows, weights, minlength=len(demand))).astype(np.int64)  # (n,)
    residual = np.maximum(demand - covered, 0)  # (n,)
    floor_strategies, floor_repeats = _greedy(residual, lengths, size, limit)
    up = whole.copy()
    left = residual.copy()
    frac = x - whole
    for j in np.argsort(-frac, kind="stable"):
        if frac[j] <= 1e-9 or not left.any():
            break
        rows, counts, _ = master.columns[j]
        if (left[rows] > 0).any():
            up[j] += 1
            left[rows] = np.maximum(left[rows] - counts.astype(np.int64), 0)
    up_strategies, up_repeats = _greedy(left, lengths, size, limit)
    if int(up.sum()) + sum(up_repeats) < int(whole.sum()) + sum(floor_repeats):
        return up, up_strategies, up_repeats
    return whole, floor_strategies, floor_repeats


class LPResult(NamedTuple):
    strategies: Optional[List[List[int]]]
    """Lengths in each pack pattern; None when ``upper_bound``'s packing was proved optimal."""
    repeats: Optional[List[int]]
    lower_bound: float
    """Valid lower bound on the packs of any packing of the histogram."""
    rounds: int
    """Rounds of column generation run (master LP solves)."""
    stopped_by: str
    """Why column generation stopped: one of STOP_REASONS."""


def optimal(
    histogram: np.ndarray,
    max_seq_length: int,
    max_sequences_per_pack: int,
    max_rounds: int = MAX_ROUNDS,
    time_limit: Optional[float] = TIME_LIMIT,
    upper_bound: Optional[int] = None,
) -> LPResult:
    """Near-optimal plan and its LP lower bound.

    max_rounds: rounds of column generation at most (the deterministic stopping rule).
    time_limit: seconds of column generation at most, or None (no limit); a plan cut short by
        it depends on machine speed, and says so in ``stopped_by``.
    upper_bound: packs of a packing already known (column generation stops once its
        integer bound proves that packing optimal; strategies are then None).
    """
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise InputError("max_rounds must be an integer >= 1, got %r" % (max_rounds,))
    if time_limit is not None and not (float(time_limit) > 0 and np.isfinite(time_limit)):
        raise InputError("time_limit must be a number of seconds > 0, got %r" % (time_limit,))
    start = time.perf_counter()
    size, limit = max_seq_length, max_sequences_per_pack
    hist = np.asarray(histogram, dtype=np.int64)
    lengths = np.flatnonzero(hist) + 1  # (n,) ascending
    demand = hist[lengths - 1]  # (n,)
    n = len(lengths)
    tokens = float((demand * lengths).sum())
    trivial = max(tokens / size, float(demand.sum()) / limit)
    bound = trivial
    if upper_bound is not None and upper_bound <= np.ceil(trivial * (1 - 1e-12) - 1e-9):
        return LPResult(None, None, trivial, 0, "known_optimal")  # already provably optimal

    index = np.zeros(size + 1, dtype=np.int64)  # (S + 1,) row of each present length
    index[lengths] = np.arange(n)
    master = _Master(demand)
    master.add([make_column([i]) for i in range(n)])  # singletons keep the LP feasible
    for heuristic in (spfhp, lpfhp):
        strategies, _ = heuristic(hist, size, limit)
        master.add(_to_columns(strategies, index))
    pricing = Pricing(lengths.astype(np.int64), size, limit)

    # Column generation with Wentges dual smoothing. Patterns are priced at a point between
    # the master's duals y and the best dual found so far (the "centre", which starts at the
    # token-proportional duals l_i / S, whose Farley bound is tokens / S). This avoids the
    # long degenerate start of plain column generation (12-16 rounds instead of ~150 on the
    # Wikipedia histogram). A pattern joins the pool only if it improves on y; when none
    # does, the point moves towards y; at y itself "none" proves the LP optimal.
    centre = lengths / float(size)  # (n,)
    centre_bound = float(centre @ demand)
    rounds = 0
    while True:
        x, objective, duals = master.solve()
        rounds += 1
        alpha = SMOOTHING
        while True:
            point = alpha * centre + (1.0 - alpha) * duals
            top, patterns, _ = pricing.solve(point)
            point_bound = float(point @ demand) / max(top, 1.0)
            if point_bound > centre_bound:
                centre, centre_bound = point, point_bound
            improving = [c for c in patterns if float(duals[c[0]] @ c[1]) > 1.0 + REDUCED_COST_TOL]
            if improving or alpha == 0.0:
                break
            alpha = alpha - 0.3 if alpha > 0.3 else 0.0
        bound = max(bound, centre_bound)
        integer_bound = np.ceil(bound * (1 - 1e-12) - 1e-9)
        if not improving:
            stopped_by = "lp_optimal"
            break
        if integer_bound >= np.ceil(objective * (1 - 1e-12) - 1e-9):
            stopped_by = "bound"  # the LP cannot raise the integer bound any further
            break
        if upper_bound is not None and upper_bound <= integer_bound:
            stopped_by = "known_optimal"
            break
        if rounds >= max_rounds:
            stopped_by = "max_rounds"
            break
        if time_limit is not None and time.perf_counter() - start > time_limit:
            stopped_by = "time_limit"
            break
        if not master.add(improving):
            stopped_by = "stalled"  # numerically stuck: nothing new to add
            break

    whole, strategies, repeats = _round(x, master, lengths, size, limit)
    strategies = list(strategies)
    repeats = list(repeats)
    for j in np.flatnonzero(whole):
        rows, counts, _ = master.columns[j]
        strategies.append([int(lengths[r]) for r, c in zip(rows, counts) for _ in range(int(c))])
        repeats.append(int(whole[j]))
    # A hair below the computed bound guards against rounding in b.y (relative 1e-12).
    return LPResult(strategies, repeats, bound * (1 - 1e-12), rounds, stopped_by)
