"""Rules 7 (output paths checked at the start) and 9 (absurd sizes answer at once) of issue 24 for `prepare` and
`pack`, with the readers' faults that belong to them (a vocab.txt with a UTF-8 BOM, a TFRecord record length
larger than the file). The mechanisms:

- data/write/output.py `claim_output`: before any input is read, the output is refused when it is a symlink,
  a file, a non-empty directory or under a parent that is a file, and an exclusive lock beside it
  (`.<output>.lock`, flock) makes a second command into the same output fail at once, naming the holder;
- data/limits.py: every size (S, K, K * S**2, workers, dupe factor, vocabulary) checked in one place, the
  limit named in the message;
- data/vocab.py `_read_vocab_file` drops a BOM before the first token;
- data/existing/tfrecord.py `read_batches` checks each record length against the bytes the file has left.

Every refusal is one line `error: ...`, exit status 2, and leaves no output."""

from __future__ import annotations

import fcntl
import gzip
import os
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from ipu_packing.data.cli import main as data_main

from existing_datasets import make_instances, masked, tf_records, write_hdf5, write_tfrecord, write_vocab

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST_SECONDS = 20  # a refusal comes before any work: the interpreter's start and imports


def _one_line(capsys, *words):
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)
    return err


@pytest.fixture()
def inputs(tmp_path):
    vocab = write_vocab(str(tmp_path / "vocab.txt"))
    hdf5 = write_hdf5(str(tmp_path / "data.hdf5"), make_instances(40, seed=3))
    return {"vocab": vocab, "hdf5": hdf5, "root": tmp_path}


def _pack(inputs, output, *extra):
    return data_main(["pack", "--input", inputs["hdf5"], "--vocab", inputs["vocab"], "--output", str(output),
                      "--max-sequences-per-pack", "3", "--workers", "1", "--quiet"] + list(extra))


def _prepare(output, *extra):
    return data_main(["prepare", "--input", "default", "--output", str(output), "--workers", "1", "--quiet"]
                     + list(extra))


# -- outputs ---------------------------------------------------------------------------------------------

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
    """Another process holds the output's lock (as a running `pack` would)."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, b'pack, pid %d' % os.getpid())\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"), str(root / ".out.lock")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    _held_by_another.holder = holder
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
def test_a_bad_output_is_refused_before_any_work(name, make, words, command, inputs, capsys, monkeypatch):
    root = inputs["root"]
    output = make(root)
    before = sorted(os.listdir(str(root)))
    calls = []
    import ipu_packing.data.existing.pack as pack_module
    import ipu_packing.data.text.pipeline as pipeline_module

    # the work itself is never reached: a refusal at the end (after the packing) is the old behaviour
    monkeypatch.setattr(pack_module, "_pack_into", lambda *a: calls.append(a))
    monkeypatch.setattr(pipeline_module, "_prepare_into", lambda *a: calls.append(a))
    try:
        code = _pack(inputs, output) if command == "pack" else _prepare(output)
    finally:
        holder = getattr(_held_by_another, "holder", None)
        if holder is not None:
            holder.kill()
            holder.wait()
            del _held_by_another.holder
    assert code == 2
    _one_line(capsys, words)
    assert calls == []
    assert sorted(os.listdir(str(root))) == before  # nothing made, nothing left


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


# -- vocab.txt with a UTF-8 BOM ----------------------------------------------------------------------------

@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_a_vocab_with_a_bom_is_read_as_without(newline, inputs, tmp_path, capsys):
    import json

    with open(inputs["vocab"], encoding="utf-8") as f:
        tokens = f.read().split()
    bom = tmp_path / "bom-vocab.txt"
    bom.write_bytes(b"\xef\xbb\xbf" + newline.join(tokens).encode("utf-8") + newline.encode())
    inputs = dict(inputs, vocab=str(bom))
    assert _pack(inputs, tmp_path / "out") == 0, capsys.readouterr().err
    with open(str(tmp_path / "out" / "packed" / "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["special_token_ids"] == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    with open(str(tmp_path / "out" / "packed" / "vocab.txt"), "rb") as f:
        assert f.read() == ("\n".join(tokens) + "\n").encode("utf-8")


# -- TFRecord record lengths -----------------------------------------------------------------------------

def _record(length_field, body):
    length = struct.pack("<Q", length_field)
    return length + struct.pack("<I", masked(length)) + body + struct.pack("<I", masked(body))


def _good_records():
    return list(tf_records(make_instances(3, seed=5)))


def _huge_first(size):
    def make(path):
        with open(path, "wb") as f:
            f.write(_record(size, b"x" * 40))
    return make


def _huge_after_good(path):
    write_tfrecord(path, _good_records())
    with open(path, "ab") as f:
        f.write(_record(1 << 40, b"x" * 40))


def _gzip_huge(path):
    with gzip.open(path, "wb") as f:
        f.write(_record(1 << 40, b"x" * 40))


def _one_past_the_end(path):
    records = _good_records()
    with open(path, "wb") as f:
        f.write(_record(len(records[0]) + 5, records[0]))  # says 5 bytes more than the file has


TFRECORD_ROWS = [
    ("length-2**40", _huge_first(1 << 40), "bytes left in the file"),
    ("length-2**63", _huge_first(1 << 63), "bytes left in the file"),
    ("length-2**64-1", _huge_first((1 << 64) - 1), "bytes left in the file"),
    ("huge-after-good-records", _huge_after_good, "record 3"),
    ("gzip-length-2**40", _gzip_huge, "truncated"),
    ("five-bytes-past-the-end", _one_past_the_end, "bytes left in the file"),
]


@pytest.mark.parametrize("name, make, words", TFRECORD_ROWS, ids=[r[0] for r in TFRECORD_ROWS])
def test_a_tfrecord_length_larger_than_the_file_is_one_line(name, make, words, inputs, tmp_path, capsys):
    path = str(tmp_path / "data.tfrecord")
    make(path)
    start = time.time()
    code = data_main(["pack", "--input", path, "--vocab", inputs["vocab"], "--output", str(tmp_path / "out"),
                      "--workers", "1", "--quiet", "--format", "tfrecord"])
    assert code == 2
    _one_line(capsys, "data.tfrecord", words)
    assert time.time() - start < FAST_SECONDS and not (tmp_path / "out").exists()


# -- absurd sizes ----------------------------------------------------------------------------------------

def _long_hdf5(root, s=70000):
    """One record of S = 70,000 tokens with a prediction at position 69,000 (the issue's uint16 case)."""
    n = 1
    ids = np.full((n, s), 10, np.int32)
    ids[0, 0], ids[0, -1] = 2, 3
    path = str(root / "long.hdf5")
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("input_ids", data=ids)
        f.create_dataset("input_mask", data=np.ones((n, s), np.int8))
        f.create_dataset("segment_ids", data=np.zeros((n, s), np.int8))
        f.create_dataset("masked_lm_positions", data=np.array([[5, 69000]], np.int32))
        f.create_dataset("masked_lm_ids", data=np.array([[10, 10]], np.int32))
        f.create_dataset("next_sentence_labels", data=np.zeros(n, np.int8))
    return path


SIZE_ROWS = [
    ("seq-length-10**9", ["prepare", "--max-seq-length", str(10 ** 9)], "the sequence length S is 1000000000"),
    ("seq-length-70000", ["prepare", "--max-seq-length", "70000"], "limit of 65536"),
    ("k-10**6", ["prepare", "--max-sequences-per-pack", str(10 ** 6)], "limit of 255"),
    ("k-256", ["prepare", "--max-sequences-per-pack", "256"], "limit of 255"),
    ("k-times-s-squared", ["prepare", "--max-seq-length", "65536", "--max-sequences-per-pack", "255"], "K * S**2"),
    ("workers-10**6", ["prepare", "--workers", str(10 ** 6)], "limit of 1024"),
    ("dupe-factor-10**9", ["prepare", "--dupe-factor", str(10 ** 9)], "limit of 1000"),
    ("train-vocab-10**12", ["prepare", "--train-vocab", str(10 ** 12)], "limit of 2147483647"),
    ("pack-k-10**6", ["pack", "--max-sequences-per-pack", str(10 ** 6)], "limit of 255"),
    ("pack-seq-length-70000", ["pack", "LONG"], "long.hdf5: the sequence length S is 70000"),
]


@pytest.mark.parametrize("name, argv, words", SIZE_ROWS, ids=[r[0] for r in SIZE_ROWS])
def test_an_absurd_size_is_refused_at_once_naming_the_limit(name, argv, words, inputs, tmp_path):
    output = str(tmp_path / "out")
    if argv[0] == "prepare":
        argv = argv[:1] + ["--input", "default", "--output", output, "--quiet"] + argv[1:]
    else:
        source = _long_hdf5(tmp_path) if "LONG" in argv else inputs["hdf5"]
        argv = ["pack", "--input", source, "--vocab", inputs["vocab"], "--output", output, "--quiet",
                "--workers", "1"] + [a for a in argv[1:] if a != "LONG"]
    start = time.time()
    try:
        done = subprocess.run([sys.executable, "-m", "ipu_packing.data"] + argv, cwd=REPO, capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("still running after 60 s")
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "data/limits.py" in lines[0], lines
    assert time.time() - start < FAST_SECONDS
    assert not os.path.exists(output)


def test_a_lock_released_by_a_killed_holder_is_taken(inputs, tmp_path, capsys):
    """flock dies with its holder: a killed pack leaves a lock file that does not block the next one."""
    with open(str(tmp_path / ".out.lock"), "w") as f:
        f.write("pack, pid 999999")  # stale content, nobody holds it
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    assert _pack(inputs, tmp_path / "out") == 0, capsys.readouterr().err
    assert sorted(os.listdir(str(tmp_path / "out"))) == ["packed", "padded"]
