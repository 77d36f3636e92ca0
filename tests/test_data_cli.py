"""`python -m ipu_packing.data`: exit codes, one-line errors, no partial output."""

import os
import subprocess
import sys

import pytest

from ipu_packing.data.cli import main

from synthetic_corpus import make_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _args(corpus, vocab, output, *extra):
    return ["prepare", "--input", corpus, "--output", output, "--max-seq-length", "32",
            "--max-sequences-per-pack", "4", "--vocab", vocab, "--dupe-factor", "1", "--workers", "1",
            "--quiet"] + list(extra)


def _one_line_error(capsys, *names):
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for name in names:
        assert name in err, (name, err)


def test_prepare_then_inspect_exit_0(tmp_path, capsys):
    corpus, vocab = make_inputs(str(tmp_path))
    output = str(tmp_path / "out")
    assert main(_args(corpus, vocab, output)) == 0
    assert sorted(os.listdir(output)) == ["packed", "padded"]
    assert sorted(os.listdir(os.path.join(output, "packed")))[:2] == ["manifest.json", "shard-00000.npy"]
    assert not [n for n in os.listdir(str(tmp_path)) if ".tmp-" in n]
    capsys.readouterr()
    assert main(["inspect", os.path.join(output, "packed")]) == 0
    assert capsys.readouterr().err == ""
    # a second run into the now non-empty directory is refused and changes nothing
    packed = os.path.join(output, "packed")
    before = {n: os.path.getmtime(os.path.join(packed, n)) for n in os.listdir(packed)}
    assert main(_args(corpus, vocab, output)) == 2
    _one_line_error(capsys, output, "not empty")
    assert before == {n: os.path.getmtime(os.path.join(packed, n)) for n in os.listdir(packed)}


@pytest.mark.slow
def test_user_errors_exit_2_with_one_line_and_leave_nothing(tmp_path, capsys):
    corpus, vocab = make_inputs(str(tmp_path))
    output = str(tmp_path / "out")
    missing = str(tmp_path / "nope.txt")
    assert main(_args(missing, vocab, output)) == 2
    _one_line_error(capsys, "nope.txt")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"Good line.\n\nAnother good line.\nbad \xc3\x28 here.\n")
    assert main(_args(str(bad), vocab, output)) == 2
    _one_line_error(capsys, "bad.txt:4", "UTF-8")
    broken_vocab = tmp_path / "broken_vocab.txt"
    broken_vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\nworld\nfoo\n", encoding="utf-8")
    assert main(_args(corpus, str(broken_vocab), output)) == 2
    _one_line_error(capsys, "broken_vocab.txt", "[MASK]")
    assert main(_args(corpus, vocab, output, "--max-sequences-per-pack", "0")) == 2
    _one_line_error(capsys, "max-sequences-per-pack")
    assert main(["prepare", "--input", corpus]) == 2
    _one_line_error(capsys, "--output")
    assert main(["inspect", str(tmp_path / "nothing")]) == 2
    _one_line_error(capsys, "nothing")
    assert not os.path.exists(output)
    assert not [n for n in os.listdir(str(tmp_path)) if ".tmp-" in n]


def test_module_entry_point_exit_code_without_traceback(tmp_path, capsys):
    """`python -m ipu_packing.data` as a shell runs it: a corrupt shard is exit status 2 and one line, no traceback
    (the prepare before it through main(), in this process)."""
    corpus, vocab = make_inputs(str(tmp_path))
    out = str(tmp_path / "out")
    assert main(_args(corpus, vocab, out)) == 0, capsys.readouterr().err
    packed = os.path.join(out, "packed")
    shard = os.path.join(packed, "shard-00000.npy")
    with open(shard, "r+b") as f:
        f.seek(-10, os.SEEK_END)
        f.write(b"\x7f\x7f")
    result = subprocess.run([sys.executable, "-m", "ipu_packing.data", "inspect", packed], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert "shard-00000.npy" in result.stderr and "sha256" in result.stderr


def test_inspect_of_a_file_says_what_it_is(tmp_path, capsys):
    from ipu_packing.data.cli import main

    path = tmp_path / "a.tsv"
    path.write_text("sentence\tlabel\n")
    assert main(["inspect", str(path)]) == 2
    assert capsys.readouterr().err == "error: %s: not a dataset directory (it is a regular file)\n" % path
