"""Runners. PLACEHOLDER: a single-process torch runner with the final interface."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import ExecutionConfig


@dataclass
class StepMetrics:
    loss: float
    mlm_loss: float
    nsp_loss: float
    mlm_accuracy: float
    nsp_accuracy: float
    sequences: int  # real sequences in the step
    tokens: int  # real tokens in the step


class TorchRunner:
    def __init__(self, model, optimizer, config: ExecutionConfig, scheduler=None):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.config = config

    def dataloader(self, dataset, num_workers: int = 0):
        return torch.utils.data.DataLoader(
            dataset, batch_size=self.config.packs_per_replica_step, num_workers=num_workers, drop_last=True
        )

    def train_step(self, batch) -> StepMetrics:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        micro = self.config.micro_batch_size
        totals = dict(loss=0.0, mlm_loss=0.0, nsp_loss=0.0, mlm_accuracy=0.0, nsp_accuracy=0.0)
        for i in range(self.config.gradient_accumulation):
            part = {k: torch.as_tensor(v[i * micro : (i + 1) * micro]) for k, v in batch.items()}
            out = self.model(**part)
            (out.loss / self.config.gradient_accumulation).backward()
            for k in totals:
                totals[k] += float(getattr(out, k)) / self.config.gradient_accumulation
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        seq_ids = torch.as_tensor(batch["sequence_ids"])
        sequences = int((torch.as_tensor(batch["nsp_labels"]) != -100).sum())
        return StepMetrics(sequences=sequences, tokens=int((seq_ids != 0).sum()), **totals)


def make_runner(model, optimizer, config: ExecutionConfig, scheduler=None):
    if config.backend != "torch" or config.replication_factor != 1 or config.num_stages != 1:
        raise NotImplementedError("placeholder runner: single-process torch only")
    return TorchRunner(model, optimizer, config, scheduler)
