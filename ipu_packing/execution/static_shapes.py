"""Why packs: fixed shapes compile once. Counts the graphs torch.compile(fullgraph=True, dynamic=False)
captures while the torch runner trains an epoch.

Packed batches are always (micro_batch, S): one graph for the whole epoch. The padded, unpacked
alternative pads each batch to its longest sequence, so the token axis changes from batch to batch and every
new length is a new graph (a recompilation; on IPUs, where a program is compiled ahead of time for one
shape, a new multi-minute compile). Counting uses torch._dynamo's own statistics (``unique_graphs``), which
exist since torch 2.0.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Mapping

import torch

from .config import ExecutionConfig
from .runner import TorchRunner


@contextlib.contextmanager
def _generous_recompile_limit(limit: int = 1024):
    """Let dynamo recompile as often as the data asks (its default gives up after 8), so every new shape
    is counted instead of falling back to eager."""
    import torch._dynamo.config as dconf

    names = [n for n in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                         "accumulated_cache_size_limit") if hasattr(dconf, n)]
    old = {n: getattr(dconf, n) for n in names}
    try:
        for n in names:
            setattr(dconf, n, limit)
        yield
    finally:
        for n, v in old.items():
            setattr(dconf, n, v)


def count_compiled_graphs(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[Mapping[str, torch.Tensor]],
    config: ExecutionConfig,
) -> int:
    """Train one step per batch through a single-process TorchRunner with torch_compile on; return the
    number of graphs dynamo compiled (1 = compiled once, never again)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    if not config.torch_compile:
        raise ValueError("count_compiled_graphs needs execution.torch_compile: true")
    torch._dynamo.reset()
    counters.clear()
    with _generous_recompile_limit():
        runner = TorchRunner(model, optimizer, config)
        for batch in batches:
            runner.train_step(batch)
    return int(counters["stats"]["unique_graphs"])
