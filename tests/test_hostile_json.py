"""Rule 8 (issue 24), strict machine-readable output. The mechanism is ipu_packing/jsonout.py `dumps`:
every non-finite float becomes null, the object's `warnings` list names each by its dotted path, and the
text is written with allow_nan=False. Tables: the helper on hostile values, compare --json on runs whose
numbers give NaN or Infinity, and the packing CLI and bench --json with a non-finite field. Every output
is parsed by a reader that refuses NaN and Infinity, as jq and JavaScript do."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ipu_packing import jsonout
from ipu_packing.compare import main as compare_main
from ipu_packing.bench.planner import main as packing_bench_main
from ipu_packing.packing.cli import main as packing_main
from ipu_packing.packing.plan import PackingPlan

from app_fixtures import write_run

NAN, INF = float("nan"), float("inf")


def strict(text):
    """json.loads that refuses NaN, Infinity and -Infinity (as a standard JSON reader does)."""
    def refuse(name):
        raise AssertionError("non-standard JSON constant %s in %s" % (name, text[:200]))
    return json.loads(text, parse_constant=refuse)


HELPER = [
    ("nan", {"x": NAN}, {"x": None}, ["x is NaN"]),
    ("inf", {"x": INF}, {"x": None}, ["x is Infinity"]),
    ("minus-inf", {"x": -INF}, {"x": None}, ["x is -Infinity"]),
    ("nested", {"a": {"b": [1.0, NAN]}}, {"a": {"b": [1.0, None]}}, ["a.b[1] is NaN"]),
    ("tuple", {"t": (INF, 2)}, {"t": [None, 2]}, ["t[0] is Infinity"]),
    ("numpy-scalar", {"x": np.float32("nan"), "y": np.int64(3)}, {"x": None, "y": 3}, ["x is NaN"]),
    ("numpy-array", {"x": np.array([1.0, np.inf])}, {"x": [1.0, None]}, ["x[1] is Infinity"]),
    ("numpy-2d", {"x": np.array([[np.nan], [2.0]])}, {"x": [[None], [2.0]]}, ["x[0][0] is NaN"]),
    ("numpy-bool", {"x": np.bool_(True)}, {"x": True}, []),
    ("own-warnings-kept", {"x": NAN, "warnings": ["w"]}, {"x": None}, ["w", "x is NaN"]),
    ("own-warning-string", {"x": NAN, "warnings": "w"}, {"x": None}, ["w", "x is NaN"]),
    ("own-warnings-null", {"x": INF, "warnings": None}, {"x": None}, ["x is Infinity"]),
    ("many", {"a": NAN, "b": INF, "c": 1.5}, {"a": None, "b": None, "c": 1.5}, ["a is NaN", "b is Infinity"]),
    ("finite-untouched", {"a": 1e308, "b": -0.0, "c": "NaN"}, {"a": 1e308, "b": -0.0, "c": "NaN"}, []),
]


@pytest.mark.parametrize("name, value, expected, warned", HELPER, ids=[c[0] for c in HELPER])
def test_dumps_is_strict(name, value, expected, warned):
    out = strict(jsonout.dumps(value))
    warnings = out.pop("warnings", [])
    assert out == expected
    assert len(warnings) == len(warned) and all(w in " | ".join(warnings) for w in warned), warnings


def test_a_top_level_list_and_a_deep_value():
    assert strict(jsonout.dumps([NAN, 1])) == [None, 1]
    deep = current = []
    for _ in range(100000):  # deeper than the recursion limit: the walk is iterative
        current.append([])
        current = current[0]
    current.append(NAN)
    clean, replaced = jsonout.finite(deep)
    assert len(replaced) == 1 and replaced[0].endswith("[0] is NaN")


def _runs(tmp, a, b, summary=None):
    """Two run directories from (sequences, seconds, mlm_loss) triples; A's summary.json if given."""
    pa, pb = write_run(tmp, "a", *a), write_run(tmp, "b", *b)
    if summary is not None:
        with open(os.path.join(pa, "summary.json"), "w") as f:
            f.write(summary)
    return [pa, pb, "--json", "--window", "1", "--warmup", "0"]


COMPARE = [
    ("zero-baseline-throughput", lambda t: _runs(t, ([10, 10], [1, 1], [5, 4]), ([0, 0], [1, 1], [5, 4])),
     ["throughput_ratio"]),
    ("no-overlap", lambda t: _runs(t, ([100, 100], [1, 1], [5, 4]), ([1, 1], [1, 1], [5, 4])), ["loss_gap"]),
    ("diverged-a", lambda t: _runs(t, ([10, 10], [1, 1], [5, NAN]), ([10, 10], [1, 1], [5, 4])),
     ["a.final_mlm_loss", "loss_gap"]),
    ("infinite-b", lambda t: _runs(t, ([10, 10], [1, 1], [5, 4]), ([10, 10], [1, 1], [5, INF])),
     ["target_mlm_loss", "b.final_mlm_loss"]),
    ("zero-loss-b", lambda t: _runs(t, ([10, 10], [1, 1], [5, 4]), ([10, 10], [1, 1], [0, 0])), ["loss_gap"]),
    ("summary-nan", lambda t: _runs(t, ([10, 10], [1, 1], [5, 4]), ([10, 10], [1, 1], [5, 4]),
                                     '{"packing_factor": NaN, "gradient_accumulation": Infinity}'),
     ["a.packing_factor", "a.gradient_accumulation"]),
]


@pytest.mark.parametrize("name, make, fields", COMPARE, ids=[c[0] for c in COMPARE])
def test_compare_json_is_strict(name, make, fields, tmp_path, capsys):
    assert compare_main(make(tmp_path)) == 0
    out, err = capsys.readouterr()
    result = strict(out)
    for field in fields:
        value = result
        for part in field.split("."):
            value = value[part]
        assert value is None, (field, value)
        assert any(w.startswith(field + " is ") for w in result["warnings"]), result["warnings"]
    assert err == ""  # no numpy RuntimeWarning beside the object


@pytest.fixture()
def histogram(tmp_path):
    path = tmp_path / "h.json"
    path.write_text('{"histogram": [1, 2, 3, 4], "max_sequence_length": 8}')
    return str(path)


@pytest.mark.parametrize("command", ["packing", "packing.bench"])
def test_packing_json_is_strict(command, histogram, monkeypatch, capsys):
    to_dict = PackingPlan.to_dict
    monkeypatch.setattr(PackingPlan, "to_dict", lambda self, *a: dict(to_dict(self, *a), seconds=NAN, gap=INF))
    main = packing_main if command == "packing" else packing_bench_main
    extra = [] if command == "packing" else ["--algorithms", "optimal,nnlshp"]
    assert main(["--histogram", histogram, "--json"] + extra) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == (1 if command == "packing" else 2)
    for line in lines:
        row = strict(line)
        assert row["seconds"] is None and row["gap"] is None and row["num_sequences"] == 10
        assert sorted(w.split(" is ")[0] for w in row["warnings"]) == ["gap", "seconds"]


def test_a_non_finite_step_metric_is_null_in_metrics_jsonl(tmp_path):
    """metrics.jsonl is machine-readable output too: a step whose loss is NaN (the step a divergence stops
    at) or whose throughput is inf (a zero-second step) is written as null with a warning, never NaN."""
    from ipu_packing.train.metrics import MetricsLogger, StepRecord
    from ipu_packing.train.sections import LoggingConfig

    logger = MetricsLogger(str(tmp_path / "metrics.jsonl"), str(tmp_path / "tensorboard"), 1, 0,
                           LoggingConfig(progress_bar=False, tensorboard=False, jsonl=True), log=lambda line: None)
    logger.log(StepRecord(step=1, metrics={"loss": float("nan"), "mlm_loss": 1.0, "nsp_loss": 0.5, "mlm_accuracy": 0.1,
                                           "nsp_accuracy": 0.5},
                          lr=1e-3, sequences=3, tokens=30, packs=2, packing_factor=1.5, seconds=0.0,
                          sequences_per_second=float("inf"), tokens_per_second=float("inf"), epoch=0))
    logger.close()
    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()

    def refuse(constant):
        raise AssertionError("not JSON: %s" % constant)

    record = json.loads(line, parse_constant=refuse)
    assert record["loss"] is None and record["sequences_per_second"] is None and record["mlm_loss"] == 1.0
    assert record["warnings"] == ["loss is NaN, not a finite number: written as null",
                                  "sequences_per_second is Infinity, not a finite number: written as null",
                                  "tokens_per_second is Infinity, not a finite number: written as null"]
