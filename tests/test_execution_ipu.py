"""Runs only where poptorch imports (Poplar SDK), and then on the IPU Model simulator, not hardware.
CI has no Poplar SDK: these tests are skipped there (see docs/execution.md)."""

from __future__ import annotations

import pytest
import torch

from ipu_packing.execution import ExecutionConfig, make_runner
from ipu_packing.execution.synthetic import PackDataset

from test_execution_fixtures import build_model, make_packs

pytestmark = pytest.mark.ipu
poptorch = pytest.importorskip("poptorch", reason="poptorch ships only with the Poplar SDK")


def _train(config, steps=2):
    model = build_model(2, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    runner = make_runner(model, optimizer, config)
    loader = runner.dataloader(PackDataset(make_packs(steps * config.packs_per_loader_item, seed=1)))
    losses = [runner.train_step(batch).loss for batch in loader]
    runner.sync_model()
    return losses, {k: v.detach().float().clone() for k, v in runner.model.state_dict().items()}


@pytest.mark.parametrize("layers_per_ipu", [[], [1, 1]])
def test_ipu_model_trains_like_torch_on_cpu(layers_per_ipu):
    # 16 micro batches: enough to fill a pipeline of 5 blocks (embeddings, 2 layers, pooler, heads)
    ipu = ExecutionConfig(backend="poptorch", use_ipu_model=True, micro_batch_size=1, gradient_accumulation=16,
                          layers_per_ipu=layers_per_ipu)
    cpu = ExecutionConfig(backend="torch", micro_batch_size=1, gradient_accumulation=16)
    ipu_losses, ipu_state = _train(ipu)
    cpu_losses, cpu_state = _train(cpu)
    # fp32 on both; the IPU's different summation order and math library allow small differences
    assert ipu_losses == pytest.approx(cpu_losses, rel=1e-3)
    for k in cpu_state:
        torch.testing.assert_close(ipu_state[k], cpu_state[k], rtol=1e-3, atol=1e-4)
