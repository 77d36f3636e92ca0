"""The single-process torch runner, which the distributed tests use as their reference: one train_step is
the mean of the micro batches' gradients followed by one optimizer and one scheduler step."""

from __future__ import annotations

import copy

import pytest
import torch

from ipu_packing.execution import ExecutionConfig, make_runner
from ipu_packing.execution.runner_common import BATCH_FIELDS
from synthetic_packs import PackDataset, collate

from execution_fixtures import build_model, make_packs


def test_train_step_is_mean_of_micro_batch_gradients():
    model = build_model()
    reference = copy.deepcopy(model)
    config = ExecutionConfig(micro_batch_size=2, gradient_accumulation=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    runner = make_runner(model, optimizer, config, scheduler=scheduler)
    packs = make_packs(6, seed=4)
    batch = next(iter(runner.dataloader(PackDataset(packs))))
    metrics = runner.train_step(batch)

    full = {k: torch.as_tensor(v) for k, v in collate(packs).items()}
    losses = []
    for i in range(3):
        out = reference(**{k: full[k][2 * i : 2 * i + 2] for k in BATCH_FIELDS})
        (out.loss / 3).backward()
        losses.append(float(out.loss.detach()))
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.1 * p.grad
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    assert metrics.loss == pytest.approx(sum(losses) / 3, abs=1e-6)
    assert metrics.sequences == int((full["nsp_labels"] != -100).sum())
    assert metrics.tokens == int((full["sequence_ids"] != 0).sum())
    assert metrics.optimizer_steps == 1
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)  # the scheduler stepped once


def test_dataloader_items_are_one_step_of_packs():
    config = ExecutionConfig(micro_batch_size=2, gradient_accumulation=3)
    model = build_model()
    runner = make_runner(model, torch.optim.SGD(model.parameters(), lr=0.1), config)
    items = list(runner.dataloader(PackDataset(make_packs(20))))
    assert len(items) == 3  # 20 // 6, the incomplete step dropped
    assert all(item["input_ids"].shape[0] == 6 for item in items)


def test_bf16_autocast_trains():
    model = build_model()
    runner = make_runner(model, torch.optim.SGD(model.parameters(), lr=0.1), ExecutionConfig(micro_batch_size=2,
                         precision="bf16"))
    before = model.bert.embeddings.word_embeddings.weight.detach().clone()
    metrics = runner.train_step(collate(make_packs(2)))
    assert torch.isfinite(torch.tensor(metrics.loss)) and metrics.loss > 0
    assert not torch.equal(before, model.bert.embeddings.word_embeddings.weight)
    assert model.bert.embeddings.word_embeddings.weight.dtype == torch.float32  # weights stay fp32
