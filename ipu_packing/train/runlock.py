"""One run per directory: an advisory lock on run_dir/run.lock for as long as the run lives.

The lock is ``fcntl.flock`` on an open file, so the kernel drops it when its holder exits for any
reason, SIGKILL included: a lock file left by a killed run is stale by construction and the next
run simply takes it over. The file holds the holder's pid and host, so a second run in the same
directory is refused with a message naming them. Only the process that writes the run's files
(rank 0 under torchrun) takes the lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from typing import Optional

from ..errors import UserError

LOCK_NAME = "run.lock"


class RunDirectoryInUse(UserError):
    """Another live process holds the run directory."""


class RunLock:
    """``with RunLock(run_dir): ...`` holds run_dir exclusively; ``acquire``/``release`` by hand too."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, LOCK_NAME)
        self._fd: Optional[int] = None
        self.took_over = False
        """True when a lock file from a run that is no longer alive was found and taken over."""

    def acquire(self) -> "RunLock":
        os.makedirs(self.run_dir, exist_ok=True)
        existed = os.path.exists(self.path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirectoryInUse(
                "run directory %s is in use by %s (lock %s): wait for it, or choose another directory"
                % (self.run_dir, holder, self.path)
            )
        except BaseException:
            os.close(fd)
            raise
        self.took_over = existed and os.fstat(fd).st_size > 0
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # an empty file reads as "nobody": the next run is no take-over
        finally:
            os.close(fd)  # closing drops the flock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return "pid %d on %s" % (int(data["pid"]), data["host"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return "another process"
