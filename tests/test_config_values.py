"""Config values as users write them: YAML 1.2 numbers, finite floats, probabilities, seed range."""

import os
from types import SimpleNamespace

import pytest

from ipu_packing.train import load_config
from ipu_packing.errors import ConfigError, UserError
from ipu_packing.train.loader import CONFIG_DIR
from ipu_packing.train.strict_yaml import yaml_load


@pytest.mark.parametrize("text, value", [("1e-4", 1e-4), ("1.0e30", 1.0e30), ("2E-3", 2e-3), (".5e1", 5.0),
                                         ("-3e+2", -300.0), ("7", 7), ("0.002828", 0.002828)])
def test_numbers_parse_as_written(text, value):
    parsed = yaml_load(text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize("text", ["1e", "e5", "-e5", ".e5", "1e-4x", "v1e4"])
def test_what_is_not_a_number_stays_a_string(text):
    assert yaml_load(text) == text


def test_exponent_in_an_override_a_file_and_a_list(tmp_path):
    assert load_config("demo", ["optimizer.lr=1e-4"]).optimizer.lr == 1e-4
    path = tmp_path / "c.yaml"
    path.write_text("base: %s\noptimizer:\n  lr: 5e-4\n  betas: [0.9, 9.99e-1]\n"
                    % os.path.join(CONFIG_DIR, "demo.yaml"))
    config = load_config(str(path))
    assert config.optimizer.lr == 5e-4
    assert list(config.optimizer.betas) == [0.9, 0.999]


@pytest.mark.parametrize(
    "override, message",
    [
        ("optimizer.lr=.inf", "finite"),
        ("optimizer.lr=-.inf", "finite"),
        ("optimizer.lr=.nan", "finite"),
        ("optimizer.weight_decay=.nan", "finite"),
        ("model.layer_norm_eps=.inf", "finite"),
        ("model.layer_norm_eps=0", "> 0"),
        ("model.layer_norm_eps=-1e-12", "> 0"),
        ("model.hidden_dropout_prob=5", r"\[0, 1\]"),
        ("model.attention_probs_dropout_prob=-0.1", r"\[0, 1\]"),
        ("model.classifier_dropout=1.5", r"\[0, 1\]"),
        ("training.seed=-1", "training.seed"),
        ("training.seed=%d" % 2**70, "training.seed"),
        ("optimizer.lr=1e", "number"),  # not a number in any YAML: stays a string, refused
    ],
)
def test_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("demo", [override])


def test_largest_seed_is_accepted():
    assert load_config("demo", ["training.seed=%d" % (2**63 - 1)]).training.seed == 2**63 - 1


def test_model_refuses_what_it_would_compute_wrongly():
    import transformers

    from ipu_packing.model import PackedBertForPreTraining

    small = dict(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    for flag in ("is_decoder", "add_cross_attention"):
        with pytest.raises(ValueError, match=flag):
            PackedBertForPreTraining(transformers.BertConfig(**dict(small, **{flag: True})))
    with pytest.raises(ValueError, match="hidden_act"):
        PackedBertForPreTraining(transformers.BertConfig(**dict(small, hidden_act="foo")))


def test_gelu_python_is_erf_gelu():
    import torch
    import transformers

    from ipu_packing.model.modeling import _activation

    x = torch.linspace(-4, 4, 101, dtype=torch.float64)

    reference = transformers.activations.ACT2FN["gelu_python"]
    assert torch.allclose(_activation("gelu_python")(x), reference(x), atol=1e-15, rtol=0)


def test_strict_false_names_the_weights_it_initialised(tmp_path):
    import transformers

    from ipu_packing.model import PackedBertForPreTraining

    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32)
    transformers.BertModel(config).save_pretrained(str(tmp_path))  # no pretraining heads
    with pytest.warns(UserWarning, match=r"initialised at random \(.*cls\.seq_relationship\.weight"):
        PackedBertForPreTraining.from_pretrained(str(tmp_path), strict=False)


def test_type_vocab_size_is_checked_against_the_data(data_dir):
    from ipu_packing.train.data import check_data_matches, read_training_data

    overrides = ["model.vocab_size=64", "data.max_seq_length=32", "data.dir=%s" % data_dir]
    config = load_config("demo", overrides + ["model.type_vocab_size=1"])
    with pytest.raises(UserError, match="type_vocab_size is 1"):
        check_data_matches(config, read_training_data(config.data.path))
    check_data_matches(load_config("demo", overrides), read_training_data(config.data.path))


# -- model.pad_token_id against the dataset's [PAD] (train/data.py check_data_matches) -------------------------

V = 64  # the session's tiny dataset (conftest.py tiny_data): S=32, K=3, V=64


def _config(pad):
    model = {"vocab_size": V, "max_position_embeddings": 512, "type_vocab_size": 2, "pad_token_id": pad}
    return SimpleNamespace(data=SimpleNamespace(max_seq_length=32, expected_sequences_per_pack=3, layout="packed"),
                           model=model, model_value=model.__getitem__)


@pytest.mark.parametrize("pad", [4, 1, V - 1], ids=["mask-id", "unk-id", "last-id"])
def test_a_pad_token_id_that_is_not_the_datasets_is_refused(pad, tiny_data):
    from ipu_packing.train.data import check_data_matches, read_training_data

    data = read_training_data(os.path.join(tiny_data, "packed"))
    with pytest.raises(UserError, match=r"\[PAD\] id 0, but model.pad_token_id is %d" % pad):
        check_data_matches(_config(pad), data)
    check_data_matches(_config(0), data)  # the dataset's own: accepted
