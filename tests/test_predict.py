"""Packed inference (ipu_packing.predict): inputs packed K to a row, scored in one pass, unpacked back to input
order, each input's scores what transformers' text-classification pipeline gives it alone (1e-5), for this
project's fine-tuning export and for classifiers transformers saved (single label, multi-label, regression; single
texts and pairs)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from app_fixtures import CLASSIFIER_WORDS as WORDS, hf_classifier
from ipu_packing.predict import Predictor, main

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


def test_the_command_writes_one_line_per_input_in_order(tmp_path, capsys):
    directory = hf_classifier(str(tmp_path / "model"), 3, "single_label_classification")
    rng = np.random.default_rng(3)
    inputs = [sentence(rng) for _ in range(25)]
    source = tmp_path / "inputs.tsv"
    source.write_text("sentence1\tlabel\n" + "".join("%s\tx\n" % x for x in inputs))
    out = str(tmp_path / "out.jsonl")
    assert main(["--model", directory, "--input", str(source), "--output", out, "--max-seq-length", "64"]) == 0
    lines = [json.loads(line) for line in open(out)]
    assert [r["index"] for r in lines] == list(range(25))
    expected = Predictor.from_pretrained(directory, max_seq_length=64).predict(inputs)
    assert [r["label"] for r in lines] == [r["label"] for r in expected]


@pytest.mark.parametrize("args, words", [
    (["--model", "missing-dir"], "is not a directory"),
    (["--max-sequences-per-pack", "0"], "--max-sequences-per-pack must be in [1, 255]"),
    (["--max-seq-length", "1000"], "exceeds the model's max_position_embeddings"),
    (["--input", "nowhere.tsv"], "nowhere.tsv"),
    (["--batch-packs", "0"], "--batch-packs must be a positive integer, got 0"),
    (["--batch-packs", "-1"], "--batch-packs must be a positive integer, got -1"),
    (["--max-seq-length", "-5"], "--max-seq-length must be a positive integer, got -5"),
    (["--max-seq-length", "0"], "--max-seq-length must be a positive integer, got 0"),
    (["--max-seq-length", "2"], "--max-seq-length must be at least 3"),
], ids=["no model", "K", "S", "no input", "batch 0", "batch -1", "S -5", "S 0", "S 2"])
def test_bad_input_is_one_line(args, words, tmp_path, capsys):
    directory = hf_classifier(str(tmp_path / "model"), 2, "single_label_classification")
    source = tmp_path / "inputs.tsv"
    source.write_text("sentence1\nthe loop runs\n")
    base = {"--model": directory, "--input": str(source), "--output": str(tmp_path / "out.jsonl")}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    argv = [x for pair in base.items() for x in pair]
    assert main(argv) == 2
    err = capsys.readouterr()[1]
    assert err.startswith("error: ") and err.count("\n") == 1 and words in err, err
    assert not os.path.exists(str(tmp_path / "out.jsonl"))


@pytest.mark.parametrize("text", ["sentence1\n", "sentence1\tlabel\n", ""], ids=["header", "header-and-label", "empty"])
def test_an_input_without_rows_is_one_line_naming_it(text, tmp_path, capsys):
    directory = hf_classifier(str(tmp_path / "model"), 2, "single_label_classification")
    source = tmp_path / "inputs.tsv"
    source.write_text(text)
    assert main(["--model", directory, "--input", str(source), "--output", str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr()[1]
    assert err.startswith("error: %s" % source) and err.count("\n") == 1, err
    assert not os.path.exists(str(tmp_path / "out.jsonl"))


def test_a_model_whose_weights_hold_nan_is_refused_and_nothing_written(tmp_path, capsys):
    """NaN weights give NaN scores, which JSON cannot hold: one line naming a weight, no output file."""
    from safetensors.torch import load_file, save_file

    directory = hf_classifier(str(tmp_path / "model"), 2, "single_label_classification")
    weights = os.path.join(directory, "model.safetensors")
    state = load_file(weights)
    name = sorted(k for k in state if k.endswith("classifier.weight"))[0]
    state[name] = torch.full_like(state[name], float("nan"))
    save_file(state, weights, metadata={"format": "pt"})
    source = tmp_path / "inputs.tsv"
    source.write_text("sentence1\nthe loop runs\n")
    out = str(tmp_path / "out.jsonl")
    assert main(["--model", directory, "--input", str(source), "--output", out]) == 2
    err = capsys.readouterr()[1]
    assert err.startswith("error: --model %s: 1 weights hold inf or NaN (first: classifier.weight)" % directory), err
    assert err.count("\n") == 1 and not os.path.exists(out)


def test_scores_that_are_not_finite_are_refused():
    from ipu_packing.errors import UserError
    from ipu_packing.predict import check_finite_scores

    check_finite_scores(np.array([[0.5, 0.5], [1.0, 0.0]]), "input")
    with pytest.raises(UserError, match=r"scores of 2 inputs are not finite numbers \(first: input 1\)"):
        check_finite_scores(np.array([[0.5, 0.5], [np.nan, 0.5], [0.1, np.inf]]), "input")


def test_serving_takes_as_many_packs_a_call_as_the_models_sizes_say_on_cpu(tmp_path):
    """predict.packs_per_call: a call's feed-forward activation within 1 MiB, or within one layer's weights where
    those are larger (the measurements behind it: predict.SERVING_CALL_BYTES); 64 on CUDA; a given value kept."""
    import transformers

    from ipu_packing.predict import packs_per_call

    sizes = {"demo": (64, 256), "tiny": (128, 512), "small": (256, 1024), "base": (768, 3072), "large": (1024, 4096)}
    got = {name: packs_per_call(transformers.BertConfig(hidden_size=h, intermediate_size=ff), 128, "cpu")
           for name, (h, ff) in sizes.items()}
    assert got == {"demo": 8, "tiny": 4, "small": 6, "base": 18, "large": 24}
    base = transformers.BertConfig(hidden_size=768, intermediate_size=3072)
    assert packs_per_call(base, 384, "cpu") == 6 and packs_per_call(base, 128, "cuda") == 64
    directory = str(tmp_path / "model")
    hf_classifier(directory, 3, "single_label_classification")
    config = transformers.BertConfig.from_pretrained(directory)
    assert Predictor.from_pretrained(directory, max_seq_length=64).batch_packs == packs_per_call(config, 64, "cpu")
    assert Predictor.from_pretrained(directory, max_seq_length=64, batch_packs=3).batch_packs == 3
