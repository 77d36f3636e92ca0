"""``execution.compile_only``: compile the training step, or load it from the executable cache, and stop."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Optional

import torch

from .build import build
from .run_config import RunConfig
from .data import open_run_data
from .phase1 import with_init_architecture
from .task import task_for


def compile_only(
    config: RunConfig,
    log: Callable[[str], None] = print,
    make_runner: Optional[Callable] = None,
    open_dataset: Optional[Callable] = None,
) -> Dict[str, Any]:
    """Compile the training step, or load it from the executable cache, then stop: no step runs and
    nothing but the cache is written (Graphcore's run_pretraining.py --compile-only does the same).

    The step is compiled for the shapes the run will feed it: the first host call's batch of the
    prepared dataset when it exists; otherwise a generated batch of the config's S and K and the M
    of the default masking recipe (Graphcore compiles on a generated batch too), with the
    accumulation the config's packing_factor_estimate gives (a question-answering config: the QA field set)."""
    from .run_plan import check_backend

    check_backend(config)
    config = with_init_architecture(config)
    data = None
    if os.path.isfile(os.path.join(config.data.path, "manifest.json")):
        data, task = open_run_data(config, open_dataset=open_dataset)
    else:
        task = task_for(config, None)
    accounting = config.batch_accounting(data.packing_factor if data is not None
                                         else config.data.packing_factor_estimate)
    built = build(config, accounting.betas, task)
    if make_runner is None:
        from ipu_packing.execution import make_runner
    runner = make_runner(built.model, built.optimizer, accounting.execution, scheduler=built.scheduler,
                         metrics=task.metrics)
    if data is not None:
        batch = next(iter(runner.dataloader(data.dataset, num_workers=0)))
        source = "the first batch of %s" % (data.path,)
    else:
        batch = _generated_batch(config, accounting.execution.packs_per_loader_item, task)
        source = "a generated batch (S=%d, K=%d%s; no dataset at %s)" % (
            config.data.max_seq_length, config.data.expected_sequences_per_pack,
            ", M=%d" % batch["mlm_positions"].shape[1] if "mlm_positions" in batch else ", task %s" % task.name,
            config.data.path)
    start = time.perf_counter()
    runner.compile(batch)
    seconds = time.perf_counter() - start
    cache = accounting.execution.executable_cache_dir
    log("compile only: compiled (or loaded) the training step of %s for %s in %.1f s" % (config.name, source, seconds))
    log("executable cache: %s"
        % (os.path.abspath(cache) if cache else "none (execution.executable_cache_dir is empty: nothing kept)"))
    return {"config": config.name, "executable_cache": cache, "compile_seconds": seconds}


def _generated_batch(config: RunConfig, packs: int, task) -> Dict[str, torch.Tensor]:
    """A host call's batch of all-zero packs of the run's shapes, in the task's field set (a task compile-only can
    build without a dataset: pretraining, question answering): shapes and dtypes are all a compile sees."""
    import numpy as np

    from ipu_packing.data.format import FieldLayout, as_batch, mlm_slots, pack_dtype

    S, K = config.data.max_seq_length, config.data.expected_sequences_per_pack
    layout = FieldLayout(task.name)
    records = np.zeros(packs, dtype=pack_dtype(S, mlm_slots(S, K), K, task=layout))
    return {name: torch.from_numpy(array) for name, array in as_batch(records).items()}


__all__ = ["compile_only"]
