"""What a training task brings to the one run machinery: its model, its step metrics and how its run reads.

The loop, the run directory, checkpoints, resume, stopping and metrics are the same for every task (train/); a
``Task`` says only what differs: which model class a config builds (with which of its settings: a classifier's
labels), which of the model output's fields are the step metrics (averaged over micro batches, replicas and
PopRun instances, logged every step), which of them summarise the run, whether and how the run is evaluated,
and what the export is. There are two kinds of task, pretraining (MLM + NSP) and fine-tuning (a head per
sequence: classification, question answering); ``task_for(config, manifest)`` gives a run's task from its config
and its dataset's manifest. This module is the seam between them, not a plugin registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

from ..errors import UserError


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
    model_settings: Dict[str, Any] = field(default_factory=dict)
    """BertConfig settings the task adds to ``model:`` (a classifier's num_labels, problem_type, label maps)."""
    problem_type: Optional[str] = None
    """A classification task's problem type (transformers' names), None for pretraining."""
    evaluated: bool = False
    """Whether the run is evaluated per example on a held-out split (train/evaluate.py)."""

    def label(self, metric: str) -> str:
        return self.labels.get(metric, metric.replace("_", " "))

    def describe(self, summary: Dict[str, Any]) -> str:
        """"loss 9.7 -> 6.6; MLM accuracy 0.03 -> 0.09; NSP accuracy 0.5": each last metric, from its first-steps
        mean where summary.json keeps one; then the last evaluation's metrics, where there was one."""
        first, last = summary["first_steps"], summary["last_steps"]
        parts = []
        for name in self.last_metrics:
            if name in first:
                parts.append("%s %.3f -> %.3f" % (self.label(name), first[name], last[name]))
            else:
                parts.append("%s %.3f" % (self.label(name), last[name]))
        evaluation = summary.get("evaluation") or {}
        shown = ["%s %s" % (k.replace("_", " "), "%.4f" % v if isinstance(v, float) else v)
                 for k, v in sorted((evaluation.get("metrics") or {}).items()) if k != "loss"]
        if shown:
            parts.append("%s: %s" % (evaluation.get("split", "evaluation"), ", ".join(shown)))
        return "; ".join(parts)


def _pretraining_model() -> type:
    from ..model import PackedBertForPreTraining

    return PackedBertForPreTraining


def _classification_model() -> type:
    from ..model import PackedBertForSequenceClassification

    return PackedBertForSequenceClassification


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


def classification(task: Dict[str, Any]) -> Task:
    """The fine-tuning task of a classification dataset (its manifest's ``task`` field): its problem type and
    labels, the step metrics (loss, and accuracy where one is defined) and the model's label settings."""
    problem_type, num_labels = task["problem_type"], int(task["num_labels"])
    names = task.get("labels")
    settings = {"num_labels": num_labels, "problem_type": problem_type}  # type: Dict[str, Any]
    if names:
        settings["id2label"] = {i: str(name) for i, name in enumerate(names)}
        settings["label2id"] = {str(name): i for i, name in enumerate(names)}
    metrics = ("loss",) if problem_type == "regression" else ("loss", "accuracy")
    return Task(name="classification", metrics=metrics, first_metrics=metrics, last_metrics=metrics,
                model_class=_classification_model, export="Hugging Face BertForSequenceClassification",
                model_settings=settings, problem_type=problem_type, evaluated=True)


def _question_answering_model() -> type:
    from ..model import PackedBertForQuestionAnswering

    return PackedBertForQuestionAnswering


QUESTION_ANSWERING = Task(
    name="question_answering",
    metrics=("loss", "start_accuracy", "end_accuracy"),
    first_metrics=("loss", "start_accuracy", "end_accuracy"),
    last_metrics=("loss", "start_accuracy", "end_accuracy"),
    model_class=_question_answering_model,
    export="Hugging Face BertForQuestionAnswering",
    model_settings={"num_labels": 2},
    evaluated=True,
)
"""Extractive question answering on packed windows (PackedBertForQuestionAnswering): the step metrics are the
loss ((start + end cross-entropy) / 2 over each window's own tokens) and how often the start and the end are their
window's argmax; the evaluation is SQuAD v1.1's exact match and F1 per question (train/evaluate.py). Its dataset
decides nothing about the model, so compile-only builds it without one."""


def task_for(config, manifest: Optional[Dict[str, Any]]) -> Task:
    """The task ``config`` trains on the dataset whose manifest is ``manifest`` (None: no dataset opened, as
    compile-only may run). Refuses (UserError, one line) a dataset of another task than the config's."""
    kind = (manifest or {}).get("task") if manifest is not None else None
    wanted = config.task.name
    if wanted == "pretraining":
        if isinstance(kind, dict):
            raise UserError("dataset %s is a %s dataset, but the config trains pretraining: set task.name=%s"
                            % (config.data.path, kind.get("name"), kind.get("name")))
        return PRETRAINING
    if manifest is None and wanted == "question_answering":
        return QUESTION_ANSWERING
    if manifest is None:
        raise UserError("task.name=%s needs its prepared dataset (%s) to know its labels: prepare it with "
                        "`python -m ipu_packing.data prepare --task %s ...`" % (wanted, config.data.path, wanted))
    if not isinstance(kind, dict) or kind.get("name") != wanted:
        raise UserError("dataset %s is not a %s dataset (%s): prepare it with `python -m ipu_packing.data prepare "
                        "--task %s ...`" % (config.data.path, wanted, "a %s dataset" % kind.get("name")
                                            if isinstance(kind, dict) else "pretraining data", wanted))
    if wanted == "question_answering":
        return QUESTION_ANSWERING
    return classification(kind)


def check_labelled(manifest: Dict[str, Any], path: str, use: str) -> None:
    """Refuse (UserError, one line) to train on or evaluate a split without labels (a test split prepared without a
    label column, or a question-answering split without answers): its labels are placeholders, so training would
    learn nothing and an evaluation would score against nothing. ``use`` names the setting that chose it."""
    task = manifest.get("task")
    if not isinstance(task, dict):
        return
    if task.get("name") == "question_answering":
        unlabelled = int(task.get("answered", 1)) == 0
    else:
        unlabelled = not task.get("has_labels", True)
    if unlabelled:
        raise UserError("dataset %s (the %s split) has no labels, so it cannot be %s: %s; predict its examples with "
                        "`ipu-packing-predict --model DIR --input FILE --output FILE.jsonl` instead"
                        % (path, task.get("split", "?"), "trained on" if use == "data.split" else "evaluated",
                           "set data.split=train" if use == "data.split"
                           else "set task.eval_split=validation, or task.eval_split= for none"))


__all__ = ["PRETRAINING", "QUESTION_ANSWERING", "Task", "check_labelled", "classification", "task_for"]
