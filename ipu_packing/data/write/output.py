"""The output directory of `prepare` and `pack`: refused unless absent or empty, written into a temporary
sibling and renamed into place only when everything succeeded, so a failure leaves nothing behind; the
temporary directory of a killed run (its name holds the run's pid) is removed by the next run into the same
output."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from typing import Callable, TypeVar

from ...fsutil import fsync_tree, replace_durably
from ..errors import DataError


def check_output(path: str) -> None:
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise DataError("%s: exists and is not a directory (refusing to overwrite)" % path)
        if os.listdir(path):
            raise DataError("%s: directory exists and is not empty (refusing to overwrite)" % path)


_TEMP_MARK = ".tmp-"


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
    first. A full disk becomes one DataError line ("... while <doing> <output> ...")."""
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    _remove_stale_temporaries(output)
    temp = tempfile.mkdtemp(prefix="%s%d-" % (_temp_prefix(output), os.getpid()), dir=parent)
    try:
        result = build(temp)
        if os.path.isdir(output):
            os.rmdir(output)  # empty (checked above)
        fsync_tree(temp)  # the shards and manifests are on disk before their directory gets its name
        replace_durably(temp, output)
        return result
    except OSError as error:
        shutil.rmtree(temp, ignore_errors=True)
        if _disk_full(error):
            raise DataError("%s: no space left on device while %s %s (nothing was kept)"
                            % (error.filename or parent, doing, output)) from None
        raise
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
