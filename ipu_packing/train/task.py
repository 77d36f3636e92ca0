"""What a training task brings to the one run machinery: its model, its step metrics and how its run reads.

The loop, the run directory, checkpoints, resume, stopping and metrics are the same for every task (train/); a
``Task`` says only what differs: which model class a config builds, which of the model output's fields are the
step metrics (averaged over micro batches, replicas and PopRun instances, logged every step), which of them
summarise the run, and what the export is. There are two kinds of task, pretraining (MLM + NSP) and fine-tuning
(a head per sequence); this module is the seam between them, not a plugin registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Tuple


@dataclass(frozen=True)
class Task:
    name: str
    """Names the task in logs and summary.json."""
    metrics: Tuple[str, ...]
    """The model output's step metrics, "loss" first (the runner reads these fields of each micro batch's output)."""
    first_metrics: Tuple[str, ...]
    """Metrics whose mean over the first steps summary.json keeps (``first_steps``)."""
    last_metrics: Tuple[str, ...]
    """Metrics whose mean over the last steps summary.json keeps (``last_steps``), and the done line shows."""
    model_class: Callable[[], type]
    """The model class a config's BertConfig builds (imported when called)."""
    export: str
    """What the run exports to final/, in words."""
    labels: Dict[str, str] = field(default_factory=dict)
    """How the done line names a metric (default: the name with "_" as " ")."""

    def label(self, metric: str) -> str:
        return self.labels.get(metric, metric.replace("_", " "))

    def describe(self, summary: Dict[str, Any]) -> str:
        """"loss 9.7 -> 6.6; MLM accuracy 0.03 -> 0.09; NSP accuracy 0.5": each last metric, from its first-steps
        mean where summary.json keeps one."""
        first, last = summary["first_steps"], summary["last_steps"]
        parts = []
        for name in self.last_metrics:
            if name in first:
                parts.append("%s %.3f -> %.3f" % (self.label(name), first[name], last[name]))
            else:
                parts.append("%s %.3f" % (self.label(name), last[name]))
        return "; ".join(parts)


def _pretraining_model() -> type:
    from ..model import PackedBertForPreTraining

    return PackedBertForPreTraining


PRETRAINING = Task(
    name="pretraining",
    metrics=("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"),
    first_metrics=("loss", "mlm_accuracy"),
    last_metrics=("loss", "mlm_accuracy", "nsp_accuracy"),
    model_class=_pretraining_model,
    export="Hugging Face BertForPreTraining",
    labels={"mlm_accuracy": "MLM accuracy", "nsp_accuracy": "NSP accuracy"},
)
"""BERT pretraining on packs: MLM per masked token, NSP per sequence (PackedBertForPreTraining)."""


__all__ = ["PRETRAINING", "Task"]
