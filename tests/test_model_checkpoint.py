"""transformers-format checkpoints, both directions: transformers saves -> we load, we save -> transformers loads."""

from __future__ import annotations

import os

import pytest
import torch
import transformers

from ipu_packing.model import PackedBertForPreTraining
from ipu_packing.model.pretrained import normalize_keys
from model_fixtures import tiny_batch, tiny_config


def hf_model(seed: int = 0) -> transformers.BertForPreTraining:
    torch.manual_seed(seed)
    return transformers.BertForPreTraining(tiny_config()).eval()


def assert_same_weights(ours: PackedBertForPreTraining, theirs: torch.nn.Module) -> None:
    our_state, their_state = ours.state_dict(), theirs.state_dict()
    assert sorted(our_state) == sorted(their_state)
    for key, value in their_state.items():
        assert torch.equal(our_state[key], value), key


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_load_what_transformers_saved(tmp_path, safe):
    reference = hf_model()
    reference.save_pretrained(str(tmp_path), safe_serialization=safe)
    expected = "model.safetensors" if safe else "pytorch_model.bin"
    assert os.path.isfile(os.path.join(str(tmp_path), expected))
    model = PackedBertForPreTraining.from_pretrained(str(tmp_path)).eval()
    assert_same_weights(model, reference)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.config.hidden_size == reference.config.hidden_size
    assert model.attention_implementation == "dense"
    assert PackedBertForPreTraining.from_pretrained(str(tmp_path), attention="sdpa").attention_implementation == "sdpa"


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_transformers_loads_what_we_saved(tmp_path, safe):
    torch.manual_seed(3)
    model = PackedBertForPreTraining(tiny_config(), attention="sdpa").eval()
    with torch.no_grad():  # make every tensor distinctive, biases included
        for param in model.parameters():
            param.normal_()
    model.save_pretrained(str(tmp_path), safe_serialization=safe)
    loaded, info = transformers.BertForPreTraining.from_pretrained(str(tmp_path), output_loading_info=True)
    assert info["missing_keys"] == [] or set(info["missing_keys"]) <= {"cls.predictions.decoder.weight"}
    assert info["unexpected_keys"] == [] and info["mismatched_keys"] == []
    assert_same_weights(model, loaded)
    # and back again, keeping the attention choice recorded in config.json
    again = PackedBertForPreTraining.from_pretrained(str(tmp_path)).eval()
    assert again.attention_implementation == "sdpa"
    batch = tiny_batch()
    assert torch.equal(again(**batch).loss, model(**batch).loss)


def test_load_sharded_checkpoint(tmp_path):
    reference = hf_model(1)
    reference.save_pretrained(str(tmp_path), max_shard_size="20KB")
    assert os.path.isfile(os.path.join(str(tmp_path), "model.safetensors.index.json"))
    assert_same_weights(PackedBertForPreTraining.from_pretrained(str(tmp_path)), reference)


def test_legacy_key_spellings_are_normalized():
    state = {
        "module.bert.embeddings.LayerNorm.gamma": torch.ones(2),
        "module.bert.embeddings.LayerNorm.beta": torch.zeros(2),
        "module.bert.embeddings.position_ids": torch.arange(4),
        "module.cls.predictions.decoder.bias": torch.zeros(3),
    }
    assert sorted(normalize_keys(state)) == [
        "bert.embeddings.LayerNorm.bias",
        "bert.embeddings.LayerNorm.weight",
        "cls.predictions.bias",
    ]
    bare = normalize_keys({"embeddings.word_embeddings.weight": torch.zeros(1)})
    assert list(bare) == ["bert.embeddings.word_embeddings.weight"]


def test_bare_bert_model_needs_strict_false(tmp_path):
    torch.manual_seed(0)
    encoder = transformers.BertModel(tiny_config())
    encoder.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="missing .*cls.seq_relationship.weight"):
        PackedBertForPreTraining.from_pretrained(str(tmp_path))
    with pytest.warns(UserWarning, match="initialised at random"):
        model = PackedBertForPreTraining.from_pretrained(str(tmp_path), strict=False)
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, encoder.embeddings.word_embeddings.weight)


def test_missing_directory_contents_name_the_cause(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        PackedBertForPreTraining.from_pretrained(str(tmp_path))
    tiny_config().to_json_file(os.path.join(str(tmp_path), "config.json"))
    with pytest.raises(FileNotFoundError, match="no weights"):
        PackedBertForPreTraining.from_pretrained(str(tmp_path))
