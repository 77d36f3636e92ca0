"""The optimal packer's master LP has two solvers: scipy's bundled HiGHS object (private,
warm-started; the fast path) and scipy.optimize.linprog (a cold solve each round), used when the
private object cannot be imported (forced here as on a scipy build without it).

What must agree: the LP bound (the certificate), to 1e-9 relative. The restricted master LP is
degenerate, so the two solvers return different optimal vertices (and duals, hence different
priced columns); the integer plan is rounded from the vertex, and its pack count moves by a pack
or two either way. Measured on these cases (scipy 1.17.1), fast vs fallback: 277/277, 216/216,
250/251, 218/218, 347/348, 3/3 with bounds 277, 215.33, 250, 217.69, 344.33, 3 (linprog's
interior-point method gives 345 on the fifth, the optimum: neither path is systematically better).
So pack counts are asserted to be valid, above the bound and within 2 packs of the fast path.
"""

import sys

import numpy as np
import pytest

import scipy.optimize

from ipu_packing.packing import optimal as optimal_module
from ipu_packing.packing import plan_packing

from test_packing_plan import check_plan


def _histograms():
    rng = np.random.default_rng(7)
    cases = []
    for size, limit in ((32, 2), (48, 3), (64, 3), (64, None), (128, 3)):
        # lengths skewed long, as in real data, so packing has something to decide
        lengths = np.minimum(size, 1 + rng.geometric(3.0 / size, size=400 + size * 4))
        cases.append((np.bincount(lengths - 1, minlength=size)[:size], size, limit))
    cases.append((np.array([3, 0, 0, 3, 3, 0, 0, 0, 0, 0]), 10, 3))  # 3 packs of 5 + 4 + 1
    return cases


CASES = _histograms()


def _solve_all():
    """(plan_packing's packs, its LP bound, optimal()'s packs, its LP bound) per case."""
    out = []
    for hist, size, limit in CASES:
        plan = plan_packing(hist, size, limit)
        check_plan(plan, hist, size, limit)
        strategies, repeats, bound, _, _ = optimal_module.optimal(hist, size, limit or size)
        placed = np.zeros(size, dtype=np.int64)
        for strategy, count in zip(strategies, repeats):
            assert sum(strategy) <= size and len(strategy) <= (limit or size)
            for length in strategy:
                placed[length - 1] += count
        assert (placed >= hist).all()  # every sequence has a slot (over-covered slots are removed by plan.py)
        out.append((plan.num_packs, plan.lower_bound_packs, int(sum(repeats)), bound))
    return out


def _count_linprog(monkeypatch):
    calls = []
    original = scipy.optimize.linprog

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(scipy.optimize, "linprog", counting)  # optimal imports scipy.optimize lazily, at call time
    return calls


def test_linprog_fallback_matches_the_highs_object(monkeypatch):
    highspy = pytest.importorskip("scipy.optimize._highspy")
    if not hasattr(highspy, "_core"):
        pytest.skip("this scipy has no private HiGHS object: the fallback is the only path")
    calls = _count_linprog(monkeypatch)
    fast = _solve_all()
    assert not calls  # the fast path never called linprog

    # As on a scipy build without the private module: `from scipy.optimize._highspy import _core` fails.
    monkeypatch.delattr(highspy, "_core")
    monkeypatch.setitem(sys.modules, "scipy.optimize._highspy._core", None)
    with pytest.raises(ImportError):
        from scipy.optimize._highspy import _core  # noqa: F401
    assert optimal_module._Master(np.array([1, 2])).highs is None
    slow = _solve_all()
    assert calls  # the fallback ran

    for (hist, size, limit), a, b in zip(CASES, fast, slow):
        label = "S=%d K=%s" % (size, limit)
        assert b[1] == pytest.approx(a[1], rel=1e-9, abs=1e-9), label  # plan_packing's LP bound
        assert b[3] == pytest.approx(a[3], rel=1e-9, abs=1e-9), label  # optimal()'s LP bound
        bound = int(np.ceil(b[1] - 1e-9))
        for packs in (a[0], a[2], b[0], b[2]):
            assert packs >= bound, label
        assert abs(b[0] - a[0]) <= 2 and abs(b[2] - a[2]) <= 2, label
