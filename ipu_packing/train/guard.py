"""The step guard: what may end a run between two steps, consulted once per step by the loop.

``StepGuard`` holds the two things that can stop a run from outside its own arithmetic:

- **SIGINT and SIGTERM.** While the loop steps, the guard takes over both signals. The first one only sets a
  flag. After each host call the processes agree on it (``runner.agree``: a max all-reduce under torchrun, an
  allgather over the PopRun instances with horovod), so every rank stops after the same step even when the
  signal reached them at different moments. The loop then writes that step's checkpoint like any other,
  atomically, and raises ``stopped(...)``, which the command wrapper reports in one line with exit status 130
  or 143:

      error: stopped by SIGTERM at step 17; checkpoint RUN/checkpoints/step_0000017.pt written; resume with
      the same command

  Resuming from it loses no step and is bitwise the uninterrupted run on CPU (tests/test_train_guard.py). A
  second signal while that checkpoint is written waits for the write; a second signal before it (a step that
  hangs) stops at once, abandoning the step in flight: the last checkpoint is then the previous one, and the
  line says which. A second signal during an evaluation stops at once too, naming the last checkpoint, which
  exists (the step's checkpoint is written before its evaluation); any stop there (a second signal, a kill)
  loses only the evaluation, which the resumed run runs first. A signal after the last step lets the run finish
  (export, summary.json) and then reports it.
  DataLoader workers ignore both signals (``signals.ignore_stop_signals``): a signal sent to the whole process
  group, as ``timeout`` and Slurm's ``scancel`` send it, reaches the main process, which stops them.
- **A loss that is not finite.** Every process stops at the step whose reduced loss is inf or NaN, naming the last
  checkpoint, which is finite throughout (a state that is not finite is never saved: train/checkpointer.py).
- **The dataset changing under the run.** The shards are memory-mapped; a shard shrunk in place makes the next
  read past its new end a SIGBUS, which Python cannot catch. So the guard takes every shard's (size, mtime,
  inode) when the run starts and compares them before each batch is fetched: a shard that changed stops the run
  with one line naming it and the last checkpoint, before anything reads it (one ``os.stat`` per shard and
  host call). Not covered: a shard changed between that check and the reads of the same step, and reads in
  DataLoader workers, which prefetch ahead of the check.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
from typing import Any, Iterator, List, Optional, Tuple

from ..errors import TrainingError, UserError
from ..signals import Stopped, handlers, signal_name

Stat = Tuple[int, int, int]
"""(size in bytes, mtime in ns, inode)."""


def _stat(path: str) -> Optional[Stat]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (int(st.st_size), int(st.st_mtime_ns), int(st.st_ino))


class StepGuard:
    """``with StepGuard(shards) as guard:`` around the training loop. After every step the loop asks it
    ``stop_requested`` (a signal anywhere?) and, once that step's checkpoint is written if due, ``check_data``
    (the shards unchanged?) before the next batch is fetched."""

    def __init__(self, shards: List[str]) -> None:
        self.shards = list(shards)
        self.seen = [_stat(p) for p in self.shards]
        self.signum = None  # type: Optional[int]
        """The first signal received (or, after ``check``, another process's), None while none came."""
        self._step = 0
        self._last_saved = None  # type: Optional[str]
        self._saving = False
        self._evaluating = False
        self._handlers = None  # type: Any

    def __enter__(self) -> "StepGuard":
        self._handlers = handlers({signal.SIGINT: self._handle, signal.SIGTERM: self._handle})
        self._handlers.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handlers.__exit__(*exc)

    def stop_requested(self, runner, step: int) -> bool:
        """Whether any process was asked to stop, after ``step``: the same answer on every one (a collective,
        ``runner.agree``; call it on every process after every host call but the last)."""
        self._step = step
        agreed = runner.agree(int(self.signum or 0))
        if agreed and self.signum is None:
            self.signum = agreed  # another process's signal: stop with it
        return bool(agreed)

    def check_loss(self, loss: float, step: int, last_finite: str) -> None:
        """Stop the run (TrainingError) at a step whose loss (reduced over every process, so all stop at the same
        step) is inf or NaN, naming ``last_finite``: the last checkpoint, finite throughout
        (Checkpointer.last_finite)."""
        if not math.isfinite(loss):
            raise TrainingError("loss is %s at step %d: the run diverged and stopped; the last checkpoint finite "
                                "throughout is %s" % (loss, step, last_finite))

    def check_data(self, step: int, last_saved: Optional[str]) -> None:
        """Before the next batch is fetched: refuse (UserError, one line, naming the shard, the step and the last
        checkpoint) a shard that changed since the run started."""
        self._step, self._last_saved = step, last_saved
        what = self._changed()
        if what is not None:
            raise UserError("%s while the run was training: it stopped after step %d, before reading it; the "
                            "last checkpoint is %s; restore the dataset (or prepare it again and start a new "
                            "run) and resume" % (what, step, last_saved or "none (none was written yet)"))

    def _changed(self) -> Optional[str]:
        for path, seen in zip(self.shards, self.seen):
            now = _stat(path)
            if now == seen:
                continue
            if now is None:
                return "shard %s was removed" % (path,)
            if seen is not None and now[0] != seen[0]:
                return "shard %s changed size (%d -> %d bytes)" % (path, seen[0], now[0])
            return "shard %s was rewritten (modification time or inode changed)" % (path,)
        return None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum  # acted on after the step in flight
            return
        if self._saving:
            return  # the checkpoint being written completes; the stop follows it
        if self._evaluating:
            raise Stopped(signum, "stopped by a second %s during the evaluation after step %d; the last checkpoint "
                          "is %s; resume with the same command (it runs that evaluation again)"
                          % (signal_name(signum), self._step, self._last_saved or "none (none was written yet)"))
        raise Stopped(signum, "stopped by a second %s before step %d ended: that step is lost; the last checkpoint "
                      "is %s; resume with the same command"
                      % (signal_name(signum), self._step + 1, self._last_saved or "none (none was written yet)"))

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """While a checkpoint is written: a second signal waits for it."""
        self._saving = True
        try:
            yield
        finally:
            self._saving = False

    def saved(self, step: int, checkpoint: Optional[str]) -> None:
        """The checkpoint of ``step`` exists: from here on a stop names it."""
        self._step, self._last_saved = step, checkpoint

    @contextlib.contextmanager
    def evaluating(self, step: int) -> Iterator[None]:
        """While the evaluation after ``step`` runs: a second signal stops at once, naming the last checkpoint and
        saying the evaluation is run again on resume (train/loop.py `resume_evaluation`)."""
        self._step, self._evaluating = step, True
        try:
            yield
        finally:
            self._evaluating = False

    def stopped(self, step: int, checkpoint: Optional[str], finished: bool = False) -> Stopped:
        """The exception that ends the run after the checkpoint of ``step`` was written."""
        assert self.signum is not None
        name = signal_name(self.signum)
        if finished:
            return Stopped(self.signum, "stopped by %s after the last step (%d): the run finished; checkpoint %s"
                           % (name, step, checkpoint))
        return Stopped(self.signum, "stopped by %s at step %d; checkpoint %s written; resume with the same command"
                       % (name, step, checkpoint))


__all__ = ["StepGuard"]
