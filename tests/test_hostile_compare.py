"""compare on hostile run directories (issue 24): every file it reads is checked before use in one place
(ipu_packing/compare.py `read_run`, `_json_value`), and `--plot` is checked before any work
(`check_plot_path`). Each row runs `python -m ipu_packing.compare`'s main(): one line `error: <cause>`,
exit 2, nothing on stdout."""

from __future__ import annotations

import json
import os

import pytest

from ipu_packing.compare import main

from app_fixtures import write_run


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

CASES = [
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


@pytest.mark.parametrize("name, make, words", CASES, ids=[c[0] for c in CASES])
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
