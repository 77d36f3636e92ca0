"""Execution: one ExecutionConfig drives PopTorch on IPUs and PyTorch (CPU/CUDA, DDP, pipelining).

    runner = make_runner(model, optimizer, config, scheduler=None)
    loader = runner.dataloader(dataset, num_workers=0)   # one item = one step's packs for this process
                                                        # (poptorch: one host call = device_iterations steps)
    metrics = runner.train_step(batch)                  # StepMetrics (named fields), incl. scheduler step(s)
    runner.compile(batch)                               # poptorch compile-only path (no-op on torch)
    runner.sync_model()                                 # runner.model holds every current weight
    runner.optimizer_state_dict()                       # every parameter's optimizer state (IPU: read back)
    runner.load_optimizer_state_dict(state)             # before the first step of a resumed run
    runner.model                                        # the unwrapped single-device model
    # all of it declared as runner.Runner (a typing.Protocol), which every runner implements

    from ipu_packing.execution.dry_run import dry_run_report   # no poptorch, no model instance needed
    python -m ipu_packing.execution dry-run --config NAME [section.key=value ...]

Placement applies the stages the model declares (ipu_packing/model/stages.py; placement.py maps them onto
IPUs and torch pipeline processes). poptorch is imported only when the poptorch backend is chosen
(poptorch_backend.py); torch.distributed and torch.distributed.pipelining only when a config needs more than
one process.
"""

from .config import ExecutionConfig
from .runner import Runner, StepMetrics, make_runner

__all__ = ["ExecutionConfig", "Runner", "StepMetrics", "make_runner"]
