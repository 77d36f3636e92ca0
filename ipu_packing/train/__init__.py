"""The training application: typed configs, LAMB, schedule, training loop, run directory, checkpoints, metrics.

Public API:

    from ipu_packing.train import load_config, run
    config = load_config("demo", ["training.steps=20"])   # configs/demo.yaml + overrides
    config.execution                    # ExecutionConfig as run with the nominal packing factor
    config.batch_accounting(factor)     # accumulation / betas for a measured packing factor
    run(config)                         # validate (no writes), train, checkpoint, export

    from ipu_packing.train.optim import LAMB, build_scheduler

The names are imported when first used (PEP 562), so that reading a run directory
(``ipu_packing.train.run_dir``, e.g. from compare) imports neither torch nor the config loader.
"""

from typing import Any

from ..errors import ConfigError, TrainingError, UserError

_LAZY = {
    "BatchAccounting": "run_config",
    "RunConfig": "run_config",
    "available_configs": "loader",
    "config_from_dict": "loader",
    "load_config": "loader",
}

__all__ = ["BatchAccounting", "ConfigError", "RunConfig", "TrainingError", "UserError", "available_configs",
           "config_from_dict", "load_config", "run"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module("." + _LAZY[name], __name__), name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def run(config, log=print):
    """Validate the config and its inputs (writes nothing on failure), then train."""
    from .loop import run as _run

    return _run(config, log=log)
