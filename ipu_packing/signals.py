"""Stopping on a signal: SIGTERM is handled like Ctrl-C, with exit status 128 + the signal's number.

``Stopped`` is a KeyboardInterrupt, so every cleanup written for Ctrl-C (a killed `prepare`'s or `pack`'s
temporary output and worker pool, a training run's lock) runs for SIGTERM as well. ``run_command``
(errors.py) routes SIGTERM to it for the whole command (``terminate_as_interrupt``) and reports it in one
line, exit status 143; Ctrl-C stays Python's KeyboardInterrupt (130). While training steps, both signals
are taken over by train/guard.py: the step in flight completes and a checkpoint is written first.
Handlers can only be set in the main thread; elsewhere these helpers change nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Callable, Dict, Iterator, Optional


def signal_name(signum: int) -> str:
    """"SIGTERM" for 15, and so on."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "signal %d" % (signum,)


class Stopped(KeyboardInterrupt):
    """The command was stopped by a signal: ``line`` is what it reports, ``exit_code`` 128 + the signal."""

    def __init__(self, signum: int, line: Optional[str] = None) -> None:
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        self.line = line or ("interrupted" if self.signum == signal.SIGINT
                             else "terminated (%s)" % signal_name(self.signum))
        super().__init__(self.line)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def handlers(table: Dict[int, Callable[[int, Any], None]]) -> Iterator[None]:
    """Install ``table``'s handlers (signal number -> handler) for the block, then put back the previous
    ones (a handler set outside Python reads as None: it goes back to the default)."""
    previous = {}  # type: Dict[int, Any]
    if _in_main_thread():
        for signum, handler in table.items():
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


_received: list = []
"""The stop signals terminate_as_interrupt's handler took during the current command."""


def _raise_stopped(signum: int, frame: Any) -> None:
    _received.append(signum)
    raise Stopped(signum)


def stop_of(error: BaseException) -> Optional[Stopped]:
    """The stop behind ``error``: a SIGTERM the command took, or a Ctrl-C or stop among the exceptions ``error``
    was raised while handling (a read failing because the stop closed its file, a worker pool torn down under
    it). A command stopped by a signal reports the stop, whatever failed on the way out."""
    seen = error
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return seen if isinstance(seen, Stopped) else Stopped(signal.SIGINT)
        seen = seen.__context__
    return Stopped(_received[0]) if _received else None


def ignore_stop_signals(*_: Any) -> None:
    """In a worker process (a DataLoader's ``worker_init_fn``; prepare's and pack's pool): ignore SIGINT and
    SIGTERM, so that a signal sent to the whole process group (Ctrl-C, ``timeout``, Slurm's ``scancel``) is
    handled once, by the main process, which then shuts its workers down."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def terminate_as_interrupt() -> "contextlib.AbstractContextManager[None]":
    """For the block: SIGTERM raises Stopped (a KeyboardInterrupt) wherever the command is, as Ctrl-C does (and
    stop_of remembers it)."""
    del _received[:]
    return handlers({signal.SIGTERM: _raise_stopped})


__all__ = ["Stopped", "handlers", "ignore_stop_signals", "signal_name", "stop_of", "terminate_as_interrupt"]
