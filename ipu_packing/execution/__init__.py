"""Execution: one ExecutionConfig drives PopTorch on IPUs and PyTorch (CPU/CUDA, DDP, pipelining).

CONTRACT (the execution work extends this; the application relies on these names):

    runner = make_runner(model, optimizer, config, scheduler=None)
    loader = runner.dataloader(dataset, num_workers=0)   # yields one step's batch per item
    metrics = runner.train_step(batch)                  # one optimizer step: StepMetrics
    runner.model                                        # the unwrapped single-device model
"""

from .config import ExecutionConfig
from .runner import StepMetrics, make_runner

__all__ = ["ExecutionConfig", "StepMetrics", "make_runner"]
