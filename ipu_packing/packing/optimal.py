"""Near-optimal histogram packing as a cutting-stock problem, with its own certificate.

Formulation (Gilmore-Gomory). Let the rows be the n distinct lengths l_i present in the
histogram, with demand b_i. A *pattern* a (n,) counts how many sequences of each length
one pack holds; it is feasible when ``sum_i a_i l_i <= S`` and ``sum_i a_i <= K``. Packing
is then the integer program

    minimise  sum_j x_j   subject to   A x >= b,  x >= 0 integer,

whose columns A[:, j] range over all feasible patterns (far too many to list).

1. Column generation solves the LP relaxation. A restricted master over a pool of patterns
   (singletons plus the SPFHP/LPFHP strategies) is solved with HiGHS (the public `highspy`
   package, imported when the first master is built), warm-started after each batch of new
   columns. Its duals y price new patterns by the knapsack ``max y.a`` over feasible a,
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
   current packing optimal, or after ``max_rounds`` rounds of pricing. The wall-clock
   ``time_limit`` is only a safety net for pathological inputs; when it fires, the result
   says so (``stopped_by == "time_limit"``), because that plan then depends on the
   machine's speed.
5. plan.py finally keeps the best of this result and the greedy heuristics' results, so
   `optimal` is never worse than them.

Exact decisions (why the same histogram gives the same plan on every machine). The LP solver
works in floating point; nothing else does, and no decision reads a float's last bits:

- The solver's duals are rounded to a dyadic grid, ``DUAL_GRID_BITS`` bits below 1 (round to
  nearest: duals that are short rationals, as this LP's usually are, sit far from a rounding
  boundary), and held as int64. Pricing, its dynamic programme, dual smoothing (weights in
  tenths), the choice and order of new columns (value, then index: stable sorts only; numpy's
  SIMD partition and sort break ties differently per CPU) and the reduced-cost test are
  integer arithmetic, exact in any order. A column counts as improving only when its grid
  value beats 1 by more than the rounding could add (half a unit per item).
- Bounds are exact fractions (Python ints: b.y can pass 2**63), so the stopping rules and the
  certificate compare exactly.
- The primal x is read through tolerances far above solver noise: ``floor(x + X_TOL)``, the
  fractional parts on a 2**-20 grid, ties broken by column order; its sum by ``math.fsum``,
  which is correctly rounded whatever the order.
- Floating-point reductions (``@``, ``sum``) and BLAS are not used for any decision, so
  numpy's CPU dispatch and OpenBLAS's kernels cannot move a plan (tests/test_packing_hashes.py
  replans under other CPU features, BLAS kernels and thread counts and checks pinned hashes).
The solver itself is pinned (requirements.txt); another HiGHS build could still take another
pivot path on a degenerate master, which docs/packing.md states.
"""

from __future__ import annotations

import math
import time
from fractions import Fraction
from typing import List, NamedTuple, Optional

import numpy as np

from ..errors import InputError

from .heuristics import lpfhp, spfhp
from .pricing import ONE, Column, Pricing, column_value, grid_duals, make_column

X_TOL = 2.0 ** -20  # primal values within this of an integer are that integer
FRAC_GRID = 1 << 20  # fractional parts of x are compared on this grid
DIVE_TAKE = (7 * FRAC_GRID) // 10  # fractional columns a dive step takes when no pack is whole
DIVE_STEPS = 1000  # re-solves of the master for the demand that rounding leaves (see _round)
SMOOTHING_TENTHS = (9, 6, 3, 0)  # Wentges weights of the dual centre, tried in turn
# Rounds of column generation before it stops with its current (valid) bound. The Wikipedia
# histogram at S=512 converges in 13-46 rounds (K=max..3); the same lengths spread over
# S=2048 need a few hundred, so 300 lets such inputs converge too (rounds grow dearer as the
# master grows). The time limit is only a safety net above that.
MAX_ROUNDS = 300
TIME_LIMIT = 600.0
STOP_REASONS = ("lp_optimal", "bound", "known_optimal", "max_rounds", "time_limit", "stalled")
# Appending columns keeps the basis primal feasible: primal simplex from it, no presolve.
MASTER_OPTIONS = (("presolve", "off"), ("simplex_strategy", 4), ("threads", 1), ("random_seed", 0))


def _dot(a: np.ndarray, b: np.ndarray) -> int:
    """Exact a.b of two int64 vectors, as a Python int (the sum can pass 2**63)."""
    return sum(x * y for x, y in zip(a.tolist(), b.tolist()))


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


def _highspy():
    try:
        import highspy  # lazy: commands that never plan with the LP do not load it
    except ImportError as exc:
        raise InputError("the optimal packer needs the highspy package (pinned in requirements.txt): %s" % exc)
    return highspy


class _Master:
    """The restricted master LP ``min 1.x  s.t.  pool x >= demand, x >= 0`` in HiGHS.

    Columns are appended between solves, and each solve is warm-started from the previous basis.
    """

    def __init__(self, demand: np.ndarray) -> None:
        self.demand = demand.astype(np.int64)  # (n,)
        self.columns = []  # type: List[Column]
        self.keys = set()
        highspy = _highspy()
        highs = highspy.Highs()
        highs.setOptionValue("output_flag", False)
        for key, value in MASTER_OPTIONS:
            highs.setOptionValue(key, value)
        n = len(demand)
        self.inf = highs.getInfinity()
        highs.addRows(
            n, self.demand.astype(np.float64), np.full(n, self.inf), 0,
            np.zeros(n, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0),
        )
        self.highs = highs
        self.status_optimal = highspy.HighsModelStatus.kOptimal

    def add(self, columns: List[Column]) -> int:
        """Appends the columns not yet in the pool; returns how many were new."""
        fresh = [c for c in columns if c[2] not in self.keys]
        if not fresh:
            return 0
        for column in fresh:
            self.keys.add(column[2])
            self.columns.append(column)
        sizes = np.array([len(c[0]) for c in fresh])
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
        rows = np.concatenate([c[0] for c in fresh]).astype(np.int32)
        values = np.concatenate([c[1] for c in fresh]).astype(np.float64)
        k = len(fresh)
        self.highs.addCols(k, np.ones(k), np.zeros(k), np.full(k, self.inf), len(values), starts, rows, values)
        return len(fresh)

    def solve(self):
        """Returns (x (m,) float64, duals (n,) float64 >= 0)."""
        self.highs.run()
        if self.highs.getModelStatus() != self.status_optimal:  # pragma: no cover - a cold solve once
            self.highs.clearSolver()
            self.highs.run()
            if self.highs.getModelStatus() != self.status_optimal:
                raise RuntimeError("the packing LP's master did not solve: %s"
                                   % self.highs.modelStatusToString(self.highs.getModelStatus()))
        sol = self.highs.getSolution()
        x = np.asarray(sol.col_value, dtype=np.float64)
        duals = np.maximum(np.asarray(sol.row_dual, dtype=np.float64), 0.0)
        return x, duals

    def solve_for(self, demand: np.ndarray) -> np.ndarray:
        """x (m,) of the master with another demand (n,) int64 (the pool stays; warm-started)."""
        for row, value in enumerate(demand.tolist()):
            self.highs.changeRowBounds(row, float(value), self.inf)
        return self.solve()[0]

    def covered(self, whole: np.ndarray) -> np.ndarray:
        """(n,) int64 sequences of each length that `whole` (m,) packs of each column hold (exact)."""
        sizes = np.array([len(c[0]) for c in self.columns])
        rows = np.concatenate([c[0] for c in self.columns]).astype(np.int64)
        counts = np.concatenate([c[1] for c in self.columns])
        out = np.zeros(len(self.demand), dtype=np.int64)
        np.add.at(out, rows, counts * np.repeat(whole, sizes))
        return out


def _to_columns(strategies, index: np.ndarray) -> List[Column]:
    """index: (S + 1,) row of each length."""
    return [make_column(index[np.asarray(strategy, dtype=np.int64)]) for strategy in strategies]


def _greedy(residual: np.ndarray, lengths: np.ndarray, size: int, limit: int):
    """Best of the greedy heuristics on a residual demand; returns (strategies, repeats)."""
    hist = np.zeros(size, dtype=np.int64)
    hist[lengths - 1] = residual
    best = ([], [])  # (strategies, repeats)
    if residual.sum() > 0:
        best = min((heuristic(hist, size, limit) for heuristic in (lpfhp, spfhp)), key=lambda sr: sum(sr[1]))
    return best


def _round(x: np.ndarray, master: "_Master", lengths: np.ndarray, size: int, limit: int):
    """Integer packing from the LP solution x (m,): returns (whole (m,), strategies, repeats).

    Three deterministic candidates; the one with fewest packs wins (the first of equals):
    - floor: x rounded down; the residual demand goes to the greedy heuristics.
    - round-up: additionally, fractional columns in decreasing order of their fractional part
      get one more pack while they still cover some residual demand; the rest goes to the
      greedy heuristics.
    - dive: from the floor, the master is solved again for the demand left uncovered; its
      whole packs are taken, or, where it has none, one pack of each column at or above
      DIVE_TAKE (else of its largest column), until every sequence is placed or DIVE_STEPS
      solves have run; the greedy heuristics place what is left.
    Fractional parts are compared on a grid, equal parts in column order. (Over-covered slots
    are removed later by plan.py, never adding packs.)
    """
    whole = np.floor(x + X_TOL).astype(np.int64)  # (m,)
    residual = np.maximum(master.demand - master.covered(whole), 0)  # (n,)
    candidates = [(whole,) + tuple(_greedy(residual, lengths, size, limit))]
    up = whole.copy()
    left = residual.copy()
    frac = np.maximum(np.rint((x - whole) * FRAC_GRID), 0).astype(np.int64)  # (m,)
    for j in np.argsort(-frac, kind="stable"):
        if frac[j] == 0 or not left.any():
            break
        rows, counts, _ = master.columns[j]
        if (left[rows] > 0).any():
            up[j] += 1
            left[rows] = np.maximum(left[rows] - counts, 0)
    candidates.append((up,) + tuple(_greedy(left, lengths, size, limit)))
    dive = whole
    for _ in range(DIVE_STEPS):
        if not residual.any():
            break
        x = master.solve_for(residual)
        more = np.floor(x + X_TOL).astype(np.int64)
        if not more.any():
            frac = np.rint(x * FRAC_GRID).astype(np.int64)  # (m,) all below FRAC_GRID here
            high = frac >= DIVE_TAKE
            if high.any():
                more[high] = 1
            else:
                more[int(np.argmax(frac))] = 1
        dive = dive + more
        residual = np.maximum(master.demand - master.covered(dive), 0)
    candidates.append((dive,) + tuple(_greedy(residual, lengths, size, limit)))
    return min(candidates, key=lambda c: int(c[0].sum()) + sum(c[2]))


class LPResult(NamedTuple):
    strategies: Optional[List[List[int]]]
    """Lengths in each pack pattern; None when ``upper_bound``'s packing was proved optimal."""
    repeats: Optional[List[int]]
    lower_bound: float
    """Valid lower bound on the packs of any packing of the histogram (the exact bound, rounded down)."""
    rounds: int
    """Rounds of column generation run (master LP solves)."""
    stopped_by: str
    """Why column generation stopped: one of STOP_REASONS."""


def _float_below(value: Fraction) -> float:
    """The largest float <= value (a bound must never round up)."""
    out = float(value)
    return float(np.nextafter(out, -np.inf)) if Fraction(out) > value else out


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
    tokens = _dot(demand, lengths)
    bound = max(Fraction(tokens, size), Fraction(int(demand.sum()), limit))  # the trivial bounds
    if upper_bound is not None and upper_bound <= _ceil(bound):
        return LPResult(None, None, _float_below(bound), 0, "known_optimal")  # already provably optimal

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
    centre = (lengths.astype(np.int64) * ONE + size // 2) // size  # (n,) l_i / S on the grid
    centre_bound = Fraction(tokens, size)
    rounds = 0
    while True:
        x, duals = master.solve()
        duals = grid_duals(duals)
        objective = math.fsum(x)  # correctly rounded: the same in any summation order
        rounds += 1
        for tenths in SMOOTHING_TENTHS:
            point = (tenths * centre + (10 - tenths) * duals) // 10
            top, patterns = pricing.solve(point)
            point_bound = Fraction(_dot(point, demand), max(top, ONE))
            if point_bound > centre_bound:
                centre, centre_bound = point, point_bound
            improving = [c for c in patterns if column_value(duals, c) > pricing.threshold]
            if improving:
                break
        bound = max(bound, centre_bound)
        integer_bound = _ceil(bound)
        if not improving:
            stopped_by = "lp_optimal"
            break
        if integer_bound >= math.ceil(objective * (1 - 1e-12) - 1e-9):
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
    return LPResult(strategies, repeats, _float_below(bound), rounds, stopped_by)
