"""Evaluation metrics of a classification task, per example, with the libraries every GLUE script uses.

    task_metrics("single_label_classification", predictions, labels, num_labels)
    # {"accuracy": ..., "f1": ..., "matthews_correlation": ...}

- single label: accuracy; F1 (binary F1 of label 1 with two labels, as GLUE reports it for MRPC and QQP; above two,
  macro F1 over the classes that occur among the labels and the predictions: scikit-learn's default, so a class
  the split never holds nor predicts is not counted as an F1 of 0); Matthews correlation (GLUE's CoLA metric).
  ``predictions``: (N, L) logits or probabilities.
- regression: Pearson and Spearman correlation (GLUE's STS-B metrics) and the mean squared error. ``predictions``:
  (N,) or (N, L) scores.
- multi label: subset accuracy (every label right), micro and macro F1 over the labels with a 0.5 threshold on the
  sigmoid. ``labels``: (N, L) in {0, 1}.

scikit-learn's ``accuracy_score``, ``f1_score`` and ``matthews_corrcoef`` and scipy's ``pearsonr`` and ``spearmanr``
compute them (the definitions of transformers' ``run_glue.py`` through ``evaluate``); a metric a split cannot
define (a correlation of constant scores) is None, written as null.
"""

from __future__ import annotations

import math
import warnings
from typing import Dict, Optional

import numpy as np

PRIMARY = {"single_label_classification": "accuracy", "regression": "pearson",
           "multi_label_classification": "f1_micro"}
"""The metric a run's summary leads with, per problem type."""


def _finite(value: float) -> Optional[float]:
    value = float(value)
    return value if math.isfinite(value) else None


def task_metrics(problem_type: str, predictions: np.ndarray, labels: np.ndarray,
                 num_labels: int) -> Dict[str, Optional[float]]:
    """The metrics of ``predictions`` against ``labels``, one example a row (see the module docstring)."""
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if len(labels) == 0:
        return {}
    if problem_type == "single_label_classification":
        chosen = predictions.argmax(axis=-1) if predictions.ndim == 2 else predictions
        labels = labels.astype(np.int64)
        average = "binary" if num_labels == 2 else "macro"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sklearn warns where a class is never predicted; the value is defined
            return {
                "accuracy": float(accuracy_score(labels, chosen)),
                "f1": float(f1_score(labels, chosen, average=average, zero_division=0)),
                "matthews_correlation": float(matthews_corrcoef(labels, chosen)),
            }
    if problem_type == "regression":
        from scipy.stats import pearsonr, spearmanr

        scores = predictions.reshape(len(predictions), -1)[:, 0] if predictions.ndim > 1 else predictions
        gold = labels.reshape(len(labels), -1)[:, 0] if labels.ndim > 1 else labels
        constant = np.all(scores == scores[0]) or np.all(gold == gold[0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {
                "pearson": None if constant else _finite(pearsonr(scores, gold)[0]),
                "spearman": None if constant else _finite(spearmanr(scores, gold)[0]),
                "mse": float(np.mean((predictions.reshape(labels.shape) - labels) ** 2)),
            }
    if problem_type == "multi_label_classification":
        chosen = (predictions > 0.0).astype(np.int64)  # logits: sigmoid(x) > 0.5 exactly when x > 0
        gold = (labels > 0.5).astype(np.int64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {
                "accuracy": float(accuracy_score(gold, chosen)),  # subset accuracy: every label of an example
                "f1_micro": float(f1_score(gold, chosen, average="micro", zero_division=0)),
                "f1_macro": float(f1_score(gold, chosen, average="macro", zero_division=0)),
            }
    raise ValueError("problem_type must be one of %s, got %r" % (sorted(PRIMARY), problem_type))


__all__ = ["PRIMARY", "task_metrics"]
