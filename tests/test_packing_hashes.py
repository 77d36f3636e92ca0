"""Pinned plan hashes: the same histogram gives the same plan on every machine (docs/packing.md,
"Determinism").

`PackingPlan.sha256()` hashes S, K and the plan's strategies and repeats. The digests below were taken
with the pinned requirements; they are the contract, not one machine's result. To make another CPU's
numeric kernels visible on this one, the planner is run again in subprocesses with numpy's dispatched
SIMD features switched off (NPY_DISABLE_CPU_FEATURES: without AVX-512, and with baseline kernels only),
with other OpenBLAS kernels and thread counts (OPENBLAS_CORETYPE, OPENBLAS_NUM_THREADS) and beside
processes that load every core. Before the exact planner, the default corpus's histogram planned to
36,804 packs here and 36,803 without AVX-512: this test failed.

Regenerate only after an intended change to the planner (and say why in the commit message):

    python tests/test_packing_hashes.py --print
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ipu_packing.packing import plan_packing
from ipu_packing.packing.io import load_histogram

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WIKIPEDIA = os.path.join(os.path.dirname(REPO), "shared", "data", "wikipedia_512_histogram.json")
DEFAULT_CORPUS = os.path.join(HERE, "assets", "default_corpus_s128_histogram.json")


def _ties_thirds():
    """Every multiple of 3 up to 99, 500 times each, at S=100: equal counts, no pack fills exactly, and
    many patterns of equal value (the greedy packers miss the bound, so the LP decides)."""
    hist = np.zeros(100, dtype=np.int64)
    hist[np.arange(3, 100, 3) - 1] = 500
    return hist, 100, 3


def _ties_long_flat():
    """Every length of 31..128 a thousand times at K=4: equal counts again, through the LP."""
    hist = np.zeros(128, dtype=np.int64)
    hist[30:] = 1000
    return hist, 128, 4


def _file(path, size, limit):
    def case():
        counts, _ = load_histogram(path)
        return counts, size, limit
    return case


CASES = {
    "wikipedia_512_k3": _file(WIKIPEDIA, 512, 3),
    "wikipedia_512_kmax": _file(WIKIPEDIA, 512, None),
    "default_corpus_s128_k3": _file(DEFAULT_CORPUS, 128, 3),
    "ties_thirds_s100_k3": _ties_thirds,
    "ties_long_flat_s128_k4": _ties_long_flat,
}

# name: (packs, plan sha256)
PINNED = {
    "wikipedia_512_k3": (8143850, "f263f77b9728516d45c82cc44e8a7342764cbe811221699725d3fff8f04551dd"),
    "wikipedia_512_kmax": (8135728, "eba593bb507e15d32a11cd75737a795a16895adb96a6980c61dc67e0432286fb"),
    "default_corpus_s128_k3": (36803, "1fd634209ae052392ce35ef83d974d534d2f2c0444651805a4c0bb34c1bd2020"),
    "ties_thirds_s100_k3": (8500, "2de8e76cf3680d9b33e63dba473ebd0e0e25cc34ba19d31df03ab753e09c702e"),
    "ties_long_flat_s128_k4": (64500, "416f1bb7785a62edf6e213477cc6d435edf62b53286b4952a8c35a252c002531"),
}


def available(name):
    return name != "wikipedia_512_k3" and name != "wikipedia_512_kmax" or os.path.exists(WIKIPEDIA)


def hashes(names):
    """{name: [packs, sha256]} of the optimal plan of each case."""
    out = {}
    for name in names:
        counts, size, limit = CASES[name]()
        plan = plan_packing(counts, size, limit)
        out[name] = [plan.num_packs, plan.sha256()]
    return out


def _names():
    return [name for name in CASES if available(name)]


@pytest.mark.parametrize("name", list(CASES))
def test_plan_hash_is_pinned(name):
    if not available(name):
        pytest.skip("%s is absent (../shared/data beside the checkout)" % WIKIPEDIA)
    packs, digest = hashes([name])[name]
    assert (packs, digest) == tuple(PINNED[name])


def _dispatched_features():
    """numpy's dispatched SIMD targets this CPU has, lowest first (e.g. X86_V3, X86_V4, AVX512_ICL)."""
    import importlib
    import importlib.util

    core = "numpy._core" if importlib.util.find_spec("numpy._core") is not None else "numpy.core"  # numpy < 2: core
    umath = importlib.import_module(core + "._multiarray_umath")
    return [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)]


def _variants():
    features = _dispatched_features()
    variants = [("as is", {})]
    if len(features) > 1:
        variants.append(("without %s" % " ".join(features[1:]), {"NPY_DISABLE_CPU_FEATURES": " ".join(features[1:])}))
    if features:
        variants.append(("baseline kernels only", {"NPY_DISABLE_CPU_FEATURES": " ".join(features)}))
    for core, threads in (("Haswell", "1"), ("Prescott", "2"), ("SkylakeX", "2"), ("Zen", "1")):
        variants.append(("OpenBLAS %s, %s thread(s)" % (core, threads),
                         {"OPENBLAS_CORETYPE": core, "OPENBLAS_NUM_THREADS": threads}))
    variants.append(("a loaded CPU", {"_LOAD": "1"}))
    return variants


def _run_variant(env_extra, names):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for key in ("NPY_DISABLE_CPU_FEATURES", "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS"):
        env.pop(key, None)
    load = env_extra.pop("_LOAD", None) if env_extra else None
    env.update(env_extra)
    burners = []
    if load:  # one busy process per core for as long as the planner runs
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        result = subprocess.run([sys.executable, os.path.abspath(__file__), "--json"] + names, env=env,
                                capture_output=True, text=True, timeout=600, cwd=REPO)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def _variant_params():
    """The variants as rows; the loaded CPU's (a busy process per core beside the planner) runs apart (serial)."""
    return [pytest.param(label, env, marks=pytest.mark.serial) if "_LOAD" in env else (label, env)
            for label, env in _variants()]


@pytest.mark.slow
@pytest.mark.parametrize("label, env_extra", _variant_params(), ids=[label for label, _ in _variants()])
def test_plan_hashes_hold_under_other_kernels(label, env_extra):
    names = _names()
    got = _run_variant(dict(env_extra), names)
    want = {name: list(PINNED[name]) for name in names}
    assert got == want, "under %s" % label


def test_planning_imports_no_solver_until_the_lp_runs():
    """The heuristics and the import of the package load neither highspy nor scipy.optimize; the
    optimal packer loads highspy (public API), never scipy's private modules."""
    code = ("import sys, numpy as np\n"
            "from ipu_packing.packing import plan_packing\n"
            "h = np.bincount(np.minimum(128, 1 + np.random.default_rng(0).geometric(0.03, 3000)) - 1, minlength=128)\n"
            "plan_packing(h, 128, 3, algorithm='lpfhp')\n"
            "before = sorted(m for m in ('highspy', 'scipy.optimize') if m in sys.modules)\n"
            "plan_packing(h, 128, 3, algorithm='optimal')\n"
            "after = sorted(m for m in ('highspy', 'scipy.optimize', 'scipy.optimize._highspy') if m in sys.modules)\n"
            "print(before, after)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.strip() == "[] ['highspy']"


def test_without_highspy_the_optimal_packer_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    """A highspy that fails to import (first on sys.path, the real one out of sys.modules for the test): the
    command's main() in this process."""
    from ipu_packing.packing.cli import main

    (tmp_path / "highspy.py").write_text("raise ImportError('No module named highspy (test)')\n")
    for name in [n for n in sys.modules if n == "highspy" or n.startswith("highspy.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    counts, size, limit = _ties_thirds()  # one the greedy packers do not solve: the LP must run
    np.save(tmp_path / "h.npy", counts)
    code = main(["--histogram", str(tmp_path / "h.npy"), "--max-seq-length", str(size), "--max-sequences-per-pack",
                 str(limit)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.splitlines() == [
        "error: the optimal packer needs the highspy package (pinned in requirements.txt): "
        "No module named highspy (test)"]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--print"]:
        for key, value in hashes(_names()).items():
            print("    %r: (%d, %r)," % (key, value[0], value[1]))
    elif sys.argv[1:2] == ["--json"]:
        print(json.dumps(hashes(sys.argv[2:])))
    else:
        sys.exit("usage: python tests/test_packing_hashes.py --print | --json NAME ...")
