"""Phase 2 from phase 1 (checkpoint.init_from): a Hugging Face BertForPreTraining directory gives the model its
architecture (gelu_new and eps 1e-12 survive training and export) when the run is planned (a config object reads
no file), a config value that disagrees is refused unless checkpoint.init_override lists it, loading prints one
line naming what is fresh, and a checkpoint trained on another vocabulary, or a directory without vocab.txt, is
refused unless overridden."""

import json
import os
import shutil

import pytest
import torch

import app_fixtures as fx
from ipu_packing.data import open_dataset
from ipu_packing.train import ConfigError, UserError, load_config
from ipu_packing.train.loop import execute, plan_run
from ipu_packing.train.phase1 import with_init_architecture

SETTINGS = ["data.max_seq_length=32", "execution.micro_batch_size=4", "training.global_batch_sequences=16",
            "logging.progress_bar=false", "logging.tensorboard=false", "optimizer.lr=0.01"]
pytestmark = pytest.mark.usefixtures("one_thread")


def hf_phase1(directory, data_dir, heads=True):
    """A tiny transformers BertForPreTraining (or, heads=False, a bare BertModel) saved with save_pretrained,
    with gelu_new and eps 1e-12, and the dataset's vocab.txt beside it."""
    import transformers

    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
                                     hidden_act="gelu_new", layer_norm_eps=1e-12)
    torch.manual_seed(3)
    model = (transformers.BertForPreTraining if heads else transformers.BertModel)(config)
    model.save_pretrained(directory)
    shutil.copyfile(os.path.join(data_dir, "packed", "vocab.txt"), os.path.join(directory, "vocab.txt"))
    return directory, model


def config(data_dir, run_dir, *extra):
    return load_config("demo", SETTINGS + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run_dir]
                       + list(extra))


def test_architecture_comes_from_the_hf_config_and_survives_training_and_export(data_dir, tmp_path, capsys):
    source, hf = hf_phase1(str(tmp_path / "phase1"), data_dir)
    # demo.yaml says layer_norm_eps 0.001 and other sizes: refused when planned, naming the keys and both values
    with pytest.raises(ConfigError) as info:
        plan_run(config(data_dir, str(tmp_path / "run"), "checkpoint.init_from=%s" % source), open_dataset=open_dataset)
    message = str(info.value)
    assert "\n" not in message
    assert "model.layer_norm_eps is 0.001 in the config but 1e-12 in its config.json" in message, message
    assert "model.hidden_size is 64 in the config but 32" in message and "checkpoint.init_override=[" in message
    # a config that states none of the architecture takes all of it from config.json
    run = str(tmp_path / "run")
    bare = _bare_demo(tmp_path)
    cfg = load_config(bare, SETTINGS + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run,
                                        "checkpoint.init_from=%s" % source, "training.steps=2"])
    assert "hidden_act" not in cfg.model  # as written: the config object read nothing
    taken = with_init_architecture(cfg).model
    assert taken["hidden_act"] == "gelu_new" and taken["layer_norm_eps"] == 1e-12
    assert taken["hidden_size"] == 32 and taken["max_position_embeddings"] == 64
    capsys.readouterr()
    plan = plan_run(cfg, open_dataset=open_dataset)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("phase-1 weights: "), lines
    assert source in lines[0] and "hidden_act gelu_new, layer_norm_eps 1e-12" in lines[0]
    assert "initialised fresh: none" in lines[0], lines[0]
    assert plan.model.config.hidden_act == "gelu_new" and plan.model.config.layer_norm_eps == 1e-12
    assert torch.equal(plan.model.bert.embeddings.word_embeddings.weight, hf.bert.embeddings.word_embeddings.weight)
    assert plan.model.bert.embeddings.LayerNorm.eps == 1e-12
    execute(plan, log=lambda m: None)
    with open(os.path.join(run, "final", "config.json")) as f:
        exported = json.load(f)
    assert exported["hidden_act"] == "gelu_new" and exported["layer_norm_eps"] == 1e-12
    # resuming the finished run recomputes the same architecture: nothing changed, nothing refused
    again = load_config(bare, SETTINGS + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run,
                                          "checkpoint.init_from=%s" % source, "training.steps=2"])
    assert with_init_architecture(again).to_dict()["model"] == fx.load(fx.latest(run)).config["model"]


def _bare_demo(tmp_path):
    """configs/demo.yaml without its model sizes and eps (what a user's phase-2 YAML from phase 1 looks like)."""
    import yaml

    from ipu_packing.train.loader import resolve_config_path

    with open(resolve_config_path("demo")) as f:
        raw = yaml.safe_load(f)
    raw["model"] = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    path = tmp_path / "bare.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_init_override_keeps_the_config_value_and_a_bare_bert_model_gets_fresh_heads(data_dir, tmp_path, capsys):
    source, hf = hf_phase1(str(tmp_path / "bare_model"), data_dir, heads=False)
    cfg = load_config(_bare_demo(tmp_path), SETTINGS + [
        "data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % str(tmp_path / "run"),
        "checkpoint.init_from=%s" % source, "model.layer_norm_eps=0.001",
        "checkpoint.init_override=[model.layer_norm_eps]"])
    taken = with_init_architecture(cfg).model
    assert taken["layer_norm_eps"] == 0.001 and taken["hidden_act"] == "gelu_new"
    capsys.readouterr()
    plan = plan_run(cfg, open_dataset=open_dataset)
    (line,) = capsys.readouterr().out.splitlines()
    fresh = line.split("initialised fresh: ")[1].split("; not used")[0].split(", ")
    assert "cls.seq_relationship.weight" in fresh and "cls.predictions.transform.dense.weight" in fresh
    assert not [key for key in fresh if key.startswith("bert.encoder")], fresh
    assert plan.model.bert.embeddings.LayerNorm.eps == 0.001
    assert torch.equal(plan.model.bert.encoder.layer[1].output.dense.weight, hf.encoder.layer[1].output.dense.weight)
    with pytest.raises(ConfigError, match="init_override: 'model.dropout' is not one of"):
        load_config("demo", ["checkpoint.init_override=[model.dropout]"])
    # an overridden size no longer fits the weights: one line naming the tensor and both shapes
    with pytest.raises(UserError, match=r"init_from does not fit the model config: bert\.embeddings\.\S+ in \S+ "
                                        r"has shape \(32,\), the model wants \(16,\).*override=\[model.hidden_size"):
        plan_run(load_config(_bare_demo(tmp_path), SETTINGS + [
            "data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % str(tmp_path / "run2"),
            "checkpoint.init_from=%s" % source, "model.hidden_size=16",
            "checkpoint.init_override=[model.hidden_size]"]), open_dataset=open_dataset)


def test_dropout_and_initializer_range_come_from_config_json_unless_the_user_sets_them(data_dir, tmp_path):
    """As transformers' from_pretrained builds the model: config.json's dropout rates and initializer range, over
    the values a config inherits through `base:` (demo_512 inherits demo's dropout 0); a value the user sets (on
    the command line here) wins, refused for no disagreement."""
    source, _ = hf_phase1(str(tmp_path / "phase1"), data_dir)
    path = os.path.join(source, "config.json")
    with open(path) as f:
        stated = dict(json.load(f), hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.15,
                      classifier_dropout=0.3, initializer_range=0.05)
    with open(path, "w") as f:
        json.dump(stated, f)
    common = SETTINGS + ["data.dir=%s" % data_dir, "checkpoint.init_from=%s" % source]
    inherited = load_config("demo_512", common)
    assert inherited.model_value("hidden_dropout_prob") == 0.0  # demo's, through base:
    taken = with_init_architecture(inherited).model
    assert [taken[k] for k in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout",
                               "initializer_range")] == [0.2, 0.15, 0.3, 0.05]
    own = with_init_architecture(load_config("demo_512", common + ["model.hidden_dropout_prob=0.05"])).model
    assert own["hidden_dropout_prob"] == 0.05 and own["attention_probs_dropout_prob"] == 0.15


@pytest.mark.parametrize("change, words", [({"position_embedding_type": "relative_key"}, "position_embedding_type"),
                                           ({"model_type": "roberta"}, "model_type")], ids=["relative", "roberta"])
def test_a_phase1_directory_the_packed_model_cannot_be_is_refused_in_one_line(change, words, data_dir, tmp_path,
                                                                             capsys):
    from ipu_packing.train.cli import main

    source, _ = hf_phase1(str(tmp_path / "phase1"), data_dir)
    path = os.path.join(source, "config.json")
    with open(path) as f:
        stated = dict(json.load(f), **change)
    with open(path, "w") as f:
        json.dump(stated, f)
    run = str(tmp_path / "run")
    assert main(["--config", _bare_demo(tmp_path)] + SETTINGS + [
        "data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % run, "checkpoint.init_from=%s" % source,
        "training.steps=1"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: %s: %s is " % (path, words)) and err.count("\n") == 1, err
    assert not os.path.exists(run)


def test_a_checkpoint_trained_on_another_vocabulary_is_refused_unless_overridden(data_dir, tmp_path):
    other = fx.write_prepared(str(tmp_path / "other"), S=32, K=3, V=64, num_sequences=96, seed=0, vocab_tag="x")
    tiny = ["model.vocab_size=64", "model.hidden_size=32", "model.intermediate_size=64", "model.num_attention_heads=2",
            "training.steps=1"]
    first = str(tmp_path / "phase1")
    execute(plan_run(config(data_dir, first, *tiny), open_dataset=open_dataset), log=lambda m: None)
    for source in (first, fx.latest(first), os.path.join(first, "final")):
        with pytest.raises(UserError, match="another vocabulary.*checkpoint.init_override=\\[vocab\\]"):
            plan_run(config(other, str(tmp_path / "p2"), "checkpoint.init_from=%s" % source, *tiny),
                     open_dataset=open_dataset)
        plan = plan_run(config(other, str(tmp_path / "p2"), "checkpoint.init_from=%s" % source,
                               "checkpoint.init_override=[vocab]", *tiny), open_dataset=open_dataset)
        assert plan.start_step == 0


def test_a_config_object_reads_no_file_planning_does(data_dir, tmp_path):
    """checkpoint.init_from names a directory whose config.json is not JSON: building the config reads nothing and
    succeeds; planning the run reads it and refuses it in one line, writing nothing."""
    source = tmp_path / "broken"
    source.mkdir()
    (source / "config.json").write_text("{not json")
    (source / "model.safetensors").write_bytes(b"")
    cfg = config(data_dir, str(tmp_path / "run"), "checkpoint.init_from=%s" % source)
    with pytest.raises(ConfigError, match="cannot read config.json") as info:
        plan_run(cfg, open_dataset=open_dataset)
    assert "\n" not in str(info.value) and not os.path.exists(str(tmp_path / "run"))


def test_a_phase1_directory_without_vocab_txt_is_refused_unless_overridden(data_dir, tmp_path):
    source, _ = hf_phase1(str(tmp_path / "phase1"), data_dir)
    os.unlink(os.path.join(source, "vocab.txt"))
    bare = _bare_demo(tmp_path)
    args = SETTINGS + ["data.dir=%s" % data_dir, "checkpoint.output_dir=%s" % str(tmp_path / "run"),
                       "checkpoint.init_from=%s" % source]
    with pytest.raises(UserError, match="has no vocab.txt: its vocabulary cannot be checked") as info:
        plan_run(load_config(bare, args), open_dataset=open_dataset)
    assert "checkpoint.init_override=[vocab]" in str(info.value)
    plan = plan_run(load_config(bare, args + ["checkpoint.init_override=[vocab]"]), open_dataset=open_dataset)
    assert plan.start_step == 0
