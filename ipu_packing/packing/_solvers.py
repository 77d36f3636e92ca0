"""The two compiled scipy solvers the planner calls, loaded without importing scipy.optimize.

Importing scipy.optimize costs ~0.5 s of CPU (it pulls in scipy.linalg, scipy.sparse, scipy.fft,
scipy.spatial, ...), while the planner needs only two extension modules: HiGHS
(scipy.optimize._highspy._core) and the NNLS solver (scipy.optimize._slsqplib), ~0.01 s to load.
Each is loaded from its file under its own module name and registered in sys.modules, so a later
`import scipy.optimize` finds and reuses it (a pybind11 module must never be loaded twice). If
scipy.optimize is already imported, or anything here fails, the ordinary import is used: the
same compiled code either way, so the results are identical.

Why not the public `highspy` package: it would be a new dependency that covers only HiGHS (NNLS
would still come from scipy), and its HiGHS build is not scipy's, so plans, and with them the
prepared data's bytes, could change; loading scipy's own modules keeps one solver build and no
new requirement.
"""

from __future__ import annotations

import sys


def _extension(name: str):
    if name in sys.modules:
        return sys.modules[name]
    try:
        import glob
        import importlib.machinery
        import importlib.util
        import os

        import scipy

        parts = name.split(".")
        base = os.path.join(os.path.dirname(scipy.__file__), *parts[1:])
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            matches = glob.glob(base + suffix)
            if matches:
                loader = importlib.machinery.ExtensionFileLoader(name, matches[0])
                spec = importlib.util.spec_from_file_location(name, matches[0], loader=loader)
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                try:
                    loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
                return module
    except Exception:  # pragma: no cover - depends on the scipy install
        pass
    import importlib

    return importlib.import_module(name)


def highs_core():
    """scipy.optimize._highspy._core (raises ImportError without scipy)."""
    return _extension("scipy.optimize._highspy._core")


def nnls_solver():
    """The compiled NNLS routine, scipy.optimize._slsqplib.nnls(A, b, maxiter) -> (x, rnorm, info)."""
    return _extension("scipy.optimize._slsqplib").nnls


def nnls(A, b):
    """scipy.optimize.nnls(A, b) for a 2-D A and 1-D b, without importing scipy.optimize."""
    import numpy as np

    A = np.asarray_chkfinite(A, dtype=np.float64, order="C")
    b = np.asarray_chkfinite(b, dtype=np.float64)
    if A.ndim != 2 or b.ndim != 1 or A.shape[0] != b.shape[0]:
        from scipy import optimize

        return optimize.nnls(A, b)
    try:
        solver = nnls_solver()
    except ImportError:  # scipy < 1.15 (e.g. the Poplar SDK's 1.10) has no _slsqplib: the ordinary path
        from scipy import optimize

        return optimize.nnls(A, b)
    x, rnorm, info = solver(A, b, 3 * A.shape[1])
    if info == 3:
        raise RuntimeError("Maximum number of iterations reached.")
    return x, rnorm
