"""ipu_packing.errors.run_command: the one convention every command's errors go through. Every exception class a
dependency raises on bad input reaches the one wrapper as one line (`describe_dependency_fault`): the decoders'
and parsers' own classes (gzip, zlib, zip, JSON, UTF-8, YAML, pickle, safetensors, EOFError), a MemoryError (naming
where it was asked for), and a RecursionError whose innermost frame is a dependency's (input nested too deeply). A
bug keeps its traceback: a RecursionError inside ipu_packing's own code, a KeyError, a plain ValueError."""

import errno
import gzip
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from ipu_packing import errors
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


def _stopped_then_failed_reading(argv):
    """A read that fails because the stop closed its file: the DataError is raised while the stop unwinds."""
    from ipu_packing.errors import DataError
    from ipu_packing.signals import Stopped

    try:
        raise Stopped(signal.SIGTERM)
    finally:
        raise DataError("corpus.txt: cannot read (Bad file descriptor)")


def _signalled_then_failed_reading(argv):
    """SIGTERM taken by the command's handler, its Stopped swallowed on the way (a worker pool torn down), then a
    read of the file the stop closed fails outside of it."""
    from ipu_packing.errors import DataError

    try:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes of the main thread
            pass
    except KeyboardInterrupt:
        pass
    raise DataError("corpus.txt: cannot read (Bad file descriptor)")


def _failed_with_oserror(argv):
    from ipu_packing.signals import Stopped

    try:
        raise Stopped(signal.SIGTERM)
    except KeyboardInterrupt:
        raise OSError(errno.EBADF, "Bad file descriptor", "corpus.txt")


@pytest.mark.parametrize("main", [_stopped_then_failed_reading, _signalled_then_failed_reading, _failed_with_oserror])
def test_a_stopped_command_reports_the_stop_whatever_failed_on_the_way_out(main, capsys):
    assert run_command(main, []) == 143
    assert capsys.readouterr().err == "error: terminated (SIGTERM)\n"


def test_an_error_after_a_command_took_no_signal_is_the_error(capsys):
    from ipu_packing.errors import DataError

    def main(argv):
        raise DataError("corpus.txt: cannot read (Bad file descriptor)")

    assert run_command(main, []) == 2
    assert capsys.readouterr().err == "error: corpus.txt: cannot read (Bad file descriptor)\n"


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


# -- a dependency's fault on real hostile bytes is one line; a bug keeps its traceback --------------------------

PACKAGE = os.path.dirname(os.path.abspath(errors.__file__))
DEEP = "[" * 100000 + "]" * 100000


def _safetensors_junk(tmp):
    from safetensors.torch import load_file

    path = os.path.join(str(tmp), "model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 1 << 40) + b"{junk")
    load_file(path)


def _safetensors_full_disk(tmp):
    """What safetensors raises when the disk fills during save_file (its Rust io::Error, as text)."""
    from safetensors import SafetensorError

    raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                          '"No space left on device" })')


def _h5py_junk(tmp):
    import h5py

    path = os.path.join(str(tmp), "x.hdf5")
    with open(path, "wb") as f:
        f.write(b"not an hdf5 file at all" * 10)
    h5py.File(path, "r")


def _npz_junk(tmp):
    path = os.path.join(str(tmp), "x.npz")
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04" + b"\0" * 60)
    np.load(path)


def _yaml_deep(tmp):
    import yaml

    yaml.safe_load(DEEP)


def _yaml_bad(tmp):
    import yaml

    yaml.safe_load("a: [1, 2\nb: {")


FAULTS = [
    ("gzip-not-gzip", lambda t: gzip.decompress(b"not gzip data"), ["not a valid gzip file"]),
    ("gzip-truncated", lambda t: gzip.decompress(gzip.compress(b"x" * 1000)[:-12]), ["a file ended early"]),
    ("zlib", lambda t: zlib.decompress(b"\x78\x9cjunkjunk"), ["corrupt compressed data"]),
    ("npz-junk", _npz_junk, ["not a valid zip/.npz file"]),
    ("json-torn", lambda t: json.loads('{"a": [1, 2'), ["not valid JSON"]),
    ("json-deep", lambda t: json.loads(DEEP), ["nested too deeply", "decoder.py"]),
    ("utf8", lambda t: b"ok \xff\xfe".decode("utf-8"), ["not valid UTF-8 text", "0xff"]),
    ("yaml-bad", _yaml_bad, ["not valid YAML"]),
    ("yaml-deep", _yaml_deep, ["nested too deeply"]),
    ("pickle", lambda t: pickle.loads(b"\x80\x04junk"), ["not a readable pickle"]),
    ("safetensors-junk", _safetensors_junk, ["not a readable safetensors file"]),
    ("safetensors-disk-full", _safetensors_full_disk, ["no space left on device"]),
    ("h5py-junk", _h5py_junk, ["file signature not found"]),
    ("memory", lambda t: np.empty(1 << 43), ["out of memory"]),
    ("oserror-no-errno", lambda t: (_ for _ in ()).throw(OSError("Unable to open file (truncated)")),
     ["truncated"]),
]


@pytest.mark.parametrize("name, fault, words", FAULTS, ids=[c[0] for c in FAULTS])
def test_a_dependency_fault_is_one_line(name, fault, words, tmp_path, capsys):
    code = run_command(lambda argv: fault(tmp_path), [])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and len(err) < 600, err
    for word in words:
        assert word in err, (word, err)


def _own_recursion():
    """A recursive function whose frames are ipu_packing's own (compiled under its directory)."""
    namespace = {}
    exec(compile("def spin(n):\n    return spin(n + 1)\n", os.path.join(PACKAGE, "spin.py"), "exec"), namespace)
    return namespace["spin"](0)


BUGS = [
    ("own-recursion", _own_recursion, RecursionError),
    ("key-error", lambda: {}["missing"], KeyError),
    ("value-error", lambda: int("x"), ValueError),
    ("attribute-error", lambda: [].get("x"), AttributeError),
    ("type-error", lambda: len(3), TypeError),
]


@pytest.mark.parametrize("name, bug, kind", BUGS, ids=[c[0] for c in BUGS])
def test_a_bug_keeps_its_traceback(name, bug, kind):
    with pytest.raises(kind):
        run_command(lambda argv: bug(), [])


def test_options_and_overrides_go_in_any_order(capsys):
    """The commands' parser takes options between the section.key=value overrides, as a user writes them
    (argparse's intermixed parsing); a parser with sub-commands parses as argparse does."""
    from ipu_packing.errors import ArgumentParser
    from ipu_packing.train.cli import main as pretrain_main

    parser = ArgumentParser(prog="x")
    parser.add_argument("--config")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(["a=1", "--config", "demo", "b=2", "--dry-run", "c=3"])
    assert (args.config, args.dry_run, args.overrides) == ("demo", True, ["a=1", "b=2", "c=3"])
    assert pretrain_main(["training.steps=3", "--config", "demo", "training.seed=7", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("config demo: model 2 layers")
