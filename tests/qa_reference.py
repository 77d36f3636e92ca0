"""transformers' run_qa.py post-processing as published, the reference the question-answering tests hold
data/finetune/answers.py to (test_qa_postprocess.py on packed and padded windows, test_predict_qa.py on predict's
answers)."""

from __future__ import annotations

import collections

import numpy as np


def run_qa_postprocess(examples, features, n_best_size=20, max_answer_length=30):
    """transformers' utils_qa.py postprocess_qa_predictions (version_2_with_negative=False), as published, over
    `features`: [(example index, start logits, end logits, offset mapping with None off the context)]."""
    features_per_example = collections.defaultdict(list)
    for i, feature in enumerate(features):
        features_per_example[feature[0]].append(i)
    all_predictions = collections.OrderedDict()
    for example_index, example in enumerate(examples):
        feature_indices = features_per_example[example_index]
        prelim_predictions = []
        for feature_index in feature_indices:
            _, start_logits, end_logits, offset_mapping = features[feature_index]
            start_indexes = np.argsort(start_logits)[-1: -n_best_size - 1: -1].tolist()
            end_indexes = np.argsort(end_logits)[-1: -n_best_size - 1: -1].tolist()
            for start_index in start_indexes:
                for end_index in end_indexes:
                    if (start_index >= len(offset_mapping) or end_index >= len(offset_mapping)
                            or offset_mapping[start_index] is None or len(offset_mapping[start_index]) < 2
                            or offset_mapping[end_index] is None or len(offset_mapping[end_index]) < 2):
                        continue
                    if end_index < start_index or end_index - start_index + 1 > max_answer_length:
                        continue
                    prelim_predictions.append({
                        "offsets": (offset_mapping[start_index][0], offset_mapping[end_index][1]),
                        "score": start_logits[start_index] + end_logits[end_index]})
        predictions = sorted(prelim_predictions, key=lambda x: x["score"], reverse=True)[:n_best_size]
        context = example.context
        for pred in predictions:
            offsets = pred.pop("offsets")
            pred["text"] = context[offsets[0]: offsets[1]]
        if len(predictions) == 0 or (len(predictions) == 1 and predictions[0]["text"] == ""):
            predictions.insert(0, {"text": "empty", "score": 0.0})
        all_predictions[example.id] = predictions[0]["text"]
    return all_predictions


__all__ = ["run_qa_postprocess"]
