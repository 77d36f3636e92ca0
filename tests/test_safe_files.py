"""Files opened safely (ipu_packing/fsutil.py): every reader of a path a user names refuses a FIFO, a device or
a directory at once in one line (`open_regular`) instead of blocking or reading without end; the output
lock never follows a symlink and never writes into another file (`open_lock_file`); outputs are written
atomically with the umask's mode (`atomic_write_with`), so a hard link at the output is replaced, never written
through, and a failed write leaves the old file whole; a symlink at the output is refused (fsutil.check_output,
the rule of every output), the file it points to untouched.

A FIFO row gives the reader WAIT seconds: then a writer opens the FIFO and closes it (so a reader that blocked
gets an empty file and the test goes on), and the row fails unless the refusal came first."""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
import time

import pytest

import app_fixtures as fx
from ipu_packing.errors import UserError

WAIT = 3.0


class Unblocker(threading.Thread):
    """After WAIT seconds, open `path` (a FIFO) for writing as soon as a reader has it open, then close it."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path, self.stop = path, threading.Event()

    def run(self):
        if self.stop.wait(WAIT):
            return
        deadline = time.time() + 30
        while time.time() < deadline and not self.stop.is_set():
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))
                return
            except OSError as exc:  # ENXIO: no reader yet
                if exc.errno != errno.ENXIO:
                    return
            time.sleep(0.05)


def outcome(action, path=None):
    """(the one line `action` was refused with, or "accepted"; seconds it took); a FIFO at `path` is unblocked
    after WAIT seconds."""
    unblock = Unblocker(path) if path and os.path.exists(path) and not os.path.isfile(path) else None
    if unblock:
        unblock.start()
    start = time.time()
    try:
        action()
        line = "accepted"
    except UserError as error:
        line = str(error)
    finally:
        if unblock:
            unblock.stop.set()
    assert "\n" not in line, line
    return line, time.time() - start


def fifo(path):
    if os.path.lexists(path):
        os.remove(path)
    os.mkfifo(path)
    return path


def device(path, target):
    if os.path.lexists(path):
        os.remove(path)
    os.symlink(target, path)
    return path


# -- readers ------------------------------------------------------------------------------------------------

def histogram(ext, make):
    def row(tmp_path, prepared):
        from ipu_packing.packing.io import load_histogram

        path = make(str(tmp_path / ("histogram" + ext)))
        return outcome(lambda: load_histogram(path), path)
    return row


def dataset_file(name, make):
    """The packed dataset with one of its files (manifest.json, vocab.txt, a shard) replaced."""
    def row(tmp_path, prepared):
        from ipu_packing.data import open_dataset

        directory = str(tmp_path / "packed")
        shutil.copytree(os.path.join(prepared, "packed"), directory)
        path = make(os.path.join(directory, name))
        return outcome(lambda: open_dataset(directory), path)
    return row


def prepare_vocab(make, inside=None):
    """`prepare --vocab PATH` where PATH (or the file `inside` the tokenizer directory PATH) is replaced."""
    def row(tmp_path, prepared):
        from ipu_packing.data.vocab import load_tokenizer

        if inside:
            directory = tmp_path / "hf"
            directory.mkdir()
            shutil.copyfile(os.path.join(prepared, "packed", "vocab.txt"), str(directory / "vocab.txt"))
            path = make(str(directory / inside))
            return outcome(lambda: load_tokenizer(str(directory)), path)
        path = make(str(tmp_path / "vocab.txt"))
        return outcome(lambda: load_tokenizer(path), path)
    return row


def write_run(path, steps=4):
    os.makedirs(path)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for i in range(steps):
            f.write(json.dumps({"step": i + 1, "sequences": 10, "tokens": 100, "seconds": 1.0, "mlm_loss": 8.0 - i,
                                "mlm_accuracy": 0.1, "nsp_accuracy": 0.5}) + "\n")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"data": {"max_seq_length": 128}}, f)
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"packing_factor": 2.0}, f)
    return path


def compare_input(name, make):
    def row(tmp_path, prepared):
        from ipu_packing.compare import read_run

        run = write_run(str(tmp_path / "run"))
        path = make(os.path.join(run, name))
        return outcome(lambda: read_run(run), path)
    return row


def json_file(make):
    def row(tmp_path, prepared):
        from ipu_packing.jsonin import load_path

        path = make(str(tmp_path / "index.json"))
        return outcome(lambda: load_path(path), path)
    return row


def model_file(name, make):
    """A model directory (predict --model) whose file `name` is replaced: what predict reads before the model."""
    def row(tmp_path, prepared):
        from ipu_packing.predict import model_architecture

        directory = tmp_path / "model"
        directory.mkdir()
        path = make(str(directory / name))
        return outcome(lambda: model_architecture(str(directory)), path)
    return row


def weight_shard(make):
    """A transformers directory whose weight index names a shard `make` replaces (read_state_dict)."""
    def row(tmp_path, prepared):
        from ipu_packing.model.pretrained import read_state_dict

        directory = tmp_path / "model"
        directory.mkdir()
        (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"w": "shard-1.bin"}}))
        path = make(str(directory / "shard-1.bin"))
        return outcome(lambda: read_state_dict(str(directory)), path)
    return row


def config_file(make):
    def row(tmp_path, prepared):
        from ipu_packing.train.strict_yaml import yaml_load_file

        path = make(str(tmp_path / "mine.yaml"))
        return outcome(lambda: yaml_load_file(path, "config %s" % path), path)
    return row


# -- the output lock ----------------------------------------------------------------------------------------

VICTIM = b"another file's bytes\n"


def lock(make):
    """`prepare --output OUT` with .OUT.lock beside it made by `make(lock, victim)`: refused, the victim intact."""
    def row(tmp_path, prepared):
        from ipu_packing.data.cli import main

        victim = str(tmp_path / "victim.txt")
        with open(victim, "wb") as f:
            f.write(VICTIM)
        out = str(tmp_path / "out")
        make(str(tmp_path / ".out.lock"), victim)
        line, seconds = outcome(lambda: _exit_line(main, ["prepare", "--input", "default", "--output", out,
                                                          "--max-seq-length", "32", "--quiet"]))
        with open(victim, "rb") as f:
            if f.read() != VICTIM:
                return "the victim was written: " + line, seconds
        if os.path.exists(out) or os.path.exists(str(tmp_path / "elsewhere")):
            return "an output was written: " + line, seconds
        return line, seconds
    return row


def _exit_line(main, argv):
    """Run a command in-process; a refusal (exit 2) raises UserError with its one line."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    if code:
        raise UserError(err.getvalue().strip()[len("error: "):] if err.getvalue().startswith("error: ")
                        else "exit %d: %s" % (code, err.getvalue()))


def symlink_to(lock_path, victim):
    os.symlink(victim, lock_path)


def dangling_symlink(lock_path, victim):
    os.symlink(os.path.join(os.path.dirname(lock_path), "elsewhere"), lock_path)


def hard_link(lock_path, victim):
    os.link(victim, lock_path)


def fifo_lock(lock_path, victim):
    os.mkfifo(lock_path)


def directory_lock(lock_path, victim):
    os.mkdir(lock_path)


def meeting_file(make):
    """A PopRun instances' meeting-place file (DirectoryGroup._read, polled while instances meet) made by
    `make(path)`: read as foreign (None) at once."""
    def row(tmp_path, prepared):
        from ipu_packing.execution.poprun_group import DirectoryGroup

        path = make(str(tmp_path / "step.rows"))
        read = []
        line, seconds = outcome(lambda: read.append(DirectoryGroup._read(path)), path)
        return "%s, read as %r" % (line, read), seconds
    return row


# -- outputs ------------------------------------------------------------------------------------------------

def plot(make, umask=0o022, fail=False):
    """compare --plot PNG with PNG made by `make(png, victim)`; returns what happened to the victim and PNG."""
    def row(tmp_path, prepared):
        from ipu_packing.compare import main

        pytest.importorskip("matplotlib")
        a, b = write_run(str(tmp_path / "a")), write_run(str(tmp_path / "b"))
        victim = str(tmp_path / "victim.png")
        with open(victim, "wb") as f:
            f.write(VICTIM)
        png = str(tmp_path / "plot.png")
        make(png, victim)
        old = os.umask(umask)
        try:
            if fail:
                import matplotlib.figure

                real = matplotlib.figure.Figure.savefig

                def half(self, fname, *args, **kwargs):
                    (fname if hasattr(fname, "write") else open(fname, "wb")).write(b"\x89PNG half")
                    raise OSError(errno.ENOSPC, "No space left on device")

                matplotlib.figure.Figure.savefig = half
            try:
                line, seconds = outcome(lambda: _exit_line(main, [a, b, "--plot", png]))
            finally:
                if fail:
                    matplotlib.figure.Figure.savefig = real
        finally:
            os.umask(old)
        with open(victim, "rb") as f:
            if f.read() != VICTIM:
                return "the victim was written through %s" % png, seconds
        if fail:
            with open(png, "rb") as f:
                return ("the old plot is whole" if f.read() == VICTIM else "the old plot was cut"), seconds
        if line != "accepted":
            return line, seconds
        if os.path.islink(png) or not os.path.isfile(png):
            return "the plot is not a file of its own", seconds
        return "plot mode %o; %s" % (os.stat(png).st_mode & 0o777, line), seconds
    return row


def existing_file(png, victim, mode=0o600):
    with open(png, "wb") as f:
        f.write(VICTIM)
    os.chmod(png, mode)


ROWS = [
    # readers: a FIFO
    ("histogram-npy-fifo", histogram(".npy", fifo), "FIFO"),
    ("histogram-json-fifo", histogram(".json", fifo), "FIFO"),
    ("histogram-txt-fifo", histogram(".txt", fifo), "FIFO"),
    ("manifest-fifo", dataset_file("manifest.json", fifo), "FIFO"),
    ("dataset-vocab-fifo", dataset_file("vocab.txt", fifo), "FIFO"),
    ("shard-fifo", dataset_file("shard-00000.npy", fifo), "FIFO"),
    ("vocab-file-fifo", prepare_vocab(fifo), "FIFO"),
    ("tokenizer-json-fifo", prepare_vocab(fifo, inside="tokenizer.json"), "FIFO"),
    ("tokenizer-config-fifo", prepare_vocab(fifo, inside="tokenizer_config.json"), "FIFO"),
    ("compare-metrics-fifo", compare_input("metrics.jsonl", fifo), "FIFO"),
    ("compare-config-fifo", compare_input("config.json", fifo), "FIFO"),
    ("compare-summary-fifo", compare_input("summary.json", fifo), "FIFO"),
    ("json-file-fifo", json_file(fifo), "FIFO"),
    ("config-file-fifo", config_file(fifo), "FIFO"),
    ("model-config-fifo", model_file("config.json", fifo), "FIFO"),
    ("model-weight-shard-fifo", weight_shard(fifo), "FIFO"),
    ("poprun-meeting-file-fifo", meeting_file(fifo), "accepted, read as [None]"),
    # readers: a device
    ("histogram-urandom", histogram(".npy", lambda p: device(p, "/dev/urandom")), "character device"),
    ("vocab-file-urandom", prepare_vocab(lambda p: device(p, "/dev/urandom")), "character device"),
    ("manifest-dev-null", dataset_file("manifest.json", lambda p: device(p, "/dev/null")), "character device"),
    ("model-config-dev-null", model_file("config.json", lambda p: device(p, "/dev/null")), "character device"),
    ("compare-config-dev-null", compare_input("config.json", lambda p: device(p, "/dev/null")), "character device"),
    ("compare-summary-directory", compare_input("summary.json", lambda p: os.remove(p) or os.mkdir(p) or p),
     "a directory"),
    # the output lock
    ("lock-symlink-to-a-file", lock(symlink_to), "symlink"),
    ("lock-dangling-symlink", lock(dangling_symlink), "symlink"),
    ("lock-hard-link", lock(hard_link), "2 links"),
    ("lock-fifo", lock(fifo_lock), "FIFO"),
    ("lock-directory", lock(directory_lock), "a directory"),
    # outputs
    ("plot-over-a-symlink", plot(symlink_to), "is a symlink"),
    ("plot-over-a-hard-link", plot(hard_link), "plot mode 644"),
    ("plot-over-a-0600-file-umask-022", plot(existing_file), "plot mode 644"),
    ("plot-umask-027", plot(lambda png, victim: None, umask=0o027), "plot mode 640"),
    ("plot-failing-midway", plot(lambda png, victim: existing_file(png, victim, 0o644), fail=True),
     "the old plot is whole"),
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return fx.write_prepared(str(tmp_path_factory.mktemp("safe")), S=32, K=3, V=64, num_sequences=40)


@pytest.mark.parametrize("name, row, words", ROWS, ids=[r[0] for r in ROWS])
def test_files_are_opened_safely(name, row, words, tmp_path, prepared):
    line, seconds = row(tmp_path, prepared)
    assert words in line, line
    assert seconds < WAIT, "took %.1f s (blocked?): %s" % (seconds, line)
