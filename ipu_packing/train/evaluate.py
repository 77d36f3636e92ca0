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

from typing import Any, Dict, List

import numpy as np
import torch

from .task_metrics import task_metrics


def collect(model: Any, dataset: Any, batch_packs: int) -> Dict[str, np.ndarray]:
    """Run every pack of ``dataset`` through ``model`` (a torch module, or an inference runner of
    execution/inference.py: PopTorch's compiles one batch size, to which the last batch is padded with empty
    packs); returns {"example_ids": (N,), "logits": (N, L), "labels": (N,) or (N, L), "loss_sum": (), "count": ()}
    over the used slots, in example order."""
    from ..execution.inference import TorchInference

    if isinstance(model, torch.nn.Module):
        params = next(model.parameters())
        if params.device.type == "cpu" and params.dtype in (torch.float16, torch.bfloat16):
            model = _float_copy(model)  # torch has no CPU kernels for several half ops
        model = TorchInference(model)
    per_call = model.packs_per_call or batch_packs
    ids: List[np.ndarray] = []
    logits: List[np.ndarray] = []
    labels: List[np.ndarray] = []
    loss_sum, count = 0.0, 0.0
    for start in range(0, len(dataset), per_call):
        rows = [dataset[i] for i in range(start, min(len(dataset), start + per_call))]
        batch = {k: torch.stack([torch.as_tensor(r[k]) for r in rows]) for k in rows[0]}  # (B, ...)
        n = len(rows)
        if model.packs_per_call and n < per_call:  # empty packs: every slot unused, never read back
            batch = {k: torch.cat([v, torch.full((per_call - n,) + tuple(v.shape[1:]), -1 if k == "example_ids"
                                                 else 0, dtype=v.dtype)]) for k, v in batch.items()}
        out = model(batch)
        used = batch["example_ids"][:n] >= 0  # (n, K)
        ids.append(batch["example_ids"][:n][used].numpy())
        logits.append(out.logits[:n].float().cpu()[used].numpy())
        labels.append(batch["labels"][:n][used].numpy())
        if out.loss is not None:
            loss_sum += float(out.loss) * float(out.count)
            count += float(out.count)
    example_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    order = np.argsort(example_ids, kind="stable")
    return {"example_ids": example_ids[order], "logits": np.concatenate(logits)[order] if logits else np.zeros((0, 1)),
            "labels": np.concatenate(labels)[order] if labels else np.zeros(0), "loss_sum": loss_sum, "count": count}


def _float_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A float32 twin of a half-precision task model, by its state dict: a model placed for PopTorch holds
    hooks and module references that deepcopy cannot copy. Building the twin initialises weights, so the
    random state is put back afterwards: evaluation draws no random number."""
    with torch.random.fork_rng(devices=[]):
        twin = type(model)(model.config, attention=model.attention_implementation)
    twin.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    return twin


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


__all__ = ["collect", "evaluate"]
