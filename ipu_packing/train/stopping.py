"""Stopping a training run on SIGINT or SIGTERM: the step in flight completes, its checkpoint is written,
then the run stops in one line (exit status 130 or 143, through errors.run_command).

While the loop steps (train/loop.py), ``StopRequests`` takes over both signals. The first one only sets a
flag. After each host call the processes agree on it (``agreed``: a max all-reduce under torchrun, an
allgather over the PopRun instances with horovod), so every rank stops after the same step even when the
signal reached them at different moments. Then the state of that step (weights, optimizer, RNG states,
data position) is written like any checkpoint, atomically (temporary file, fsync, rename), and ``stopped``
gives the exception the wrapper reports:

    error: stopped by SIGTERM at step 17; checkpoint RUN/checkpoints/step_0000017.pt written; resume with
    the same command

Resuming from it loses no step and is bitwise the uninterrupted run on CPU (tests/test_train_stopping.py).
A second signal while that checkpoint is written waits for the write; a second signal before it (a step
that hangs) stops at once, abandoning the step in flight: the last checkpoint is then the previous one,
and the line says which. A signal after the last step lets the run finish (export, summary.json) and
then reports it. Where the metrics cannot be exchanged (PopRun without horovod) each instance acts on its
own signal: poprun forwards it to every instance, which then stop after the same step only if it reached
them within one host call.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator, Optional

from ..signals import Stopped, handlers, signal_name


class StopRequests:
    """``with StopRequests() as stop:`` around the training loop (SIGINT and SIGTERM set ``signum``)."""

    def __init__(self) -> None:
        self.signum = None  # type: Optional[int]
        """The first signal received (or, after ``agreed``, another process's), None while none came."""
        self.step = 0
        """The last step done, for a second signal's line."""
        self.last_saved = None  # type: Optional[str]
        """The last checkpoint written, for a second signal's line."""
        self._saving = False
        self._handlers = None  # type: Any

    def __enter__(self) -> "StopRequests":
        self._handlers = handlers({signal.SIGINT: self._handle, signal.SIGTERM: self._handle})
        self._handlers.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handlers.__exit__(*exc)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum  # acted on after the step in flight
            return
        if self._saving:
            return  # the checkpoint being written completes; the stop follows it
        raise Stopped(signum, "stopped by a second %s before step %d ended: that step is lost; the last checkpoint "
                      "is %s; resume with the same command"
                      % (signal_name(signum), self.step + 1, self.last_saved or "none (none was written yet)"))

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """While a checkpoint is written: a second signal waits for it."""
        self._saving = True
        try:
            yield
        finally:
            self._saving = False

    def agreed(self, runner, group, step: int) -> bool:
        """Whether any process was asked to stop, the same answer on every one (a collective under torchrun,
        and over PopRun instances that exchange their metrics); call it after every host call, on every rank."""
        self.step = step
        mine = float(self.signum or 0)
        if runner.world > 1:
            import torch
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                device = "cuda" if dist.get_backend() == "nccl" else "cpu"
                flag = torch.tensor([mine], dtype=torch.float64, device=device)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                mine = float(flag.item())
        elif group is not None and group.reduces_metrics:
            mine = max(float(row[0]) for row in group.allgather([mine], name="ipu_packing.stop.%d" % step))
        if mine and self.signum is None:
            self.signum = int(mine)  # another process's signal: stop with it
        return bool(mine)

    def stopped(self, step: int, checkpoint: Optional[str], finished: bool = False) -> Stopped:
        """The exception that ends the run after the checkpoint of ``step`` was written."""
        assert self.signum is not None
        name = signal_name(self.signum)
        if finished:
            return Stopped(self.signum, "stopped by %s after the last step (%d): the run finished; checkpoint %s"
                           % (name, step, checkpoint))
        return Stopped(self.signum, "stopped by %s at step %d; checkpoint %s written; resume with the same command"
                       % (name, step, checkpoint))


__all__ = ["StopRequests"]
