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

Its field set in the one pack format (data/format.py, whose legend this uses, plus L = num_labels):

    classification  input_ids, token_type_ids, position_ids, sequence_ids   (S,) as in format.py
                    cls_positions   (K,)  as in format.py
                    labels          (K,)  int: single-label class in [0, L); IGNORE_INDEX in an empty slot and
                                          everywhere in a split without labels (an unlabelled test split)
                                    (K,)  float32: regression with L = 1; 0 in an empty slot
                                    (K, L) float32: regression with L > 1 (0 in an empty slot), or multi-label:
                                          multi-hot 0/1 over the label names (0 in an empty slot)
                    example_ids     (K,)  int32: the example's row in its split (0-based, data rows in file
                                          order); -1 in an empty slot

    The order is the model's forward order (input_ids, token_type_ids, position_ids, sequence_ids,
    cls_positions, labels), then example_ids (to match predictions back to the input rows).

    Invariants of a classification pack, besides format.py's sequences, positions, token types and [CLS]:

    example slots   example_ids[j] is used (not -1) exactly when j < k, and no example id appears twice in
                    the dataset (over all its packs: every example of the split exactly once)
    label slots     single-label: labels[j] is used (not IGNORE_INDEX) exactly when j < k in a split with
                    labels, and IGNORE_INDEX everywhere in a split without; float labels: an empty slot's
                    are 0 (a used one may be 0 too: example_ids says which slots hold a sequence)

    A classification dataset's `task` entry (MANIFEST_KEYS below), e.g.

        {"name": "classification", "problem_type": "single_label_classification", "num_labels": 3,
         "labels": ["contradiction", "entailment", "neutral"], "label_counts": [61, 70, 69],
         "split": "validation", "has_labels": true, "text_columns": ["sentence1", "sentence2"],
         "label_column": "label", "truncated": 2, "tokenizer": "output/runs/demo/final",
         "source": {"file": "dev.tsv", "format": "tsv", "rows": 200, "sha256": "..."}}

    problem_type is one of PROBLEM_TYPES (transformers' names); labels: the class names by id (single-label,
    sorted as run_glue.py sorts its label_list), the label names of the multi-hot columns (multi-label), or
    null (integer classes kept as they are, regression); label_counts: examples of each class (single-label)
    or with each label (multi-label), null for regression or without labels; truncated: examples cut to S;
    source: the split's input file (its name, format, data rows and sha256).
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
