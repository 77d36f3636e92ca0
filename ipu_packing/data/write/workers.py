"""The worker processes of `prepare` and `pack`: every job of both runs in them (text/shard_worker.py builds
instances, existing/read.py converts records, write/packs.py scatters and gathers).

Workers ignore Ctrl-C and SIGTERM (the parent reports it once), die with their parent, and are fed at most two
tasks each at a time, so the parent's memory holds a few shards, never the corpus.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Dict, Iterable, Optional

import numpy as np


_HELD_BACK = (signal.SIGINT, signal.SIGTERM)
"""The signals the parent reports (errors.run_command: SIGTERM as Ctrl-C) and holds back while forking."""


def _die_with_parent(parent: int) -> None:
    """Worker processes ignore Ctrl-C and SIGTERM (the parent reports it once and shuts them down) and, on Linux,
    get SIGKILL when the parent dies, so a killed prepare leaves no orphans behind. A parent killed
    between the fork and the prctl call has already gone: then the worker ends itself."""
    for signum in _HELD_BACK:
        signal.signal(signum, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(_HELD_BACK))  # blocked by the parent while forking
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def _start_worker(parent: int, initializer: Optional[Callable[..., None]], initargs: tuple) -> None:
    _die_with_parent(parent)
    if initializer is not None:
        initializer(*initargs)


def _no_hugepage_advice() -> None:
    """Stop numpy from asking the kernel for transparent huge pages for its large arrays.

    With THP's defrag setting "madvise" (a common default), each fresh madvised region may stall in
    direct compaction; here that made the write phase of the default corpus take 0.2 s in one run and
    1.3-3.7 s of system time in the next. Data preparation allocates and frees many arrays of tens of
    MB, so ordinary pages are faster and steadier. Inherited by the forked workers.
    """
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    setter = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    if setter is not None:
        setter(False)


class _Immediate:
    """A finished 'future' for work run in this process."""

    def __init__(self, value) -> None:
        self.value = value

    def result(self):
        return self.value


class Workers:
    """The worker processes of one `prepare` or `pack` (or this process alone when workers == 1).

    `map_bounded` keeps at most two tasks per worker in flight, so memory holds a few shards,
    never the corpus, while the results come back in submission order.
    """

    def __init__(self, count: int, initializer: Optional[Callable[..., None]] = None, initargs: tuple = ()) -> None:
        """`initializer(*initargs)` sets up each worker's state (and this process's, which runs the tasks
        itself when count == 1)."""
        self.count = count
        self.pool = None
        _no_hugepage_advice()
        if initializer is not None:
            initializer(*initargs)
        if count > 1:
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the workers are the parallelism
            import tokenizers  # noqa: F401  (imported once here, inherited by the forked workers)
            self.pool = ProcessPoolExecutor(count, mp_context=multiprocessing.get_context(method),
                                            initializer=_start_worker,
                                            initargs=(os.getpid(), initializer, initargs))
            try:
                self.start()
            except BaseException:  # e.g. Ctrl-C held back during the forks: the caller never gets the pool
                self.abort()
                raise

    def start(self) -> None:
        """Start the worker processes now (the pool would start them at the first task).

        Ctrl-C (and SIGTERM) is held back while the pool forks them: a SIGINT that lands inside os.fork() is
        swallowed by CPython's after-fork hooks ("Exception ignored in _after_fork"), and the run
        would carry on. It is delivered as soon as the workers are up."""
        if self.pool is None:
            return
        mask = hasattr(signal, "pthread_sigmask")
        if mask:
            signal.pthread_sigmask(signal.SIG_BLOCK, set(_HELD_BACK))
        try:
            self.pool.submit(os.getpid).result()
        finally:
            if mask:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, set(_HELD_BACK))

    def map_bounded(self, fn, argument_tuples: Iterable[tuple], on_result=None) -> list:
        results, pending = [], []
        for args in argument_tuples:
            pending.append(self.pool.submit(fn, *args) if self.pool else _Immediate(fn(*args)))
            while len(pending) >= 2 * self.count:
                results.append(pending.pop(0).result())
                if on_result:
                    on_result(results[-1])
        for future in pending:
            results.append(future.result())
            if on_result:
                on_result(results[-1])
        return results

    def abort(self) -> None:
        """On an error or Ctrl-C: kill the workers rather than wait for their tasks to finish."""
        if self.pool is not None:
            from ...errors import quiet_teardown

            with quiet_teardown():  # the pool's helper thread and finalisers complain about dead workers
                processes = getattr(self.pool, "_processes", None) or {}  # pid -> multiprocessing.Process
                for process in list(processes.values()):
                    process.kill()
                thread = getattr(self.pool, "_queue_management_thread", None) or getattr(
                    self.pool, "_executor_manager_thread", None)
                self.pool.shutdown(wait=False)
                self.pool = None
                if thread is not None:
                    thread.join(10)  # bounded: it notices the dead workers and ends

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True) if sys.version_info >= (3, 9) \
                else self.pool.shutdown(wait=True)


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress(desc: str, enabled: bool, unit: str, total: Optional[int] = None):
    """A tqdm bar on stderr (shown only when it is a terminal); without progress, tqdm is not even
    imported."""
    if not enabled or not sys.stderr.isatty():
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(desc=desc, total=total, unit=unit, disable=None if enabled else True, file=sys.stderr,
                leave=False)


class Phases:
    """Wall-clock seconds per phase of a command (prepare, a task's prepare, pack): ``lap(name)`` ends the phase
    ``name`` (a phase met again, one per split or per layout, adds up); ``total()`` gives them all with the total.
    The one phase timer of the data commands."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}
        self.start = self.last = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.last = now

    def total(self) -> Dict[str, float]:
        return dict(self.seconds, total=time.perf_counter() - self.start)
