"""Evaluating a fine-tuning run per example: the packed held-out split through the model, back to its examples.

    result = evaluate(model, data, task, batch_packs=64)
    # {"split": "validation", "examples": N, "loss": ..., "metrics": {"accuracy": ..., "f1": ...}}

Every pack of the split runs once, in stored order, in ``eval`` mode without gradients, on the model's device
(a half-precision model is evaluated as a float32 copy on the CPU, where torch has no half kernels). Each used
sequence slot gives its example's logits (``example_ids`` names the example; an empty slot has -1), so every
example of the split is scored exactly once, whichever pack holds it; the metrics are then computed per example
(train/task_metrics.py), as transformers' ``run_glue.py`` computes them on the unpacked split. Evaluation draws
no random number (no dropout, no shuffling), so a run resumed from a checkpoint evaluates and trains bitwise as
an uninterrupted one.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List

import numpy as np
import torch

from .task_metrics import task_metrics


def collect(model: torch.nn.Module, dataset: Any, batch_packs: int) -> Dict[str, np.ndarray]:
    """Run every pack of ``dataset`` through ``model``; returns {"example_ids": (N,), "logits": (N, L),
    "labels": (N,) or (N, L), "loss_sum": (), "count": ()} over the used slots, in example order."""
    device = next(model.parameters()).device
    if device.type == "cpu" and next(model.parameters()).dtype in (torch.float16, torch.bfloat16):
        model = copy.deepcopy(model).float()
    inputs = _forward_inputs(model)
    was_training = model.training
    model.eval()
    ids: List[np.ndarray] = []
    logits: List[np.ndarray] = []
    labels: List[np.ndarray] = []
    loss_sum, count = 0.0, 0.0
    try:
        with torch.no_grad():
            for start in range(0, len(dataset), batch_packs):
                rows = [dataset[i] for i in range(start, min(len(dataset), start + batch_packs))]
                batch = {k: torch.stack([torch.as_tensor(r[k]) for r in rows]) for k in rows[0]}  # (B, ...)
                out = model(**{k: batch[k].to(device) for k in inputs if k in batch})
                used = batch["example_ids"] >= 0  # (B, K)
                ids.append(batch["example_ids"][used].numpy())
                logits.append(out.logits.float().cpu()[used].numpy())
                labels.append(batch["labels"][used].numpy())
                if out.loss is not None:
                    loss_sum += float(out.loss) * float(out.count)
                    count += float(out.count)
    finally:
        model.train(was_training)
    example_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    order = np.argsort(example_ids, kind="stable")
    return {"example_ids": example_ids[order], "logits": np.concatenate(logits)[order] if logits else np.zeros((0, 1)),
            "labels": np.concatenate(labels)[order] if labels else np.zeros(0), "loss_sum": loss_sum, "count": count}


def evaluate(model: torch.nn.Module, data: Any, task: Any, batch_packs: int, split: str) -> Dict[str, Any]:
    """The evaluation of ``model`` on ``data`` (a TrainingData of the task's ``split``): per-example metrics of
    ``task``'s problem type, the mean loss per labelled sequence, how many examples were scored."""
    got = collect(model, data.dataset, batch_packs)
    num_labels = int(task.model_settings["num_labels"])
    duplicated = len(got["example_ids"]) - len(np.unique(got["example_ids"]))
    if duplicated:  # the format's invariants forbid it; a check here costs nothing
        raise ValueError("%d examples of %s were scored twice" % (duplicated, data.path))
    metrics = task_metrics(task.problem_type, got["logits"], got["labels"], num_labels)
    return {"split": split, "examples": int(len(got["example_ids"])),
            "loss": got["loss_sum"] / got["count"] if got["count"] else None, "metrics": metrics}


def _forward_inputs(model: torch.nn.Module):
    import inspect

    return tuple(inspect.signature(model.forward).parameters)


__all__ = ["collect", "evaluate"]
