"""Packed inference for sequence classification (ipu_packing.predict's Predictor on classifiers transformers
saved: single label, multi-label, regression; single texts and pairs): the inputs are packed several to a row,
scored and unpacked back to input order, each input's scores what transformers' text-classification pipeline gives
it alone (1e-5; regression: the model's raw output), and shuffled inputs keep their own scores. What the command
guarantees for every task it serves, classification among them: test_predict_tasks.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app_fixtures import CLASSIFIER_WORDS as WORDS, hf_classifier
from ipu_packing.predict import Predictor

pytestmark = pytest.mark.usefixtures("one_thread")

def sentence(rng, low=3, high=30):
    return " ".join(rng.choice(WORDS, size=int(rng.integers(low, high))))


def pipeline_scores(directory, inputs):
    """transformers' text-classification pipeline on each input alone: {label: score} (top_k=None)."""
    import transformers

    pipe = transformers.pipeline("text-classification", model=directory, tokenizer=directory, top_k=None,
                                 device="cpu")
    out = []
    for x in inputs:
        got = pipe({"text": x[0], "text_pair": x[1]} if isinstance(x, tuple) else x)
        got = got[0] if isinstance(got[0], list) else got
        out.append({d["label"]: d["score"] for d in got})
    return out


CASES = [
    ("single label", 3, "single_label_classification", False),
    ("single label, pairs", 2, "single_label_classification", True),
    ("multi-label", 4, "multi_label_classification", False),
]


@pytest.mark.parametrize("name, num_labels, problem_type, pairs", CASES, ids=[c[0] for c in CASES])
def test_shuffled_inputs_come_back_in_order_with_the_pipelines_scores(name, num_labels, problem_type, pairs,
                                                                      tmp_path):
    directory = hf_classifier(str(tmp_path / "model"), num_labels, problem_type)
    rng = np.random.default_rng(1)
    inputs = [(sentence(rng), sentence(rng)) if pairs else sentence(rng) for _ in range(57)]
    predictor = Predictor.from_pretrained(directory, max_seq_length=64, max_sequences_per_pack=8, batch_packs=4)
    packs = predictor.packs(inputs)
    assert len(packs) < len(inputs) * (0.75 if pairs else 0.5)  # packed: several inputs a row
    records = predictor.predict(inputs)
    assert [r["index"] for r in records] == list(range(len(inputs)))
    expected = pipeline_scores(directory, inputs)
    worst = max(abs(r["scores"][k] - v) for r, e in zip(records, expected) for k, v in e.items())
    assert worst < 1e-5, worst
    assert all(r["label"] == max(e, key=e.get) for r, e in zip(records, expected))
    # shuffled: each input keeps its own scores
    order = rng.permutation(len(inputs))
    again = predictor.predict([inputs[i] for i in order])
    for j, i in enumerate(order):
        assert again[j]["scores"] == pytest.approx(records[i]["scores"], abs=1e-6)


def test_regression_scores_are_the_raw_outputs(tmp_path):
    directory = hf_classifier(str(tmp_path / "model"), 1, "regression")
    rng = np.random.default_rng(2)
    inputs = [sentence(rng) for _ in range(20)]
    records = Predictor.from_pretrained(directory, max_seq_length=64, max_sequences_per_pack=8).predict(inputs)
    import transformers

    model = transformers.BertForSequenceClassification.from_pretrained(directory).eval()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(directory)
    with torch.no_grad():
        want = [float(model(**tokenizer(x, return_tensors="pt")).logits[0, 0]) for x in inputs]
    assert [r["score"] for r in records] == pytest.approx(want, abs=1e-5)
