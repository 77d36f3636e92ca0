"""On the IPU Model: one training step of a tiny packed BERT, pipelined over 2 IPUs, against the torch
backend on the same weights and batch. Runs only where the real poptorch imports (Graphcore's Poplar SDK:
``make test-ipu``); CI has no SDK and skips every test here. The stand-in of tests/fake_poptorch is never
imported here."""

from __future__ import annotations

import pytest
import torch

from ipu_packing.execution import ExecutionConfig, make_runner
from synthetic_packs import PackDataset

import poptorch_stand_in as si

pytestmark = pytest.mark.ipu
poptorch = pytest.importorskip("poptorch", reason="poptorch ships only with Graphcore's Poplar SDK (make test-ipu)")
if getattr(poptorch, "__stand_in__", False):  # pragma: no cover - the stand-in is never on sys.path
    pytest.skip("the PopTorch stand-in is not poptorch", allow_module_level=True)


def _one_step(config):
    model = si.tiny_model(2, seed=0, dropout=0.0)  # no dropout: the IPU and the CPU draw different masks
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    runner = make_runner(model, optimizer, config)
    batch = next(iter(runner.dataloader(PackDataset(si.packs(config.packs_per_loader_item, seed=1)))))
    loss = runner.train_step(batch).loss
    runner.sync_model()
    state = {k: v.detach().float().clone() for k, v in runner.model.state_dict().items()}
    close = getattr(runner, "close", None)
    if close is not None:
        close()
    return loss, state


@pytest.mark.parametrize("layers_per_ipu", [[1, 1], []], ids=["2-IPU-pipeline", "1-IPU"])
def test_one_ipu_model_step_matches_torch(layers_per_ipu):
    # 5 micro batches: the 3 forward groups (embeddings + layer 0 | layer 1 | heads on IPU 0) make 2*3-1 = 5
    # pipeline stages with their backward, PopART's minimum accumulation.
    ipu = ExecutionConfig(backend="poptorch", use_ipu_model=True, micro_batch_size=2, gradient_accumulation=5,
                          layers_per_ipu=layers_per_ipu, optimizer_state_offchip=False)
    cpu = ExecutionConfig(backend="torch", micro_batch_size=2, gradient_accumulation=5)
    ipu_loss, ipu_state = _one_step(ipu)
    cpu_loss, cpu_state = _one_step(cpu)
    # fp32 on both; the IPU's summation order and math library allow small differences.
    assert ipu_loss == pytest.approx(cpu_loss, rel=1e-3)
    for k in cpu_state:
        torch.testing.assert_close(ipu_state[k], cpu_state[k], rtol=1e-3, atol=1e-4)
