"""The user's own model taken as it is: a run that starts from a transformers-saved BERT (phase 2's and fine-tuning's
checkpoint.init_from) takes its architecture from its config.json (a vocabulary and a layer_norm_eps of its own,
with no `model.*` key typed: the values a shipped `base:` config gives a model from scratch give way); a value the
user sets and that differs is still refused, naming both."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import app_fixtures as fx
import model_fixtures as mf
from ipu_packing.data import open_dataset
from ipu_packing.data.cli import main as data_main
from ipu_packing.errors import UserError
from ipu_packing.train import ConfigError, load_config
from ipu_packing.train.loader import resolve_config_path
from ipu_packing.train.loop import execute, plan_run

pytestmark = pytest.mark.usefixtures("one_thread")

RUN = ["execution.micro_batch_size=4", "training.global_batch_sequences=16", "logging.progress_bar=false",
       "logging.tensorboard=false", "training.steps=1", "checkpoint.every_steps=0"]


def _task_rows(n, seed):
    words = ["the loop", "a mail", "the socket", "a header", "the server", "a test case"]
    return "".join("%s %s\t%s\n" % (words[(i * 7 + seed) % 6], words[i % 6], "good" if (i + seed) % 3 else "bad")
                   for i in range(n))


def prepare_task(root, tokenizer, files, *options):
    """`prepare --task classification` of the split files ``files`` ({"train": text, "dev": text, ...}) written
    under ``root``, with ``tokenizer``: (exit code, stdout, stderr, the output directory)."""
    argv = ["prepare", "--task", "classification", "--tokenizer", tokenizer, "--output", str(root / "task"),
            "--max-seq-length", "32", "--max-sequences-per-pack", "4", "--workers", "1"]
    for split, text in files.items():
        (root / ("%s.tsv" % split)).write_text(text, encoding="utf-8")
        argv += ["--%s" % {"dev": "validation"}.get(split, split), str(root / ("%s.tsv" % split))]
    code, out, err = fx.captured(data_main, argv + list(options))
    return code, out, err, str(root / "task")


@pytest.fixture(scope="module")
def own_model_task(tmp_path_factory):
    """A transformers BertForPreTraining with its own 28-token vocabulary and eps 1e-7, and a classification task
    prepared with its tokenizer (a test split without labels): (model directory, task root)."""
    root = tmp_path_factory.mktemp("own")
    model = mf.save_hf_bert(str(root / "bert"))
    files = {name: "sentence1\tlabel\n" + _task_rows(n, len(name)) for name, n in (("train", 48), ("dev", 16))}
    files["test"] = "sentence1\n" + "".join(row.split("\t")[0] + "\n" for row in _task_rows(8, 3).splitlines())
    code, _, err, task = prepare_task(root, model, files, "--quiet")
    assert code == 0, err
    return model, task


def test_fine_tuning_from_a_transformers_bert_takes_its_vocabulary_and_eps(own_model_task, tmp_path, capsys):
    model, task = own_model_task
    run = str(tmp_path / "run")
    plan = plan_run(load_config("finetune_demo", RUN + ["data.dir=%s" % task, "checkpoint.init_from=%s" % model,
                                                        "checkpoint.output_dir=%s" % run, "data.max_seq_length=32",
                                                        "data.max_sequences_per_pack=4"]), open_dataset=open_dataset)
    config = plan.model.config
    assert (config.vocab_size, config.layer_norm_eps, config.hidden_size) == (28, 1e-7, 32)
    assert plan.model.bert.embeddings.LayerNorm.eps == 1e-7
    assert capsys.readouterr().out.startswith("pretrained weights: ")  # a fine-tuning run names no phase 1
    execute(plan, log=lambda m: None)
    with open(os.path.join(run, "final", "config.json")) as f:
        exported = json.load(f)
    assert (exported["vocab_size"], exported["layer_norm_eps"]) == (28, 1e-7)


def test_phase_2_from_a_transformers_bert_takes_its_vocabulary_and_eps(data_dir, tmp_path, capsys):
    model = mf.save_hf_bert(str(tmp_path / "bert"), words=["w%d" % i for i in range(59)])  # the data's 64 ids
    shutil.copyfile(os.path.join(data_dir, "packed", "vocab.txt"), os.path.join(model, "vocab.txt"))
    plan = plan_run(load_config("demo_512", RUN + ["data.dir=%s" % data_dir, "data.max_seq_length=32",
                                                   "checkpoint.init_from=%s" % model,
                                                   "checkpoint.output_dir=%s" % str(tmp_path / "run")]),
                    open_dataset=open_dataset)
    assert (plan.model.config.vocab_size, plan.model.config.layer_norm_eps) == (64, 1e-7)
    assert capsys.readouterr().out.startswith("phase-1 weights: ")


@pytest.mark.parametrize("where", ["command line", "config file"])
def test_a_value_the_user_sets_that_differs_is_refused(data_dir, tmp_path, where):
    model = mf.save_hf_bert(str(tmp_path / "bert"), words=["w%d" % i for i in range(59)])
    shutil.copyfile(os.path.join(data_dir, "packed", "vocab.txt"), os.path.join(model, "vocab.txt"))
    extra = ["data.dir=%s" % data_dir, "data.max_seq_length=32", "checkpoint.init_from=%s" % model]
    if where == "command line":
        name = "demo_512"
        extra.append("model.layer_norm_eps=1e-5")
    else:
        name = str(tmp_path / "mine.yaml")
        with open(name, "w") as f:
            f.write("base: %s\nmodel:\n  layer_norm_eps: 1.0e-5\n" % resolve_config_path("demo_512"))
    with pytest.raises(ConfigError, match=r"model.layer_norm_eps is 1e-05 in the config but 1e-07 in its config.json"):
        plan_run(load_config(name, RUN + extra), open_dataset=open_dataset)


def _classifier(tmp_path, names):
    """A transformers BertForSequenceClassification with the task's vocabulary whose labels are ``names`` by id
    (None: saved without names, transformers' LABEL_0, LABEL_1)."""
    fields = {"num_labels": 2} if names is None else {"id2label": dict(enumerate(names)),
                                                     "label2id": {n: i for i, n in enumerate(names)}}
    return mf.save_hf_bert(str(tmp_path / "classifier"), cls="BertForSequenceClassification", seed=5, **fields)


# (id, the classifier's labels by id, extra overrides, the dataset's rows of the classifier ("bad", "good") taken
# from these rows of its own, or the words of the refusal)
HEADS = [
    ("same-names-other-order", ["good", "bad"], [], [1, 0]),
    ("same-order", ["bad", "good"], [], [0, 1]),
    ("names-in-capitals", ["GOOD", "BAD"], [], [1, 0]),
    ("saved-without-names", None, [], [0, 1]),
    ("other-names", ["negative", "positive"], [], "labels (negative, positive) are not the dataset's (bad, good)"),
    ("three-labels", ["bad", "good", "neutral"], [], "labels (bad, good, neutral) are not the dataset's"),
    ("other-names-head-replaced", ["negative", "positive"], ["task.replace_head=true"], None),
]


@pytest.mark.parametrize("name, names, extra, expected", HEADS, ids=[h[0] for h in HEADS])
def test_a_classifiers_labels_go_through_its_label2id(own_model_task, tmp_path, capsys, name, names, extra, expected):
    import torch
    from safetensors.torch import load_file

    from ipu_packing.errors import UserError

    _, task = own_model_task
    source = _classifier(tmp_path, names)
    theirs = load_file(os.path.join(source, "model.safetensors"))
    config = load_config("finetune_demo", RUN + extra + [
        "data.dir=%s" % task, "checkpoint.init_from=%s" % source, "checkpoint.output_dir=%s" % str(tmp_path / "run"),
        "data.max_seq_length=32", "data.max_sequences_per_pack=4"])
    if isinstance(expected, str):
        with pytest.raises(UserError, match="task.replace_head=true") as info:
            plan_run(config, open_dataset=open_dataset)
        assert expected in str(info.value) and "\n" not in str(info.value)
        assert not os.path.exists(str(tmp_path / "run"))
        return
    capsys.readouterr()
    model = plan_run(config, open_dataset=open_dataset).model
    (line,) = capsys.readouterr().out.splitlines()
    assert model.config.id2label == {0: "bad", 1: "good"}
    if expected is None:  # a new head: transformers' initialisation, named fresh
        assert "initialised fresh: classifier.weight, classifier.bias" in line, line
        assert not torch.equal(model.classifier.weight, theirs["classifier.weight"])
        return
    assert torch.equal(model.classifier.weight, theirs["classifier.weight"][expected])
    assert torch.equal(model.classifier.bias, theirs["classifier.bias"][expected])
    assert ("rows mapped" in line) == (expected != [0, 1]), line


@pytest.mark.parametrize("rows, words, code", [
    (20, "error: --model {}: its tokenizer has 28 tokens, but the model's embeddings hold 20 (config.json vocab_size): "
         "ids 20 .. 27 have no embedding row", 2),
    (32, "note: --model {}: its tokenizer has 28 tokens, fewer than the model's 32 embedding rows (config.json "
         "vocab_size): rows 28 .. 31 are never used", 0),
], ids=["tokenizer-larger", "tokenizer-smaller"])
def test_predict_checks_the_tokenizer_against_the_embeddings(tmp_path, capsys, rows, words, code):
    from ipu_packing.predict import main

    model = mf.save_hf_bert(str(tmp_path / "model"), cls="BertForSequenceClassification", vocab_size=rows)
    source = tmp_path / "inputs.tsv"
    source.write_text("sentence1\nthe loop\na mail\n")
    out = str(tmp_path / "out.jsonl")
    assert main(["--model", model, "--input", str(source), "--output", out, "--max-seq-length", "32"]) == code
    err = capsys.readouterr().err
    assert words.format(model) in err.splitlines(), err
    assert os.path.exists(out) == (code == 0)


def test_predict_says_which_columns_it_read_and_never_scores_an_id(tmp_path, capsys):
    from ipu_packing.predict import Predictor, main

    model = mf.save_hf_bert(str(tmp_path / "model"), cls="BertForSequenceClassification")
    texts = ["the loop", "a mail header", "the socket server"]
    source = tmp_path / "inputs.tsv"
    source.write_text("id\ttext\n" + "".join("%d\t%s\n" % (i + 1, t) for i, t in enumerate(texts)))
    out = tmp_path / "out.jsonl"
    assert main(["--model", model, "--input", str(source), "--output", str(out), "--max-seq-length", "32"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "%s: columns: text 'text', pair none, label none" % source in err, err
    expected = Predictor.from_pretrained(model, max_seq_length=32).predict(texts)  # the texts alone, not ("1", text)
    assert [json.loads(line)["scores"] for line in out.read_text().splitlines()] == [r["scores"] for r in expected]


@pytest.mark.parametrize("setting, words", [
    ("data.split=test", "(the test split) has no labels, so it cannot be trained on: set data.split=train"),
    ("task.eval_split=test", "(the test split) has no labels, so it cannot be evaluated: set task.eval_split="),
])
def test_a_split_without_labels_is_neither_trained_on_nor_evaluated(own_model_task, tmp_path, setting, words):
    from ipu_packing.train.cli import finetune_main

    model, task = own_model_task
    run = str(tmp_path / "run")
    code, out, err = fx.captured(finetune_main, ["--config", "finetune_demo"] + RUN + [
        "data.dir=%s" % task, "checkpoint.init_from=%s" % model, "checkpoint.output_dir=%s" % run,
        "data.max_seq_length=32", "data.max_sequences_per_pack=4", setting])
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: dataset "), err
    assert words in err and "ipu-packing-predict" in err, err
    assert not os.path.exists(run)


def test_a_classifier_with_its_labels_in_another_order_scores_as_transformers_does(own_model_task, tmp_path):
    """End to end: fine-tuned for one step at lr 1e-12 from a classifier whose label2id orders the labels otherwise,
    the export gives each validation text transformers' scores for each label name (taken by index, each name would
    get the other name's score)."""
    import numpy as np
    import torch
    import transformers

    from ipu_packing.predict import Predictor

    _, task = own_model_task
    source = _classifier(tmp_path, ["good", "bad"])
    run = str(tmp_path / "run")
    execute(plan_run(load_config("finetune_demo", RUN + [
        "data.dir=%s" % task, "checkpoint.init_from=%s" % source, "checkpoint.output_dir=%s" % run,
        "data.max_seq_length=32", "data.max_sequences_per_pack=4", "optimizer.lr=1e-12"]), open_dataset=open_dataset),
        log=lambda m: None)
    texts = [row.split("\t")[0] for row in _task_rows(16, 3).splitlines()]
    ours = Predictor.from_pretrained(os.path.join(run, "final"), max_seq_length=32).predict(texts)
    model = transformers.BertForSequenceClassification.from_pretrained(source).eval()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(source)
    with torch.no_grad():
        probabilities = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits.softmax(-1).numpy()
    theirs = [{model.config.id2label[i]: float(p[i]) for i in range(2)} for p in probabilities]
    for mine, want in zip(ours, theirs):
        assert sorted(mine["scores"]) == ["bad", "good"]
        np.testing.assert_allclose([mine["scores"][n] for n in ("bad", "good")], [want["bad"], want["good"]],
                                   atol=1e-5)


def test_a_model_whose_embeddings_outnumber_its_tokenizer_fine_tunes_as_it_is(tmp_path, capsys):
    """A transformers BERT with 32 embedding rows beside its 28-token vocabulary (padded embeddings): the dataset
    made with its tokenizer trains on it, the load line says which rows are never used, and the export keeps both."""
    model = mf.save_hf_bert(str(tmp_path / "bert"), vocab_size=32)
    files = {name: "sentence1\tlabel\n" + _task_rows(n, len(name)) for name, n in (("train", 24), ("dev", 8))}
    code, _, err, task = prepare_task(tmp_path, model, files, "--quiet")
    assert code == 0, err
    run = str(tmp_path / "run")
    capsys.readouterr()
    plan = plan_run(load_config("finetune_demo", RUN + ["data.dir=%s" % task, "checkpoint.init_from=%s" % model,
                                                        "checkpoint.output_dir=%s" % run, "data.max_seq_length=32",
                                                        "data.max_sequences_per_pack=4"]), open_dataset=open_dataset)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.endswith("its tokenizer has 28 tokens, fewer than the model's 32 embedding rows (config.json "
                         "vocab_size): rows 28 .. 31 are never used"), line
    execute(plan, log=lambda m: None)
    with open(os.path.join(run, "final", "config.json")) as f:
        assert json.load(f)["vocab_size"] == 32
    with open(os.path.join(run, "final", "vocab.txt")) as f:
        assert len(f.read().splitlines()) == 28


# (id, what checkpoint.init_from is made into under tmp_path (None: left absent), the refusal's words)
UNREADABLE_SOURCES = [
    ("absent", None, None, "checkpoint.init_from {} does not exist"),
    ("config-json-a-fifo", "config.json", "fifo", "{}/config.json: is a FIFO (named pipe), not a regular file"),
    ("config-json-a-device", "config.json", "device", "{}/config.json: is a character device, not a regular file"),
    ("weights-a-fifo", "model.safetensors", "fifo", "{}/model.safetensors: is a FIFO (named pipe), not a regular file"),
    ("weights-a-device", "model.safetensors", "device",
     "{}/model.safetensors: is a character device, not a regular file"),
]


@pytest.mark.parametrize("name, make, words", [s[1:] for s in UNREADABLE_SOURCES],
                         ids=[s[0] for s in UNREADABLE_SOURCES])
def test_a_source_that_cannot_be_read_is_named_before_the_datasets_vocabulary(own_model_task, tmp_path, name, make,
                                                                               words):
    """A model directory that is absent, or whose config.json or weights are no regular file, is refused naming it,
    not as a dataset 'of another vocabulary' than the `base:` config's (the architecture it would have given is
    unknown), and a FIFO is never opened."""
    model, task = own_model_task
    source = str(tmp_path / "bert")
    if make is not None:
        shutil.copytree(model, source)
        os.remove(os.path.join(source, name))
        if make == "fifo":
            os.mkfifo(os.path.join(source, name))
        else:
            os.symlink("/dev/null", os.path.join(source, name))
    config = load_config("finetune_demo", RUN + ["data.dir=%s" % task, "checkpoint.init_from=%s" % source,
                                                 "checkpoint.output_dir=%s" % str(tmp_path / "run"),
                                                 "data.max_seq_length=32", "data.max_sequences_per_pack=4"])
    with pytest.raises(UserError) as refused:
        plan_run(config, open_dataset=open_dataset)
    assert words.format(source) in str(refused.value), str(refused.value)
    assert not os.path.exists(str(tmp_path / "run"))


# (id, the classifier's labels when saved, the config.json's id2label then written over them, the refusal's words):
# as transformers could not read it, as it names no label of an id, or as it is not label2id's inverse
MALFORMED_ID2LABEL = [
    ("a-list", None, ["bad", "good"], "its id2label is not"),
    ("a-key-not-an-id", None, {"x": "bad", "1": "good"}, "its id2label is not"),
    ("ids-with-a-gap", None, {"0": "bad", "2": "good"}, "its id2label is not"),
    ("not-label2id-s-inverse", ["bad", "good"], {"0": "good", "1": "bad"},
     "its label2id and id2label disagree (bad: label2id 0, id2label 1)"),
]


@pytest.mark.parametrize("names, id2label, words", [m[1:] for m in MALFORMED_ID2LABEL],
                         ids=[m[0] for m in MALFORMED_ID2LABEL])
def test_a_classifier_whose_id2label_names_no_label_by_id_is_refused(own_model_task, tmp_path, names, id2label,
                                                                     words):
    """An id2label that is not {id: name} over ids 0 .. N - 1 (transformers refuses the first two when it loads the
    config) is refused naming it, not taken for a head saved without names whose rows are kept by index; so is one
    that is not label2id's inverse (run_glue.py maps the dataset's labels through label2id, the classifier's rows
    are id2label's: no one mapping is the model's)."""
    _, task = own_model_task
    source = _classifier(tmp_path, names)
    path = os.path.join(source, "config.json")
    with open(path) as f:
        raw = json.load(f)
    raw["id2label"] = id2label
    with open(path, "w") as f:
        json.dump(raw, f)
    config = load_config("finetune_demo", RUN + [
        "data.dir=%s" % task, "checkpoint.init_from=%s" % source, "checkpoint.output_dir=%s" % str(tmp_path / "run"),
        "data.max_seq_length=32", "data.max_sequences_per_pack=4"])
    with pytest.raises(UserError) as refused:
        plan_run(config, open_dataset=open_dataset)
    assert "%s: %s" % (path, words) in str(refused.value), str(refused.value)
    assert not os.path.exists(str(tmp_path / "run"))

