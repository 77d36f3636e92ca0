"""The output directory of `prepare` and `pack`: claimed at the start (`claim_output`: refused when it is a
symlink, a file or a non-empty directory, or while another command writes it, before any input is read),
written into a temporary sibling and renamed into place only when everything succeeded, so a failure leaves
nothing behind; the temporary directory of a killed run (its name holds the run's pid) is removed by the
next run into the same output.

Two commands into one output: the first takes an exclusive lock on `.<output>.lock` beside it (flock, so a
killed holder releases it); the second fails at once, in one line naming the holder's pid. The lock file is
opened through `fsutil.open_lock_file`: a symlink, a FIFO, a device or a hard link there is refused in one
line, so writing the holder's name can never truncate another file."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from typing import Callable, Iterator, Sequence, TypeVar

from ... import fsutil
from ...fsutil import LockBusy, publish_directory, release_lock, take_lock
from ...errors import DataError, describe_os_error


def check_output(path: str, reading: Sequence[str] = ()) -> None:
    """`path` refused unless absent or an empty directory, and unless outside every file and directory the command
    reads (`reading`: its corpus, its split files, its tokenizer; fsutil.check_output, the rule of every output)."""
    fsutil.check_output(path, "--output", directory=True, reading=[p for p in reading if p], error=DataError)


_TEMP_MARK = ".tmp-"


@contextlib.contextmanager
def claim_output(output: str, command: str, reading: Sequence[str] = ()) -> Iterator[None]:
    """Hold `output` (an absolute path) for the whole command: an exclusive lock on `.<output>.lock` beside it,
    then `check_output` (`reading`: the paths the command reads). Another command holding it: DataError at once,
    naming its pid. The lock file is removed when the command ends."""
    parent = os.path.dirname(output)
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise DataError("%s: its parent %s is not a directory" % (output, parent))
    created = []  # the parents made here for the lock: removed again if the command fails
    missing = parent
    while not os.path.isdir(missing):
        created.append(missing)
        missing = os.path.dirname(missing)
    os.makedirs(parent, exist_ok=True)
    lock_path = os.path.join(parent, "." + os.path.basename(output) + ".lock")
    ok = False
    try:
        try:
            fd = take_lock(lock_path, DataError, command)  # fsutil's one lock: never through a symlink
        except LockBusy as busy:
            raise DataError("%s: another command is writing it (%s; lock %s): wait for it, or choose another "
                            "--output" % (output, busy.holder, lock_path)) from None
        try:
            check_output(output, reading)
            yield
            ok = True
        finally:
            release_lock(fd, lock_path)  # the lock file removed
    finally:
        for directory in created if not ok else ():
            with contextlib.suppress(OSError):
                os.rmdir(directory)  # only if empty: another command's files stay


def _temp_prefix(output: str) -> str:
    return "." + os.path.basename(output) + _TEMP_MARK


def _remove_stale_temporaries(output: str) -> None:
    """Remove the temporary directories that killed runs into `output` left (named
    .<output>.tmp-<pid>-...; the pid is no longer running)."""
    parent, prefix = os.path.dirname(output), _temp_prefix(output)
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):].split("-", 1)[0] if name.startswith(prefix) else ""
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still running: another prepare's
        except ProcessLookupError:
            pass
        except OSError:  # alive, owned by someone else
            continue
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _disk_full(error: OSError) -> bool:
    return error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


T = TypeVar("T")


def write_atomically(output: str, build: Callable[[str], T], doing: str) -> T:
    """`build(temp)` into a fresh temporary sibling directory of `output` (an absolute path that
    `check_output` accepted), which is then fsynced and renamed to `output`; on any failure it is
    removed, so nothing is left behind. Removes the temporaries of killed runs into the same output
    first. A full disk or the file-size limit becomes one DataError line ("... while <doing> <output> ...")."""
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    _remove_stale_temporaries(output)
    try:  # fsutil's one publish: built whole in a temporary sibling, fsynced, renamed to output
        return publish_directory(output, build, "%s%d-" % (_temp_prefix(output), os.getpid()))
    except OSError as error:
        if _disk_full(error):
            raise DataError("%s: no space left on device while %s %s (nothing was kept)"
                            % (error.filename or parent, doing, output)) from None
        if error.errno == errno.EFBIG:
            raise DataError("%s while %s %s (nothing was kept)"
                            % (describe_os_error(error), doing, output)) from None
        raise
