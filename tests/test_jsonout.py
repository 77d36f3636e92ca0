"""Strict machine-readable output (ipu_packing/jsonout.py `dumps`): every non-finite float becomes null, the
object's `warnings` list names each by its dotted path, and the text is written with allow_nan=False. Every output
is parsed by a reader that refuses NaN and Infinity, as jq and JavaScript do (app_fixtures.strict_json); compare
--json, the packing CLI and bench --json, and metrics.jsonl are checked beside their commands."""

from __future__ import annotations

import numpy as np
import pytest

from app_fixtures import strict_json as strict
from ipu_packing import jsonout

NAN, INF = float("nan"), float("inf")


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
