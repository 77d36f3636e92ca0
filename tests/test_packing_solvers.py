"""ipu_packing.packing._solvers loads scipy's compiled HiGHS and NNLS modules without importing
scipy.optimize (start-up time); the answers must be exactly scipy.optimize's."""

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("scipy")


def test_nnls_is_bit_identical_to_scipy():
    from scipy import optimize

    from ipu_packing.packing._solvers import nnls

    rng = np.random.default_rng(3)
    for m, n in ((5, 3), (40, 25), (128, 300)):
        A = rng.integers(0, 3, size=(m, n)).astype(np.float64)
        b = rng.integers(0, 50, size=m).astype(np.float64)
        x, r = nnls(A, b)
        x0, r0 = optimize.nnls(A, b)
        assert np.array_equal(x, x0) and r == r0


def _has_fast_modules() -> bool:
    import importlib.util

    try:
        return all(importlib.util.find_spec(name) is not None
                   for name in ("scipy.optimize._slsqplib", "scipy.optimize._highspy._core"))
    except ImportError:
        return False


@pytest.mark.skipif(not _has_fast_modules(), reason="this scipy lacks _slsqplib or _highspy._core (scipy < 1.15): "
                    "the planner imports scipy.optimize the ordinary way")
def test_planning_does_not_import_scipy_optimize():
    code = ("import sys, numpy as np\n"
            "from ipu_packing.packing import plan_packing\n"
            "h = np.bincount(np.minimum(128, 1 + np.random.default_rng(0).geometric(0.03, 3000)) - 1, minlength=128)\n"
            "for a in ('optimal', 'nnlshp'):\n"
            "    plan_packing(h, 128, 3, algorithm=a)\n"
            "print(sorted(m for m in ('scipy.optimize', 'scipy.sparse') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).stdout
    assert out.strip() == "[]"
    from ipu_packing.packing._solvers import highs_core

    import scipy.optimize._highspy._core as core  # a later ordinary import reuses the same module
    assert highs_core() is core
