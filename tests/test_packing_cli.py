import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ipu_packing.packing import plan_packing
from app_fixtures import captured, strict_json as strict
from ipu_packing.bench.planner import main as packing_bench_main
from ipu_packing.packing.cli import main
from ipu_packing.packing.plan import PackingPlan

REPO = Path(__file__).resolve().parents[1]
HIST = np.array([0, 5, 0, 7, 3, 0, 2, 9, 1, 0, 4, 6], dtype=np.int64)  # bins 1..12
KEYS = {
    "algorithm", "max_seq_length", "max_sequences_per_pack", "num_sequences", "num_packs",
    "efficiency", "theoretical_speedup", "lower_bound_packs", "seconds",
}


def run(*args, module="ipu_packing.packing"):
    """``python -m MODULE ARGS``'s main() in this process: its exit status, stdout and stderr."""
    command = {"ipu_packing.packing": main, "ipu_packing.bench.planner": packing_bench_main}[module]
    code, out, err = captured(command, [str(a) for a in args])
    return subprocess.CompletedProcess(args, code, out, err)


def run_process(*args, module="ipu_packing.packing"):
    """``python -m MODULE ARGS`` in a process of its own, as a shell runs it."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", module] + [str(a) for a in args],
        cwd=str(REPO), env=env, capture_output=True, text=True, timeout=120,
    )


@pytest.fixture
def files(tmp_path):
    np.save(tmp_path / "h.npy", HIST)
    (tmp_path / "h.txt").write_text("# counts\n" + "\n".join(map(str, HIST)) + "\n")
    (tmp_path / "list.json").write_text(json.dumps(HIST.tolist()))
    (tmp_path / "obj.json").write_text(json.dumps({"histogram": HIST.tolist(), "max_sequence_length": 16}))
    return tmp_path


@pytest.mark.parametrize(
    "name, algorithm, limit",
    [("h.npy", "optimal", "3"), ("h.txt", "lpfhp", "max"), ("list.json", "optimal", "max"),
     ("obj.json", "nnlshp", "2")],
)
def test_json_output_matches_the_library(files, name, algorithm, limit):
    proc = run("--histogram", files / name, "--max-seq-length", 16,
               "--max-sequences-per-pack", limit, "--algorithm", algorithm, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert KEYS <= set(out)
    expected = plan_packing(HIST, 16, None if limit == "max" else int(limit), algorithm)
    assert out["algorithm"] == algorithm
    assert out["max_seq_length"] == 16
    assert out["max_sequences_per_pack"] == (None if limit == "max" else int(limit))
    assert out["num_sequences"] == int(HIST.sum()) == expected.num_sequences
    assert out["num_packs"] == expected.num_packs
    assert abs(out["efficiency"] - expected.efficiency) < 1e-12
    assert abs(out["theoretical_speedup"] - expected.theoretical_speedup) < 1e-12
    assert abs(out["theoretical_speedup"] - expected.theoretical_speedup) < 1e-12
    if algorithm == "optimal":
        assert out["lower_bound_packs"] <= out["num_packs"]
        assert out["lower_bound_packs"] == pytest.approx(expected.lower_bound_packs)
    else:
        assert out["lower_bound_packs"] is None


def test_json_file_supplies_the_max_length(files):
    proc = run("--histogram", files / "obj.json", "--algorithm", "spfhp", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["max_seq_length"] == 16


def test_table_output(files):
    proc = run("--histogram", files / "h.npy", "--max-seq-length", 16, "--max-sequences-per-pack", 3)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    head, table = proc.stdout.split("\n\nmost frequent strategies (lengths in one pack):\n")
    rows = dict(line.rsplit("  ", 1) for line in head.splitlines())
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    expected = plan_packing(HIST, 16, 3, "optimal")
    assert rows["algorithm"] == "optimal" and rows["max sequence length"] == "16"
    assert rows["max sequences per pack"] == "3"
    assert int(rows["sequences"]) == int(HIST.sum()) == 37
    assert int(rows["packs"]) == expected.num_packs
    assert rows["efficiency"] == "%.4f%%" % (100 * expected.efficiency)
    assert rows["plan sha256"] == expected.sha256()
    assert rows["LP lower bound (packs)"].endswith("-> at least %d" % expected.num_packs)  # the bound is met here
    assert rows["packs above the bound"] == "0"
    # the strategy table: packs, tokens, lengths; its packs add up to the plan's (all 8 strategies shown)
    lines = table.splitlines()
    assert lines[0].split() == ["packs", "tokens", "lengths"]
    counts = [int(line.split()[0]) for line in lines[1:]]
    assert len(counts) == int(rows["strategies"]) and sum(counts) == expected.num_packs
    for line in lines[1:]:
        packs, tokens, lengths = line.split(None, 2)
        assert int(tokens) == sum(int(n) for n in lengths.split(" + ")) <= 16


def bad_files(tmp_path):
    (tmp_path / "neg.txt").write_text("1\n-2\n3\n")
    (tmp_path / "empty.json").write_text("[]")
    (tmp_path / "garbage.npy").write_bytes(b"not numpy at all")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "word.txt").write_text("1\nseven\n")
    (tmp_path / "h.csv").write_text("1,2\n")
    np.save(tmp_path / "ok.npy", HIST)
    return tmp_path


@pytest.mark.parametrize("name", ["latin.txt", "latin.json"])
def test_a_histogram_file_that_is_not_utf8_is_refused_as_such(tmp_path, capsys, name):
    path = tmp_path / name
    path.write_bytes(b"1\n\xff\xfe\n")
    assert main(["--histogram", str(path), "--max-seq-length", "16"]) == 2
    assert capsys.readouterr() == ("", "error: %s is not UTF-8 text (byte 0xff at offset 2)\n" % path)


@pytest.mark.parametrize(
    "args",
    [
        ["--histogram", "{d}/neg.txt", "--max-seq-length", "16"],
        ["--histogram", "{d}/empty.json", "--max-seq-length", "16"],
        ["--histogram", "{d}/ok.npy", "--max-seq-length", "8"],  # histogram has 12 bins
        ["--histogram", "{d}/ok.npy", "--max-seq-length", "16", "--max-sequences-per-pack", "0"],
        ["--histogram", "{d}/ok.npy", "--max-seq-length", "16", "--max-sequences-per-pack", "lots"],
        ["--histogram", "{d}/missing.npy", "--max-seq-length", "16"],
        ["--histogram", "{d}/garbage.npy", "--max-seq-length", "16"],
        ["--histogram", "{d}/bad.json", "--max-seq-length", "16"],
        ["--histogram", "{d}/word.txt", "--max-seq-length", "16"],
        ["--histogram", "{d}/h.csv", "--max-seq-length", "16"],
        ["--histogram", "{d}/ok.npy"],  # no max length anywhere
        ["--histogram", "{d}/ok.npy", "--max-seq-length", "16", "--algorithm", "ffd"],
        ["--max-seq-length", "16"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args):
    d = bad_files(tmp_path)
    assert main([a.format(d=d) for a in args] + ["--json"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("error: ")


@pytest.mark.parametrize(
    "args, process",
    [
        (["--histogram", "{d}/neg.txt", "--max-seq-length", "16"], True),
        (["--histogram", "{d}/ok.npy", "--max-seq-length", "16", "--max-sequences-per-pack", "0"], False),
        (["--histogram", "{d}/missing.npy", "--max-seq-length", "16"], False),
    ],
)
def test_bad_input_exit_code_of_the_process(tmp_path, args, process):
    """The exit status, stdout and stderr of the command: the first row in a process of its own (what a shell
    sees), the others through main() in this process."""
    d = bad_files(tmp_path)
    proc = (run_process if process else run)(*[a.format(d=d) for a in args], "--json")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_bench_prints_every_algorithm(files):
    proc = run("--histogram", files / "h.npy", "--max-seq-length", 16, "--max-sequences-per-pack", 3,
               "--json", module="ipu_packing.bench.planner")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["algorithm"] for r in rows] == ["spfhp", "lpfhp", "nnlshp", "optimal"]
    best = min(r["num_packs"] for r in rows)
    assert rows[-1]["num_packs"] == best
    assert all(r["packs_above_lp_bound"] >= 0 for r in rows)


def test_the_earlier_spelling_of_S_still_parses():
    from ipu_packing.packing.cli import build_parser

    assert build_parser().parse_args(["--histogram", "h.npy", "--max-sequence-length", "16"]).max_seq_length == 16
    assert build_parser().parse_args(["--histogram", "h.npy", "--max-seq-length", "16"]).max_seq_length == 16
    assert build_parser().parse_args(["--histogram", "h.npy"]).max_seq_length is None


def test_bench_assign_reports_seconds_memory_and_the_ratio_to_a_stable_argsort(files):
    proc = run("--histogram", files / "h.npy", "--max-seq-length", 16, "--algorithms", "optimal", "--assign",
               "--assign-repeats", 2, "--json", module="ipu_packing.bench.planner")
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout.splitlines()[-1])
    assert row["assign"] is True and row["repeats"] == 2
    assert row["num_sequences"] == int(HIST.sum())
    assert row["num_packs"] == plan_packing(HIST, 16, None, "optimal").num_packs
    assert row["seconds"] > 0 and row["argsort_seconds"] > 0 and row["argsort_int64_seconds"] > 0
    assert row["ratio_to_argsort"] == pytest.approx(row["seconds"] / row["argsort_seconds"])
    assert row["peak_mib"] > 0
    assert [len(row["runs"][k]) for k in ("assign", "argsort", "argsort_int64")] == [2, 2, 2]
    assert row["seconds"] == min(row["runs"]["assign"]) and row["argsort_seconds"] == min(row["runs"]["argsort"])
    text = run("--histogram", files / "h.npy", "--max-seq-length", 16, "--algorithms", "optimal", "--assign",
               "--assign-repeats", 1, module="ipu_packing.bench.planner")
    assert text.returncode == 0, text.stderr
    assert "assign_sequences (optimal plan): 37 sequences" in text.stdout
    assert "stable np.argsort of the same lengths" in text.stdout and "x the uint16 argsort" in text.stdout
    bad = run("--histogram", files / "h.npy", "--max-seq-length", 16, "--assign", "--assign-repeats", 0,
              module="ipu_packing.bench.planner")
    assert bad.returncode == 2 and "--assign-repeats" in bad.stderr


# -- --json is strict JSON: a non-finite field is null, named in `warnings` (ipu_packing/jsonout.py) ---------------

NAN, INF = float("nan"), float("inf")


@pytest.fixture()
def histogram(tmp_path):
    path = tmp_path / "h.json"
    path.write_text('{"histogram": [1, 2, 3, 4], "max_sequence_length": 8}')
    return str(path)


@pytest.mark.parametrize("command", ["packing", "packing.bench"])
def test_packing_json_is_strict(command, histogram, monkeypatch, capsys):
    to_dict = PackingPlan.to_dict
    monkeypatch.setattr(PackingPlan, "to_dict", lambda self, *a: dict(to_dict(self, *a), seconds=NAN, gap=INF))
    command_main = main if command == "packing" else packing_bench_main
    extra = [] if command == "packing" else ["--algorithms", "optimal,nnlshp"]
    assert command_main(["--histogram", histogram, "--json"] + extra) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == (1 if command == "packing" else 2)
    for line in lines:
        row = strict(line)
        assert row["seconds"] is None and row["gap"] is None and row["num_sequences"] == 10
        assert sorted(w.split(" is ")[0] for w in row["warnings"]) == ["gap", "seconds"]
