"""The pretraining application: typed configs, LAMB, schedule, training loop, checkpoints, metrics.

Public API:

    from ipu_packing.train import load_config, run
    config = load_config("demo", ["training.steps=20"])   # configs/demo.yaml + overrides
    config.execution                    # ExecutionConfig as run with the nominal packing factor
    config.batch_accounting(factor)     # accumulation / betas for a measured packing factor
    run(config)                         # validate (no writes), train, checkpoint, export

    from ipu_packing.train.optim import LAMB, build_scheduler
"""

from .run_config import BatchAccounting, PretrainingConfig
from .loader import available_configs, config_from_dict, load_config
from ..errors import ConfigError, TrainingError, UserError

__all__ = [
    "BatchAccounting",
    "ConfigError",
    "PretrainingConfig",
    "TrainingError",
    "UserError",
    "available_configs",
    "config_from_dict",
    "load_config",
    "run",
]


def run(config, log=print):
    """Validate the config and its inputs (writes nothing on failure), then train."""
    from .loop import run as _run

    return _run(config, log=log)
