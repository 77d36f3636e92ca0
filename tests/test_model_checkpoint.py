"""transformers-format checkpoints, both directions: transformers saves -> we load, we save -> transformers loads;
a directory's config.json is checked value by value before a model is built from it, and a sharded directory's
index names only files inside it."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import transformers

from ipu_packing.errors import InputError
from ipu_packing.model import PackedBertForPreTraining
from ipu_packing.model.pretrained import normalize_keys
from app_fixtures import TINY
from ipu_packing.train.cli import main as train_main
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


# -- a Hugging Face directory's config.json: every value checked before the model is built -------------------------
# model/pretrained.py `check_config_values`: refused in one line naming config.json and the field.

V = 64


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf") / "clean"
    config = transformers.BertConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=64)
    transformers.BertForPreTraining(config).save_pretrained(str(root))
    return str(root)


CONFIG_ROWS = [
    ("vocab-zero", {"vocab_size": 0}, "vocab_size"),
    ("vocab-string", {"vocab_size": "64"}, "vocab_size"),
    ("vocab-absurd", {"vocab_size": 10 ** 12}, "vocab_size"),
    ("heads-not-dividing", {"num_attention_heads": 3}, "multiple"),
    ("layers-negative", {"num_hidden_layers": -1}, "num_hidden_layers"),
    ("eps-nan", {"layer_norm_eps": float("nan")}, "layer_norm_eps"),
    ("eps-negative", {"layer_norm_eps": -1e-12}, "layer_norm_eps"),
    ("dropout-over-one", {"hidden_dropout_prob": 1.5}, "hidden_dropout_prob"),
    ("attention-dropout-inf", {"attention_probs_dropout_prob": float("inf")}, "attention_probs_dropout_prob"),
    ("pad-outside-vocab", {"pad_token_id": V}, "pad_token_id"),
    ("type-vocab-bool", {"type_vocab_size": True}, "type_vocab_size"),
    ("hidden-act-number", {"hidden_act": 3}, "hidden_act"),
    ("model-type-roberta", {"model_type": "roberta"}, "model_type is 'roberta'"),
    ("relative-positions", {"position_embedding_type": "relative_key"}, "position_embedding_type is 'relative_key'"),
    ("weights-absurd", {"hidden_size": 1 << 18, "num_attention_heads": 2, "intermediate_size": 1 << 18,
                        "num_hidden_layers": 64}, "weights"),
]


@pytest.mark.parametrize("name, change, words", CONFIG_ROWS, ids=[r[0] for r in CONFIG_ROWS])
def test_a_hostile_config_json_is_refused_before_the_model_is_built(name, change, words, hf_dir, tmp_path):
    from ipu_packing.errors import InputError
    from ipu_packing.model import PackedBertForPreTraining

    directory = str(tmp_path / "hf")
    shutil.copytree(hf_dir, directory)
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(change)
    with open(path, "w") as f:
        f.write(json.dumps(config))
    with pytest.raises(InputError) as info:
        PackedBertForPreTraining.from_pretrained(directory)
    message = str(info.value)
    assert words in message and path in message and "\n" not in message, message


def test_the_clean_config_json_loads(hf_dir):
    from ipu_packing.model import PackedBertForPreTraining

    assert PackedBertForPreTraining.from_pretrained(hf_dir).config.vocab_size == V


# -- a sharded directory (model.safetensors.index.json) is read only inside itself --------------------------------
# PackedBertForPreTraining.from_pretrained joins each shard name the index holds through fsutil.contained_path; the
# same directory as run_pretraining.py's checkpoint.init_from ends in one line, exit 2.

INDEX = "model.safetensors.index.json"


def _tiny_hf_config():
    return transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=512)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A sharded transformers BertForPreTraining directory of TINY's shape (two or more shards)."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    transformers.BertForPreTraining(_tiny_hf_config()).save_pretrained(str(root / "clean"), max_shard_size="40KB")
    with open(str(root / "clean" / INDEX)) as f:
        index = json.load(f)
    assert len(set(index["weight_map"].values())) >= 2
    return str(root)


def _hostile_dir(sharded, tmp_path, how):
    """A copy of the sharded directory whose index names the first shard the way ``how`` says."""
    directory = str(tmp_path / "hostile")
    shutil.copytree(os.path.join(sharded, "clean"), directory)
    with open(os.path.join(directory, INDEX)) as f:
        index = json.load(f)
    first = sorted(set(index["weight_map"].values()))[0]
    outside = str(tmp_path / "outside")
    os.makedirs(outside, exist_ok=True)
    shutil.move(os.path.join(directory, first), os.path.join(outside, first))
    if how == "absolute":
        name = os.path.join(outside, first)
    elif how == "dotdot":
        name = os.path.join("..", "outside", first)
    elif how == "symlink":
        os.symlink(os.path.join(outside, first), os.path.join(directory, first))
        name = first
    elif how == "symlinked-subdir":
        os.symlink(outside, os.path.join(directory, "shards"))
        name = "shards/" + first
    elif how == "not-a-string":
        name = {"file": first}
    else:
        raise AssertionError(how)
    index["weight_map"] = {k: (name if v == first else v) for k, v in index["weight_map"].items()}
    with open(os.path.join(directory, INDEX), "w") as f:
        json.dump(index, f)
    return directory


def _index_text(sharded, tmp_path, text):
    directory = str(tmp_path / "hostile")
    shutil.copytree(os.path.join(sharded, "clean"), directory)
    with open(os.path.join(directory, INDEX), "w") as f:
        f.write(text)
    return directory


HF_CASES = [
    ("absolute", lambda s, t: _hostile_dir(s, t, "absolute"), ["absolute"]),
    ("dotdot", lambda s, t: _hostile_dir(s, t, "dotdot"), ["leaves"]),
    ("symlink", lambda s, t: _hostile_dir(s, t, "symlink"), ["symlink"]),
    ("symlinked-subdir", lambda s, t: _hostile_dir(s, t, "symlinked-subdir"), ["symlink"]),
    ("not-a-string", lambda s, t: _hostile_dir(s, t, "not-a-string"), ["not a file name"]),
    ("weight-map-list", lambda s, t: _index_text(s, t, '{"weight_map": ["a", "b"]}'), ["weight_map"]),
    ("index-a-list", lambda s, t: _index_text(s, t, "[1, 2]"), ["weight_map"]),
    ("index-torn", lambda s, t: _index_text(s, t, '{"weight_map": {"a": "model-0'), ["not a JSON index"]),
    ("index-deep", lambda s, t: _index_text(s, t, "[" * 100000 + "]" * 100000), ["not a JSON index"]),
]


@pytest.mark.parametrize("name, make, words", HF_CASES, ids=[c[0] for c in HF_CASES])
def test_from_pretrained_reads_only_inside_the_directory(name, make, words, sharded, tmp_path):
    directory = make(sharded, tmp_path)
    with pytest.raises(InputError) as info:
        PackedBertForPreTraining.from_pretrained(directory)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_a_clean_sharded_directory_still_loads(sharded):
    model = PackedBertForPreTraining.from_pretrained(os.path.join(sharded, "clean"))
    assert model.config.hidden_size == 32


@pytest.mark.parametrize("name, make, words", HF_CASES[:5], ids=[c[0] for c in HF_CASES[:5]])
def test_init_from_a_hostile_index_is_one_line(name, make, words, sharded, tiny_data, tmp_path, capsys):
    directory = make(sharded, tmp_path)
    code = train_main(["--config", "demo"] + TINY + ["data.dir=%s" % tiny_data, "training.steps=1",
                                                     "checkpoint.output_dir=%s" % str(tmp_path / "run"),
                                                     "checkpoint.init_from=%s" % directory,
                                                     # the phase-1 config's eps (1e-12) against demo's: kept;
                                                     # no vocab.txt beside it: started from all the same
                                                     "checkpoint.init_override=[model.layer_norm_eps,vocab]"])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, err


# -- one line means one line: a refused file is reported without a third-party warning above the error ------------
# torch.load(weights_only=True) refuses a crafted pickle, but first warns about its pickle protocol ("UserWarning:
# Detected pickle protocol ..."): two more lines on stderr above the `error:` line, as the training command printed
# them for a crafted `checkpoint.init_from` before model/checkpoint.load_tensors. Every warning is recorded here
# ("always", whatever an earlier test already triggered): none may come.

class _PrintingPayload:
    def __reduce__(self):
        return (print, ("the pickle ran code",))


def test_a_crafted_checkpoint_as_init_from_is_one_stderr_line(default_data_128, one_thread, tmp_path, capsys):
    import pickle
    import warnings

    evil = tmp_path / "evil.pt"
    with open(str(evil), "wb") as f:
        pickle.dump({"step": 1, "model": {}, "payload": _PrintingPayload()}, f, protocol=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = train_main(["--config", "demo", "data.dir=%s" % os.path.dirname(default_data_128),
                           "checkpoint.init_from=%s" % evil, "checkpoint.output_dir=%s" % (tmp_path / "run"),
                           "training.steps=1", "logging.progress_bar=false"])
    out, err = capsys.readouterr()
    assert code == 2 and "the pickle ran code" not in out + err
    assert [str(w.message) for w in caught] == []  # no warning to print above the line
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: checkpoint %s is unreadable" % evil), err
