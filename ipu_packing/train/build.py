"""The one builder of what a config trains: the model, its optimizer and its schedule, from a seeded start.

Training (train/run_plan.py), compile-only (train/compile_only.py) and the bench (bench/config_bench.py) all
build through ``build``, so the same config gives the same initial weights everywhere.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Tuple

import numpy as np
import torch

from ..errors import ConfigError, one_line
from .optim import build_optimizer, build_scheduler


@dataclass
class Built:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def build(config, betas: Tuple[float, float], task) -> Built:
    """``config``'s model (``task``'s class, from ``config.bert_config()`` with the task's settings, seeded by
    training.seed), an optimizer with ``betas`` (the batch accounting's) and the schedule over training.steps."""
    if config.training.num_threads:
        torch.set_num_threads(config.training.num_threads)
    seed_everything(config.training.seed)
    try:
        model = task.model_class()(config.bert_config(**task.model_settings))
    except ValueError as exc:  # the model refusing a model: value (hidden_act, position_embedding_type, ...)
        raise ConfigError("model: %s" % (one_line(exc),))
    optimizer = build_optimizer(model, config.optimizer, betas)
    scheduler = build_scheduler(optimizer, config.schedule, config.training.steps)
    return Built(model, optimizer, scheduler)


__all__ = ["Built", "build", "seed_everything"]
