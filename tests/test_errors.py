"""ipu_packing.errors.run_command: the one convention every command's errors go through."""

import errno
import os
import subprocess
import sys

import pytest

from ipu_packing.errors import ArgumentParser, InputError, UserError, run_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(main, capsys):
    code = run_command(main, [])
    out, err = capsys.readouterr()
    return code, out, err


def _raises(error):
    def main(argv):
        raise error

    return main


@pytest.mark.parametrize(
    "error, code, line",
    [
        (UserError("bad\n value"), 2, "error: bad value\n"),
        (InputError("--x must be >= 1"), 2, "error: --x must be >= 1\n"),
        (KeyboardInterrupt(), 130, "error: interrupted\n"),
        (OSError(errno.ENOSPC, "No space left on device", "/out/shard-00001.npy"), 2,
         "error: no space left on device: /out/shard-00001.npy\n"),
        (PermissionError(errno.EACCES, "Permission denied", "/ro/run"), 2, "error: permission denied: /ro/run\n"),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "x.yaml"), 2,
         "error: No such file or directory: x.yaml\n"),
    ],
)
def test_one_line_and_status(error, code, line, capsys):
    assert _run(_raises(error), capsys) == (code, "", line)


def test_bugs_keep_their_traceback():
    with pytest.raises(ZeroDivisionError):
        run_command(lambda argv: 1 // 0, [])


def test_success_passes_the_status_through(capsys):
    assert _run(lambda argv: print("ok") or 0, capsys) == (0, "ok\n", "")
    assert _run(lambda argv: 3, capsys)[0] == 3


def test_argument_errors_are_one_line(capsys):
    def main(argv):
        parser = ArgumentParser(prog="tool")
        parser.add_argument("--n", type=int, required=True)
        parser.parse_args(["--n", "x"])

    code, out, err = _run(main, capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: argument --n: invalid int value") and err.count("\n") == 1


def test_input_error_is_a_value_error():
    assert issubclass(InputError, ValueError) and issubclass(InputError, UserError)


def test_closed_pipe_is_silent(tmp_path):
    # `python -m ipu_packing.packing ... | head -1`: the reader goes away after one line.
    hist = tmp_path / "h.txt"
    hist.write_text("\n".join(["5"] * 64))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ipu_packing.packing", "--histogram", str(hist), "--max-seq-length", "64",
         "--top", "1000"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code in (0, 141)
