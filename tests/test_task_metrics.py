"""Evaluation metrics as the references compute them: each metric of train/task_metrics.py against scikit-learn's
own functions called with their defaults (run_glue.py's `compute_metrics` through `evaluate`), on held-out
predictions where classes are absent: a validation split that lacks a class, integer labels 1 .. 5 read with
run_glue.py's label set (the distinct integers, sorted), predictions that never name a class."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from ipu_packing.data.finetune.labels import encode_labels, infer_labels
from ipu_packing.data.finetune.rows import read_split
from ipu_packing.train.task_metrics import task_metrics

SINGLE = "single_label_classification"


def _logits(chosen, num_labels):
    """Logits whose argmax is each of ``chosen``."""
    out = np.zeros((len(chosen), num_labels))
    out[np.arange(len(chosen)), chosen] = 1.0
    return out


def _sklearn(labels, chosen, num_labels):
    return {"accuracy": accuracy_score(labels, chosen),
            "f1": f1_score(labels, chosen, average="binary" if num_labels == 2 else "macro"),
            "matthews_correlation": matthews_corrcoef(labels, chosen)}


# (id, gold class ids, predicted class ids, num_labels, the F1 expected)
CASES = [
    ("validation-lacks-one-of-3-classes-perfect", [0, 0, 1, 1, 0, 1], [0, 0, 1, 1, 0, 1], 3, 1.0),
    ("validation-lacks-one-of-3-classes-wrong", [0, 0, 1, 1, 0, 1], [0, 1, 1, 1, 0, 0], 3, 2 / 3),
    ("a-class-predicted-never-held", [0, 0, 1, 1], [0, 2, 1, 1], 3, (2 / 3 + 1.0 + 0.0) / 3),
    ("five-classes-two-absent", [0, 1, 1, 3, 3, 3], [0, 1, 3, 3, 3, 1], 5, (1.0 + 0.5 + 2 / 3) / 3),
    ("binary-f1-of-class-1", [0, 1, 1, 0, 1], [0, 1, 0, 1, 1], 2, 2 / 3),
]


@pytest.mark.parametrize("name, gold, chosen, num_labels, f1", CASES, ids=[c[0] for c in CASES])
def test_single_label_metrics_are_scikit_learns_defaults(name, gold, chosen, num_labels, f1):
    got = task_metrics(SINGLE, _logits(chosen, num_labels), np.asarray(gold), num_labels)
    assert got == pytest.approx(_sklearn(gold, chosen, num_labels))
    assert got["f1"] == pytest.approx(f1)


def test_integer_labels_1_to_5_are_five_classes_and_perfect_predictions_score_1(tmp_path):
    """run_glue.py's label set: the distinct integers sorted (label_list), not 0 .. the largest."""
    rows = "".join("text %d,%d\n" % (i, 1 + i % 5) for i in range(10))
    path = tmp_path / "train.csv"
    path.write_text("sentence1,label\n" + rows, encoding="utf-8")
    table = read_split(str(path))
    labels = infer_labels(table, "label")
    assert (labels.num_labels, labels.names) == (5, ["1", "2", "3", "4", "5"])
    ids = encode_labels(table, "label", labels, "train").labels
    assert ids.tolist() == [i % 5 for i in range(10)]
    got = task_metrics(SINGLE, _logits(ids, labels.num_labels), ids, labels.num_labels)
    assert got == {"accuracy": 1.0, "f1": 1.0, "matthews_correlation": 1.0}


def test_multi_label_and_regression_metrics_are_scikit_learns_and_scipys():
    from scipy.stats import pearsonr, spearmanr

    gold = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0], [1, 0, 0]], dtype=np.float32)  # label 2 never held
    logits = np.array([[2.0, -1, -1], [1.0, -2, 3], [-1.0, 1, -1], [-1.0, -1, -1]])
    chosen = (logits > 0).astype(int)
    got = task_metrics("multi_label_classification", logits, gold, 3)
    assert got == pytest.approx({"accuracy": accuracy_score(gold, chosen),
                                 "f1_micro": f1_score(gold, chosen, average="micro"),
                                 "f1_macro": f1_score(gold, chosen, average="macro", zero_division=0)})
    scores, targets = np.array([0.1, 0.4, 0.35, 0.8]), np.array([0.0, 0.5, 0.2, 1.0])
    got = task_metrics("regression", scores, targets, 1)
    assert got == pytest.approx({"pearson": pearsonr(scores, targets)[0], "spearman": spearmanr(scores, targets)[0],
                                 "mse": float(np.mean((scores - targets) ** 2))})
