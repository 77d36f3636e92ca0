"""One error convention for every command, and the one wrapper that applies it.

Every entry point (run_pretraining.py, ``python -m ipu_packing.data``, ``ipu_packing.packing``,
``ipu_packing.packing.bench``, ``ipu_packing.bench``, ``ipu_packing.execution``) runs its ``main``
through :func:`run_command`, which decides by exception *type*, never by message text:

- :class:`UserError` (bad config, dataset, checkpoint, option; the packages subclass it) and the
  environment refusing a file (:class:`OSError`: missing, read-only, full disk): one line
  ``error: <cause>`` on stderr, exit status 2, no traceback.
- Ctrl-C: one line ``error: interrupted``, exit status 130 (128 + SIGINT), as a shell reports it.
- A reader that closed the pipe (``inspect ... | head``): no message, exit status 141
  (128 + SIGPIPE), as ``git log | head`` and other Unix tools end.
- Anything else is a bug and keeps its traceback.

Commands validate their input before writing anything, so an error leaves no partial output.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from typing import Callable, Iterator, List, Optional

USER_ERROR_EXIT = 2
INTERRUPTED_EXIT = 130
BROKEN_PIPE_EXIT = 141


class UserError(Exception):
    """Bad user input: the message is one line naming the cause; the command exits with status 2."""

    exit_code = USER_ERROR_EXIT


class InputError(UserError, ValueError):
    """An argument, option or input file is wrong. Also a ValueError: library callers may catch either."""


class ConfigError(InputError):
    """A config value is wrong (a YAML key, an override, a dataclass field); the message names the key."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises InputError (one line) instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise InputError("%s (see %s --help)" % (message, self.prog))


_OS_CAUSES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EMFILE: "too many open files (raise `ulimit -n`)",
}


def one_line(text: str) -> str:
    """``text`` with every run of white space (newlines included) folded to one space."""
    return " ".join(str(text).split())


def describe_os_error(error: OSError) -> str:
    """``<cause>: <path>`` for an OSError, naming the file where the error knows it."""
    cause = _OS_CAUSES.get(error.errno or 0) or error.strerror or type(error).__name__
    names = [n for n in (error.filename, getattr(error, "filename2", None)) if n]
    return "%s: %s" % (cause, " -> ".join(str(n) for n in names)) if names else cause


def _quiet_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


class _QuietFinalisers:
    """While a failure is reported: discard the noise of the failed work's half-built objects.

    After a full disk or a Ctrl-C, objects the failure left half-done (numpy's zip writer of a file the
    disk refused, a process pool's queue thread on Python 3.8) are finalised when the traceback that
    holds them goes away, and print "Exception ignored in ..." before the one error line. The failure
    is already being reported, so from the moment it is caught until everything it held is collected,
    such unraisable exceptions are dropped."""

    def __init__(self) -> None:
        self.saved = None

    def start(self) -> None:
        import threading

        if self.saved is None and hasattr(sys, "unraisablehook") and hasattr(threading, "excepthook"):
            self.saved = (sys.unraisablehook, threading.excepthook)
            sys.unraisablehook = lambda unraisable: None
            threading.excepthook = lambda args: None  # a pool's helper thread dying with its pool

    def finish(self) -> None:
        import gc
        import threading

        gc.collect()
        if self.saved is not None:
            (sys.unraisablehook, threading.excepthook), self.saved = self.saved, None


@contextlib.contextmanager
def quiet_teardown() -> Iterator[None]:
    """The failure handling of `run_command`, for code that tears down after a failure itself (a
    process pool killed on Ctrl-C)."""
    quiet = _QuietFinalisers()
    quiet.start()
    try:
        yield
    finally:
        quiet.finish()


def run_command(main: Callable[[Optional[List[str]]], int], argv: Optional[List[str]] = None) -> int:
    """Run ``main(argv)`` under the convention above and return its exit status."""
    quiet = _QuietFinalisers()
    try:
        code = int(main(argv) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at interpreter exit
        return code
    except UserError as error:
        quiet.start()
        message, code = one_line(error) or type(error).__name__, error.exit_code
    except KeyboardInterrupt:
        quiet.start()
        message, code = "interrupted", INTERRUPTED_EXIT
    except BrokenPipeError:
        _quiet_stdout()
        return BROKEN_PIPE_EXIT
    except OSError as error:
        quiet.start()
        message, code = describe_os_error(error), USER_ERROR_EXIT
    quiet.finish()  # the exception and its traceback are gone: collect what they held, quietly
    try:
        sys.stdout.flush()
    except (BrokenPipeError, OSError, ValueError):
        _quiet_stdout()
    sys.stderr.write("error: %s\n" % message)
    sys.stderr.flush()
    return code


__all__ = [
    "ArgumentParser",
    "BROKEN_PIPE_EXIT",
    "ConfigError",
    "INTERRUPTED_EXIT",
    "USER_ERROR_EXIT",
    "InputError",
    "UserError",
    "describe_os_error",
    "one_line",
    "run_command",
]
