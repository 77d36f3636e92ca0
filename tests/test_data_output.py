"""An output is checked at the start, before any input is read (data/write/output.py `claim_output`): `prepare` and
`pack` refuse an output that is a symlink, a file, a non-empty directory or under a parent that is a file, and an
exclusive lock beside it (`.<output>.lock`, flock) makes a second command into the same output fail at once,
naming the holder. Every refusal is one line `error: ...`, exit status 2, and leaves no output."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

import pytest

from existing_datasets import pack_args
from ipu_packing.data.cli import main as data_main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST_SECONDS = 20  # a refusal comes before any work: the interpreter's start and imports


def _one_line(capsys, *words):
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)
    return err


def _pack(inputs, output, *extra):
    return data_main(pack_args(inputs, output, *extra))


def _prepare(output, *extra):
    return data_main(["prepare", "--input", "default", "--output", str(output), "--workers", "1", "--quiet"]
                     + list(extra))


def _symlink_to_empty_dir(root):
    (root / "real").mkdir()
    os.symlink(str(root / "real"), str(root / "out"))
    return root / "out"


def _dangling_symlink(root):
    os.symlink(str(root / "nowhere"), str(root / "out"))
    return root / "out"


def _symlink_to_file(root):
    (root / "file").write_text("x")
    os.symlink(str(root / "file"), str(root / "out"))
    return root / "out"


def _non_empty(root):
    (root / "out").mkdir()
    (root / "out" / "keep.txt").write_text("keep")
    return root / "out"


def _a_file(root):
    (root / "out").write_text("x")
    return root / "out"


def _parent_is_a_file(root):
    (root / "parent").write_text("x")
    return root / "parent" / "out"


def _held_by_another(root):
    """Another command holds the output's lock, as a running `pack` would: an open file description of its own
    holding the flock (flock's locks belong to the open file description, so this process's claim meets it as
    another process's)."""
    from ipu_packing.fsutil import take_lock

    _held_by_another.holder = take_lock(str(root / ".out.lock"), command="pack")  # what a running pack writes
    return root / "out"


OUTPUT_ROWS = [
    ("symlink-to-empty-dir", _symlink_to_empty_dir, "symlink"),
    ("dangling-symlink", _dangling_symlink, "symlink"),
    ("symlink-to-file", _symlink_to_file, "symlink"),
    ("non-empty-dir", _non_empty, "not empty"),
    ("a-file", _a_file, "not a directory"),
    ("parent-is-a-file", _parent_is_a_file, "not a directory"),
    ("locked-by-another-command", _held_by_another, "another command is writing it (pack, pid"),
]


@pytest.mark.parametrize("command", ["pack", "prepare"])
@pytest.mark.parametrize("name, make, words", OUTPUT_ROWS, ids=[r[0] for r in OUTPUT_ROWS])
def test_a_bad_output_is_refused_before_any_work(name, make, words, command, pack_inputs, capsys, monkeypatch):
    root = pack_inputs["root"]
    output = make(root)
    before = sorted(os.listdir(str(root)))
    calls = []
    import ipu_packing.data.existing.pack as pack_module
    import ipu_packing.data.text.pipeline as pipeline_module

    # the work itself is never reached: a refusal at the end (after the packing) is the old behaviour
    monkeypatch.setattr(pack_module, "_pack_into", lambda *a: calls.append(a))
    monkeypatch.setattr(pipeline_module, "_prepare_into", lambda *a: calls.append(a))
    try:
        code = _pack(pack_inputs, output) if command == "pack" else _prepare(output)
    finally:
        holder = getattr(_held_by_another, "holder", None)
        if holder is not None:
            os.close(holder)  # the lock goes with it
            del _held_by_another.holder
    assert code == 2
    _one_line(capsys, words)
    assert calls == []
    assert sorted(os.listdir(str(root))) == before  # nothing made, nothing left


@pytest.mark.serial
@pytest.mark.slow
def test_two_concurrent_prepares_into_one_directory_one_fails_at_once(tmp_path):
    output = str(tmp_path / "out")
    argv = [sys.executable, "-m", "ipu_packing.data", "prepare", "--input", "default", "--output", output,
            "--workers", "1", "--quiet"]
    first = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not any(n.startswith(".out") for n in os.listdir(str(tmp_path))) and time.time() < deadline:
        time.sleep(0.02)  # the first one has claimed the output
    start = time.time()
    second = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    second_seconds = time.time() - start
    first_out, first_err = first.communicate(timeout=120)
    assert first.returncode == 0, first_err
    assert second.returncode == 2, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "another command is writing it (prepare, pid %d" % first.pid in lines[0], lines
    assert first.poll() is not None and second_seconds < FAST_SECONDS
    assert sorted(os.listdir(output)) == ["packed", "padded"]
    assert sorted(os.listdir(str(tmp_path))) == ["out"]  # no lock file, no temporary left


def test_a_lock_released_by_a_killed_holder_is_taken(pack_inputs, tmp_path, capsys):
    """flock dies with its holder: a killed pack leaves a lock file that does not block the next one."""
    with open(str(tmp_path / ".out.lock"), "w") as f:
        f.write('{"command": "pack", "pid": 999999, "host": "h"}')  # a killed holder's record, nobody holds it
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    assert _pack(pack_inputs, tmp_path / "out") == 0, capsys.readouterr().err
    assert sorted(os.listdir(str(tmp_path / "out"))) == ["packed", "padded"]


def test_a_users_file_where_the_lock_goes_is_refused_and_kept(pack_inputs, tmp_path, capsys):
    """.<output>.lock beside the output holding anything but a holder's record is the user's: not overwritten, not
    removed, and nothing written."""
    lock = tmp_path / ".out.lock"
    lock.write_text("my notes\n")
    assert _pack(pack_inputs, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: %s holds something other than" % lock), err
    assert lock.read_text() == "my notes\n" and not (tmp_path / "out").exists()


def _corpus_dir(inputs):
    """prepare --input DIR --output DIR/out: the corpus directory would hold its dataset, read as corpus next time."""
    corpus = inputs["root"] / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the loop runs a task.\nthe server reads a mail.\n\nthe test case passes.\n")
    return ["prepare", "--input", str(corpus), "--vocab", inputs["vocab"], "--max-seq-length", "32"], corpus / "out"


def _tokenizer_dir(inputs):
    """prepare --task ... --tokenizer MODEL --output MODEL/data: a dataset written into the model directory."""
    model = inputs["root"] / "model"
    model.mkdir()
    with open(inputs["vocab"]) as f:
        (model / "vocab.txt").write_text(f.read())
    for split in ("train", "dev"):
        (inputs["root"] / ("%s.tsv" % split)).write_text("sentence\tlabel\nthe loop\tgood\na task\tbad\n")
    return ["prepare", "--task", "classification", "--train", str(inputs["root"] / "train.tsv"), "--validation",
            str(inputs["root"] / "dev.tsv"), "--tokenizer", str(model), "--max-seq-length", "32"], model / "data"


def _hdf5_dir(inputs):
    """pack --input DIR --output DIR/out: the input directory would hold the packed dataset."""
    directory = inputs["root"] / "hdf5"
    directory.mkdir()
    os.rename(inputs["hdf5"], str(directory / "data.hdf5"))
    return ["pack", "--input", str(directory), "--vocab", inputs["vocab"]], directory / "out"


INSIDE_AN_INPUT = [("prepare-inside-its-corpus", _corpus_dir), ("prepare-task-inside-its-tokenizer", _tokenizer_dir),
                   ("pack-inside-its-input", _hdf5_dir)]


@pytest.mark.parametrize("make", [r[1] for r in INSIDE_AN_INPUT], ids=[r[0] for r in INSIDE_AN_INPUT])
def test_an_output_inside_a_directory_the_command_reads_is_refused(make, pack_inputs, capsys):
    """The rule of every output (fsutil.check_output): an output inside a directory the same command reads is
    refused, as predict refuses one inside its model directory."""
    argv, output = make(pack_inputs)
    code = data_main(argv + ["--output", str(output), "--max-sequences-per-pack", "3", "--workers", "1", "--quiet"])
    assert code == 2
    _one_line(capsys, "--output %s: is inside %s, which this command reads" % (output, output.parent))
    assert not os.path.exists(str(output))
