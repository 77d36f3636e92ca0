"""Sequence classification, as transformers' run_glue.py fine-tunes it: one label (or a regression target, or a
multi-hot row) per sequence, scored from that sequence's own [CLS] through the pooler.

- fields: the four (S,) token fields, each sequence's [CLS], its labels and its example's row.
- manifest entry: the problem type, the labels and their counts, the split, the text and label columns
  (MANIFEST_KEYS; checked by data/format.py check_classification_entry).
- preparation: run_glue.py's CSV, TSV, JSON Lines (Parquet, a datasets directory) -> labelled examples
  (data/finetune/preparation.py; columns and labels as run_glue.py picks them: data/finetune/labels.py).
- model: PackedBertForSequenceClassification (model/classification.py); its parts: that module's
  pipeline_stages; its labels: the dataset's (``for_dataset``).
- metrics: the loss and accuracy (a regression: the loss); evaluation per example with run_glue.py's metrics of the
  problem type (train/evaluate.py, train/task_metrics.py); serving: predict.py ``Predictor``; export:
  BertForSequenceClassification.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from .spec import TOKEN_FIELDS, ManifestKeys, Task

MANIFEST_KEYS: ManifestKeys = {
    "name": (str, '"classification"'),
    "problem_type": (str, "one of data/format.py PROBLEM_TYPES"),
    "num_labels": (int, "L: classes (single-label), label names (multi-label) or regression targets"),
    "labels": ((list, type(None)), "class names by id, or multi-hot label names; null: integer classes, regression"),
    "label_counts": ((list, type(None)), "examples of each class, or with each label; null: regression, no labels"),
    "split": (str, '"train", "validation" or "test"'),
    "has_labels": (bool, "false: a split without labels (labels IGNORE_INDEX, or 0 for float labels)"),
    "text_columns": (list, "the input's text column(s): sentence 1, and sentence 2 for pairs"),
    "label_column": ((str, type(None)), "the input's label column; null: the split has none"),
    "truncated": (int, "examples cut to max_seq_length"),
    "tokenizer": (str, "where the tokenizer came from"),
    "source": (dict, "the split's input: {file, format, rows, sha256}"),
}
"""The keys of a classification manifest's `task` entry (all required), each with its type(s) and meaning."""


class Classification(Task):
    def for_dataset(self, entry: Optional[Mapping[str, Any]]) -> "Task":
        """The classifier of a dataset (its manifest's ``task`` entry): its problem type and labels, the step
        metrics (loss, and accuracy where one is defined) and the model's label settings."""
        if entry is None:
            return self
        problem_type, num_labels = entry["problem_type"], int(entry["num_labels"])
        names = entry.get("labels")
        settings: Dict[str, Any] = {"num_labels": num_labels, "problem_type": problem_type}
        if names:
            settings["id2label"] = {i: str(name) for i, name in enumerate(names)}
            settings["label2id"] = {str(name): i for i, name in enumerate(names)}
        metrics = ("loss",) if problem_type == "regression" else ("loss", "accuracy")
        return self.replace(metrics=metrics, first_metrics=metrics, last_metrics=metrics, model_settings=settings,
                            problem_type=problem_type)



CLASSIFICATION = Classification(
    name="classification",
    fields=TOKEN_FIELDS + ("cls_positions", "labels", "example_ids"),
    metrics=("loss", "accuracy"),
    first_metrics=("loss", "accuracy"),
    last_metrics=("loss", "accuracy"),
    export="BertForSequenceClassification",
    evaluated=True,
    manifest_keys=MANIFEST_KEYS,
    labelled_key="has_labels",
    dataset_decides_model=True,
    inputs="--train, --validation, --test: run_glue.py's CSV, TSV, JSON Lines; Parquet or a datasets directory with "
    "the datasets extra",
    prepare_options={"sentence1_key": None, "sentence2_key": None, "label_key": "label", "problem_type": None},
    hooks={
        "check_entry": "ipu_packing.data.format:check_classification_entry",
        "check_counts": "ipu_packing.data.format:check_classification_counts",
        "broken_slots": "ipu_packing.data.shards:broken_label_slots",
        "first_broken_slot": "ipu_packing.data.shards:first_broken_label_slot",
        "inspect": "ipu_packing.data.finetune.preparation:inspect_lines",
        "check_prepare": "ipu_packing.data.finetune.preparation:check_options",
        "prepare": "ipu_packing.data.finetune.preparation:prepare_task",
        "prepared": "ipu_packing.data.finetune.preparation:prepared_lines",
        "model": "ipu_packing.model.classification:PackedBertForSequenceClassification",
        "stages": "ipu_packing.model.classification:pipeline_stages",
        "evaluate": "ipu_packing.train.evaluate:evaluate_examples",
        "predictor": "ipu_packing.predict:Predictor",
    },
)

__all__ = ["CLASSIFICATION", "Classification", "MANIFEST_KEYS"]
