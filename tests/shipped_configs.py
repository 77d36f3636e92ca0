"""The shipped IPU configs as the application runs them (tests/test_execution_poptorch.py, the dry-run, options
and PopDist tests): each config with the poptorch backend, read from configs/, as the ExecutionConfig the
application derives from it."""

from __future__ import annotations

import glob
import os
from dataclasses import asdict

from ipu_packing.train import load_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shipped_ipu_configs(multi_host: bool = False, fine_tuning: bool = False):
    """Every shipped pretraining config (``fine_tuning``: fine-tuning config) with the poptorch backend, as run:
    the ExecutionConfig the application derives (accumulation from the global batch and the config's packing
    factor estimate). One-host configs, or (``multi_host``) those of several PopRun instances, which need poprun
    (tests/test_popdist.py)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml"))):
        config = load_config(path)
        if config.task.fine_tuning != fine_tuning:
            continue
        if config.execution_spec.backend == "poptorch" and (config.execution_spec.num_instances > 1) == multi_host:
            found[os.path.basename(path)] = config.batch_accounting(config.data.packing_factor_estimate).execution
    return found


SHIPPED = shipped_ipu_configs()
MULTI_HOST = shipped_ipu_configs(multi_host=True)
TINY_IPU_MODEL = dict(backend="poptorch", micro_batch_size=2, gradient_accumulation=5, layers_per_ipu=[1, 1],
                      use_ipu_model=True, device_iterations=2, optimizer_state_offchip=False)
"""ExecutionConfig fields of a tiny two-IPU pipeline on the IPU Model."""
CASES = dict({n: (sum(c.layers_per_ipu), asdict(c)) for n, c in SHIPPED.items()}, tiny_ipu_model=(2, TINY_IPU_MODEL))
"""name -> (encoder layers, ExecutionConfig fields): every IPU config these tests use (the dry-run tests too)."""
