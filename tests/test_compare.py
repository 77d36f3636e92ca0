"""ipu_packing.compare on small made-up run directories, with exact expected values; its --json output is strict
JSON; a hostile run directory or plot path is refused in one line."""

import json
import os

import numpy as np
import pytest

from app_fixtures import strict_json as strict, write_run
from ipu_packing.compare import compare, main, read_run, smooth


@pytest.fixture
def runs(tmp_path):
    a = write_run(tmp_path, "packed", [10, 10, 10, 10], [2, 1, 1, 1], [8, 6, 4, 2])
    b = write_run(tmp_path, "padded", [10, 10, 10, 10], [4, 2, 2, 2], [8, 7, 6, 5])
    return a, b


def test_smoothing_is_a_trailing_mean():
    np.testing.assert_array_equal(smooth([1, 2, 3, 4], 2), [1.0, 1.5, 2.5, 3.5])
    np.testing.assert_array_equal(smooth([1, 2, 3, 4], 1), [1, 2, 3, 4])


def test_the_arithmetic(runs):
    c = compare(read_run(runs[0]), read_run(runs[1]), window=1, warmup=1)
    assert c.throughput_ratio == pytest.approx(2.0, abs=1e-12)  # 30 seq / 3 s against 30 seq / 6 s
    assert c.target_mlm_loss == 5.0
    assert c.time_to_target_ratio == pytest.approx(2.5, abs=1e-12)  # B reaches 5 at 10 s, A at 4 s
    assert c.loss_gap == pytest.approx(0.6, abs=1e-12)  # |2 - 5| / 5 at 40 sequences seen
    assert c.warnings == []
    assert c.a["sequences_per_step_mean"] == 10 and c.a["sequences_per_step_std"] == 0
    assert c.a["tokens_per_second"] == pytest.approx(100.0)
    assert c.b["final_mlm_loss"] == 5.0 and c.a["final_mlm_accuracy"] == pytest.approx(0.4)
    assert c.a["global_batch_sequences"] == 40


def test_never_reaching_the_target_and_unlike_batches_warn(tmp_path):
    a = write_run(tmp_path, "a", [10, 10, 10], [1, 1, 1], [9, 9, 9])
    b = write_run(tmp_path, "b", [12, 12, 12], [1, 1, 1], [9, 8, 7])
    c = compare(read_run(a), read_run(b), window=1, warmup=0)
    assert c.time_to_target_ratio is None
    assert c.throughput_ratio == pytest.approx(10 / 12)
    assert len(c.warnings) == 1 and "-16.7%" in c.warnings[0]


def test_command_json_plot_and_errors(runs, tmp_path, capsys):
    png = str(tmp_path / "plots" / "compare.png")
    assert main([runs[0], runs[1], "--json", "--window", "1", "--warmup", "1", "--plot", png]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["throughput_ratio"] == pytest.approx(2.0) and out["time_to_target_ratio"] == pytest.approx(2.5)
    assert os.path.getsize(png) > 1000
    assert main([runs[0], runs[1]]) == 0
    assert "throughput ratio" in capsys.readouterr().out
    assert main([runs[0], str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nowhere" in err and err.count("\n") == 1
    assert main([runs[0], runs[1], "--warmup", "3"]) == 0  # the last step of 4 timed
    capsys.readouterr()
    assert main([runs[0], runs[1], "--warmup", "4"]) == 2  # no step left: refused, not the last step's ratio
    assert capsys.readouterr() == ("", "error: --warmup 4 leaves no step of the shorter run (4 steps) to time: give "
                                       "at most 3\n")


def test_a_fine_tuning_run_is_refused_naming_its_task(runs, tmp_path, capsys):
    tuned = os.path.join(str(tmp_path), "tuned")
    os.makedirs(tuned)
    with open(os.path.join(tuned, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 1, "sequences": 8, "tokens": 80, "seconds": 1.0, "loss": 0.7, "accuracy": 0.5})
                + "\n")
    with open(os.path.join(tuned, "config.json"), "w") as f:
        json.dump({"task": {"name": "classification"}, "training": {}}, f)
    assert main([tuned, runs[1]]) == 2
    assert capsys.readouterr() == ("", "error: %s is a classification run: compare reads pretraining runs' MLM and "
                                       "NSP curves (python -m ipu_packing.bench.convergence compares fine-tuning "
                                       "layouts)\n" % tuned)


# -- compare --json is strict JSON: a NaN or an Infinity is null, named in `warnings` (ipu_packing/jsonout.py) ------

NAN, INF = float("nan"), float("inf")


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
    assert main(make(tmp_path)) == 0
    out, err = capsys.readouterr()
    result = strict(out)
    for field in fields:
        value = result
        for part in field.split("."):
            value = value[part]
        assert value is None, (field, value)
        assert any(w.startswith(field + " is ") for w in result["warnings"]), result["warnings"]
    assert err == ""  # no numpy RuntimeWarning beside the object


# -- hostile run directories: every file compare reads is checked before use, in one place (compare.py `read_run`,
# `_json_value`), and `--plot` is checked before any work (`check_plot_path`); each is one line `error: <cause>`,
# exit 2, nothing on stdout.

def _run(tmp, name="a"):
    return write_run(tmp, name, [10, 10, 10], [1, 1, 1], [8, 7, 6])


def _with(name, data):
    """A run whose file ``name`` holds ``data`` (bytes), compared against a clean one."""
    def make(tmp):
        a = _run(tmp, "a")
        with open(os.path.join(a, name), "wb") as f:
            f.write(data)
        return [a, _run(tmp, "b")]
    return make


def _line(data):
    """A run whose metrics.jsonl gets one more line, ``data`` (bytes)."""
    def make(tmp):
        a = _run(tmp, "a")
        with open(os.path.join(a, "metrics.jsonl"), "ab") as f:
            f.write(data)
        return [a, _run(tmp, "b")]
    return make


def _record(**fields):
    row = {"step": 4, "sequences": 10, "tokens": 100, "seconds": 1, "mlm_loss": 5, "mlm_accuracy": 0.1,
           "nsp_accuracy": 0.5}
    row.update(fields)
    return _line((json.dumps(row) + "\n").encode())


def _plot(name):
    def make(tmp):
        (tmp / "a_file").write_text("x")
        (tmp / "a_dir.png").mkdir()
        return [_run(tmp, "a"), _run(tmp, "b"), "--plot", str(tmp / name)]
    return make


def _plot_before_work(tmp):
    return [str(tmp / "no_run_a"), str(tmp / "no_run_b"), "--plot", str(tmp / "x.xyz")]


DEEP = b"[" * 100000 + b"]" * 100000

HOSTILE_RUNS = [
    ("summary-list", _with("summary.json", b"[1, 2]"), ["summary.json is a list"]),
    ("summary-string", _with("summary.json", b'"done"'), ["summary.json is a string"]),
    ("summary-null", _with("summary.json", b"null"), ["summary.json is null"]),
    ("summary-number", _with("summary.json", b"3"), ["summary.json is a number"]),
    ("summary-deep", _with("summary.json", DEEP), ["summary.json", "nested too deeply"]),
    ("summary-not-utf8", _with("summary.json", b'{"a": "\xff"}'), ["summary.json is not UTF-8"]),
    ("config-list", _with("config.json", b"[]"), ["config.json is a list"]),
    ("config-training-list", _with("config.json", b'{"training": [1]}'), ["training is a list"]),
    ("config-deep", _with("config.json", b'{"a": ' + DEEP + b"}"), ["config.json", "nested too deeply"]),
    ("metrics-list-line", _line(b"[1, 2]\n"), ["line 4 is a list"]),
    ("metrics-string-line", _line(b'"step"\n'), ["line 4 is a string"]),
    ("metrics-null-line", _line(b"null\n"), ["line 4 is null"]),
    ("metrics-number-line", _line(b"7\n"), ["line 4 is a number"]),
    ("metrics-torn", _line(b'{"step": 4, "sequ'), ["line 4 is not JSON"]),
    ("metrics-not-utf8", _line(b'{"step": "\xfe"}\n'), ["line 4 is not UTF-8"]),
    ("metrics-deep", _line(DEEP + b"\n"), ["line 4", "nested too deeply"]),
    ("metrics-huge-step", _record(step=10 ** 400), ["line 4", "step must be a finite number"]),
    ("metrics-nan-seconds", _record(seconds=float("nan")), ["line 4", "seconds"]),
    ("metrics-inf-tokens", _record(tokens=float("inf")), ["line 4", "tokens"]),
    ("metrics-negative-sequences", _record(sequences=-10), ["line 4", "sequences"]),
    ("metrics-string-loss", _record(mlm_loss="5"), ["lacks mlm_loss"]),
    ("plot-unknown-extension", _plot("x.xyz"), ["unsupported extension .xyz", "supported:", ".png", ".pdf"]),
    ("plot-no-extension", _plot("plot"), ["no file extension", ".png"]),
    ("plot-is-a-directory", _plot("a_dir.png"), ["is a directory"]),
    ("plot-under-a-file", _plot("a_file/x.png"), ["a_file is not a directory"]),
    ("plot-checked-first", _plot_before_work, ["unsupported extension .xyz"]),
]


@pytest.mark.parametrize("name, make, words", HOSTILE_RUNS, ids=[c[0] for c in HOSTILE_RUNS])
def test_hostile_run_is_one_line(name, make, words, tmp_path, capsys):
    code = main(make(tmp_path) + ["--json"])
    out, err = capsys.readouterr()
    assert code == 2, (out, err[-500:])
    assert err.startswith("error: ") and err.count("\n") == 1, err[-500:]
    assert out == "" and len(err) < 1000
    for word in words:
        assert word in err, (word, err)


def test_an_upper_case_extension_is_a_supported_one(tmp_path, capsys):
    png = str(tmp_path / "plot.PNG")
    assert main([_run(tmp_path, "a"), _run(tmp_path, "b"), "--plot", png]) == 0
    assert os.path.getsize(png) > 0
