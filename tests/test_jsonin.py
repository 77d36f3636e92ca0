"""ipu_packing/jsonin.py: nesting is measured before json parses, so no reader meets a RecursionError."""

from __future__ import annotations

import json

import pytest

from ipu_packing import jsonin


@pytest.mark.parametrize("text, value", [
    ('{"a": [1, 2, {"b": "[[[[[[[["}]}', {"a": [1, 2, {"b": "[[[[[[[["}]}),  # brackets in a string
    ('["\\"[[[[", 1]', ['"[[[[', 1]),  # an escaped quote does not end the string
    ("[" * 64 + "]" * 64, eval("[" * 64 + "]" * 64)),  # exactly the limit
    (b'{"x": 1}', {"x": 1}),  # bytes are UTF-8
])
def test_what_json_reads_within_the_limit(text, value):
    assert jsonin.loads(text) == value


@pytest.mark.parametrize("text, at", [
    ("[" * 65 + "]" * 65, 64),
    ('{"a": ' * 65 + "1" + "}" * 65, 6 * 64),
    ("[" * 1000000, 64),  # a megabyte of brackets: refused without parsing it
    ('["]]]]"' + ", [" * 70, 6 + 3 * 64),
])
def test_deeper_than_the_limit_is_a_json_error_at_its_place(text, at):
    with pytest.raises(json.JSONDecodeError) as info:
        jsonin.loads(text)
    assert isinstance(info.value, jsonin.TooDeep) and info.value.pos == at
    assert str(info.value).startswith("nested too deeply: more than 64 levels of arrays and objects")


def test_a_lower_limit_is_the_callers_choice():
    assert jsonin.loads("[[[1]]]", max_depth=3) == [[[1]]]
    with pytest.raises(jsonin.TooDeep):
        jsonin.loads("[[[[1]]]]", max_depth=3)


def test_a_json_file_larger_than_the_bound_is_refused_without_reading_it_whole(tmp_path):
    from ipu_packing.errors import InputError

    path = tmp_path / "config.json"
    path.write_bytes(b'{"pad": "' + b" " * 2000 + b'"}')
    assert jsonin.load_path(str(path), max_bytes=4096) == {"pad": " " * 2000}
    with pytest.raises(InputError, match="config.json: larger than 1024 bytes"):
        jsonin.load_path(str(path), max_bytes=1024)


BREAKS = ["\u2028", "\u2029", "\u0085", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c"]
"""Characters str.splitlines breaks a line at, besides \\n and \\r."""


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_json_lines_are_cut_at_newlines_only(ensure_ascii):
    from ipu_packing.jsonout import jsonl_text

    records = [{"context": "a%sb" % ch, "n": i} for i, ch in enumerate(BREAKS)] + [{"context": "crlf", "n": -1}]
    text = jsonl_text(records, ensure_ascii=ensure_ascii).replace('"n": -1}\n', '"n": -1}\r\n') + "\n\n"
    assert [jsonin.loads(line) for _, line in jsonin.jsonl_lines(text)] == records
    assert [n for n, _ in jsonin.jsonl_lines(text)] == list(range(1, len(records) + 1))


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_json_lines_bytes_are_cut_as_their_text(ensure_ascii):
    """The file's bytes cut at b"\\n" give the lines of its text, encoded (a reader names a line that is not UTF-8
    by its number)."""
    from ipu_packing.jsonout import jsonl_text

    records = [{"context": "a%sb" % ch, "n": i} for i, ch in enumerate(BREAKS)]
    text = jsonl_text(records, ensure_ascii=ensure_ascii) + "\n \n"
    assert jsonin.jsonl_lines(text.encode("utf-8")) == [(n, line.encode("utf-8"))
                                                        for n, line in jsonin.jsonl_lines(text)]
    assert len(jsonin.jsonl_lines(text.encode("utf-8") + b'{"torn": \xff')) == len(records) + 1


@pytest.mark.parametrize("text, complete", [
    ("", True), ('{"a": 1}\n', True), ('{"a": 1}\n  ', True), ('{"a": 1}\r\n', True), ('{"a": 1}', False),
    ('{"a": 1}\n{"a": 2', False), ('{"a": "\u2028"}', False), (b'{"a": 1}\n', True), (b'{"a": \xff', False),
], ids=["empty", "ended", "white space after", "crlf", "no newline", "torn second", "u2028 at the end", "bytes",
        "torn bytes"])
def test_a_json_lines_text_is_complete_when_its_last_record_ends_with_a_newline(text, complete):
    assert jsonin.jsonl_complete(text) is complete


def test_forced_changes_are_strict_json_whatever_the_values():
    """A non-finite value is written as null (with a warning), never as NaN or Infinity, which no strict reader
    takes."""
    import os
    import tempfile

    from ipu_packing.train.run_dir import RunDirectory

    with tempfile.TemporaryDirectory() as root:
        run = RunDirectory(os.path.join(root, "run"))
        run.record_forced(3, None, {}, [("optimizer.learning_rate", 0.001, float("inf")), ("x.path", 1, b"a")])
        with open(os.path.join(run.path, "forced_changes.jsonl")) as f:
            (line,) = f.read().splitlines()

    def refuse(constant):
        raise ValueError("not JSON: %s" % constant)

    record = json.loads(line, parse_constant=refuse)
    assert record["changes"] == {"optimizer.learning_rate": {"old": 0.001, "new": None},
                                 "x.path": {"old": 1, "new": "b'a'"}}
    assert record["warnings"] == ["changes.optimizer.learning_rate.new is Infinity, not a finite number: written as "
                                  "null"]


# Every JSON Lines file a command writes or reads back keeps a record whose strings hold the characters
# str.splitlines also breaks at: each row writes records holding them (as the file's writer writes them, or raw
# UTF-8 where another program may have written the file) and reads them back through the command's own reader.

NOTES = ["a\u2028b", "c\u0085d", "e\u2029f\x1cg"]


def _step(i, note):
    return {"step": i + 1, "sequences": 10, "tokens": 100, "seconds": 1.0, "mlm_loss": 2.0, "mlm_accuracy": 0.5,
            "nsp_accuracy": 0.5, "loss": 2.5, "note": note}


def _raw_metrics(directory):
    """metrics.jsonl of len(NOTES) step records, each with a note holding a line-breaking character, raw UTF-8."""
    import os

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "metrics.jsonl"), "wb") as f:
        for i, note in enumerate(NOTES):
            f.write(json.dumps(_step(i, note), ensure_ascii=False).encode("utf-8") + b"\n")
    return os.path.join(directory, "metrics.jsonl")


def _read(path):
    with open(path, "rb") as f:
        return [jsonin.loads(line) for _, line in jsonin.jsonl_lines(f.read().decode("utf-8"))]


def _compare_metrics(tmp_path):
    from ipu_packing.compare import read_run

    _raw_metrics(str(tmp_path / "run"))
    run = read_run(str(tmp_path / "run"))
    return [int(s) for s in run.steps]


def _repaired_metrics(tmp_path):
    from ipu_packing.train.metrics import repair_jsonl

    path = _raw_metrics(str(tmp_path / "run"))
    assert repair_jsonl(path, last_step=len(NOTES), log=lambda line: None) == len(NOTES)
    return [r["note"] for r in _read(path)]


def _forced_changes(tmp_path):
    import os

    from ipu_packing.train.run_dir import RunDirectory

    run = RunDirectory(str(tmp_path / "run"))
    for step, note in enumerate(NOTES, 1):
        run.record_forced(step, None, {}, [("data.dir", note, note + "/new")])
    return [r["changes"]["data.dir"]["old"] for r in _read(os.path.join(run.path, "forced_changes.jsonl"))]


def _evaluations(tmp_path):
    from ipu_packing.train.run_dir import RunDirectory

    run = RunDirectory(str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    for step, note in enumerate(NOTES, 1):
        run.append_evaluation({"step": step, "split": note})
    return [r["split"] for r in run.read_metrics(RunDirectory.EVAL)]


def _convergence_row(tmp_path):
    import os

    from ipu_packing.bench.convergence import run_row

    directory = str(tmp_path / "run")
    _raw_metrics(directory)
    with open(os.path.join(directory, "summary.json"), "w") as f:
        json.dump({"steps": 3, "evaluation": {"metrics": {"accuracy": 0.5}, "split": "v\u2028al"}}, f,
                  ensure_ascii=False)
    row = run_row("packed", 1, directory, 0.0)
    return [row["split"], row["sequences_per_step"], row["metrics"]]


ROUND_TRIPS = [
    ("compare-metrics", _compare_metrics, [1, 2, 3]),
    ("repaired-metrics", _repaired_metrics, NOTES),
    ("forced-changes", _forced_changes, NOTES),
    ("eval-jsonl", _evaluations, NOTES),
    ("convergence-run", _convergence_row, ["v\u2028al", 10, {"accuracy": 0.5}]),
]


@pytest.mark.parametrize("name, round_trip, expected", ROUND_TRIPS, ids=[r[0] for r in ROUND_TRIPS])
def test_a_record_holding_line_breaking_characters_round_trips(name, round_trip, expected, tmp_path):
    assert round_trip(tmp_path) == expected
