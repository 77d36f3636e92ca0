"""Runners: one ExecutionConfig, three ways to run the packed model, one interface (``Runner``).

    runner = make_runner(model, optimizer, config, scheduler=None)
    for batch in runner.dataloader(dataset):        # one item = one host call's packs for this process
        metrics = runner.train_step(batch)          # StepMetrics, identical on every process
    runner.sync_model()                             # runner.model now holds every current weight
    runner.model                                    # the unwrapped single-device model
    runner.optimizer_state_dict()                   # every parameter's optimizer state, to checkpoint
    runner.load_optimizer_state_dict(state)         # before the first step of a resumed run

``Runner`` (below) declares all a caller may use; every runner implements every member of it
(tests/test_runner_protocol.py).

- ``TorchRunner`` (runner_ddp.py): one process, or DistributedDataParallel over ``torchrun``.
- ``PipelineRunner`` (runner_pipeline.py): ``torch.distributed.pipelining``, one process per stage, the same
  split as the IPUs.
- ``PoptorchRunner`` (poptorch_backend.py): Graphcore IPUs, lazily imported.

Loss and gradient conventions are the same everywhere: every micro batch's loss is the model's mean over
its own masked tokens / sequences, the step's gradient is the mean of the micro batches' gradients (and of
the replicas'), so a global batch gives the same update however it is split.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch

from ..errors import UserError
from .config import ExecutionConfig
from .placement import model_stages
from .runner_common import BATCH_FIELDS, StepMetrics, init_distributed
from .runner_ddp import TorchRunner
from .runner_pipeline import PipelineRunner

__all__ = ["BATCH_FIELDS", "PipelineRunner", "Runner", "StepMetrics", "TorchRunner", "init_distributed",
           "make_runner"]


@runtime_checkable
class Runner(Protocol):
    """What the training loop (train/loop.py) uses of a runner, implemented by TorchRunner, PipelineRunner
    and PoptorchRunner (which under PopRun is one host instance's runner)."""

    model: torch.nn.Module
    """The unwrapped single-device model; after ``sync_model`` it holds every current weight."""
    rank: int
    """This process's torch.distributed rank: 0 in one process, and on poptorch (one process per instance)."""
    world: int
    """torch.distributed processes of the run: 1 in one process, and on poptorch."""
    metrics: Tuple[str, ...]
    """The model output's step metrics ``train_step`` reports, "loss" first (the model's METRICS, or the task's)."""

    @property
    def is_writer(self) -> bool:
        """Whether this process writes the run's files and logs: the first torch process, PopRun instance 0."""

    def dataloader(self, dataset, num_workers: int = 0) -> Any:
        """Batches of ``dataset`` (in the order given) for this process: one item per ``train_step``."""

    def is_compiled(self) -> bool:
        """Whether ``train_step`` can run without compiling first (torch: always; poptorch: once compiled)."""

    def compile(self, batch) -> None:
        """Compile the step for ``batch``'s shapes, or load it from the executable cache (torch: nothing)."""

    def train_step(self, batch) -> StepMetrics:
        """Run ``config.optimizer_steps_per_call`` optimizer steps (and the scheduler's) on ``batch``."""

    def sync_model(self) -> None:
        """Make ``model`` hold every current weight (IPU: copy back; pipeline: gather the stages')."""

    def optimizer_state_dict(self) -> Dict[str, Any]:
        """Every parameter's optimizer state, to checkpoint (a collective on a torch pipeline)."""

    def load_optimizer_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore a checkpoint's optimizer state, before the first step of a resumed run."""

    # The host collectives: between the processes that run one training (torch ranks under torchrun; the PopRun
    # instances on poptorch), each a no-op on a single process. Every process calls them in the same order.

    def agree_on_start(self, run_dir: str, step: int, resumed: bool, log: Callable[[str], None]) -> None:
        """Before anything is written: every process starts from the same step and weights, or all stop (one
        line). PopRun: the instances exchange their start (poprun_group.py); torch: nothing to exchange."""

    def agree_ready(self, refused: Optional[UserError]) -> None:
        """After the writer tried to take the run directory's lock: raise ``refused`` (this process's reason not
        to start), or stop together where another process could not start."""

    def agree(self, flag: int) -> int:
        """The largest ``flag`` over the processes (e.g. a stop request's signal number; 0: none)."""

    def gather_rng_states(self, state: Dict[str, Any]) -> List[Dict[str, Any]]:
        """Every process's generator states by rank (the writer checkpoints them all); [state] on one process."""

    def reduce_metrics(self, values: Dict[str, float]) -> Dict[str, float]:
        """The whole step from this process's ``values`` (the metrics, and sequences, tokens, packs, seconds,
        compile_seconds): means of the metrics, sums of the counts, the slowest seconds; plus ``instances``,
        how many PopRun instances the result covers."""


def make_runner(model, optimizer, config: ExecutionConfig, scheduler=None, metrics: Optional[Sequence[str]] = None):
    """The runner ``config`` asks for (``metrics``: the step metrics to report, default the model's METRICS). The
    poptorch backend imports poptorch here, and only here."""
    if config.backend == "poptorch":
        from .poptorch_backend import make_poptorch_runner

        return make_poptorch_runner(model, optimizer, config, scheduler=scheduler, metrics=metrics)
    model_stages(model, config)  # one-line error when layers_per_ipu does not fit
    if config.num_stages > 1:
        return PipelineRunner(model, optimizer, config, scheduler=scheduler, metrics=metrics)
    return TorchRunner(model, optimizer, config, scheduler=scheduler, metrics=metrics)
