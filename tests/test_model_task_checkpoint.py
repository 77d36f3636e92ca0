"""transformers-format directories for the task heads, both directions: what transformers' classifier and QA
model save, ours load (the same weights, the same per-sequence logits); what ours save, transformers loads
with no missing, unexpected or mismatched weights (the same logits, labels kept); a pretraining or encoder-only
directory (transformers' or this project's export) gives the encoder and a fresh head, reported."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import transformers
from safetensors.torch import save_file

from ipu_packing.model import (
    PackedBertForPreTraining,
    PackedBertForQuestionAnswering,
    PackedBertForSequenceClassification,
)
from task_packs import alone, scaled_difference, slots, task_packs
from model_fixtures import make_config, randomize_

ID2LABEL = {0: "contradiction", 1: "entailment", 2: "neutral"}
LABEL2ID = {name: index for index, name in ID2LABEL.items()}
SMALL = dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=32, vocab_size=97)


def config(**fields):
    return make_config(**dict(SMALL, **fields))


def distinct(model, seed=0):
    randomize_(model, seed)  # every tensor distinctive, biases included
    return model.eval()


def assert_same_weights(ours, theirs):
    mine = ours.hf_state_dict()
    other = theirs.state_dict()
    assert sorted(mine) == sorted(other)
    for key, value in other.items():
        assert torch.equal(mine[key], value), key


def classifier_logits_match(ours, theirs):
    """Our logits of every sequence of a batch of packs against transformers' on each sequence alone."""
    groups, batch = task_packs(9)
    with torch.no_grad():
        out = ours(**{k: batch[k] for k in ("input_ids", "token_type_ids", "position_ids", "sequence_ids",
                                            "cls_positions")})
        worst = max(scaled_difference(out.logits[b, k], theirs(**alone(seq)).logits[0]) for b, k, seq in slots(groups))
    assert worst <= 1e-5, worst
    return worst


def qa_logits_match(ours, theirs):
    groups, batch = task_packs(9)
    with torch.no_grad():
        out = ours(**{k: batch[k] for k in ("input_ids", "token_type_ids", "position_ids", "sequence_ids")},
                   num_slots=batch["cls_positions"].shape[1])
        worst = 0.0
        for b, k, seq in slots(groups):
            own = batch["sequence_ids"][b] == k + 1
            ref = theirs(**alone(seq))
            worst = max(worst, scaled_difference(out.start_logits[b, k][own], ref.start_logits[0]),
                        scaled_difference(out.end_logits[b, k][own], ref.end_logits[0]))
    assert worst <= 1e-5, worst


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_we_load_what_transformers_classifier_saved(tmp_path, safe):
    reference = distinct(transformers.BertForSequenceClassification(
        config(num_labels=3, id2label=ID2LABEL, problem_type="single_label_classification")))
    reference.save_pretrained(str(tmp_path), safe_serialization=safe)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing fresh, nothing unused: no warning
        ours, info = PackedBertForSequenceClassification.from_pretrained(str(tmp_path), output_loading_info=True)
    assert info == {"missing_keys": [], "unexpected_keys": []}
    assert_same_weights(ours, reference)
    assert ours.config.id2label == ID2LABEL and ours.config.problem_type == "single_label_classification"
    classifier_logits_match(ours.eval(), reference)
    # a classifier directory is exactly this model: strict loading accepts it
    PackedBertForSequenceClassification.from_pretrained(str(tmp_path), strict=True, attention="sdpa")


@pytest.mark.parametrize("fused", [False, True], ids=["qkv", "fused_qkv"])
@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_transformers_loads_what_our_classifier_saved(tmp_path, safe, fused):
    ours = distinct(PackedBertForSequenceClassification(
        config(id2label=ID2LABEL, label2id=LABEL2ID, problem_type="multi_label_classification", fused_qkv=fused)), 4)
    ours.save_pretrained(str(tmp_path), safe_serialization=safe)
    theirs, info = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path), output_loading_info=True)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == []
    assert theirs.config.architectures == ["BertForSequenceClassification"]
    assert theirs.config.id2label == ID2LABEL and theirs.config.label2id == LABEL2ID
    assert theirs.config.problem_type == "multi_label_classification" and theirs.config.num_labels == 3
    assert_same_weights(ours, theirs)
    classifier_logits_match(ours, theirs.eval())
    again = PackedBertForSequenceClassification.from_pretrained(str(tmp_path), strict=True)
    assert again.config.fused_qkv is fused and again.config.id2label == ID2LABEL


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_qa_round_trips_both_ways(tmp_path, safe):
    reference = distinct(transformers.BertForQuestionAnswering(config()))
    reference.save_pretrained(str(tmp_path / "theirs"), safe_serialization=safe)
    ours = PackedBertForQuestionAnswering.from_pretrained(str(tmp_path / "theirs"), strict=True).eval()
    assert ours.bert.pooler is None
    assert_same_weights(ours, reference)
    qa_logits_match(ours, reference)

    ours = distinct(PackedBertForQuestionAnswering(config()), 5)
    ours.save_pretrained(str(tmp_path / "ours"), safe_serialization=safe)
    theirs, info = transformers.BertForQuestionAnswering.from_pretrained(str(tmp_path / "ours"),
                                                                        output_loading_info=True)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == []
    assert theirs.config.architectures == ["BertForQuestionAnswering"]
    assert_same_weights(ours, theirs)
    qa_logits_match(ours, theirs.eval())


def pretraining_directory(tmp_path, source):
    """A directory of the pretraining model (transformers' or this project's export) or of a bare encoder."""
    path = str(tmp_path / source)
    if source == "BertForPreTraining":
        model = distinct(transformers.BertForPreTraining(config()))
    elif source == "BertModel":
        model = distinct(transformers.BertModel(config()))
    else:  # this project's pretraining export: PackedBertForPreTraining.save_pretrained
        model = distinct(PackedBertForPreTraining(config()))
    model.save_pretrained(path)
    return path, model


def encoder_weights(model):
    state = model.hf_state_dict() if hasattr(model, "hf_state_dict") else model.state_dict()
    prefix = "" if isinstance(model, transformers.BertModel) else "bert."
    return {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}


@pytest.mark.parametrize("source", ["BertForPreTraining", "BertModel", "project export"])
def test_a_classifier_from_a_pretraining_directory_has_a_fresh_reported_head(tmp_path, source):
    path, pretrained = pretraining_directory(tmp_path, source)
    with pytest.warns(UserWarning, match=r"2 weights not in the checkpoint were initialised at random "
                                         r"\(classifier.weight, classifier.bias\)"):
        ours, info = PackedBertForSequenceClassification.from_pretrained(
            str(path), num_labels=4, problem_type="regression", output_loading_info=True)
    assert info["missing_keys"] == ["classifier.weight", "classifier.bias"]
    unused = [] if source == "BertModel" else ["cls.predictions.bias", "cls.predictions.transform.dense.weight"]
    assert all(key in info["unexpected_keys"] for key in unused)
    assert all(key.startswith("cls.") for key in info["unexpected_keys"])
    theirs = encoder_weights(pretrained)
    mine = {key[len("bert."):]: value for key, value in ours.hf_state_dict().items() if key.startswith("bert.")}
    assert sorted(mine) == sorted(theirs) and all(torch.equal(mine[k], theirs[k]) for k in theirs)  # pooler too
    # transformers' initialisation of the new head: N(0, initializer_range), zero bias
    assert ours.classifier.weight.shape == (4, 32) and torch.equal(ours.classifier.bias, torch.zeros(4))
    assert abs(ours.classifier.weight.std().item() - ours.config.initializer_range) < 0.01
    assert ours.config.num_labels == 4 and ours.config.problem_type == "regression"


@pytest.mark.parametrize("source", ["BertForPreTraining", "BertModel", "project export"])
def test_qa_from_a_pretraining_directory_has_a_fresh_reported_head(tmp_path, source):
    path, pretrained = pretraining_directory(tmp_path, source)
    with pytest.warns(UserWarning, match=r"initialised at random \(qa_outputs.weight, qa_outputs.bias\)"):
        ours, info = PackedBertForQuestionAnswering.from_pretrained(str(path), output_loading_info=True)
    assert info["missing_keys"] == ["qa_outputs.weight", "qa_outputs.bias"]
    assert "bert.pooler.dense.weight" in info["unexpected_keys"]  # QA has no pooler, as transformers'
    theirs = {k: v for k, v in encoder_weights(pretrained).items() if not k.startswith("pooler.")}
    mine = {key[len("bert."):]: value for key, value in ours.hf_state_dict().items() if key.startswith("bert.")}
    assert sorted(mine) == sorted(theirs) and all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_a_classifier_directory_gives_qa_its_encoder_and_the_other_way_round(tmp_path):
    classifier = distinct(transformers.BertForSequenceClassification(config(num_labels=3, id2label=ID2LABEL)))
    classifier.save_pretrained(str(tmp_path / "classifier"))
    with pytest.warns(UserWarning, match="were not used"):
        qa = PackedBertForQuestionAnswering.from_pretrained(str(tmp_path / "classifier"))
    assert qa.config.num_labels == 2
    qa.save_pretrained(str(tmp_path / "qa"))
    with pytest.warns(UserWarning, match=r"initialised at random \(bert.pooler.dense.weight, bert.pooler.dense.bias, "
                                         r"classifier.weight, classifier.bias\)"):
        PackedBertForSequenceClassification.from_pretrained(str(tmp_path / "qa"))


def test_refusals_name_the_weights(tmp_path):
    path, _ = pretraining_directory(tmp_path, "BertForPreTraining")
    with pytest.raises(ValueError, match=r"does not match PackedBertForSequenceClassification: missing "
                                         r"\['classifier.weight', 'classifier.bias'\]"):
        PackedBertForSequenceClassification.from_pretrained(path, strict=True)
    three = str(tmp_path / "three")
    distinct(transformers.BertForSequenceClassification(config(num_labels=3))).save_pretrained(three)
    with pytest.raises(ValueError, match=r"classifier\.bias in .* has shape \(3,\), the model wants \(5,\)"):
        PackedBertForSequenceClassification.from_pretrained(three, num_labels=5)
    # a directory without the encoder: only the head's weights
    headless = str(tmp_path / "headless")
    os.makedirs(headless)
    config(num_labels=3).to_json_file(os.path.join(headless, "config.json"))
    save_file({"classifier.weight": torch.zeros(3, 32), "classifier.bias": torch.zeros(3)},
              os.path.join(headless, "model.safetensors"))
    with pytest.raises(ValueError, match=r"lacks weights PackedBertForSequenceClassification needs besides its head "
                                         r"\(bert.pooler., classifier.\): bert.embeddings.word_embeddings.weight"):
        PackedBertForSequenceClassification.from_pretrained(headless)


def test_labels_given_to_from_pretrained_are_kept_in_what_we_save(tmp_path):
    path, _ = pretraining_directory(tmp_path, "project export")
    with pytest.warns(UserWarning, match="initialised at random"):
        ours = PackedBertForSequenceClassification.from_pretrained(
            path, id2label={str(k): v for k, v in ID2LABEL.items()}, problem_type="single_label_classification")
    assert ours.num_labels == 3 and ours.config.id2label == ID2LABEL and ours.config.label2id == LABEL2ID
    ours.save_pretrained(str(tmp_path / "saved"))
    theirs = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "saved"))
    assert theirs.config.id2label == ID2LABEL and theirs.config.label2id == LABEL2ID
    assert theirs.config.problem_type == "single_label_classification"
