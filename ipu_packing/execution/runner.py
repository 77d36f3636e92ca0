"""Runners: one ExecutionConfig, three ways to run the packed model.

    runner = make_runner(model, optimizer, config, scheduler=None)
    for batch in runner.dataloader(dataset):        # one item = one optimizer step's packs for this process
        metrics = runner.train_step(batch)          # StepMetrics, identical on every process
    runner.sync_model()                             # runner.model now holds every current weight
    runner.model                                    # the unwrapped single-device model
    runner.optimizer_state_dict()                   # every parameter's optimizer state, to checkpoint
    runner.load_optimizer_state_dict(state)         # before the first step of a resumed run

- ``TorchRunner`` (runner_ddp.py): one process, or DistributedDataParallel over ``torchrun``.
- ``PipelineRunner`` (runner_pipeline.py): ``torch.distributed.pipelining``, one process per stage, the same
  split as the IPUs.
- ``PoptorchRunner`` (poptorch_backend.py): Graphcore IPUs, lazily imported.

Loss and gradient conventions are the same everywhere: every micro batch's loss is the model's mean over
its own masked tokens / sequences, the step's gradient is the mean of the micro batches' gradients (and of
the replicas'), so a global batch gives the same update however it is split.
"""

from __future__ import annotations

from .config import ExecutionConfig
from .placement import model_stages
from .runner_common import BATCH_FIELDS, StepMetrics, init_distributed
from .runner_ddp import TorchRunner
from .runner_pipeline import PipelineRunner

__all__ = ["BATCH_FIELDS", "PipelineRunner", "StepMetrics", "TorchRunner", "init_distributed", "make_runner"]


def make_runner(model, optimizer, config: ExecutionConfig, scheduler=None):
    """The runner ``config`` asks for. The poptorch backend imports poptorch here, and only here."""
    if config.backend == "poptorch":
        from .poptorch_backend import make_poptorch_runner

        return make_poptorch_runner(model, optimizer, config, scheduler=scheduler)
    model_stages(int(model.config.num_hidden_layers), config)  # one-line error when layers_per_ipu does not fit
    if config.num_stages > 1:
        return PipelineRunner(model, optimizer, config, scheduler=scheduler)
    return TorchRunner(model, optimizer, config, scheduler=scheduler)
