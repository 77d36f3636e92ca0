"""One run per directory: a second run is refused naming the holder; a killed run's lock is taken over."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from ipu_packing.errors import UserError
from ipu_packing.train.runlock import LOCK_NAME, RunLock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_second_holder_is_refused_naming_the_first(tmp_path):
    with RunLock(str(tmp_path / "run")) as first:
        assert first.held and not first.took_over
        with pytest.raises(UserError, match="in use by pid %d" % os.getpid()):
            RunLock(str(tmp_path / "run")).acquire()
    # released: the next run gets it, and it is not a take-over (the file was emptied)
    with RunLock(str(tmp_path / "run")) as again:
        assert again.held and not again.took_over


def test_lock_of_a_killed_run_is_taken_over(tmp_path):
    run = str(tmp_path / "run")
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, time
            from ipu_packing.train.runlock import RunLock
            RunLock(sys.argv[1]).acquire()
            print("held", flush=True)
            time.sleep(600)
        """), run],
        cwd=ROOT, stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == b"held"
        with pytest.raises(UserError, match="in use by pid %d" % holder.pid):
            RunLock(run).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert os.path.getsize(os.path.join(run, LOCK_NAME)) > 0  # the killed run left its lock file
    lock = RunLock(run).acquire()
    try:
        assert lock.took_over
    finally:
        lock.release()
