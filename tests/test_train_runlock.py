"""One run per directory (RunDirectory.lock): a second run is refused naming the holder; a killed run's lock is
taken over; the lock never follows a symlink planted in its place."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from ipu_packing.errors import UserError
from ipu_packing.train.run_dir import RunDirectory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def holder(path):
    with open(os.path.join(path, RunDirectory.LOCK)) as f:
        text = f.read()
    return json.loads(text)["pid"] if text else None


def test_second_holder_is_refused_naming_the_first(tmp_path):
    run = str(tmp_path / "run")
    first = RunDirectory(run)
    first.lock()
    try:
        assert first.locked and holder(run) == os.getpid()
        with pytest.raises(UserError, match="in use by pid %d" % os.getpid()):
            RunDirectory(run).lock()
    finally:
        first.unlock()
    assert holder(run) is None  # released: the file reads as nobody
    again = RunDirectory(run)
    again.lock()
    assert again.locked
    again.unlock()


def test_lock_of_a_killed_run_is_taken_over(tmp_path):
    run = str(tmp_path / "run")
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, time
            from ipu_packing.train.run_dir import RunDirectory
            RunDirectory(sys.argv[1]).lock()
            print("held", flush=True)
            time.sleep(600)
        """), run],
        cwd=ROOT, stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout.readline().strip() == b"held"
        with pytest.raises(UserError, match="in use by pid %d" % proc.pid):
            RunDirectory(run).lock()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert holder(run) == proc.pid  # the killed run left its lock file, naming it
    taken = RunDirectory(run)
    taken.lock()
    try:
        assert holder(run) == os.getpid()
    finally:
        taken.unlock()


@pytest.mark.parametrize("target", ["a file", "a missing file", "a directory"])
def test_the_lock_never_follows_a_symlink_planted_in_its_place(tmp_path, target):
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim"
    if target == "a file":
        victim.write_text("precious\n")
    elif target == "a directory":
        victim.mkdir()
    os.symlink(str(victim), str(run / RunDirectory.LOCK))
    with pytest.raises(UserError) as info:
        RunDirectory(str(run)).lock()
    assert str(info.value).count("\n") == 0 and "lock" in str(info.value)
    if target == "a file":
        assert victim.read_text() == "precious\n"  # neither truncated nor written
    elif target == "a missing file":
        assert not victim.exists()  # not created through the link
