"""`prepare` under faults: a full disk, Ctrl-C, a killed run, bad sizes, special files, missing input,
pathological lines and documents. Every failure is one `error:` line, exit 2, and leaves nothing."""

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from ipu_packing.data.text import corpus as corpus_module
from ipu_packing.data.write import packs
from ipu_packing.data.cli import main
from synthetic_corpus import make_inputs, write_bert_corpus, write_vocab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _args(corpus, vocab, output, *extra):
    return ["prepare", "--input", corpus, "--output", output, "--max-seq-length", "32",
            "--max-sequences-per-pack", "3", "--vocab", vocab, "--dupe-factor", "2", "--workers", "1",
            "--quiet"] + list(extra)


def _one_line_error(capsys, *words):
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


def test_the_file_size_limit_is_one_line_naming_the_output_and_leaves_nothing(tmp_path, capsys):
    """A real `ulimit -f` (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a write past it fails with EFBIG): one line that
    names the output being written, nothing left."""
    import resource

    corpus, vocab = make_inputs(str(tmp_path / "inputs"))
    out = tmp_path / "space"
    out.mkdir()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, hard))
    try:
        code = main(_args(corpus, vocab, str(out / "data")))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 2
    _one_line_error(capsys, "file too large", "while preparing %s" % (out / "data"))
    assert os.listdir(str(out)) == []


def test_full_disk_is_one_line_and_removes_the_temporary_output(tmp_path, capsys, monkeypatch):
    corpus, vocab = make_inputs(str(tmp_path / "inputs"))

    class FullFile:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(packs, "open", lambda path, mode="r": FullFile(open(path, mode)), raising=False)
    out = tmp_path / "space"
    out.mkdir()
    assert main(_args(corpus, vocab, str(out / "data"))) == 2
    _one_line_error(capsys, "no space left on device")
    assert os.listdir(str(out)) == []  # neither the output nor the temporary directory


def _mount_tmpfs(directory, size):
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % size, "tmpfs", directory],
                          capture_output=True).returncode == 0


def test_a_really_full_tmpfs_is_one_line_not_sigbus(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if not _mount_tmpfs(str(mount), "192k"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        os.makedirs(str(tmp_path / "inputs"))
        corpus = write_bert_corpus(str(tmp_path / "inputs" / "corpus.txt"), documents=300)
        vocab = write_vocab(str(tmp_path / "inputs" / "vocab.txt"))
        proc = subprocess.run([sys.executable, "-m", "ipu_packing.data"] + _args(corpus, vocab, str(mount / "out")),
                              cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
        assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
        assert "no space left on device" in proc.stderr
        assert os.listdir(str(mount)) == []
    finally:
        subprocess.run(["umount", str(mount)])


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_nonpositive_shard_size_is_refused(tmp_path, capsys, value):
    corpus, vocab = make_inputs(str(tmp_path / "inputs"))
    assert main(_args(corpus, vocab, str(tmp_path / "out"), "--shard-mb", value)) == 2
    _one_line_error(capsys, "--shard-mb")
    assert not (tmp_path / "out").exists()


def test_special_files_are_refused(tmp_path, capsys):
    _, vocab = make_inputs(str(tmp_path / "inputs"))
    assert main(_args("/dev/zero", vocab, str(tmp_path / "out"))) == 2
    _one_line_error(capsys, "/dev/zero", "not a regular file")
    fifo = str(tmp_path / "inputs" / "pipe")
    os.mkfifo(fifo)
    assert main(_args(str(tmp_path / "inputs"), vocab, str(tmp_path / "out"))) == 2  # a directory holding a FIFO
    _one_line_error(capsys, "pipe", "not a regular file")
    assert not (tmp_path / "out").exists()


def test_a_missing_input_creates_no_output_folders(tmp_path, capsys):
    _, vocab = make_inputs(str(tmp_path / "inputs"))
    assert main(_args(str(tmp_path / "nothing.txt"), vocab, str(tmp_path / "a" / "b" / "out"))) == 2
    _one_line_error(capsys, "nothing.txt", "no such file")
    assert not (tmp_path / "a").exists()


def test_a_huge_line_is_read_in_bounded_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_module, "MAX_LINE_BYTES", 1000)
    line = ("wörd " * 3001).strip()  # 2-byte characters, so some pieces would cut one in half
    path = tmp_path / "long.txt"
    path.write_bytes(("short line\n" + line + "\nlast\n").encode("utf-8"))
    pieces = list(corpus_module._lines(str(path)))
    assert pieces[0] == "short line" and pieces[-1] == "last"
    assert len(pieces) > 10 and "".join(pieces[1:-1]) == line
    assert max(len(p.encode("utf-8")) for p in pieces) <= 1000
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n" + b"a" * 2500 + b"\xff" + b"\n")
    with pytest.raises(corpus_module.DataError, match=r"bad\.txt:2: not UTF-8 \(byte 0xff at column 2501\)"):
        list(corpus_module._lines(str(bad)))


@pytest.mark.parametrize("fmt", ["bert", "text"])
def test_a_document_without_blank_lines_ends_at_the_size_bound(tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(corpus_module, "MAX_DOCUMENT_CHARS", 500)
    path = tmp_path / "stream.txt"
    path.write_text("".join("Sentence number %d is here.\n" % i for i in range(400)), encoding="utf-8")
    documents = list(corpus_module.read_documents(str(path), fmt))
    assert len(documents) > 10
    assert max(sum(len(s) for s in d) for d in documents) <= 500 + 40
    joined = " ".join(s for d in documents for s in d)
    assert joined.count("Sentence number") == 400


# --- killed and interrupted runs ---------------------------------------------------------------------

_RUN = r"""
import faulthandler, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's diagnosis if the run ever hangs
# Ctrl-C as in a terminal's foreground job: Python's KeyboardInterrupt handler, even when this test runs in a process
# that ignores SIGINT (a background job of a script: the ignored disposition is inherited, and Python keeps it)
signal.signal(signal.SIGINT, signal.default_int_handler)
from ipu_packing.data.cli import main
if __name__ == "__main__":  # prepare's workers, started by spawn or forkserver, may re-import it
    sys.exit(main(sys.argv[1:]))
"""


def _children(pid):
    found = []
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                found.extend(int(c) for c in f.read().split())
        except OSError:  # a thread that has just ended
            pass
    return found


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _start_with_workers(tmp_path, name):
    """A two-worker prepare of a few MB, started in its own session; returns (proc, worker pids)
    once its workers run and its temporary directory exists."""
    from ipu_packing.bench.prepare_scale import build_corpus

    corpus = str(tmp_path / "corpus.txt")
    if not os.path.exists(corpus):
        build_corpus(corpus, 6)
    output = str(tmp_path / name)
    proc = subprocess.Popen([sys.executable, "-c", _RUN, "prepare", "--input", corpus, "--output", output,
                             "--vocab", "default", "--dupe-factor", "1", "--workers", "2", "--quiet"], cwd=ROOT,
                            start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    for _ in range(1200):  # up to 60 s for the workers to start on a loaded machine
        workers = _children(proc.pid) if proc.poll() is None else []
        temps = [n for n in os.listdir(str(tmp_path)) if n.startswith("." + name + ".tmp-")]
        if len(workers) >= 2 and temps:
            return proc, workers, output
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the workers did not start")


@pytest.mark.parametrize("signum, to_group, code, line", [
    (signal.SIGINT, True, 130, "error: interrupted\n"),  # a terminal's Ctrl-C: the whole process group
    (signal.SIGTERM, True, 143, "error: terminated (SIGTERM)\n"),  # a batch system stopping the job's group
    (signal.SIGTERM, False, 143, "error: terminated (SIGTERM)\n"),  # `kill PID`: the parent alone
])
@pytest.mark.serial
def test_ctrl_c_and_sigterm_are_one_line_and_leave_nothing(tmp_path, signum, to_group, code, line):
    proc, workers, output = _start_with_workers(tmp_path, "out")
    (os.killpg if to_group else os.kill)(proc.pid, signum)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("prepare did not stop on %s:\n" % signum + proc.communicate()[1][-6000:])
    assert proc.returncode == code, (proc.returncode, err)
    assert err == line, err  # once, and no worker tracebacks
    assert not [n for n in os.listdir(str(tmp_path)) if n.startswith(".out.tmp-")]
    assert not os.path.exists(output)


@pytest.mark.serial
def test_a_killed_run_takes_its_workers_along_and_the_next_run_removes_its_leftovers(tmp_path):
    proc, workers, output = _start_with_workers(tmp_path, "out")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(60)  # not communicate(): a surviving worker would hold its pipes open for ever
    for _ in range(600):  # the kernel delivers the parent-death signal at once; allow a loaded machine 30 s
        if not any(_alive(pid) for pid in workers):
            break
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers), "worker processes outlived their parent"
    stale = [n for n in os.listdir(str(tmp_path)) if n.startswith(".out.tmp-")]
    assert len(stale) == 1
    corpus, vocab = make_inputs(str(tmp_path / "inputs"))
    assert main(_args(corpus, vocab, output)) == 0  # the next run into the same output
    assert not [n for n in os.listdir(str(tmp_path)) if n.startswith(".out.tmp-")]


_DIE_WITH_PARENT = """
import os, sys
from ipu_packing.data.write.workers import _die_with_parent
_die_with_parent(os.getppid() + int(sys.argv[1]))
print("alive")
"""


def test_a_worker_whose_parent_died_before_it_asked_to_die_with_it_ends_itself():
    # the parent-death signal only covers a parent that dies after the prctl call; a worker forked
    # just before its parent was killed has been re-parented already, and must end itself
    def run(offset):
        return subprocess.run([sys.executable, "-c", _DIE_WITH_PARENT, str(offset)], capture_output=True, text=True,
                              cwd=ROOT, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))

    kept = run(0)
    assert kept.returncode == 0 and kept.stdout.strip() == "alive", kept.stderr
    orphan = run(12345)
    assert orphan.returncode == 1 and orphan.stdout == "" and orphan.stderr == ""
