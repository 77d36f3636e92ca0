"""The `optimal` planner stops by a rule that depends only on its input (rounds of column
generation), so `prepare` writes the same bytes on a quiet machine and on a loaded one. The wall
clock is only a safety net, and a plan it cuts short says so."""

import itertools
import warnings

import numpy as np
import pytest

from ipu_packing.packing import optimal as optimal_module
from ipu_packing.packing import plan_packing
from ipu_packing.packing.cli import main as packing_main

from packing_fixtures import check_plan

S, K = 512, 3


def _histogram():
    """A dense histogram whose LP needs about 15 rounds (under a second)."""
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.normal(S * 0.4, S * 0.25, size=20000).astype(int), 1, S)
    return np.bincount(lengths, minlength=S + 1)[1:]


class _SlowClock:
    """perf_counter of a machine where every round takes `step` seconds (a heavily loaded one)."""

    def __init__(self, step):
        self.ticks = itertools.count()
        self.step = step

    def __call__(self):
        return next(self.ticks) * self.step


def _same(a, b):
    return a.strategies == b.strategies and np.array_equal(a.repeats, b.repeats)


@pytest.mark.slow
def test_plan_does_not_depend_on_machine_speed(monkeypatch):
    hist = _histogram()
    quiet = plan_packing(hist, S, K)
    assert quiet.lp_rounds > 5 and quiet.stopped_by in ("lp_optimal", "bound")
    # Every clock reading 5 s later than the last: a machine ~10,000x slower than this one.
    monkeypatch.setattr(optimal_module.time, "perf_counter", _SlowClock(5.0))
    loaded = plan_packing(hist, S, K)
    assert loaded.stopped_by == quiet.stopped_by and loaded.lp_rounds == quiet.lp_rounds
    assert _same(loaded, quiet)
    assert loaded.lower_bound_packs == quiet.lower_bound_packs


def test_max_rounds_is_the_stopping_rule():
    hist = _histogram()
    full = plan_packing(hist, S, K)
    short = plan_packing(hist, S, K, max_rounds=2)
    assert short.lp_rounds == 2 and short.stopped_by == "max_rounds"
    check_plan(short, hist, S, K)
    # Stopping early keeps a valid (weaker or equal) bound and never beats the converged plan.
    assert short.lower_bound_packs <= full.lower_bound_packs + 1e-6
    assert short.lower_bound_integer <= full.num_packs <= short.num_packs
    assert _same(short, plan_packing(hist, S, K, max_rounds=2))


def test_time_limit_is_a_reported_safety_net(monkeypatch):
    hist = _histogram()
    monkeypatch.setattr(optimal_module.time, "perf_counter", _SlowClock(5.0))
    with pytest.warns(RuntimeWarning, match="depends on the machine's speed"):
        plan = plan_packing(hist, S, K, time_limit=12.0)
    assert plan.stopped_by == "time_limit" and plan.lp_rounds < 5
    check_plan(plan, hist, S, K)
    assert plan.to_dict()["stopped_by"] == "time_limit"


def test_no_warning_when_the_rule_stops_it(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = plan_packing(_histogram(), S, K, max_rounds=3)
    assert plan.stopped_by == "max_rounds"


@pytest.mark.parametrize("kwargs", [{"max_rounds": 0}, {"max_rounds": 2.5}, {"max_rounds": True},
                                    {"time_limit": 0}, {"time_limit": float("inf")}, {"time_limit": float("nan")}])
def test_bad_limits_are_refused(kwargs):
    with pytest.raises(ValueError):
        plan_packing([1, 2, 3], 8, 2, **kwargs)


def test_cli_exposes_the_rule(tmp_path, capsys):
    path = tmp_path / "h.txt"
    path.write_text("\n".join(str(int(c)) for c in _histogram()))
    assert packing_main(["--histogram", str(path), "--max-seq-length", str(S),
                         "--max-sequences-per-pack", str(K), "--lp-max-rounds", "2", "--json"]) == 0
    import json

    row = json.loads(capsys.readouterr().out)
    assert row["lp_rounds"] == 2 and row["stopped_by"] == "max_rounds"
    for bad in (["--lp-max-rounds", "0"], ["--lp-time-limit", "-1"], ["--lp-time-limit", "inf"]):
        assert packing_main(["--histogram", str(path), "--max-seq-length", str(S)] + bad) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1


def test_prepare_passes_the_rule_to_the_planner(tmp_path, capsys, monkeypatch):
    from ipu_packing.data.cli import main as data_main
    from synthetic_corpus import make_inputs
    from ipu_packing.packing import plan as plan_module

    corpus, vocab = make_inputs(str(tmp_path))
    seen = []
    real = plan_module.plan_packing

    def spy(*args, **kwargs):
        seen.append((kwargs["max_rounds"], kwargs["time_limit"]))
        return real(*args, **kwargs)

    monkeypatch.setattr("ipu_packing.packing.plan_packing", spy)
    common = ["prepare", "--input", corpus, "--vocab", vocab, "--max-seq-length", "32",
              "--max-sequences-per-pack", "4", "--dupe-factor", "1", "--workers", "1", "--quiet", "--no-padded"]
    assert data_main(common + ["--output", str(tmp_path / "a"), "--lp-max-rounds", "7", "--lp-time-limit", "none"]) == 0
    assert seen == [(7, None)]
    capsys.readouterr()
    assert data_main(common + ["--output", str(tmp_path / "b"), "--lp-max-rounds", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--lp-max-rounds" in err and err.count("\n") == 1
    assert not (tmp_path / "b").exists()
